//! The one path by which a launched or restored cell starts: checks,
//! admission, the module, the sandbox, the cell table, the thread.
//!
//! A migration's arrival shares its checks and admission (`admit`) and its
//! entry into the table ([`super::register`]), but not the thread: the
//! receiving thread that built the instance goes on to run it.

use std::sync::Arc;

use roam_runtime::{Cell, LoadedModule, ThreadedCell};
use roam_snapshot::{Snapshot, PAGE_SIZE};
use roam_wasi::WasiConfig;
use roam_wire::CellSpec;

use super::{make_preopens, module, on_end, options, register};
use crate::cell::{self, Program};
use crate::error::NodeError;
use crate::ids::unix_ms;
use crate::log::CellLog;
use crate::state::NodeInner;
use crate::types::CellState;

/// Rebuilds a cell's snapshot and its log history once its module is
/// loaded (on a blocking thread).
pub(crate) type Rebuild =
    Box<dyn FnOnce(&LoadedModule) -> Result<(Snapshot, CellLog), NodeError> + Send>;

/// How the program begins.
pub(crate) enum Begin {
    /// From its entry point.
    Fresh,
    /// From a snapshot (a kept checkpoint), under the same id.
    Restore(Rebuild),
}

/// A cell to start here.
pub(crate) struct Start {
    pub id: String,
    pub module: [u8; 32],
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub dirs: Vec<String>,
    pub service: Option<String>,
    /// Its memory limit; `None`: the node's default.
    pub max_memory: Option<u64>,
    /// The planner's generation, for a cell the planner placed.
    pub generation: Option<u64>,
    /// Its CPU weight and cap; unset: the node's defaults.
    pub cpu: roam_wire::CpuLimits,
    pub begin: Begin,
    /// Far memory: the budget and the store of its far pages.
    pub far: Option<FarPlan>,
}

/// A cell's far memory, its store already open (`migrate::far`).
pub(crate) struct FarPlan {
    pub opts: roam_runtime::FarOptions,
    pub store: Box<dyn roam_runtime::PageStore>,
    /// The memory server's name.
    pub server: String,
    /// What the cell carries where it moves.
    pub spec: roam_wire::FarSpec,
}

/// Check what a start asks for before anything is taken: the arguments,
/// the guest directories and the service.
pub(crate) fn check(
    n: &NodeInner,
    args: &[String],
    dirs: &[String],
    service: Option<&str>,
) -> Result<(), NodeError> {
    if args.is_empty() {
        return Err(NodeError::bad("args must hold at least the program name"));
    }
    roam_wire::ident::check_guest_dirs(dirs).map_err(NodeError::bad)?;
    if let Some(service) = service {
        roam_wire::ident::check_service_name(service).map_err(NodeError::bad)?;
        n.check_can_serve(service).map_err(NodeError::BadRequest)?;
    }
    Ok(())
}

/// Start a cell: checked, admitted, built, entered in the table and run on
/// its own thread.
pub(crate) async fn start(n: &Arc<NodeInner>, s: Start) -> Result<(), NodeError> {
    roam_wire::ident::check_cell_id(&s.id).map_err(NodeError::bad)?;
    check(n, &s.args, &s.dirs, s.service.as_deref())?;
    s.cpu.check().map_err(NodeError::bad)?;
    let running = n
        .cells()
        .get(&s.id)
        .is_some_and(|e| matches!(e.state, CellState::Running | CellState::Migrating));
    if running {
        return Err(NodeError::Conflict(format!(
            "cell {} already runs on node {}",
            s.id, n.cfg.name
        )));
    }
    let max_memory = s.max_memory.unwrap_or(n.cfg.limits.cell_memory);
    // A far-memory cell takes its local budget here, not its limit: the
    // rest lives on the memory server.
    let here = match &s.far {
        Some(f) => max_memory.min((f.opts.local_pages * PAGE_SIZE) as u64),
        None => max_memory,
    };
    let admission = super::admit::admit(n, &format!("cell {}", s.id), here).map_err(|e| {
        if max_memory > n.cfg.limits.max_cell_memory {
            NodeError::BadRequest(e)
        } else {
            NodeError::Conflict(e)
        }
    })?;
    let node = n.clone();
    tokio::task::spawn_blocking(move || {
        let r = build_and_run(&node, s, max_memory);
        drop(admission);
        r
    })
    .await?
}

/// The blocking half of [`start`].
fn build_and_run(n: &Arc<NodeInner>, mut s: Start, max_memory: u64) -> Result<(), NodeError> {
    let module = module(n, &s.module)?;
    let threaded = roam_runtime::is_threaded(&module);
    if threaded && s.far.is_some() {
        // Far memory pages a memory that roam maps; a shared memory is
        // wasmtime's.
        return Err(NodeError::bad(format!(
            "cell {}: a threaded program cannot run with far memory",
            s.id
        )));
    }
    let (mut far_spec, mut far_mem) = (None, None);
    let preopens = make_preopens(n, &s.id, &s.dirs).map_err(NodeError::internal)?;
    let opts = options(n, &s.dirs, max_memory);
    let fresh = |preopens| WasiConfig {
        args: s.args.clone(),
        env: s.env.clone(),
        preopens,
        listeners: s.service.iter().cloned().collect(),
    };
    let (cell, log) = match s.begin {
        Begin::Fresh if threaded => {
            let cell = ThreadedCell::start(&n.rt, module, fresh(preopens), opts)
                .map_err(NodeError::bad)?;
            tracing::info!(cell = %s.id, program = %s.args[0], "launched (threaded)");
            (Program::Threads(cell), CellLog::new(n.log_capacity()))
        }
        Begin::Restore(rebuild) if threaded => {
            let (snap, log) = rebuild(&module)?;
            tracing::info!(cell = %s.id, threads = 1 + snap.threads.len(), "threaded cell restored");
            let cell = ThreadedCell::restore(&n.rt, module, &snap, preopens, opts)
                .map_err(|e| NodeError::bad(format!("cannot restore cell {}: {e}", s.id)))?;
            (Program::Threads(cell), log)
        }
        Begin::Fresh => {
            let cell = Cell::start(&n.rt, module, fresh(preopens), opts).map_err(NodeError::bad)?;
            tracing::info!(cell = %s.id, program = %s.args[0], max_memory, "launched");
            (Program::One(cell), CellLog::new(n.log_capacity()))
        }
        Begin::Restore(rebuild) => {
            let (snap, log) = rebuild(&module)?;
            let restored = match s.far.take() {
                // Its memory goes to the memory server as it is written,
                // so it never all sits here.
                Some(plan) => {
                    Cell::restore_far(&n.rt, module, &snap, preopens, opts, plan.opts, plan.store)
                        .map(|(cell, far)| {
                            far_spec = Some(plan.spec);
                            far_mem = Some((far, plan.server));
                            cell
                        })
                }
                None => Cell::restore(&n.rt, module, &snap, preopens, opts),
            };
            let cell = restored
                .map_err(|e| NodeError::bad(format!("cannot restore cell {}: {e}", s.id)))?;
            (Program::One(cell), log)
        }
    };
    let mut cell = cell;
    if let (Some(plan), Program::One(one)) = (s.far.take(), &mut cell) {
        let far = one
            .attach_far(plan.opts, plan.store)
            .map_err(|e| NodeError::bad(format!("cell {}: {e}", s.id)))?;
        far_spec = Some(plan.spec);
        far_mem = Some((far, plan.server));
    }
    if let Some((far, server)) = &far_mem {
        let local = far.options().local_pages * PAGE_SIZE;
        tracing::info!(cell = %s.id, local, %server, "far memory");
    }
    let spec = CellSpec {
        id: s.id,
        module_hash: s.module,
        args: s.args,
        env: s.env,
        dirs: s.dirs,
        launched_unix_ms: unix_ms(),
        hops: 0,
        max_memory,
        service: s.service,
        generation: s.generation,
        cpu: s.cpu,
        far: far_spec.map(Box::new),
    };
    spawn(n, spec, Arc::new(log), cell, far_mem)
}

/// Put a cell into the table and start its thread.
fn spawn(
    n: &Arc<NodeInner>,
    spec: CellSpec,
    log: Arc<CellLog>,
    mut cell: Program,
    far: Option<(roam_runtime::FarMemory, String)>,
) -> Result<(), NodeError> {
    let id = spec.id.clone();
    let handle = register(n, spec, log, &mut cell);
    if let Some(far) = far {
        let _ = handle.far.set(far);
    }
    cell::spawn(&id, cell, handle, on_end(n, &id)).map_err(|e| {
        n.set_state(
            &id,
            CellState::Failed {
                error: e.to_string(),
            },
        );
        NodeError::internal(e)
    })
}
