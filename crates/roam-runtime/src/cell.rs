//! A [`Cell`]: one running program, its store and its checkpoint loop.

use std::sync::Arc;

use roam_snapshot::{Snapshot, UnwoundStack};
use roam_wasi::{Preopen, WasiConfig, WasiCtx};
use wasmtime::{Global, Instance, Linker, Store, TypedFunc};

use crate::asyncify::{Asyncify, Buffer, HEADER, UNWINDING};
use crate::capture;
use crate::control::{CheckpointKind, CheckpointTiming, Control, Controller};
use crate::error::{boxed, CheckpointError, RestoreError, RunError, Source, StartError};
use crate::host::{self, Hooks, HostState};
use crate::module::LoadedModule;
use crate::runtime::Runtime;

/// Options of a cell.
#[derive(Debug, Clone)]
pub struct CellOptions {
    /// Embed the module in snapshots. Default false.
    pub embed_module: bool,
    /// Carry the sandbox directories' files in snapshots. Default false.
    pub with_files: bool,
    /// Checkpoint-and-stop at the Nth migration point reached (deterministic,
    /// for tests and reproduction; each point then calls the host). Default none.
    pub checkpoint_at_point: Option<u64>,
    /// Checkpoint-and-continue at every Nth migration point reached
    /// (deterministic stress test of unwind and rewind). Default none.
    pub checkpoint_every_points: Option<u64>,
    /// zstd level for snapshots written by the caller. Not used by the cell itself.
    pub compression_level: i32,
}

impl Default for CellOptions {
    fn default() -> Self {
        CellOptions {
            embed_module: false,
            with_files: false,
            checkpoint_at_point: None,
            checkpoint_every_points: None,
            compression_level: 3,
        }
    }
}

/// How a run ended.
#[derive(Debug)]
pub enum Outcome {
    /// The program exited with this status.
    Exited(i32),
    /// A checkpoint-and-stop was taken; the program is no longer running.
    Stopped(Box<Snapshot>, CheckpointTiming),
}

/// One running program.
pub struct Cell {
    store: Store<HostState>,
    module: Arc<LoadedModule>,
    start: TypedFunc<(), ()>,
    hooks: Hooks,
    control: Arc<Control>,
}

struct Parts {
    store: Store<HostState>,
    instance: Instance,
    start: TypedFunc<(), ()>,
    globals: Vec<(String, Global)>,
    asyncify: Asyncify,
    memory: wasmtime::Memory,
    flag: Global,
}

fn instantiate(rt: &Runtime, module: &LoadedModule, host: HostState) -> Result<Parts, Source> {
    let mut linker = Linker::new(rt.engine());
    host::add_to_linker(&mut linker).map_err(boxed)?;
    let mut store = Store::new(rt.engine(), host);
    host::arm_epoch(&mut store);
    let instance = linker
        .instantiate(&mut store, module.module())
        .map_err(boxed)?;
    let asyncify = Asyncify::new(&instance, &mut store)?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(boxed)?;
    let memory = instance
        .get_memory(&mut store, roam_prepare::MEMORY_EXPORT)
        .ok_or("no memory export")?;
    let flag = instance
        .get_global(&mut store, roam_prepare::FLAG_GLOBAL_EXPORT)
        .ok_or("no flag export")?;
    let globals = module
        .global_exports()
        .iter()
        .filter_map(|n| Some((n.clone(), instance.get_global(&mut store, n)?)))
        .collect();
    Ok(Parts {
        store,
        instance,
        start,
        globals,
        asyncify,
        memory,
        flag,
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
        let control = Control::new(rt.engine().clone());
        let ctx = WasiCtx::new(wasi, control.interrupt.clone())?;
        let host = HostState::new(
            ctx,
            control.clone(),
            opts.checkpoint_at_point,
            opts.checkpoint_every_points.filter(|&k| k > 0),
        );
        let mut p = instantiate(rt, &module, host).map_err(StartError::Instantiate)?;
        if opts.checkpoint_at_point.is_some() || opts.checkpoint_every_points.is_some() {
            p.flag
                .set(&mut p.store, wasmtime::Val::I32(1))
                .map_err(|e| StartError::Instantiate(boxed(e)))?;
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
        if snapshot.module.hash != *module.hash() {
            return Err(RestoreError::ModuleMismatch {
                expected: crate::cache::hex(&snapshot.module.hash),
                found: crate::cache::hex(module.hash()),
            });
        }
        if let Some(files) = &snapshot.files {
            crate::files::materialize(files, &preopens)?;
        }
        let control = Control::new(rt.engine().clone());
        let state = roam_wasi::OsState::decode(&snapshot.os_state)?;
        let ctx = WasiCtx::restore(state, preopens, control.interrupt.clone())?;
        let host = HostState::new(
            ctx,
            control.clone(),
            opts.checkpoint_at_point,
            opts.checkpoint_every_points.filter(|&k| k > 0),
        );
        let mut p = instantiate(rt, &module, host).map_err(RestoreError::Instantiate)?;
        let buffer = capture::restore_state(&mut p.store, p.memory, &p.globals, snapshot, &module)?;
        let mut cell = Cell::assemble(p, module, &opts, control);
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
            asyncify: p.asyncify,
            memory: p.memory,
            flag: p.flag,
            globals: p.globals.into(),
            module: module.clone(),
            embed_module: opts.embed_module,
            with_files: opts.with_files,
        };
        let mut store = p.store;
        store.data_mut().hooks = Some(hooks.clone());
        Cell {
            store,
            module,
            start: p.start,
            hooks,
            control,
        }
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
        loop {
            let result = self.start.call(&mut self.store, ());
            if let Err(e) = result {
                if let Some(exit) = e.downcast_ref::<roam_wasi::ProcExit>() {
                    return Ok(Outcome::Exited(exit.0));
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
            let state = self.hooks.asyncify.state(&mut self.store).map_err(engine)?;
            if state != UNWINDING {
                return Err(CheckpointError::Stack(format!(
                    "program returned in Asyncify state {state} during a checkpoint"
                ))
                .into());
            }
            self.hooks
                .asyncify
                .stop_unwind(&mut self.store)
                .map_err(engine)?;
            let mem = self.hooks.memory.data_mut(&mut self.store);
            let stack = u.buffer.data(mem).map_err(CheckpointError::Stack)?.to_vec();
            let (start, end) = (
                u.buffer.offset as usize,
                (u.buffer.offset + HEADER) as usize + stack.len(),
            );
            let image = u.captured.memory;
            capture::restore_range(mem, &image, self.module.initial_image(), start, end);
            self.control.take();
            let mut snapshot = match u.captured.rest {
                Ok(s) => s,
                Err(e) => {
                    // Nothing is lost: the program rewinds and goes on.
                    tracing::error!("checkpoint failed, the program continues: {e}");
                    self.store.data_mut().spare = image.into_stored_data();
                    self.begin_rewind(u.buffer, &stack)
                        .map_err(CheckpointError::Stack)?;
                    continue;
                }
            };
            snapshot.memory = image;
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
                CheckpointKind::Stop => return Ok(Outcome::Stopped(Box::new(snapshot), timing)),
                CheckpointKind::Continue => {
                    on_checkpoint(&snapshot, timing).map_err(RunError::Sink)?;
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
            .asyncify
            .start_rewind(&mut self.store, buffer)
            .map_err(|e| format!("asyncify_start_rewind failed: {e}"))?;
        self.store.data_mut().rewinding = Some((buffer, saved));
        Ok(())
    }
}
