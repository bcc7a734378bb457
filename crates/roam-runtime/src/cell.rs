//! A [`Cell`]: one running program, its store and its checkpoint loop.

use std::sync::Arc;

use roam_snapshot::{Snapshot, UnwoundStack};
use roam_wasi::{CapturedOutput, Preopen, WasiConfig, WasiCtx};
use wasmtime::{Global, Instance, Linker, Store, TypedFunc};

use crate::asyncify::{Buffer, HEADER, UNWINDING};
use crate::capture::{self, Saved};
use crate::control::{CheckpointKind, CheckpointTiming, Control, Controller, Killed};
use crate::error::{boxed, CheckpointError, RestoreError, RunError, Source, StartError};
use crate::flag::FlagWord;
use crate::host::{self, Hooks, HostState};
use crate::incoming::Incoming;
use crate::limits::CellLimits;
use crate::memory::LiveMemory;
use crate::module::LoadedModule;
use crate::runtime::Runtime;
use crate::unwind::Unwinder;

/// Options of a cell.
#[derive(Debug, Clone)]
pub struct CellOptions {
    /// Embed the module in snapshots. Default false.
    pub embed_module: bool,
    /// Carry the sandbox directories' files in snapshots. Default false.
    pub with_files: bool,
    /// Caps on the files a snapshot carries (with `with_files`): past
    /// them a checkpoint is refused before the files are read. Default
    /// [`crate::files::FileTreeLimits::DEFAULT`].
    pub files_limits: crate::files::FileTreeLimits,
    /// Most bytes the sandbox directories' files may add up to; past it a
    /// write that would grow a file fails with `EDQUOT` (see
    /// `roam_wasi::WasiCtx::set_disk_quota`). Default none.
    pub disk_quota: Option<u64>,
    /// Checkpoint-and-stop at the Nth migration point reached (deterministic,
    /// for tests and reproduction; each point then calls the host). Default none.
    pub checkpoint_at_point: Option<u64>,
    /// Checkpoint-and-continue at every Nth migration point reached
    /// (deterministic stress test of unwind and rewind). Default none.
    pub checkpoint_every_points: Option<u64>,
    /// zstd level for snapshots written by the caller. Not used by the cell itself.
    pub compression_level: i32,
    /// Most bytes of linear memory the program may have. A `memory.grow`
    /// past it returns -1 (`malloc` returns NULL; the program decides), and
    /// a snapshot or an incoming migration with a larger memory is refused
    /// before anything is allocated. Default [`crate::DEFAULT_MAX_MEMORY`]
    /// (4 GiB: no limit beyond wasm32's).
    pub max_memory: u64,
}

impl Default for CellOptions {
    fn default() -> Self {
        CellOptions {
            embed_module: false,
            with_files: false,
            files_limits: crate::files::FileTreeLimits::DEFAULT,
            disk_quota: None,
            checkpoint_at_point: None,
            checkpoint_every_points: None,
            compression_level: 3,
            max_memory: crate::limits::DEFAULT_MAX_MEMORY,
        }
    }
}

/// What [`Cell::run_taking`] hands its sink at a checkpoint-and-continue.
pub enum Taken<'a> {
    /// The snapshot. The sink may take its memory (leaving
    /// [`roam_snapshot::MemoryImage::empty`]): then the cell does not keep
    /// it as the next capture's buffer, and no copy of the memory is made.
    Snapshot(&'a mut Snapshot),
    /// The capture failed; the program goes on.
    Failed(&'a CheckpointError),
}

/// How a run ended.
#[derive(Debug)]
pub enum Outcome {
    /// The program exited with this status.
    Exited(i32),
    /// A checkpoint-and-stop was taken; the program is no longer running
    /// (unless [`Cell::resume`] is called).
    Stopped(Box<Snapshot>, CheckpointTiming),
    /// A [`CheckpointKind::Pause`] was taken. The snapshot is complete except
    /// for its memory image, which is **empty**: the memory stays live in the
    /// cell, intact, and is read with [`Cell::live_memory`] or
    /// [`Cell::memory`]. [`Cell::resume`] continues the program; otherwise
    /// it is no longer running.
    Paused(Box<Snapshot>, CheckpointTiming),
}

/// One running program.
pub struct Cell {
    store: Store<HostState>,
    module: Arc<LoadedModule>,
    start: TypedFunc<(), ()>,
    hooks: Hooks,
    control: Arc<Control>,
    live: LiveMemory,
    /// Stopped or paused at a checkpoint: `_start` must not be called again
    /// until [`Cell::resume`] prepares the rewind.
    stopped: bool,
    /// Post-copy: keeps the fault handler running while the cell lives.
    pub(crate) lazy: Option<crate::lazy::Owner>,
    /// Far memory: keeps its fault handler running while the cell lives.
    far: Option<crate::far::Owner>,
}

pub(crate) struct Parts {
    pub(crate) store: Store<HostState>,
    instance: Instance,
    start: TypedFunc<(), ()>,
    globals: Vec<(String, Global)>,
    unwinder: Unwinder,
    pub(crate) memory: wasmtime::Memory,
    pub(crate) live: LiveMemory,
}

pub(crate) fn instantiate(
    rt: &Runtime,
    module: &LoadedModule,
    host: HostState,
) -> Result<Parts, Source> {
    // The module's own engine: with or without epoch checks.
    let engine = module.module().engine();
    let mut linker = Linker::new(engine);
    host::add_to_linker(&mut linker).map_err(boxed)?;
    let mut store = Store::new(engine, host);
    store.limiter(|h| &mut h.limiter);
    if module.epoch_checks() {
        host::arm_stop(&mut store);
    }
    if crate::threads::is_threaded(module) {
        return Err(
            "this program uses threads (a shared memory): run it with `roam run`, which gives \
             it a threaded cell; nodes do not run threaded programs yet"
                .into(),
        );
    }
    let instance = linker
        .instantiate(&mut store, module.module())
        .map_err(boxed)?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(boxed)?;
    let memory = instance
        .get_memory(&mut store, roam_prepare::MEMORY_EXPORT)
        .ok_or("no memory export")?;
    let unwinder = Unwinder::new(
        &instance,
        &mut store,
        module.captures_by_exceptions(),
        memory,
    )?;
    let flag_memory = instance
        .get_memory(&mut store, crate::flag::FLAG_MEMORY_EXPORT)
        .ok_or("no flag memory export")?;
    let flag = rt
        .memories()
        .find(flag_memory.data_ptr(&store))
        .and_then(FlagWord::new)
        .ok_or("the flag memory was not mapped by roam's memory creator")?;
    store.data().control.attach_flag(flag);
    let globals = module
        .global_exports()
        .iter()
        .filter_map(|n| Some((n.clone(), instance.get_global(&mut store, n)?)))
        .collect();
    let map = rt
        .memories()
        .find(memory.data_ptr(&store))
        .ok_or("the linear memory was not mapped by roam's memory creator")?;
    Ok(Parts {
        live: LiveMemory { map },
        store,
        instance,
        start,
        globals,
        unwinder,
        memory,
    })
}

impl Cell {
    /// Instantiate `module` for a fresh run.
    pub fn start(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        wasi: WasiConfig,
        opts: CellOptions,
    ) -> Result<Cell, StartError> {
        let control = Control::new(module.epoch_engine());
        let mut ctx = WasiCtx::new(wasi, control.interrupt.clone())?;
        if let Some(q) = opts.disk_quota {
            ctx.set_disk_quota(q);
        }
        let host = HostState::new(
            ctx,
            control.clone(),
            opts.checkpoint_at_point,
            opts.checkpoint_every_points.filter(|&k| k > 0),
            CellLimits::of(&opts),
        );
        let p = instantiate(rt, &module, host).map_err(StartError::Instantiate)?;
        if opts.checkpoint_at_point.is_some() || opts.checkpoint_every_points.is_some() {
            control.set_flag(true);
        }
        Ok(Cell::assemble(p, module, &opts, control))
    }

    /// Rebuild a cell from a snapshot, ready to rewind into the point where
    /// it was taken. `preopens` map the snapshot's guest directories to
    /// directories on this machine.
    pub fn restore(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        opts: CellOptions,
    ) -> Result<Cell, RestoreError> {
        check_module(snapshot, &module)?;
        CellLimits::of(&opts).check_memory(snapshot.memory.byte_len())?;
        let mut incoming = Cell::incoming(rt, module, opts)?;
        incoming.write_image(snapshot)?;
        Cell::finish_incoming(incoming, snapshot, preopens)
    }

    /// [`Cell::restore`] into far memory: at most `far.local_pages` of the
    /// memory stay resident, from the first page written on, and the rest
    /// goes to `store` (see [`crate::FarMemory`]).
    pub fn restore_far(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        opts: CellOptions,
        far: crate::FarOptions,
        store: Box<dyn crate::PageStore>,
    ) -> Result<(Cell, crate::FarMemory), RestoreError> {
        check_module(snapshot, &module)?;
        CellLimits::of(&opts).check_memory(snapshot.memory.byte_len())?;
        let mut incoming = Cell::incoming(rt, module, opts)?;
        let paged = incoming
            .attach_far(far, store)
            .map_err(|e| RestoreError::Memory(e.to_string()))?;
        incoming.write_image(snapshot)?;
        Ok((Cell::finish_incoming(incoming, snapshot, preopens)?, paged))
    }

    /// Instantiate `module` to receive a migrating program: its memory
    /// holds the initial image (data segments) and can be grown and written
    /// page by page with the returned [`Incoming`], then
    /// [`Incoming::finish`] (or [`Incoming::finish_lazy`]) turns it into a
    /// cell ready to rewind.
    pub fn incoming(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        opts: CellOptions,
    ) -> Result<Incoming, RestoreError> {
        let control = Control::new(module.epoch_engine());
        // The OS layer comes with the snapshot; until then an empty one.
        let ctx = WasiCtx::new(WasiConfig::default(), control.interrupt.clone())
            .map_err(|e| RestoreError::Instantiate(Box::new(e)))?;
        let host = HostState::new(
            ctx,
            control.clone(),
            opts.checkpoint_at_point,
            opts.checkpoint_every_points.filter(|&k| k > 0),
            CellLimits::of(&opts),
        );
        let parts = instantiate(rt, &module, host).map_err(RestoreError::Instantiate)?;
        Ok(Incoming {
            parts,
            module,
            opts,
            control,
            far: None,
        })
    }

    /// Finish an [`Incoming`]: OS layer, files, globals, and the rewind.
    pub(crate) fn finish_incoming(
        incoming: Incoming,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
    ) -> Result<Cell, RestoreError> {
        let Incoming {
            mut parts,
            module,
            opts,
            control,
            far,
        } = incoming;
        check_module(snapshot, &module)?;
        if let Some(files) = &snapshot.files {
            crate::files::materialize(files, &preopens)?;
        }
        let state = roam_wasi::OsState::decode(&snapshot.os_state)?;
        let mut wasi = WasiCtx::restore(state, preopens, control.interrupt.clone())?;
        if let Some(q) = opts.disk_quota {
            wasi.set_disk_quota(q);
        }
        parts.store.data_mut().wasi = wasi;
        let have = parts.memory.data_size(&parts.store) as u64;
        let want = snapshot.memory.byte_len();
        if want != 0 && want != have {
            return Err(RestoreError::Memory(format!(
                "the snapshot's memory is {want} bytes, the receiving memory {have}"
            )));
        }
        let buffer =
            capture::restore_state(&mut parts.store, parts.memory, &parts.globals, snapshot)?;
        let mut cell = Cell::assemble(parts, module, &opts, control);
        cell.far = far;
        cell.begin_rewind(buffer, &snapshot.stack.data)
            .map_err(RestoreError::Stack)?;
        Ok(cell)
    }

    fn assemble(
        p: Parts,
        module: Arc<LoadedModule>,
        opts: &CellOptions,
        control: Arc<Control>,
    ) -> Cell {
        let _ = p.instance;
        let hooks = Hooks {
            unwinder: p.unwinder,
            memory: p.memory,
            globals: p.globals.into(),
            module: module.clone(),
            embed_module: opts.embed_module,
            with_files: opts.with_files,
            files_limits: opts.files_limits,
        };
        let mut store = p.store;
        store.data_mut().hooks = Some(hooks.clone());
        Cell {
            store,
            module,
            start: p.start,
            hooks,
            control,
            live: p.live,
            stopped: false,
            lazy: None,
            far: None,
        }
    }

    /// A handle to this cell's linear memory, usable from other threads
    /// while the program runs (see [`LiveMemory`]).
    pub fn live_memory(&self) -> LiveMemory {
        self.live.clone()
    }

    /// Keep at most `opts.local_pages` of this cell's memory resident and
    /// the rest in `store` (see [`crate::FarMemory`]). Call before the
    /// program runs, once; pages over the budget leave at once. Not with
    /// post-copy memory still arriving, nor with dirty tracking (both use
    /// the same kernel mechanism on the same pages).
    pub fn attach_far(
        &mut self,
        opts: crate::FarOptions,
        store: Box<dyn crate::PageStore>,
    ) -> Result<crate::FarMemory, crate::FarError> {
        if self.lazy.is_some() {
            return Err(crate::FarError::Setup(
                "the memory is already paged by roam (far or post-copy)".into(),
            ));
        }
        let lost = self.store.data().lost.clone();
        crate::far::attach_into(
            &mut self.far,
            self.live.clone(),
            opts,
            store,
            lost,
            self.control.clone(),
        )
    }

    /// The linear memory, while the program is not running (e.g. after
    /// [`Outcome::Paused`]).
    pub fn memory(&self) -> &[u8] {
        self.hooks.memory.data(&self.store)
    }

    /// Collect the program's stdout and stderr in memory from now on
    /// instead of writing them to this process's streams.
    pub fn capture_output(&mut self) -> CapturedOutput {
        self.store.data_mut().wasi.capture_output()
    }

    /// Continue a program that stopped with [`Outcome::Stopped`] or
    /// [`Outcome::Paused`] in this same cell: the next [`Cell::run`] rewinds
    /// into the checkpoint from `snapshot`'s stack, with the memory as it is
    /// in the cell. This keeps a program running on the source when a
    /// migration fails. `snapshot` must be the one this cell returned.
    pub fn resume(&mut self, snapshot: &Snapshot) -> Result<(), RestoreError> {
        if !self.stopped {
            return Err(RestoreError::NotStopped);
        }
        check_module(snapshot, &self.module)?;
        let s = &snapshot.stack;
        let len = self.hooks.memory.data_size(&self.store) as u64;
        let end = u64::from(s.buffer_offset) + u64::from(s.capacity);
        if end > len || s.capacity < HEADER {
            return Err(RestoreError::Stack(format!(
                "buffer [{:#x}, {end:#x}) lies outside the {len}-byte memory",
                s.buffer_offset
            )));
        }
        let buffer = Buffer {
            offset: s.buffer_offset,
            capacity: s.capacity,
        };
        self.begin_rewind(buffer, &s.data)
            .map_err(RestoreError::Stack)?;
        self.stopped = false;
        Ok(())
    }

    /// A handle to request checkpoints from other threads.
    pub fn controller(&self) -> Controller {
        Controller(self.control.clone())
    }

    /// Migration points reached so far while counting for
    /// [`CellOptions::checkpoint_at_point`].
    pub fn points_reached(&self) -> u64 {
        self.store.data().points_seen
    }

    /// Send the program's stdout and stderr to `sink` instead of this
    /// process's own streams.
    pub fn set_output(&mut self, sink: Arc<dyn roam_wasi::OutputSink>) {
        self.store.data_mut().wasi.set_output(sink);
    }

    /// The hub a network backend uses to serve this cell's listeners and
    /// connections (`None` without listeners). For a restored cell it holds
    /// the restored connections; the backend calls `resume_points` (behind a
    /// gateway) or `reset_all` (standalone) before running the cell.
    pub fn net(&self) -> Option<Arc<roam_wasi::net::NetHub>> {
        self.store.data().wasi.net()
    }

    /// The module this cell runs.
    pub fn module(&self) -> &Arc<LoadedModule> {
        &self.module
    }

    /// Run until the program exits or a checkpoint-and-stop is taken. Every
    /// checkpoint-and-continue is handed to `on_checkpoint` while the program
    /// is paused; the program resumes when it returns.
    pub fn run(
        &mut self,
        on_checkpoint: &mut dyn FnMut(&Snapshot, CheckpointTiming) -> Result<(), Source>,
    ) -> Result<Outcome, RunError> {
        self.run_taking(&mut |taken, t| match taken {
            Taken::Snapshot(s) => on_checkpoint(s, t),
            Taken::Failed(_) => Ok(()),
        })
    }

    /// [`Cell::run`], with a sink that also hears of a checkpoint-and-
    /// continue that failed (the program goes on), and may take a
    /// snapshot's memory instead of copying it: what it leaves in
    /// `snapshot.memory` is kept as the next capture's buffer.
    pub fn run_taking(
        &mut self,
        on_checkpoint: &mut dyn FnMut(Taken<'_>, CheckpointTiming) -> Result<(), Source>,
    ) -> Result<Outcome, RunError> {
        if self.stopped {
            return Err(RunError::Stopped);
        }
        loop {
            if self.control.killed() {
                // Killed before it ran, while paused, or during a
                // checkpoint-and-continue: it never runs again.
                self.stopped = true;
                return Err(RunError::Killed);
            }
            self.store.data_mut().checkpointing = false;
            // A rewind by exceptions enters the program's rewind copy.
            let entry = match (
                &self.store.data().rewinding,
                self.hooks.unwinder.rewind_entry(),
            ) {
                (Some(_), Some(rewind)) => rewind,
                _ => self.start.clone(),
            };
            let result = match entry.call(&mut self.store, ()) {
                // The unwind by exceptions ends here, under `_start`.
                Err(e)
                    if self.store.data().unwinding.is_some()
                        && e.downcast_ref::<wasmtime::ThrownException>().is_some() =>
                {
                    self.store.take_pending_exception();
                    Ok(())
                }
                other => other,
            };
            if let Some(reason) = self.store.data().pages_lost() {
                self.stopped = true;
                return Err(RunError::PagesLost(reason));
            }
            if let Err(e) = result {
                if let Some(exit) = e.downcast_ref::<roam_wasi::ProcExit>() {
                    return Ok(Outcome::Exited(exit.0));
                }
                // Whatever ended it after a kill (the epoch callback, a
                // point, a woken blocking call) ended it because of the kill.
                if e.downcast_ref::<Killed>().is_some() || self.control.killed() {
                    self.stopped = true;
                    return Err(RunError::Killed);
                }
                if let Some(u) = &self.store.data().unwinding {
                    return Err(RunError::UnwindOverflow {
                        capacity: u.buffer.capacity,
                    });
                }
                return Err(RunError::Trap(boxed(e)));
            }
            let Some(u) = self.store.data_mut().unwinding.take() else {
                return Ok(Outcome::Exited(0));
            };
            let engine = |e| CheckpointError::Engine(boxed(e));
            let state = self.hooks.unwinder.state(&mut self.store).map_err(engine)?;
            if state != UNWINDING {
                return Err(CheckpointError::Stack(format!(
                    "program returned in capture state {state} during a checkpoint"
                ))
                .into());
            }
            self.hooks
                .unwinder
                .stop_unwind(&mut self.store, u.buffer)
                .map_err(engine)?;
            let mem = self.hooks.memory.data_mut(&mut self.store);
            let stack = u.buffer.data(mem).map_err(CheckpointError::Stack)?.to_vec();
            let (start, end) = (
                u.buffer.offset as usize,
                (u.buffer.offset + HEADER) as usize + stack.len(),
            );
            let saved = u.captured.memory;
            saved.put_back(mem, self.module.initial_image(), start, end);
            self.control.take();
            let mut snapshot = match u.captured.rest {
                Ok(s) => s,
                Err(e) => {
                    // Nothing is lost: the program rewinds and goes on.
                    tracing::error!("checkpoint failed, the program continues: {e}");
                    if u.req.kind == CheckpointKind::Continue {
                        let timing = CheckpointTiming {
                            response: u.point_at.saturating_duration_since(u.req.at),
                            capture: u.point_at.elapsed(),
                        };
                        on_checkpoint(Taken::Failed(&e), timing).map_err(RunError::Sink)?;
                    }
                    match saved {
                        Saved::Image(image) => {
                            self.store.data_mut().spare = image.into_stored_data()
                        }
                        Saved::Prefix(p) => self.store.data_mut().pause_spare = p,
                    }
                    self.begin_rewind(u.buffer, &stack)
                        .map_err(CheckpointError::Stack)?;
                    continue;
                }
            };
            let (image, prefix) = saved.into_image();
            snapshot.memory = image;
            self.store.data_mut().pause_spare = prefix;
            snapshot.stack = UnwoundStack {
                buffer_offset: u.buffer.offset,
                capacity: u.buffer.capacity,
                data: stack,
            };
            let timing = CheckpointTiming {
                response: u.point_at.saturating_duration_since(u.req.at),
                capture: u.point_at.elapsed(),
            };
            match u.req.kind {
                CheckpointKind::Stop => {
                    self.stopped = true;
                    return Ok(Outcome::Stopped(Box::new(snapshot), timing));
                }
                CheckpointKind::Pause => {
                    self.stopped = true;
                    return Ok(Outcome::Paused(Box::new(snapshot), timing));
                }
                CheckpointKind::Continue => {
                    on_checkpoint(Taken::Snapshot(&mut snapshot), timing)
                        .map_err(RunError::Sink)?;
                    self.begin_rewind(u.buffer, &snapshot.stack.data)
                        .map_err(CheckpointError::Stack)?;
                    self.store.data_mut().spare = snapshot.memory.into_stored_data();
                }
            }
        }
    }

    fn begin_rewind(&mut self, buffer: Buffer, stack: &[u8]) -> Result<(), String> {
        let saved = buffer.load(self.hooks.memory.data_mut(&mut self.store), stack)?;
        self.hooks
            .unwinder
            .start_rewind(&mut self.store, buffer)
            .map_err(|e| format!("starting the rewind failed: {e}"))?;
        self.store.data_mut().rewinding = Some((buffer, saved));
        Ok(())
    }
}

pub(crate) fn check_module(snapshot: &Snapshot, module: &LoadedModule) -> Result<(), RestoreError> {
    if snapshot.module.hash != *module.hash() {
        return Err(RestoreError::ModuleMismatch {
            expected: crate::cache::hex(&snapshot.module.hash),
            found: crate::cache::hex(module.hash()),
        });
    }
    Ok(())
}
