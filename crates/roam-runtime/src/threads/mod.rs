//! [`ThreadedCell`]: a program of several threads (wasi-threads), stopped
//! at a consistent point and restored on any ISA.
//!
//! Why a cell of its own: wasmtime dropped its wasi-threads crate, and the
//! model it offers is one store and instance per thread over one shared
//! memory. roam builds that itself: `wasi.thread-spawn` makes a store and an
//! instance on a new OS thread, every instance imports the one
//! [`SharedMemory`], and all share one WASI context behind a lock. Each
//! instance has its own globals (the stack pointer and the TLS base among
//! them) and its own flag word, which a request raises in all of them.
//!
//! A checkpoint-and-stop parks every thread at its next site and captures
//! each one's stack by records, one at a time ([`gate`]). The snapshot
//! holds the memory once, the first thread's globals and stack where a
//! single-threaded snapshot has them, and each other thread's id, start
//! argument, globals and stack (format 2.1). A restore makes every
//! instance, rewinds each thread through its module's `roam.rewind` or
//! `roam.rewind_thread`, and releases them together.
//!
//! A checkpoint-and-continue parks and captures the same way, hands the
//! snapshot over, and rewinds every thread. What this cell does not do
//! yet: pauses (a request for one is logged and set aside), so live
//! migration between nodes, far memory and post-copy, and memory limits (a
//! shared memory grows without roam's limiter).

mod gate;
mod host;
mod life;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use roam_snapshot::{MemoryImage, ModuleRef, Origin, Snapshot, UnwoundStack};
use roam_wasi::{Preopen, WasiConfig, WasiCtx};
use wasmtime::{ExternType, InstancePre, SharedMemory, Store};

use crate::asyncify::HEADER;
use crate::control::{CheckpointKind, CheckpointTiming, Control, Controller};
use crate::error::{boxed, CheckpointError, RestoreError, RunError, Source, StartError};
use crate::memory::Creator;
use crate::module::LoadedModule;
use crate::runtime::Runtime;
use crate::Outcome;
use gate::Gate;
use host::ThreadState;
use life::{
    finish, instantiate, set_globals, start_os_thread, start_rewind, unwinding, Next, Thread,
};

/// Most threads a program may have running besides its first
/// ([`roam_snapshot::MAX_THREADS`]): `thread-spawn` fails past it.
pub const MAX_THREADS: usize = roam_snapshot::MAX_THREADS;

/// The largest thread id wasi-threads allows.
const MAX_TID: u32 = 0x1FFF_FFFF;

/// How the program ended, as the first thread to end it saw.
enum Ending {
    Exit(i32),
    Trap(String),
}

/// What the threads of one program share.
pub(crate) struct Shared {
    module: Arc<LoadedModule>,
    memories: Arc<Creator>,
    pre: OnceLock<InstancePre<ThreadState>>,
    memory: SharedMemory,
    wasi: Mutex<WasiCtx>,
    control: Arc<Control>,
    gate: Gate,
    next_tid: AtomicU32,
    ending: OnceLock<Ending>,
    children: Mutex<Vec<JoinHandle<()>>>,
    embed_module: bool,
    /// The address each thread waits on now (`roam.wait32/64`), so that a
    /// request wakes it at once rather than at the end of its slice.
    waiting: Mutex<BTreeMap<u32, u64>>,
}

impl Shared {
    /// The program's memory as bytes.
    ///
    /// # Safety
    ///
    /// No thread may run program code while the slice lives: every thread
    /// is parked (`gate.rs`), or none has started (a restore), or only the
    /// calling thread's own unwind wrote the bytes it reads (its records).
    /// Otherwise threads could write the bytes under the slice.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self) -> &mut [u8] {
        let cells = self.memory.data();
        // SAFETY: the slice covers the shared memory's accessible bytes,
        // mapped while `self.memory` lives (a shared memory never moves or
        // shrinks); the caller keeps every other writer away.
        unsafe { std::slice::from_raw_parts_mut(cells.as_ptr() as *mut u8, cells.len()) }
    }

    /// Write `data` at `at`, while no thread runs program code (the borrowed
    /// buffer: every thread is parked or about to rewind).
    fn write_memory(&self, at: usize, data: &[u8]) {
        // SAFETY: called only between a stop's park and the gate opening
        // again, or before any thread runs (`gate.rs`, `start_rewind`).
        let mem = unsafe { self.bytes() };
        let end = (at + data.len()).min(mem.len());
        if at < end {
            mem[at..end].copy_from_slice(&data[..end - at]);
        }
    }

    /// Memory and OS layer, read while every thread is parked.
    fn read_state(&self) -> Result<Snapshot, CheckpointError> {
        // SAFETY: every thread is parked (the last one to park calls this).
        let memory = MemoryImage::capture(unsafe { self.bytes() }, self.module.initial_image());
        let os_state = self
            .wasi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .save()?
            .encode();
        Ok(Snapshot {
            module: ModuleRef {
                hash: *self.module.hash(),
                embedded: self.embed_module.then(|| self.module.bytes().to_vec()),
            },
            origin: Origin {
                isa: crate::host_isa().to_string(),
                roam_version: env!("CARGO_PKG_VERSION").to_string(),
                created_unix_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0),
                reason: "threads".to_string(),
            },
            memory,
            globals: Vec::new(),
            stack: UnwoundStack::default(),
            os_state,
            files: None,
            threads: Vec::new(),
        })
    }

    /// Wake every thread parked in a wait (a request or a kill came); each
    /// looks at why before it waits again.
    fn wake_waiters(&self) {
        let waiting: Vec<u64> = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect();
        for at in waiting {
            let _ = self.memory.atomic_notify(at, u32::MAX);
        }
    }

    /// A thread waits on `at` (`Some`), or no longer (`None`).
    pub(crate) fn waits_on(&self, tid: u32, at: Option<u64>) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        match at {
            Some(at) => w.insert(tid, at),
            None => w.remove(&tid),
        };
    }

    /// The program ends: the first reason wins, and every thread is told.
    fn end(&self, ending: Ending) {
        let _ = self.ending.set(ending);
        self.control.kill();
    }
}

/// A running threaded program: its first thread's store, and what all
/// threads share.
pub struct ThreadedCell {
    shared: Arc<Shared>,
    main: Thread,
    /// The first thread's records, when it must rewind first.
    rewind: Option<Vec<u8>>,
}

/// Whether `module` is a threaded program (it imports a shared memory).
pub fn is_threaded(module: &LoadedModule) -> bool {
    module
        .module()
        .imports()
        .any(|i| matches!(i.ty(), ExternType::Memory(m) if m.is_shared()))
}

impl ThreadedCell {
    fn new(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        ctx: WasiCtx,
        control: Arc<Control>,
        min_bytes: u64,
        embed_module: bool,
    ) -> Result<ThreadedCell, Source> {
        let engine = module.module().engine().clone();
        let (name, ty) = module
            .module()
            .imports()
            .find_map(|i| match i.ty() {
                ExternType::Memory(m) if m.is_shared() => {
                    Some(((i.module().to_string(), i.name().to_string()), m))
                }
                _ => None,
            })
            .ok_or("the module imports no shared memory")?;
        let memory = SharedMemory::new(&engine, ty.clone()).map_err(boxed)?;
        let have = memory.data_size() as u64;
        if min_bytes > have {
            let pages = (min_bytes - have).div_ceil(roam_snapshot::WASM_PAGE_SIZE);
            memory.grow(pages).map_err(boxed)?;
        }
        let shared = Arc::new(Shared {
            module,
            memories: rt.memory_creator(),
            pre: OnceLock::new(),
            memory: memory.clone(),
            wasi: Mutex::new(ctx),
            control,
            gate: Gate::new(),
            next_tid: AtomicU32::new(1),
            ending: OnceLock::new(),
            children: Mutex::new(Vec::new()),
            embed_module,
            waiting: Mutex::new(BTreeMap::new()),
        });
        let weak = Arc::downgrade(&shared);
        shared.control.on_alarm(Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.wake_waiters();
            }
        }));
        let mut linker = host::linker(&engine).map_err(boxed)?;
        // A shared memory belongs to no store: the first one defines it
        // for every instance.
        let store = Store::new(
            &engine,
            ThreadState {
                shared: shared.clone(),
                tid: 0,
                ready: None,
            },
        );
        linker
            .define(&store, &name.0, &name.1, memory)
            .map_err(boxed)?;
        drop(store);
        let pre = linker
            .instantiate_pre(shared.module.module())
            .map_err(boxed)?;
        let _ = shared.pre.set(pre);
        let main = instantiate(&shared, 0)?;
        Ok(ThreadedCell {
            shared,
            main,
            rewind: None,
        })
    }

    /// The hub a network backend serves this program's listeners and
    /// connections through (`None` without listeners). Every thread's
    /// socket calls go through it; a thread blocked in `accept` or `recv`
    /// holds no lock while it waits, so the others go on serving.
    pub fn net(&self) -> Option<Arc<roam_wasi::net::NetHub>> {
        self.shared
            .wasi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .net()
    }

    /// Instantiate a threaded `module` for a fresh run.
    pub fn start(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        wasi: WasiConfig,
        embed_module: bool,
    ) -> Result<ThreadedCell, StartError> {
        let control = Control::new(module.epoch_engine());
        let ctx = WasiCtx::new(wasi, control.interrupt.clone())?;
        ThreadedCell::new(rt, module, ctx, control, 0, embed_module)
            .map_err(StartError::Instantiate)
    }

    /// Rebuild a threaded program from a snapshot: every thread is made,
    /// and each rewinds into its site when [`ThreadedCell::run`] is called.
    pub fn restore(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        embed_module: bool,
    ) -> Result<ThreadedCell, RestoreError> {
        crate::cell::check_module(snapshot, &module)?;
        let control = Control::new(module.epoch_engine());
        let state = roam_wasi::OsState::decode(&snapshot.os_state)?;
        let ctx = WasiCtx::restore(state, preopens, control.interrupt.clone())?;
        let want = snapshot.memory.byte_len();
        let mut cell = ThreadedCell::new(rt, module, ctx, control, want, embed_module)
            .map_err(RestoreError::Instantiate)?;
        let shared = cell.shared.clone();
        // SAFETY: no thread has started yet.
        let mem = unsafe { shared.bytes() };
        if mem.len() as u64 != want {
            return Err(RestoreError::Memory(format!(
                "the snapshot's memory is {want} bytes, the new memory {}",
                mem.len()
            )));
        }
        snapshot
            .memory
            .restore_into(mem, shared.module.initial_image(), false)
            .map_err(|e| RestoreError::Memory(e.to_string()))?;
        // Every stack goes through the buffer at address 0; what the
        // program has there comes back when all have rewound.
        let longest = std::iter::once(&snapshot.stack)
            .chain(snapshot.threads.iter().map(|t| &t.stack))
            .map(|s| s.data.len())
            .max()
            .unwrap_or(0);
        let borrowed = (HEADER as usize + longest).min(mem.len());
        let args: BTreeMap<u32, u32> = snapshot
            .threads
            .iter()
            .map(|t| (t.tid, t.start_arg))
            .collect();
        shared
            .gate
            .rewinding(1 + snapshot.threads.len(), args, mem[..borrowed].to_vec());
        set_globals(&mut cell.main.store, &snapshot.globals)?;
        // Every instance first, so that no start function runs while a
        // rewind borrows the buffer.
        let mut made = Vec::with_capacity(snapshot.threads.len());
        for t in &snapshot.threads {
            let mut thread = instantiate(&shared, t.tid).map_err(RestoreError::Instantiate)?;
            set_globals(&mut thread.store, &t.globals)?;
            made.push((thread, t));
        }
        // Ids are at most `MAX_TID` (the snapshot was checked).
        let next = snapshot
            .threads
            .iter()
            .map(|t| t.tid)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        shared.next_tid.store(next, Ordering::SeqCst);
        for (thread, t) in made {
            start_os_thread(
                &shared,
                thread,
                t.tid,
                t.start_arg,
                Some(t.stack.data.clone()),
            )
            .map_err(RestoreError::Stack)?;
        }
        cell.rewind = Some(snapshot.stack.data.clone());
        Ok(cell)
    }

    /// Keep what the program writes to stdout and stderr in memory instead
    /// of passing it to this process's own (for tests and benchmarks).
    pub fn capture_output(&mut self) -> roam_wasi::CapturedOutput {
        self.shared
            .wasi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .capture_output()
    }

    /// A handle to ask for a checkpoint or kill the program from another
    /// thread. Pauses are not taken.
    pub fn controller(&self) -> Controller {
        Controller(self.shared.control.clone())
    }

    /// Run the program until it exits, traps, is killed, or is stopped by a
    /// checkpoint-and-stop ([`Outcome::Stopped`]). Every checkpoint-and-
    /// continue is handed to `on_checkpoint` while all threads are stopped;
    /// they go on together when it returns.
    pub fn run(
        mut self,
        on_checkpoint: &mut dyn FnMut(&Snapshot, CheckpointTiming) -> Result<(), Source>,
    ) -> Result<Outcome, RunError> {
        let shared = self.shared.clone();
        let mut rewind = self.rewind.take();
        let failed = loop {
            let result = (|| -> wasmtime::Result<()> {
                let store = &mut self.main.store;
                match &rewind {
                    Some(records) => {
                        let entry = self
                            .main
                            .instance
                            .get_typed_func::<(), ()>(&mut *store, roam_prepare::REWIND_EXPORT)?;
                        start_rewind(&shared, store, records)?;
                        entry.call(store, ())
                    }
                    None => {
                        let entry = self
                            .main
                            .instance
                            .get_typed_func::<(), ()>(&mut *store, "_start")?;
                        entry.call(store, ())
                    }
                }
            })();
            let unwound = result.is_ok() && unwinding(&mut self.main.store);
            let next = finish(&shared, &mut self.main.store, 0, result);
            let (true, Next::Rewind(records)) = (unwound, next) else {
                break None;
            };
            match shared.gate.snapshot(&shared) {
                Ok((snap, timing, CheckpointKind::Continue)) => {
                    if let Err(e) = on_checkpoint(&snap, timing) {
                        break Some(RunError::Sink(e));
                    }
                    if shared.control.killed() {
                        break None;
                    }
                    let prefix = borrowed_bytes(&snap, shared.module.initial_image());
                    shared.gate.resume(&shared, prefix);
                    rewind = Some(records);
                }
                Ok((snap, timing, _)) => {
                    join(&shared);
                    return Ok(Outcome::Stopped(Box::new(snap), timing));
                }
                // The program ended meanwhile (a trap while unwinding): its
                // reason is the one to give.
                Err(_) if shared.ending.get().is_some() => break None,
                Err(e) => break Some(e.into()),
            }
        };
        // Whatever happened, the other threads end now.
        shared.control.kill();
        join(&shared);
        if let Some(e) = failed {
            return Err(e);
        }
        match shared.ending.get() {
            Some(Ending::Exit(code)) => Ok(Outcome::Exited(*code)),
            Some(Ending::Trap(why)) => Err(RunError::Trap(why.clone().into())),
            None => Err(RunError::Killed),
        }
    }
}

/// A cell that is dropped without running to its end (a restore that
/// failed half-way, a caller that never called `run`) ends its threads.
impl Drop for ThreadedCell {
    fn drop(&mut self) {
        self.shared.control.kill();
        join(&self.shared);
    }
}

/// Wait for every thread but the first.
fn join(shared: &Shared) {
    let children = std::mem::take(&mut *shared.children.lock().unwrap_or_else(|e| e.into_inner()));
    for c in children {
        let _ = c.join();
    }
}

/// The bytes at the start of memory that the threads' unwinds borrowed,
/// as the snapshot holds them: a rewind puts them back.
fn borrowed_bytes(snap: &Snapshot, initial: &roam_snapshot::InitialImage) -> Vec<u8> {
    let longest = std::iter::once(&snap.stack)
        .chain(snap.threads.iter().map(|t| &t.stack))
        .map(|s| s.data.len())
        .max()
        .unwrap_or(0);
    let len = (HEADER as usize + longest).min(snap.memory.byte_len() as usize);
    let mut out = vec![0u8; len];
    crate::capture::restore_range(&mut out, &snap.memory, initial, 0, len);
    out
}
