//! Registration of every `wasi_snapshot_preview1` import on a wasmtime `Linker`.
//!
//! Exists to translate between wasmtime's calling convention (a `Caller`,
//! i32/i64 arguments, one exported linear memory) and the host logic in
//! `ops`, and to run the blocking-call protocol (`enter_blocking` first,
//! `suspend` instead of waiting) that makes checkpoints of blocked programs
//! possible.

mod fs;

use crate::ctx::WasiCtx;
use crate::errno::Errno;
use crate::mem::Mem;
use crate::ops::Outcome;
use crate::{ProcExit, WasiView};
use wasmtime::{Caller, Extern, Linker, Memory};

pub(crate) const MODULE: &str = "wasi_snapshot_preview1";

fn memory<T>(caller: &mut Caller<'_, T>) -> wasmtime::Result<Memory> {
    let find = |c: &mut Caller<'_, T>, name: &str| c.get_export(name).and_then(Extern::into_memory);
    find(caller, "memory").or_else(|| find(caller, "roam.memory")).ok_or_else(|| {
        wasmtime::Error::msg("the module exports no linear memory named `memory` or `roam.memory`; WASI calls need one")
    })
}

/// Run `f` with the context and guest memory borrowed together.
pub(crate) fn with_mem<T: WasiView, R>(
    caller: &mut Caller<'_, T>,
    f: impl FnOnce(&mut WasiCtx, &mut Mem) -> R,
) -> wasmtime::Result<R> {
    let m = memory(caller)?;
    let (data, t) = m.data_and_store_mut(caller);
    Ok(f(t.wasi(), &mut Mem(data)))
}

/// The errno a call returns to the guest.
pub(crate) fn code(r: Result<(), Errno>) -> i32 {
    r.err().unwrap_or(Errno::SUCCESS).code()
}

/// Finish a blocking call: either its errno, or hand over to the embedder.
fn finish<T: WasiView>(caller: &mut Caller<'_, T>, o: Outcome) -> wasmtime::Result<i32> {
    match o {
        Outcome::Done(e) => Ok(e.code()),
        Outcome::Suspend => {
            T::suspend(caller)?;
            Ok(Errno::SUCCESS.code())
        }
    }
}

/// Registers every `wasi_snapshot_preview1` function.
pub fn add_to_linker<T: WasiView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    add_process::<T>(linker)?;
    add_fd::<T>(linker)?;
    fs::add_path::<T>(linker)?;
    fs::add_sock::<T>(linker)?;
    Ok(())
}

fn add_process<T: WasiView>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        "args_get",
        |mut c: Caller<'_, T>, a: i32, b: i32| {
            with_mem(&mut c, |x, m| code(x.args_get(m, a as u32, b as u32)))
        },
    )?;
    l.func_wrap(
        MODULE,
        "args_sizes_get",
        |mut c: Caller<'_, T>, a: i32, b: i32| {
            with_mem(&mut c, |x, m| code(x.args_sizes_get(m, a as u32, b as u32)))
        },
    )?;
    l.func_wrap(
        MODULE,
        "environ_get",
        |mut c: Caller<'_, T>, a: i32, b: i32| {
            with_mem(&mut c, |x, m| code(x.environ_get(m, a as u32, b as u32)))
        },
    )?;
    l.func_wrap(
        MODULE,
        "environ_sizes_get",
        |mut c: Caller<'_, T>, a: i32, b: i32| {
            with_mem(&mut c, |x, m| {
                code(x.environ_sizes_get(m, a as u32, b as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "clock_res_get",
        |mut c: Caller<'_, T>, id: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.clock_res_get(m, id as u32, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "clock_time_get",
        |mut c: Caller<'_, T>, id: i32, _prec: i64, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.clock_time_get(m, id as u32, out as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "random_get",
        |mut c: Caller<'_, T>, buf: i32, len: i32| {
            with_mem(&mut c, |_, m| {
                code(crate::ops::args::random_get(m, buf as u32, len as u32))
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "poll_oneoff",
        |mut c: Caller<'_, T>, i: i32, o: i32, n: i32, ne: i32| {
            T::enter_blocking(&mut c)?;
            let out = with_mem(&mut c, |x, m| {
                x.poll_oneoff(m, i as u32, o as u32, n as u32, ne as u32)
            })?;
            finish(&mut c, out)
        },
    )?;
    l.func_wrap(
        MODULE,
        "proc_exit",
        |_c: Caller<'_, T>, code: i32| -> wasmtime::Result<()> {
            Err(wasmtime::Error::new(ProcExit(code)))
        },
    )?;
    l.func_wrap(MODULE, "proc_raise", |_c: Caller<'_, T>, _sig: i32| {
        Errno::NOTSUP.code()
    })?;
    l.func_wrap(MODULE, "sched_yield", |_c: Caller<'_, T>| {
        std::thread::yield_now();
        Errno::SUCCESS.code()
    })?;
    Ok(())
}

fn add_fd<T: WasiView>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        "fd_read",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, out: i32| {
            T::enter_blocking(&mut c)?;
            let o = with_mem(&mut c, |x, m| {
                x.fd_read(m, fd as u32, iov as u32, n as u32, out as u32)
            })?;
            finish(&mut c, o)
        },
    )?;
    l.func_wrap(
        MODULE,
        "fd_write",
        |mut c: Caller<'_, T>, fd: i32, iov: i32, n: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                code(x.fd_write(m, fd as u32, iov as u32, n as u32, out as u32))
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
