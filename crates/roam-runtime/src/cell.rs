//! A [`Cell`]: one running program, its store and its checkpoint loop.

use std::sync::Arc;

use roam_snapshot::Snapshot;
use roam_wasi::{Preopen, WasiConfig, WasiCtx};
use wasmtime::{Global, Instance, Linker, Store, TypedFunc};

use crate::asyncify::{Asyncify, Buffer, UNWINDING};
use crate::capture::{self, CaptureOptions};
use crate::control::{CheckpointKind, Control, Controller};
use crate::error::{boxed, CheckpointError, RestoreError, RunError, Source, StartError};
use crate::host::{self, Hooks, HostState};
use crate::module::LoadedModule;
use crate::runtime::Runtime;

/// Options of a cell.
#[derive(Debug, Clone)]
pub struct CellOptions {
    /// Bytes reserved for the unwound stack. Default [`crate::DEFAULT_UNWIND_BUFFER`].
    pub unwind_buffer: u32,
    /// Embed the module in snapshots. Default false.
    pub embed_module: bool,
    /// Carry the sandbox directories' files in snapshots. Default false.
    pub with_files: bool,
    /// Checkpoint-and-stop at the Nth migration point reached (deterministic,
    /// for tests and reproduction; each point then calls the host). Default none.
    pub checkpoint_at_point: Option<u64>,
    /// zstd level for snapshots written by the caller. Not used by the cell itself.
    pub compression_level: i32,
}

impl Default for CellOptions {
    fn default() -> Self {
        CellOptions {
            unwind_buffer: crate::DEFAULT_UNWIND_BUFFER,
            embed_module: false,
            with_files: false,
            checkpoint_at_point: None,
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
    Stopped(Box<Snapshot>),
}

/// One running program.
pub struct Cell {
    store: Store<HostState>,
    module: Arc<LoadedModule>,
    start: TypedFunc<(), ()>,
    globals: Vec<(String, Global)>,
    hooks: Hooks,
    opts: CellOptions,
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

fn instantiate(
    rt: &Runtime,
    module: &LoadedModule,
    host: HostState,
) -> Result<Parts, Source> {
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
        let host = HostState::new(ctx, control.clone(), opts.checkpoint_at_point);
        let mut p = instantiate(rt, &module, host).map_err(StartError::Instantiate)?;
        let pages = u64::from(opts.unwind_buffer).div_ceil(roam_snapshot::WASM_PAGE_SIZE);
        let reserve = StartError::Reserve {
            bytes: u64::from(opts.unwind_buffer),
        };
        let old = p.memory.grow(&mut p.store, pages).map_err(|_| reserve)?;
        let offset = u32::try_from(old * roam_snapshot::WASM_PAGE_SIZE).map_err(|_| {
            StartError::Reserve {
                bytes: u64::from(opts.unwind_buffer),
            }
        })?;
        let buffer = Buffer {
            offset,
            capacity: (pages * roam_snapshot::WASM_PAGE_SIZE) as u32,
        };
        if opts.checkpoint_at_point.is_some() {
            p.flag
                .set(&mut p.store, wasmtime::Val::I32(1))
                .map_err(|e| StartError::Instantiate(boxed(e)))?;
        }
        Ok(Cell::assemble(p, module, buffer, opts, control))
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
        let host = HostState::new(ctx, control.clone(), opts.checkpoint_at_point);
        let mut p = instantiate(rt, &module, host).map_err(RestoreError::Instantiate)?;
        let buffer = capture::restore_state(&mut p.store, p.memory, &p.globals, snapshot, &module)?;
        let mut cell = Cell::assemble(p, module, buffer, opts, control);
        cell.begin_rewind(&snapshot.stack.data)
            .map_err(RestoreError::Stack)?;
        Ok(cell)
    }

    fn assemble(
        p: Parts,
        module: Arc<LoadedModule>,
        buffer: Buffer,
        opts: CellOptions,
        control: Arc<Control>,
    ) -> Cell {
        let _ = p.instance;
        let hooks = Hooks {
            asyncify: p.asyncify,
            memory: p.memory,
            flag: p.flag,
            buffer,
        };
        let mut store = p.store;
        store.data_mut().hooks = Some(hooks.clone());
        Cell {
            store,
            module,
            start: p.start,
            globals: p.globals,
            hooks,
            opts,
            control,
        }
    }

    /// A handle to request checkpoints from other threads.
    pub fn controller(&self) -> Controller {
        Controller(self.control.clone())
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
        on_checkpoint: &mut dyn FnMut(&Snapshot) -> Result<(), Source>,
    ) -> Result<Outcome, RunError> {
        loop {
            let result = self.start.call(&mut self.store, ());
            if let Err(e) = result {
                if let Some(exit) = e.downcast_ref::<roam_wasi::ProcExit>() {
                    return Ok(Outcome::Exited(exit.0));
                }
                if self.store.data().unwinding.is_some() {
                    return Err(RunError::UnwindOverflow {
                        capacity: self.hooks.buffer.capacity,
                    });
                }
                return Err(RunError::Trap(boxed(e)));
            }
            let Some(req) = self.store.data_mut().unwinding.take() else {
                return Ok(Outcome::Exited(0));
            };
            let state = self
                .hooks
                .asyncify
                .state(&mut self.store)
                .map_err(|e| CheckpointError::Engine(boxed(e)))?;
            if state != UNWINDING {
                return Err(CheckpointError::Stack(format!(
                    "program returned in Asyncify state {state} during a checkpoint"
                ))
                .into());
            }
            let (snapshot, stack) = self.capture(req.trigger.as_str())?;
            self.control.take();
            match req.kind {
                CheckpointKind::Stop => return Ok(Outcome::Stopped(Box::new(snapshot))),
                CheckpointKind::Continue => {
                    on_checkpoint(&snapshot).map_err(RunError::Sink)?;
                    self.begin_rewind(&stack).map_err(CheckpointError::Stack)?;
                }
            }
        }
    }

    fn capture(&mut self, reason: &str) -> Result<(Snapshot, Vec<u8>), CheckpointError> {
        let opts = CaptureOptions {
            embed_module: self.opts.embed_module,
            with_files: self.opts.with_files,
            reason,
        };
        capture::capture(
            &mut self.store,
            &self.hooks,
            &self.globals,
            &self.module,
            &opts,
        )
    }

    fn begin_rewind(&mut self, stack: &[u8]) -> Result<(), String> {
        let b = self.hooks.buffer;
        let used = b.load(self.hooks.memory.data_mut(&mut self.store), stack)?;
        self.hooks
            .asyncify
            .start_rewind(&mut self.store, b)
            .map_err(|e| format!("asyncify_start_rewind failed: {e}"))?;
        self.store.data_mut().rewinding = Some(used);
        Ok(())
    }
}
