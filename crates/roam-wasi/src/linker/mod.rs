//! Registration of every `wasi_snapshot_preview1` import on a wasmtime `Linker`.
//!
//! Exists to translate between wasmtime's calling convention (a `Caller`,
//! i32/i64 arguments, one exported linear memory) and the host logic in
//! `ops`, and to run the blocking-call protocol (`enter_blocking` first,
//! `suspend` instead of waiting) that makes checkpoints of blocked programs
//! possible.

mod fd;
mod fs;

use crate::ctx::WasiCtx;
use crate::errno::Errno;
use crate::mem::Mem;
use crate::ops::{Outcome, Round};
use crate::{ProcExit, WasiView};
use wasmtime::{Caller, Extern, Linker, Memory, SharedMemory};

pub(crate) const MODULE: &str = "wasi_snapshot_preview1";

/// The program's linear memory: its own, or the memory its threads share.
enum Linear {
    Own(Memory),
    Shared(SharedMemory),
}

fn memory<T>(caller: &mut Caller<'_, T>) -> wasmtime::Result<Linear> {
    for name in ["memory", "roam.memory"] {
        match caller.get_export(name) {
            Some(Extern::Memory(m)) => return Ok(Linear::Own(m)),
            Some(Extern::SharedMemory(m)) => return Ok(Linear::Shared(m)),
            _ => {}
        }
    }
    Err(wasmtime::Error::msg(
        "the module exports no linear memory named `memory` or `roam.memory`; WASI calls need one",
    ))
}

/// Run `f` with the context and guest memory borrowed together.
pub(crate) fn with_mem<T: WasiView, R>(
    caller: &mut Caller<'_, T>,
    f: impl FnOnce(&mut WasiCtx, &mut Mem) -> R,
) -> wasmtime::Result<R> {
    caller.data().check_memory()?;
    match memory(caller)? {
        Linear::Own(m) => {
            let (data, t) = m.data_and_store_mut(caller);
            Ok(f(&mut t.wasi(), &mut Mem(data)))
        }
        Linear::Shared(m) => {
            let cells = m.data();
            // SAFETY: the slice covers the shared memory's accessible bytes,
            // which stay mapped while `m` lives (a shared memory never
            // moves or shrinks). Other threads of the program may write
            // them meanwhile: as with a `read(2)` into memory another thread
            // writes, the program sees some interleaving of the bytes, and
            // the host reads every guest value by copy, never by reference
            // held across a check.
            let data =
                unsafe { std::slice::from_raw_parts_mut(cells.as_ptr() as *mut u8, cells.len()) };
            Ok(f(&mut caller.data_mut().wasi(), &mut Mem(data)))
        }
    }
}

/// The errno a call returns to the guest.
pub(crate) fn code(r: Result<(), Errno>) -> i32 {
    r.err().unwrap_or(Errno::SUCCESS).code()
}

/// Run a blocking call's rounds with the context borrowed only during each
/// round, not while waiting between them: the threads of one program share
/// the context behind a lock, and a thread blocked in `accept`, `recv` or a
/// sleep must not hold up the others' calls. Ends in its errno, or hands
/// over to the embedder (`WasiView::suspend`).
fn blocking<T: WasiView>(
    caller: &mut Caller<'_, T>,
    mut round: impl FnMut(&mut WasiCtx, &mut Mem, Round) -> Outcome,
) -> wasmtime::Result<i32> {
    let mut r = Round::new();
    loop {
        let (o, interrupt) = with_mem(caller, |x, m| {
            let o = round(x, m, r);
            let interrupt = matches!(o, Outcome::Wait(_)).then(|| x.interrupt().clone());
            (o, interrupt)
        })?;
        match (o, interrupt) {
            (Outcome::Wait(w), Some(interrupt)) => {
                w.wait(&interrupt);
                r = r.next();
            }
            (Outcome::Suspend, _) => {
                T::suspend(caller)?;
                return Ok(Errno::SUCCESS.code());
            }
            (Outcome::Done(e), _) => return Ok(e.code()),
            (Outcome::Wait(_), None) => unreachable!("a wait always carries its interrupt"),
        }
    }
}

/// Registers every `wasi_snapshot_preview1` function.
pub fn add_to_linker<T: WasiView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    add_process::<T>(linker)?;
    fd::add_fd::<T>(linker)?;
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
            blocking(&mut c, |x, m, r| {
                x.poll_round(m, i as u32, o as u32, n as u32, ne as u32, r)
            })
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
