//! Registration of the fd imports (byte I/O, seek, metadata, readdir).
//!
//! Exists to keep `linker/mod.rs` short; each import decodes its integer
//! arguments and delegates to the matching `WasiCtx` method in `ops`.

use super::{blocking, code, with_mem, MODULE};
use crate::WasiView;
use wasmtime::{Caller, Linker};

pub(super) fn add_fd<T: WasiView>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        "fd_read",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, out: i32| {
            T::enter_blocking(&mut c)?;
            blocking(&mut c, |x, m, r| {
                x.fd_read_round(m, fd as u32, iov as u32, n as u32, out as u32, r)
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, out: i32| {
            // Only a socket with a full window waits; a write never suspends.
            blocking(&mut c, |x, m, r| {
                x.fd_write_round(m, fd as u32, iov as u32, n as u32, out as u32, r)
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_pread",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, off: i64, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_pread(m, fd as u32, iov as u32, n as u32, off as u64, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_pwrite",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, off: i64, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_pwrite(m, fd as u32, iov as u32, n as u32, off as u64, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_seek",
        |mut c: Caller<'_, T>, fd: i32, off: i64, wh: i32, out: i32| {
            let whence = u8::try_from(wh).unwrap_or(u8::MAX);
            with_mem(&mut c, |x, m| {
                code(x.fd_seek(m, fd as u32, off, whence, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_tell",
        |mut c: Caller<'_, T>, fd: i32, out: i32| {
            with_mem(&mut c, |x, m| code(x.fd_tell(m, fd as u32, out as u32)))
        },
    )?;
    l.func_wrap(MODULE, "fd_close", |mut c: Caller<'_, T>, fd: i32| {
        code(c.data_mut().wasi().fd_close(fd as u32))
    })?;
    l.func_wrap(
        MODULE,
        "fd_renumber",
        |mut c: Caller<'_, T>, from: i32, to: i32| {
            code(c.data_mut().wasi().fd_renumber(from as u32, to as u32))
        },
    )?;
    l.func_wrap(MODULE, "fd_sync", |mut c: Caller<'_, T>, fd: i32| {
        code(c.data_mut().wasi().fd_sync(fd as u32, false))
    })?;
    l.func_wrap(MODULE, "fd_datasync", |mut c: Caller<'_, T>, fd: i32| {
        code(c.data_mut().wasi().fd_sync(fd as u32, true))
    })?;
    l.func_wrap(
        MODULE,
        "fd_advise",
        |mut c: Caller<'_, T>, fd: i32, _off: i64, _len: i64, adv: i32| {
            let advice = u8::try_from(adv).unwrap_or(u8::MAX);
            code(c.data_mut().wasi().fd_advise(fd as u32, advice))
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_allocate",
        |mut c: Caller<'_, T>, fd: i32, off: i64, len: i64| {
            code(
                c.data_mut()
                    .wasi()
                    .fd_allocate(fd as u32, off as u64, len as u64),
            )
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_fdstat_get",
        |mut c: Caller<'_, T>, fd: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_fdstat_get(m, fd as u32, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_fdstat_set_flags",
        |mut c: Caller<'_, T>, fd: i32, fl: i32| {
            let flags = u16::try_from(fl).unwrap_or(u16::MAX);
            code(c.data_mut().wasi().fd_fdstat_set_flags(fd as u32, flags))
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_fdstat_set_rights",
        |mut c: Caller<'_, T>, fd: i32, b: i64, i: i64| {
            code(
                c.data_mut()
                    .wasi()
                    .fd_fdstat_set_rights(fd as u32, b as u64, i as u64),
            )
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_filestat_get",
        |mut c: Caller<'_, T>, fd: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_filestat_get(m, fd as u32, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_filestat_set_size",
        |mut c: Caller<'_, T>, fd: i32, size: i64| {
            code(
                c.data_mut()
                    .wasi()
                    .fd_filestat_set_size(fd as u32, size as u64),
            )
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_filestat_set_times",
        |mut c: Caller<'_, T>, fd: i32, a: i64, m: i64, fl: i32| {
            let fst = u16::try_from(fl).unwrap_or(u16::MAX);
            code(
                c.data_mut()
                    .wasi()
                    .fd_filestat_set_times(fd as u32, a as u64, m as u64, fst),
            )
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_prestat_get",
        |mut c: Caller<'_, T>, fd: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_prestat_get(m, fd as u32, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_prestat_dir_name",
        |mut c: Caller<'_, T>, fd: i32, p: i32, len: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_prestat_dir_name(m, fd as u32, p as u32, len as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_readdir",
        |mut c: Caller<'_, T>, fd: i32, buf: i32, len: i32, cookie: i64, used: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_readdir(
                    m,
                    fd as u32,
                    buf as u32,
                    len as u32,
                    cookie as u64,
                    used as u32,
                ))
            })
        },
    )?;
    Ok(())
}
