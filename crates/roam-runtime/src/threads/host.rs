//! The host side of one thread: its store's data, and the imports that
//! threads add (`wasi.thread-spawn`, `roam.wait32/64`) or see differently
//! (`roam.migration_point`, the blocking WASI calls).

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use roam_snapshot::{GlobalVal, GlobalValue};
use roam_wasi::{WasiCtx, WasiView};
use wasmtime::{Caller, Global, Linker, SharedMemory, Val};

use super::Shared;
use crate::asyncify::HEADER;
use crate::control::Killed;
use crate::flag::FlagWord;

/// The longest a wait sleeps before it looks again. A request wakes it at
/// once (`Shared::wake_waiters`); the slice bounds the one race left, a
/// request between the last look and the wait. A program's own wake that
/// comes between two slices is seen by the next slice's compare (every
/// futex user changes the word before it wakes), so slices lose nothing.
const WAIT_SLICE: Duration = Duration::from_millis(25);

/// Handles into a thread's instance, set once it exists.
pub(crate) struct Ready {
    pub state: Global,
    pub cursor: Global,
    pub end: Global,
    pub globals: Vec<(String, Global)>,
    pub flag: FlagWord,
}

/// Data of one thread's store.
pub(crate) struct ThreadState {
    pub shared: Arc<Shared>,
    /// 0 for the first thread, else the id `thread-spawn` gave it.
    pub tid: u32,
    pub ready: Option<Ready>,
}

fn i32_of(caller: &mut Caller<'_, ThreadState>, g: impl Fn(&Ready) -> Global) -> i32 {
    let Some(r) = caller.data().ready.as_ref() else {
        return roam_prepare::NORMAL;
    };
    let g = g(r);
    match g.get(&mut *caller) {
        Val::I32(v) => v,
        _ => 0,
    }
}

fn set_i32(
    caller: &mut Caller<'_, ThreadState>,
    g: impl Fn(&Ready) -> Global,
    v: i32,
) -> wasmtime::Result<()> {
    let Some(r) = caller.data().ready.as_ref() else {
        wasmtime::bail!("roam import called before the thread's instance was ready");
    };
    let g = g(r);
    g.set(&mut *caller, Val::I32(v))
}

/// Read a thread's exported mutable globals.
pub(crate) fn read_globals(
    mut store: impl wasmtime::AsContextMut,
    globals: &[(String, Global)],
) -> wasmtime::Result<Vec<GlobalValue>> {
    let mut out = Vec::with_capacity(globals.len());
    for (name, g) in globals {
        let value = match g.get(&mut store) {
            Val::I32(v) => GlobalVal::I32(v),
            Val::I64(v) => GlobalVal::I64(v),
            Val::F32(v) => GlobalVal::F32(v),
            Val::F64(v) => GlobalVal::F64(v),
            Val::V128(v) => GlobalVal::V128(v.as_u128()),
            _ => wasmtime::bail!("global `{name}` holds a reference, which snapshots cannot carry"),
        };
        out.push(GlobalValue {
            name: name.clone(),
            value,
        });
    }
    Ok(out)
}

/// Clear the flags, then raise them again if a request is still pending.
fn rearm(shared: &Shared) {
    shared.control.set_flag(false);
    if shared.control.pending().is_some() || shared.control.killed() {
        shared.control.set_flag(true);
    }
}

/// The innermost site of a rewind was reached: this thread is back.
fn finish_rewind(caller: &mut Caller<'_, ThreadState>) -> wasmtime::Result<()> {
    set_i32(caller, |r| r.state, roam_prepare::NORMAL)?;
    let shared = caller.data().shared.clone();
    shared.gate.rewound(&shared)?;
    rearm(&shared);
    Ok(())
}

/// A request is pending: park with the others, then unwind when it is
/// this thread's turn. Returns false when there is nothing to take here.
/// A pause copies no memory: the unwinds then write below
/// [`crate::PAUSE_BUFFER_MAX`], the part the gate copied aside.
fn stop_here(caller: &mut Caller<'_, ThreadState>) -> wasmtime::Result<bool> {
    let shared = caller.data().shared.clone();
    let Some(req) = shared.control.pending() else {
        return Ok(false);
    };
    let globals = {
        let Some(r) = caller.data().ready.as_ref() else {
            // Still in its start function: it parks at its next site.
            return Ok(false);
        };
        let globals = r.globals.clone();
        read_globals(&mut *caller, &globals)?
    };
    let tid = caller.data().tid;
    let limit = shared.gate.park(&shared, tid, globals, req.at, req.kind)?;
    let end = limit.min(i32::MAX as usize) as i32;
    set_i32(caller, |r| r.cursor, HEADER as i32)?;
    set_i32(caller, |r| r.end, end)?;
    set_i32(caller, |r| r.state, roam_prepare::UNWINDING)?;
    Ok(true)
}

fn rewinding(caller: &mut Caller<'_, ThreadState>) -> bool {
    i32_of(caller, |r| r.state) == roam_prepare::REWINDING
}

fn migration_point(mut caller: Caller<'_, ThreadState>) -> wasmtime::Result<()> {
    let shared = caller.data().shared.clone();
    if shared.control.killed() {
        return Err(Killed.into());
    }
    if rewinding(&mut caller) {
        return finish_rewind(&mut caller);
    }
    if !stop_here(&mut caller)? {
        rearm(&shared);
    }
    Ok(())
}

/// `roam.wait32/64`: `memory.atomic.wait`, interruptible (see
/// `roam_prepare`'s `waits.rs`).
fn wait(
    caller: &mut Caller<'_, ThreadState>,
    addr: i32,
    expected: u64,
    timeout_ns: i64,
    offset: i32,
    wide: bool,
) -> wasmtime::Result<i32> {
    let shared = caller.data().shared.clone();
    if rewinding(caller) {
        finish_rewind(caller)?;
    }
    let at = u64::from(addr as u32) + u64::from(offset as u32);
    let deadline = u64::try_from(timeout_ns)
        .ok()
        .map(|ns| Instant::now() + Duration::from_nanos(ns));
    loop {
        if shared.control.killed() {
            return Err(Killed.into());
        }
        if stop_here(caller)? {
            return Ok(0);
        }
        let slice = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(2);
                }
                left.min(WAIT_SLICE)
            }
            None => WAIT_SLICE,
        };
        // Registered first, then one more look: a request made after the
        // look notifies this address (`Shared::wake_waiters`).
        let tid = caller.data().tid;
        shared.waits_on(tid, Some(at));
        let can_stop = caller.data().ready.is_some();
        if can_stop && (shared.control.pending().is_some() || shared.control.killed()) {
            shared.waits_on(tid, None);
            continue;
        }
        let r = wait_once(&shared.memory, at, expected, wide, slice);
        shared.waits_on(tid, None);
        match r? {
            wasmtime::WaitResult::Ok => return Ok(0),
            wasmtime::WaitResult::Mismatch => return Ok(1),
            wasmtime::WaitResult::TimedOut => {}
        }
    }
}

fn wait_once(
    memory: &SharedMemory,
    at: u64,
    expected: u64,
    wide: bool,
    slice: Duration,
) -> wasmtime::Result<wasmtime::WaitResult> {
    // wasmtime checks bounds and alignment and traps as the instruction would.
    match wide {
        false => memory.atomic_wait32(at, expected as u32, Some(slice)),
        true => memory.atomic_wait64(at, expected, Some(slice)),
    }
    .map_err(wasmtime::Error::new)
}

/// `wasi.thread-spawn`: a new thread over the same memory. Returns its id,
/// or a negative number when none can be made.
fn thread_spawn(caller: Caller<'_, ThreadState>, start_arg: i32) -> i32 {
    let shared = caller.data().shared.clone();
    match super::life::spawn(&shared, start_arg as u32) {
        Ok(tid) => tid as i32,
        Err(why) => {
            tracing::warn!("thread-spawn refused: {why}");
            -1
        }
    }
}

impl WasiView for ThreadState {
    type Guard<'a> = MutexGuard<'a, WasiCtx>;

    fn wasi(&mut self) -> MutexGuard<'_, WasiCtx> {
        self.shared.wasi.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enter_blocking(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        if rewinding(caller) {
            finish_rewind(caller)?;
        }
        Ok(())
    }

    fn suspend(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        if caller.data().shared.control.killed() {
            return Err(Killed.into());
        }
        // The call returns without its results, which only an unwind may
        // follow: with no checkpoint to take (blocking calls are never
        // armed to stop a threaded program by themselves), it ends the
        // program rather than hand it words it did not write.
        match stop_here(caller)? {
            true => Ok(()),
            false => Err(wasmtime::Error::msg(
                "a blocking call was interrupted with no checkpoint to take; \
                 threaded programs do not stop when they block",
            )),
        }
    }
}

/// Every import of a thread: WASI, the point, the waits, thread-spawn.
pub(crate) fn linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<ThreadState>> {
    let mut linker = Linker::new(engine);
    roam_wasi::add_to_linker(&mut linker)?;
    linker.func_wrap(
        roam_prepare::POINT_MODULE,
        roam_prepare::POINT_FUNC,
        migration_point,
    )?;
    linker.func_wrap(
        roam_prepare::POINT_MODULE,
        roam_prepare::WAIT32_FUNC,
        |mut c: Caller<'_, ThreadState>, addr: i32, expected: i32, timeout: i64, offset: i32| {
            wait(
                &mut c,
                addr,
                u64::from(expected as u32),
                timeout,
                offset,
                false,
            )
        },
    )?;
    linker.func_wrap(
        roam_prepare::POINT_MODULE,
        roam_prepare::WAIT64_FUNC,
        |mut c: Caller<'_, ThreadState>, addr: i32, expected: i64, timeout: i64, offset: i32| {
            wait(&mut c, addr, expected as u64, timeout, offset, true)
        },
    )?;
    linker.func_wrap("wasi", "thread-spawn", thread_spawn)?;
    Ok(linker)
}

/// With epoch interruption: a kill ends the thread at its next check.
pub(crate) fn arm_stop(store: &mut wasmtime::Store<ThreadState>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        if ctx.data().shared.control.killed() {
            return Err(Killed.into());
        }
        Ok(wasmtime::UpdateDeadline::Continue(1))
    });
}
