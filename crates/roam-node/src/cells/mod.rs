//! The cells of a node: starting them, looking at them, stopping them.
//!
//! Why one module: a cell begins here in three ways (a launch, a restore
//! from a kept checkpoint, a migration's arrival) and each must pass the
//! same checks, take the same admission and enter the cell table the same
//! way, so that what the gateway, the planner and the fence see does not
//! depend on how the cell came. [`start`] is that one path; the migration
//! destination uses its [`register`] half, because its receiving thread
//! becomes the cell's thread.
//!
//! Everything here answers with a [`NodeError`]; only `http` knows status
//! codes.

use std::sync::Arc;

use roam_runtime::{CellOptions, LoadedModule};
use roam_snapshot::PAGE_SIZE;
use roam_wasi::Preopen;
use roam_wire::CellSpec;

use crate::cell::{self, CellEntry, CellHandle, KILL_WAIT, PAUSE_TIMEOUT};
use crate::error::NodeError;
use crate::ids::{new_id, unix_ms};
use crate::log::CellLog;
use crate::state::NodeInner;
use crate::types::*;

pub(crate) mod admit;
mod start;

pub(crate) use start::{check, start, Begin, FarPlan, Rebuild, Start};

/// What this node is, for `GET /v1/node`.
pub(crate) fn node_info(n: &NodeInner) -> NodeInfo {
    let running = n
        .cells()
        .values()
        .filter(|e| matches!(e.state, CellState::Running | CellState::Migrating))
        .count();
    NodeInfo {
        name: n.cfg.name.clone(),
        isa: roam_runtime::host_isa().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        migrate_addr: n
            .cfg
            .advertise_migrate
            .clone()
            .unwrap_or_else(|| n.migrate_addr.to_string()),
        userfaultfd: n.features().userfaultfd,
        cells_running: running,
        machine: crate::sysinfo::Machine::read(),
        cpu: Some(n.cpu.info()),
    }
}

/// Load (validate, prepare, compile, cache) an uploaded module.
pub(crate) async fn upload_module(
    n: Arc<NodeInner>,
    body: bytes::Bytes,
) -> Result<ModuleInfo, NodeError> {
    let module = tokio::task::spawn_blocking(move || n.rt.load_bytes(&body))
        .await?
        .map_err(|e| NodeError::bad(format!("module refused: {e}")))?;
    Ok(ModuleInfo {
        hash: roam_runtime::cache::hex(module.hash()),
        bytes: module.bytes().len() as u64,
    })
}

/// A module hash given in hex.
pub(crate) fn parse_hash(s: &str) -> Result<[u8; 32], NodeError> {
    roam_wire::ident::parse_module_hash(s).map_err(NodeError::bad)
}

/// A module this node has, by hash.
pub(crate) fn module(n: &NodeInner, hash: &[u8; 32]) -> Result<Arc<LoadedModule>, NodeError> {
    n.rt.load_by_hash(hash, None)
        .map_err(|e| NodeError::NotFound(e.to_string()))
}

/// Host directories for a cell's guest directories, created empty.
pub(crate) fn make_preopens(
    n: &NodeInner,
    id: &str,
    dirs: &[String],
) -> std::io::Result<Vec<Preopen>> {
    dirs.iter()
        .enumerate()
        .map(|(i, guest)| {
            let host = n.cell_dir(id).join("dirs").join(i.to_string());
            std::fs::create_dir_all(&host)?;
            Ok(Preopen {
                host,
                guest: guest.clone(),
            })
        })
        .collect()
}

/// The cell left this node: remove its sandbox directories. Its files live
/// on at the destination; left here, a file the program deleted there
/// would come back if the cell returned. Runs on a blocking thread of the
/// node's runtime.
pub(crate) fn forget_files(n: &NodeInner, id: &str) {
    let dirs = n.cell_dir(id).join("dirs");
    let id = id.to_string();
    let remove = move || match std::fs::remove_dir_all(&dirs) {
        Ok(()) => tracing::debug!(cell = %id, "removed the departed cell's sandbox"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(cell = %id, "cannot remove {}: {e}", dirs.display()),
    };
    tokio::task::spawn_blocking(remove);
}

/// Put a cell into the table with its handle, and route its service's
/// clients to it. The caller then runs it.
pub(crate) fn register(
    n: &Arc<NodeInner>,
    spec: CellSpec,
    log: Arc<CellLog>,
    cell: &mut cell::Program,
) -> Arc<CellHandle> {
    let handle = cell::handle_for(cell, log.clone(), n.cpu.clone(), &spec);
    n.cells().insert(
        spec.id.clone(),
        CellEntry {
            spec: spec.clone(),
            state: CellState::Running,
            log,
            handle: Some(handle.clone()),
            memory_lost: false,
            cpu_used: None,
        },
    );
    n.serve(&spec, handle.net.as_ref());
    handle
}

/// What to do when a cell's thread ends: record the state it ended in.
pub(crate) fn on_end(n: &Arc<NodeInner>, id: &str) -> cell::OnEnd {
    let node = n.clone();
    let id = id.to_string();
    Box::new(move |st| {
        if let Some(st) = st {
            node.set_state(&id, st);
        }
    })
}

/// The options of a cell with these guest directories and memory limit.
/// Its sandbox may hold, and its kept checkpoints carry, as many bytes of
/// files as an arriving cell may bring here.
pub(crate) fn options(n: &NodeInner, dirs: &[String], max_memory: u64) -> CellOptions {
    CellOptions {
        with_files: !dirs.is_empty(),
        files_limits: roam_runtime::files::FileTreeLimits {
            max_entries: usize::try_from(n.cfg.limits.max_file_entries).unwrap_or(usize::MAX),
            max_total_bytes: n.cfg.limits.max_files_bytes,
            ..roam_runtime::files::FileTreeLimits::DEFAULT
        },
        // What its sandbox may hold is what may travel with it.
        disk_quota: (!dirs.is_empty()).then_some(n.cfg.limits.max_files_bytes),
        max_memory,
        ..CellOptions::default()
    }
}

/// A launch's or restore's CPU settings as the wire carries them.
pub(crate) fn cpu_limits(r: CpuRequest) -> roam_wire::CpuLimits {
    roam_wire::CpuLimits {
        weight: r.weight,
        max_millicores: r.max_millicores,
    }
}

/// `POST /v1/cells`: launch a program.
pub(crate) async fn launch(
    n: &Arc<NodeInner>,
    req: LaunchRequest,
    far: Option<FarPlan>,
) -> Result<LaunchResponse, NodeError> {
    let id = match &req.id {
        Some(id) => {
            roam_wire::ident::check_cell_id(id).map_err(NodeError::bad)?;
            if n.cells().contains_key(id) {
                return Err(NodeError::Conflict(format!(
                    "a cell {id} already exists on this node: choose another id"
                )));
            }
            id.clone()
        }
        None => new_id("c-"),
    };
    let s = Start {
        id: id.clone(),
        module: parse_hash(&req.module)?,
        args: req.args,
        env: req.env,
        dirs: req.dirs,
        service: req.service,
        max_memory: req.max_memory,
        generation: req.generation,
        cpu: cpu_limits(req.cpu),
        begin: Begin::Fresh,
        far,
    };
    start(n, s).await?;
    Ok(LaunchResponse { id })
}

/// A cell's row in `roam cells`.
pub(crate) fn info(e: &CellEntry) -> CellInfo {
    CellInfo {
        id: e.spec.id.clone(),
        state: e.state.clone(),
        program: e.spec.args.first().cloned().unwrap_or_default(),
        module: roam_runtime::cache::hex(&e.spec.module_hash),
        memory_bytes: e.handle.as_ref().map_or(0, |h| h.memory.len() as u64),
        max_memory: e.spec.max_memory,
        log_dropped_bytes: e.log.dropped(),
        uptime_ms: unix_ms().saturating_sub(e.spec.launched_unix_ms),
        hops: e.spec.hops,
        service: e.spec.service.clone(),
        cpu: e
            .handle
            .as_ref()
            .filter(|h| !h.has_ended())
            .and_then(|h| h.cpu.get().cloned()),
        far: e
            .handle
            .as_ref()
            .filter(|h| !h.has_ended())
            .and_then(|h| h.far.get())
            .map(|(far, server)| far_info(far, server)),
        memory_lost: e.memory_lost,
        cpu_ms: e
            .handle
            .as_ref()
            .and_then(|h| h.cpu_time())
            .or(e.cpu_used)
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        threads: e
            .handle
            .as_ref()
            .filter(|h| !h.has_ended())
            .map(|h| h.controller.threads())
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
    }
}

fn far_info(far: &roam_runtime::FarMemory, server: &str) -> roam_api::types::FarInfo {
    let (s, page) = (far.stats(), PAGE_SIZE as u64);
    roam_api::types::FarInfo {
        server: server.to_string(),
        local_memory: far.options().local_pages as u64 * page,
        resident_bytes: s.resident * page,
        far_bytes: s.far * page,
        far_faults: s.far_faults,
        bytes_in: s.pages_in * page,
        bytes_out: s.pages_out * page,
    }
}

/// Every cell on this node, by id.
pub(crate) fn list(n: &NodeInner) -> Vec<CellInfo> {
    let mut v: Vec<CellInfo> = n.cells().values().map(info).collect();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

/// One cell. A cell that is arriving by a migration is not in the table
/// yet, but it is not absent either: the planner restores a cell whose
/// owner says it does not know it, so such a cell answers `409`.
pub(crate) fn status(n: &NodeInner, id: &str) -> Result<CellInfo, NodeError> {
    if let Some(e) = n.cells().get(id) {
        return Ok(info(e));
    }
    let arriving = n
        .inbound
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .values()
        .any(|i| i.brings(id));
    if arriving {
        return Err(NodeError::Conflict(format!(
            "cell {id} is arriving on this node by a migration"
        )));
    }
    Err(not_found(id))
}

fn not_found(id: &str) -> NodeError {
    NodeError::NotFound(format!("no cell {id} on this node"))
}

/// A cell's output, or where it moved.
pub(crate) enum Logs {
    /// The output kept here, with a note of what was dropped first.
    Here(Vec<u8>),
    /// The cell moved: its logs are at this URL.
    Moved(String),
}

/// `GET /v1/cells/{id}/logs`.
pub(crate) fn logs(n: &NodeInner, id: &str) -> Result<Logs, NodeError> {
    let cells = n.cells();
    let e = cells.get(id).ok_or_else(|| not_found(id))?;
    if let CellState::Moved { to } = &e.state {
        let url = if to.contains("://") {
            format!("{}/v1/cells/{id}/logs", to.trim_end_matches('/'))
        } else {
            format!(
                "{}://{to}/v1/cells/{id}/logs",
                crate::secure::scheme(&n.auth)
            )
        };
        return Ok(Logs::Moved(url));
    }
    let mut body = Vec::new();
    let dropped = e.log.dropped();
    if dropped > 0 {
        body.extend_from_slice(
            format!(
                "[roam: {} of earlier output dropped]\n",
                crate::size::human(dropped)
            )
            .as_bytes(),
        );
    }
    body.extend(e.log.contents());
    Ok(Logs::Here(body))
}

/// The handle of a cell that runs here now.
pub(crate) fn running_handle(n: &NodeInner, id: &str) -> Result<Arc<CellHandle>, NodeError> {
    let cells = n.cells();
    let e = cells.get(id).ok_or_else(|| not_found(id))?;
    match (&e.state, &e.handle) {
        (CellState::Running, Some(h)) => Ok(h.clone()),
        (state, _) => Err(NodeError::Conflict(format!(
            "cell {id} is not running here (state: {state:?})"
        ))),
    }
}

/// `POST /v1/cells/{id}/kill`.
pub(crate) async fn kill(n: &NodeInner, id: &str) -> Result<CellInfo, NodeError> {
    let h = running_handle(n, id)?;
    if n.fence.release(id) {
        // Held by the fence: already paused.
        n.set_state(id, CellState::Killed);
        return status(n, id);
    }
    // A kill keeps nothing of the program, so it needs no checkpoint: end
    // it at its next loop header, function entry or point, whatever it runs.
    n.set_state(id, CellState::Migrating);
    if !h.kill(KILL_WAIT).await {
        tracing::warn!(
            cell = %id,
            "the killed cell's thread is still in a host call; it runs no more wasm code"
        );
    }
    n.set_state(id, CellState::Killed);
    status(n, id)
}

/// A checkpoint-and-continue of a running cell.
pub(crate) async fn checkpoint_now(h: &CellHandle) -> Result<cell::Checkpoint, NodeError> {
    tokio::time::timeout(PAUSE_TIMEOUT, h.checkpoint())
        .await
        .map_err(|_| NodeError::internal("the cell did not reach a migration point in time"))?
        .map_err(|_| NodeError::internal("the cell ended before the checkpoint"))?
        .map_err(NodeError::Internal)
}

/// `POST /v1/cells/{id}/checkpoint`: a snapshot file in the cell's
/// directory; its path and size.
pub(crate) async fn checkpoint(
    n: &NodeInner,
    id: &str,
) -> Result<(std::path::PathBuf, u64), NodeError> {
    let h = running_handle(n, id)?;
    let snap = checkpoint_now(&h).await?.snapshot;
    let dir = n.cell_dir(id).join("checkpoints");
    let path = dir.join(format!("{}.roamsnap", unix_ms()));
    let bytes = tokio::task::spawn_blocking({
        let path = path.clone();
        move || -> Result<u64, String> {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            snap.write_file(&path).map_err(|e| e.to_string())
        }
    })
    .await?
    .map_err(NodeError::Internal)?;
    Ok((path, bytes))
}
