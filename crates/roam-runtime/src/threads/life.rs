//! The life of one thread: made (`thread-spawn`, a restore), run on its
//! OS thread, and what its entry returning means (it ended, it unwound
//! for a checkpoint, or the program ended).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use roam_snapshot::GlobalValue;
use wasmtime::{Global, Store, Val};

use super::host::{self, Ready, ThreadState};
use super::{Ending, Shared, MAX_THREADS, MAX_TID};
use crate::asyncify::HEADER;
use crate::control::Killed;
use crate::error::{boxed, RestoreError, Source};
use crate::flag::FlagWord;
use crate::runtime::RUN_THREAD_STACK;

/// One instance on its store, not yet running.
pub(super) struct Thread {
    pub(super) store: Store<ThreadState>,
    pub(super) instance: wasmtime::Instance,
}

pub(super) fn instantiate(shared: &Arc<Shared>, tid: u32) -> Result<Thread, Source> {
    let module = &shared.module;
    let mut store = Store::new(
        module.module().engine(),
        ThreadState {
            shared: shared.clone(),
            tid,
            ready: None,
        },
    );
    if module.epoch_checks() {
        host::arm_stop(&mut store);
    }
    let pre = shared.pre.get().ok_or("the linker is not ready")?;
    let instance = pre.instantiate(&mut store).map_err(boxed)?;
    let flag_memory = instance
        .get_memory(&mut store, crate::flag::FLAG_MEMORY_EXPORT)
        .ok_or("no flag memory export")?;
    let flag = shared
        .memories
        .find(flag_memory.data_ptr(&store))
        .and_then(FlagWord::new)
        .ok_or("the flag memory was not mapped by roam's memory creator")?;
    let global = |store: &mut Store<ThreadState>, name: &str| -> Result<Global, Source> {
        instance
            .get_global(&mut *store, name)
            .ok_or_else(|| format!("the module does not export `{name}`").into())
    };
    let ready = Ready {
        state: global(&mut store, roam_prepare::STATE_EXPORT)?,
        cursor: global(&mut store, roam_prepare::CAPTURE_GLOBAL_EXPORT)?,
        end: global(&mut store, roam_prepare::CAPTURE_END_EXPORT)?,
        globals: module
            .global_exports()
            .iter()
            .filter_map(|n| Some((n.clone(), instance.get_global(&mut store, n)?)))
            .collect(),
        flag: flag.clone(),
    };
    store.data_mut().ready = Some(ready);
    shared.control.attach_flag(flag);
    Ok(Thread { store, instance })
}

/// `thread-spawn`: instantiate here, run on a new OS thread.
pub(super) fn spawn(shared: &Arc<Shared>, start_arg: u32) -> Result<u32, String> {
    if shared.control.killed() {
        return Err("the program is ending".into());
    }
    let tid = shared.next_tid.fetch_add(1, Ordering::SeqCst);
    if tid > MAX_TID {
        return Err("thread ids are used up".into());
    }
    let thread = instantiate(shared, tid).map_err(|e| e.to_string())?;
    if !shared.gate.spawned(tid, start_arg, MAX_THREADS) {
        if let Some(r) = thread.store.data().ready.as_ref() {
            shared.control.detach_flag(&r.flag);
        }
        return Err(format!("the program already runs {MAX_THREADS} threads"));
    }
    start_os_thread(shared, thread, tid, start_arg, None).inspect_err(|_| {
        shared.gate.ended(shared, tid);
    })?;
    Ok(tid)
}

pub(super) fn start_os_thread(
    shared: &Arc<Shared>,
    thread: Thread,
    tid: u32,
    arg: u32,
    records: Option<Vec<u8>>,
) -> Result<(), String> {
    // Under the lock that `join` takes after a kill: no thread starts
    // once the program is ending, so none outlives `run`.
    let mut children = shared.children.lock().unwrap_or_else(|e| e.into_inner());
    if shared.control.killed() {
        return Err("the program is ending".into());
    }
    let s = shared.clone();
    let handle = std::thread::Builder::new()
        .name(format!("roam-thread-{tid}"))
        .stack_size(RUN_THREAD_STACK)
        .spawn(move || {
            let s2 = s.clone();
            // A panic in the host's code ends the program, not just the
            // thread, and never leaves the others waiting for it.
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                child(s, thread, tid, arg, records)
            }));
            if caught.is_err() {
                s2.end(Ending::Trap(format!("thread {tid}: the host panicked")));
                s2.gate.ended(&s2, tid);
            }
        })
        .map_err(|e| format!("cannot start an OS thread: {e}"))?;
    // Threads that ended need no join: their handles go.
    children.retain(|h| !h.is_finished());
    children.push(handle);
    Ok(())
}

/// The body of every thread but the first.
fn child(shared: Arc<Shared>, mut t: Thread, tid: u32, arg: u32, records: Option<Vec<u8>>) {
    let mut records = records;
    loop {
        let export = match records {
            Some(_) => roam_prepare::REWIND_THREAD_EXPORT,
            None => roam_prepare::THREAD_START_EXPORT,
        };
        let result = (|| -> wasmtime::Result<()> {
            let entry = t
                .instance
                .get_typed_func::<(i32, i32), ()>(&mut t.store, export)?;
            if let Some(records) = &records {
                start_rewind(&shared, &mut t.store, records)?;
            }
            entry.call(&mut t.store, (tid as i32, arg as i32))
        })();
        match finish(&shared, &mut t.store, tid, result) {
            // A checkpoint-and-continue: back into the stack just taken.
            Next::Rewind(stack) => records = Some(stack),
            Next::Done => return,
        }
    }
}

/// What a thread does once its entry returned.
pub(super) enum Next {
    /// Rewind through these records: the program goes on.
    Rewind(Vec<u8>),
    /// Nothing more: the thread ended, or the program stopped or ended.
    Done,
}

/// A thread's entry returned (or trapped): hand in its stack, or end.
pub(super) fn finish(
    shared: &Arc<Shared>,
    store: &mut Store<ThreadState>,
    tid: u32,
    r: wasmtime::Result<()>,
) -> Next {
    let flag = store.data().ready.as_ref().map(|r| r.flag.clone());
    match r {
        // Only a thread the gate gave the buffer to has records there.
        Ok(()) if unwinding(store) && !shared.gate.holds_buffer(tid) => shared.end(Ending::Trap(
            format!("thread {tid}: its entry returned unwinding, but no checkpoint asked it to"),
        )),
        Ok(()) if rewinding(store) => shared.end(Ending::Trap(format!(
            "thread {tid}: its rewind returned without reaching the site it was captured at"
        ))),
        Ok(()) if unwinding(store) => match records(shared, store) {
            Ok(records) => {
                shared.gate.unwound(shared, tid, records.clone());
                // The first thread decides, after its sink, whether all go
                // on (`ThreadedCell::run`); the others wait for that.
                if tid == 0 || shared.gate.resumes(shared) {
                    return Next::Rewind(records);
                }
            }
            Err(e) => shared.end(Ending::Trap(format!("thread {tid}: {e}"))),
        },
        Ok(()) if tid == 0 => shared.end(Ending::Exit(0)),
        Ok(()) => shared.gate.ended(shared, tid),
        Err(e) => {
            if let Some(exit) = e.downcast_ref::<roam_wasi::ProcExit>() {
                shared.end(Ending::Exit(exit.0));
            } else if e.downcast_ref::<Killed>().is_none() && !shared.control.killed() {
                shared.end(Ending::Trap(format!("thread {tid}: {e:?}")));
            }
            shared.gate.ended(shared, tid);
        }
    }
    if let Some(flag) = flag {
        shared.control.detach_flag(&flag);
    }
    Next::Done
}

fn get_i32(store: &mut Store<ThreadState>, pick: impl Fn(&Ready) -> Global) -> i32 {
    let Some(g) = store.data().ready.as_ref().map(pick) else {
        return 0;
    };
    match g.get(&mut *store) {
        Val::I32(v) => v,
        _ => 0,
    }
}

pub(super) fn unwinding(store: &mut Store<ThreadState>) -> bool {
    get_i32(store, |r| r.state) == roam_prepare::UNWINDING
}

pub(super) fn rewinding(store: &mut Store<ThreadState>) -> bool {
    get_i32(store, |r| r.state) == roam_prepare::REWINDING
}

/// The records an unwind wrote, `[HEADER, cursor)` of memory.
fn records(shared: &Shared, store: &mut Store<ThreadState>) -> Result<Vec<u8>, String> {
    let cursor = get_i32(store, |r| r.cursor) as u32 as usize;
    // SAFETY: the other threads are parked; this thread's unwind wrote them.
    let mem = unsafe { shared.bytes() };
    if cursor < HEADER as usize || cursor > mem.len() {
        return Err(format!("its unwind ended at {cursor:#x}, outside memory"));
    }
    let records = mem[HEADER as usize..cursor].to_vec();
    if let Some(r) = store.data().ready.as_ref() {
        let state = r.state;
        state
            .set(&mut *store, Val::I32(roam_prepare::NORMAL))
            .map_err(|e| e.to_string())?;
    }
    Ok(records)
}

/// Put `records` in the buffer (when it is this thread's turn) and set the
/// thread's state for the rewind.
pub(super) fn start_rewind(
    shared: &Arc<Shared>,
    store: &mut Store<ThreadState>,
    records: &[u8],
) -> wasmtime::Result<()> {
    let tid = store.data().tid;
    shared.gate.take_turn(shared, tid)?;
    let end = HEADER as usize + records.len();
    let size = shared.memory.data_size();
    if end > size {
        wasmtime::bail!(
            "a stack of {} bytes does not fit a {size}-byte memory",
            records.len()
        );
    }
    shared.write_memory(HEADER as usize, records);
    let Some(r) = store.data().ready.as_ref() else {
        wasmtime::bail!("the thread's instance is not ready");
    };
    let (state, cursor, limit) = (r.state, r.cursor, r.end);
    cursor.set(&mut *store, Val::I32(end as i32))?;
    limit.set(&mut *store, Val::I32(size.min(i32::MAX as usize) as i32))?;
    state.set(&mut *store, Val::I32(roam_prepare::REWINDING))
}

pub(super) fn set_globals(
    store: &mut Store<ThreadState>,
    values: &[GlobalValue],
) -> Result<(), RestoreError> {
    let globals = store
        .data()
        .ready
        .as_ref()
        .map(|r| r.globals.clone())
        .unwrap_or_default();
    if values.len() != globals.len() {
        return Err(RestoreError::Global {
            name: String::new(),
            detail: format!(
                "the snapshot holds {} globals for a thread, the module exports {}",
                values.len(),
                globals.len()
            ),
        });
    }
    crate::capture::write_globals(store, &globals, values)
}
