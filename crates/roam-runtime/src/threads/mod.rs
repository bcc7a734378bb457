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
//! snapshot over, and rewinds every thread. A pause (a migration between
//! nodes) parks and unwinds them too, but copies no memory: the memory
//! stays live ([`ThreadedCell::live_memory`]) and the threads wait for the
//! decision, to rewind or to end. A migration's destination fills a fresh
//! shared memory page by page ([`ThreadedIncoming`]) before the threads
//! are made. What this cell does not do yet: far memory and post-copy
//! (both page a memory that wasmtime maps, not roam).

mod arrive;
mod gate;
mod host;
mod life;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use roam_snapshot::{MemoryImage, ModuleRef, Origin, Snapshot, UnwoundStack};
use roam_wasi::{WasiConfig, WasiCtx};
use wasmtime::{ExternType, InstancePre, MemoryType, SharedMemory, Store};

use crate::asyncify::HEADER;
use crate::control::{CheckpointKind, CheckpointTiming, Control, Controller};
use crate::error::{boxed, CheckpointError, RunError, Source, StartError};
use crate::memory::Creator;
use crate::module::LoadedModule;
use crate::runtime::Runtime;
use crate::{CellOptions, LiveMemory, Outcome};
pub use arrive::ThreadedIncoming;
use gate::Gate;
use host::ThreadState;
use life::{finish, instantiate, start_rewind, unwinding, Next, Thread};

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
    /// Caps on the sandbox files a checkpoint carries; `None`: it carries
    /// none.
    files: Option<crate::files::FileTreeLimits>,
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

    /// Memory (unless `with_memory` is false: a pause), the OS layer and
    /// the sandbox files, read while every thread is parked.
    fn read_state(&self, with_memory: bool) -> Result<Snapshot, CheckpointError> {
        let memory = match with_memory {
            // SAFETY: every thread is parked (the last one to park calls this).
            true => MemoryImage::capture(unsafe { self.bytes() }, self.module.initial_image()),
            false => MemoryImage::empty(),
        };
        let wasi = self.wasi.lock().unwrap_or_else(|e| e.into_inner());
        let os_state = wasi.save()?.encode();
        // A pause carries no files: a migration streams them itself.
        let files = match &self.files {
            Some(limits) if with_memory => Some(crate::files::capture(wasi.preopens(), limits)?),
            _ => None,
        };
        drop(wasi);
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
            files,
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

/// The shared memory a threaded module imports: its import name and type.
fn shared_import(module: &LoadedModule) -> Result<((String, String), MemoryType), Source> {
    module
        .module()
        .imports()
        .find_map(|i| match i.ty() {
            ExternType::Memory(m) if m.is_shared() => {
                Some(((i.module().to_string(), i.name().to_string()), m))
            }
            _ => None,
        })
        .ok_or_else(|| "the module imports no shared memory".into())
}

/// A fresh shared memory for `module`, of at least `min_bytes`, that
/// cannot grow past `max_bytes`.
///
/// wasmtime grows a shared memory without the store's limiter, so the
/// limit is the memory's own maximum: an import accepts a memory whose
/// maximum is below the one the module declares, and `memory.grow` past
/// it returns -1 as the limiter would have.
fn new_memory(
    module: &LoadedModule,
    min_bytes: u64,
    max_bytes: u64,
) -> Result<SharedMemory, Source> {
    let (_, ty) = shared_import(module)?;
    let page = roam_snapshot::WASM_PAGE_SIZE;
    let declared = ty.maximum().unwrap_or(ty.minimum());
    let limit = declared.min(max_bytes / page);
    if limit < ty.minimum() {
        return Err(format!(
            "the program's memory starts at {} bytes, over the cell's limit of {max_bytes}",
            ty.minimum().saturating_mul(page)
        )
        .into());
    }
    let (min, max) = (
        u32::try_from(ty.minimum()).map_err(|_| "a 64-bit memory cannot be shared here")?,
        u32::try_from(limit).map_err(|_| "a 64-bit memory cannot be shared here")?,
    );
    let memory =
        SharedMemory::new(module.module().engine(), MemoryType::shared(min, max)).map_err(boxed)?;
    let have = memory.data_size() as u64;
    if min_bytes > have {
        let pages = (min_bytes - have).div_ceil(page);
        memory.grow(pages).map_err(boxed)?;
    }
    Ok(memory)
}

impl ThreadedCell {
    fn new(
        memories: Arc<Creator>,
        module: Arc<LoadedModule>,
        ctx: WasiCtx,
        control: Arc<Control>,
        memory: SharedMemory,
        opts: &CellOptions,
    ) -> Result<ThreadedCell, Source> {
        let engine = module.module().engine().clone();
        let (name, _) = shared_import(&module)?;
        let shared = Arc::new(Shared {
            module,
            memories,
            pre: OnceLock::new(),
            memory: memory.clone(),
            wasi: Mutex::new(ctx),
            control,
            gate: Gate::new(),
            next_tid: AtomicU32::new(1),
            ending: OnceLock::new(),
            children: Mutex::new(Vec::new()),
            embed_module: opts.embed_module,
            files: opts.with_files.then_some(opts.files_limits),
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

    /// Instantiate a threaded `module` for a fresh run. Of `opts`, the
    /// module's embedding, the files a checkpoint carries, the disk quota
    /// and the memory limit apply; the per-point triggers are not offered.
    pub fn start(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        wasi: WasiConfig,
        opts: CellOptions,
    ) -> Result<ThreadedCell, StartError> {
        let control = Control::new(module.epoch_engine());
        let mut ctx = WasiCtx::new(wasi, control.interrupt.clone())?;
        if let Some(q) = opts.disk_quota {
            ctx.set_disk_quota(q);
        }
        let memory = new_memory(&module, 0, opts.max_memory).map_err(StartError::Instantiate)?;
        ThreadedCell::new(rt.memory_creator(), module, ctx, control, memory, &opts)
            .map_err(StartError::Instantiate)
    }

    /// A handle to the program's memory, readable from any thread while
    /// the program runs (see [`LiveMemory`]); it keeps the memory alive
    /// after the cell ends.
    pub fn live_memory(&self) -> LiveMemory {
        live_memory_of(&self.shared.memory)
    }

    /// The module the program runs.
    pub fn module(&self) -> &Arc<LoadedModule> {
        &self.shared.module
    }

    /// Send what the program writes to stdout and stderr to `sink`.
    pub fn set_output(&mut self, sink: Arc<dyn roam_wasi::OutputSink>) {
        self.shared
            .wasi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_output(sink);
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
    /// continue is handed to `on_checkpoint` while all threads are stopped
    /// (it may take the snapshot's memory); they go on together when it
    /// returns. A pause resumes at once: see [`ThreadedCell::run_with`].
    pub fn run(
        self,
        on_checkpoint: &mut dyn FnMut(&mut Snapshot, CheckpointTiming) -> Result<(), Source>,
    ) -> Result<Outcome, RunError> {
        self.run_with(on_checkpoint, &mut |_, _| AfterPause::Resume)
    }

    /// [`ThreadedCell::run`], and every pause is handed to `on_pause`
    /// while all threads are stopped: a snapshot without memory (read it
    /// with [`ThreadedCell::live_memory`], which no thread writes until
    /// `on_pause` returns). [`AfterPause::Release`] ends the threads and
    /// returns [`Outcome::Paused`]: the program goes on elsewhere.
    pub fn run_with(
        mut self,
        on_checkpoint: &mut dyn FnMut(&mut Snapshot, CheckpointTiming) -> Result<(), Source>,
        on_pause: &mut dyn FnMut(&Snapshot, CheckpointTiming) -> AfterPause,
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
                Ok((mut snap, timing, CheckpointKind::Continue, _)) => {
                    // Read before the sink may take the memory.
                    let prefix = borrowed_bytes(&snap, shared.module.initial_image());
                    if let Err(e) = on_checkpoint(&mut snap, timing) {
                        break Some(RunError::Sink(e));
                    }
                    if shared.control.killed() {
                        break None;
                    }
                    shared.gate.resume(&shared, prefix);
                    rewind = Some(records);
                }
                Ok((snap, timing, CheckpointKind::Pause, prefix)) => {
                    match on_pause(&snap, timing) {
                        AfterPause::Resume if !shared.control.killed() => {
                            shared.gate.resume(&shared, prefix);
                            rewind = Some(records);
                        }
                        AfterPause::Resume => break None,
                        AfterPause::Release => {
                            shared.control.kill();
                            join(&shared);
                            return Ok(Outcome::Paused(Box::new(snap), timing));
                        }
                    }
                }
                Ok((snap, timing, _, _)) => {
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

/// What a paused threaded program does next ([`ThreadedCell::run_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPause {
    /// Every thread rewinds and goes on here.
    Resume,
    /// Every thread ends: the program goes on elsewhere.
    Release,
}

/// A handle to a shared memory as roam reads other cells' memories.
fn live_memory_of(memory: &SharedMemory) -> LiveMemory {
    LiveMemory {
        map: Arc::new(crate::memory::Mapping::of_shared(memory.clone())),
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
