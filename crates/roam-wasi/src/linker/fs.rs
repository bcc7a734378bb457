//! Registration of the path and socket imports.
//!
//! Exists to keep `linker/mod.rs` short; path calls share the decode-path-then-
//! delegate shape; the socket calls delegate to `ops/sock.rs`.

use super::{blocking, code, with_mem, MODULE};
use crate::errno::Errno;
use crate::ops::path::OpenArgs;
use crate::ops::sock::RecvArgs;
use crate::{WasiCtx, WasiView};
use wasmtime::{Caller, Linker};

/// Register a call of the form `(dirfd, path, path_len) -> errno`.
fn dir_path_call<T: WasiView>(
    l: &mut Linker<T>,
    name: &str,
    op: fn(&WasiCtx, u32, &str) -> Result<(), Errno>,
) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        name,
        move |mut c: Caller<'_, T>, fd: i32, p: i32, pl: i32| {
            with_mem(&mut c, |x, m| {
                code(
                    m.str(p as u32, pl as u32)
                        .and_then(|s| op(x, fd as u32, &s)),
                )
            })
        },
    )?;
    Ok(())
}

pub(super) fn add_path<T: WasiView>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        "path_open",
        |mut c: Caller<'_, T>,
         fd: i32,
         df: i32,
         p: i32,
         pl: i32,
         of: i32,
         base: i64,
         inh: i64,
         ff: i32,
         out: i32| {
            with_mem(&mut c, |x, m| {
                let path = m.str(p as u32, pl as u32)?;
                let a = OpenArgs {
                    dirflags: df as u32,
                    path,
                    oflags: u16::try_from(of).map_err(|_| Errno::INVAL)?,
                    base: base as u64,
                    inheriting: inh as u64,
                    fdflags: u16::try_from(ff).map_err(|_| Errno::INVAL)?,
                };
                m.slice(out as u32, 4)?;
                let new_fd = x.path_open(fd as u32, a)?;
                m.put_u32(out as u32, new_fd)
            })
            .map(code)
        },
    )?;
    dir_path_call(l, "path_create_directory", WasiCtx::path_create_directory)?;
    dir_path_call(l, "path_remove_directory", WasiCtx::path_remove_directory)?;
    dir_path_call(l, "path_unlink_file", WasiCtx::path_unlink_file)?;
    l.func_wrap(
        MODULE,
        "path_rename",
        |mut c: Caller<'_, T>, fd: i32, op: i32, ol: i32, nfd: i32, np: i32, nl: i32| {
            with_mem(&mut c, |x, m| {
                let (old, new) = (m.str(op as u32, ol as u32)?, m.str(np as u32, nl as u32)?);
                x.path_rename(fd as u32, &old, nfd as u32, &new)
            })
            .map(code)
        },
    )?;
    l.func_wrap(
        MODULE,
        "path_readlink",
        |mut c: Caller<'_, T>, fd: i32, p: i32, pl: i32, buf: i32, bl: i32, used: i32| {
            with_mem(&mut c, |x, m| {
                let target = x.path_readlink(fd as u32, &m.str(p as u32, pl as u32)?)?;
                let n = target.len().min(bl as u32 as usize);
                m.write(buf as u32, &target[..n])?;
                m.put_u32(used as u32, n as u32)
            })
            .map(code)
        },
    )?;
    l.func_wrap(
        MODULE,
        "path_symlink",
        |mut c: Caller<'_, T>, op: i32, ol: i32, fd: i32, np: i32, nl: i32| {
            with_mem(&mut c, |x, m| {
                let (old, new) = (m.str(op as u32, ol as u32)?, m.str(np as u32, nl as u32)?);
                x.path_symlink(&old, fd as u32, &new)
            })
            .map(code)
        },
    )?;
    l.func_wrap(
        MODULE,
        "path_link",
        |mut c: Caller<'_, T>, fd: i32, fl: i32, op: i32, ol: i32, nfd: i32, np: i32, nl: i32| {
            with_mem(&mut c, |x, m| {
                let (old, new) = (m.str(op as u32, ol as u32)?, m.str(np as u32, nl as u32)?);
                x.path_link(fd as u32, fl as u32, &old, nfd as u32, &new)
            })
            .map(code)
        },
    )?;
    l.func_wrap(
        MODULE,
        "path_filestat_get",
        |mut c: Caller<'_, T>, fd: i32, fl: i32, p: i32, pl: i32, out: i32| {
            with_mem(&mut c, |x, m| {
                let path = m.str(p as u32, pl as u32)?;
                x.path_filestat_get(m, fd as u32, fl as u32, &path, out as u32)
            })
            .map(code)
        },
    )?;
    l.func_wrap(
        MODULE,
        "path_filestat_set_times",
        |mut c: Caller<'_, T>, fd: i32, fl: i32, p: i32, pl: i32, a: i64, mt: i64, fst: i32| {
            with_mem(&mut c, |x, m| {
                let path = m.str(p as u32, pl as u32)?;
                let fst = u16::try_from(fst).map_err(|_| Errno::INVAL)?;
                x.path_filestat_set_times(fd as u32, fl as u32, &path, (a as u64, mt as u64, fst))
            })
            .map(code)
        },
    )?;
    Ok(())
}

pub(super) fn add_sock<T: WasiView>(l: &mut Linker<T>) -> wasmtime::Result<()> {
    l.func_wrap(
        MODULE,
        "sock_accept",
        |mut c: Caller<'_, T>, fd: i32, fl: i32, out: i32| {
            T::enter_blocking(&mut c)?;
            let flags = u16::try_from(fl).unwrap_or(u16::MAX);
            blocking(&mut c, |x, m, r| {
                x.sock_accept_round(m, fd as u32, flags, out as u32, r)
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "sock_recv",
        |mut c: Caller<'_, T>, fd: i32, d: i32, dl: i32, fl: i32, ol: i32, of: i32| {
            T::enter_blocking(&mut c)?;
            let a = RecvArgs {
                fd: fd as u32,
                iovs: d as u32,
                n: dl as u32,
                flags: u16::try_from(fl).unwrap_or(u16::MAX),
                out_len: ol as u32,
                out_flags: Some(of as u32),
            };
            blocking(&mut c, |x, m, r| x.sock_recv_round(m, a, r))
        },
    )?;
    l.func_wrap(
        MODULE,
        "sock_send",
        |mut c: Caller<'_, T>, fd: i32, d: i32, dl: i32, fl: i32, o: i32| {
            if fl != 0 {
                // No send flags are defined in preview 1.
                return Ok(Errno::INVAL.code());
            }
            blocking(&mut c, |x, m, r| {
                x.sock_send_round(m, fd as u32, d as u32, dl as u32, o as u32, r)
            })
        },
    )?;
    l.func_wrap(
        MODULE,
        "sock_shutdown",
        |mut c: Caller<'_, T>, fd: i32, how: i32| {
            let how = u8::try_from(how).unwrap_or(u8::MAX);
            code(c.data_mut().wasi().sock_shutdown(fd as u32, how))
        },
    )?;
    Ok(())
}
