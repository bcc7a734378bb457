//! The control API of kept checkpoints (see [`crate::kept`]):
//!
//! - on the owner, `POST /v1/cells/{id}/keep {holder, holder_name}`:
//!   checkpoint and continue, send the snapshot to the holder, deduplicated;
//! - on the holder, `POST /v1/kept/{cell}/missing`, `PUT /v1/kept/{cell}`
//!   and `GET /v1/kept/{cell}`;
//! - on any node, `POST /v1/cells/restore`: run a cell from a kept
//!   checkpoint, under the same id, as its owner at the given generation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use roam_runtime::{Cell, CellOptions};
use roam_wire::CellSpec;

use crate::api::{make_preopens, parse_hash, register_and_spawn, running_handle, AppError};
use crate::cell::PAUSE_TIMEOUT;
use crate::kept::{self, Holder, Manifest};
use crate::log::CellLog;
use crate::node::{unix_ms, NodeInner};
use crate::types::*;

type N = State<Arc<NodeInner>>;

fn bad(msg: impl Into<String>) -> AppError {
    AppError(StatusCode::BAD_REQUEST, msg.into())
}
fn internal(msg: impl std::fmt::Display) -> AppError {
    AppError(StatusCode::INTERNAL_SERVER_ERROR, msg.to_string())
}
fn kept_err(e: kept::KeptError) -> AppError {
    match e {
        kept::KeptError::Io { .. } => internal(e),
        _ => bad(e.to_string()),
    }
}

/// Largest body of a kept checkpoint: the largest cell memory, plus room
/// for its state and manifest.
pub(crate) fn body_limit(n: &NodeInner) -> usize {
    usize::try_from(n.cfg.limits.max_cell_memory.saturating_add(256 << 20)).unwrap_or(usize::MAX)
}

/// `POST /v1/cells/{id}/keep`.
pub(crate) async fn keep(
    State(n): N,
    Path(id): Path<String>,
    Json(req): Json<KeepRequest>,
) -> Result<Json<KeepResponse>, AppError> {
    roam_wire::ident::check_node_name(&req.holder_name).map_err(|e| bad(e.to_string()))?;
    if req.holder_name == n.cfg.name {
        return Err(bad(format!(
            "node {} owns cell {id}: a kept checkpoint must be held by another node",
            n.cfg.name
        )));
    }
    let h = running_handle(&n, &id)?;
    let generation = n.cells().get(&id).and_then(|e| e.spec.generation);
    let cp = tokio::time::timeout(PAUSE_TIMEOUT, h.checkpoint())
        .await
        .map_err(|_| internal("the cell did not reach a migration point in time"))?
        .map_err(|_| internal("the cell ended before the checkpoint"))?
        .map_err(internal)?;
    let taken_ms = unix_ms();
    let module = h.module.clone();
    let snap = cp.snapshot;
    let split = tokio::task::spawn_blocking(move || kept::split(&snap, module.initial_image()))
        .await
        .map_err(internal)?
        .map_err(internal)?;
    let hex = |h: &[u8; 32]| roam_runtime::cache::hex(h);
    let pages: Vec<(u32, String)> = split.pages.iter().map(|(i, h, _)| (*i, hex(h))).collect();
    let state_hash = hex(blake3::hash(&split.state).as_bytes());
    let holder = n
        .client(&req.holder)
        .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    let mut unique: Vec<String> = pages.iter().map(|(_, h)| h.clone()).collect();
    unique.sort();
    unique.dedup();
    let unreachable = |e: crate::client::ClientError| {
        AppError(
            StatusCode::BAD_GATEWAY,
            format!("holder {} ({}): {e}", req.holder_name, req.holder),
        )
    };
    let missing: std::collections::HashSet<String> = holder
        .kept_missing(&id, &unique)
        .await
        .map_err(unreachable)?
        .into_iter()
        .collect();
    // Each missing page once, in the order of the manifest.
    let mut sent = Vec::new();
    let mut send: Vec<&[u8]> = Vec::new();
    let mut queued = std::collections::HashSet::new();
    for ((_, hash), (_, _, page)) in pages.iter().zip(&split.pages) {
        if missing.contains(hash) && queued.insert(hash.clone()) {
            sent.push(hash.clone());
            send.push(page);
        }
    }
    let bytes = (split.state.len() + cp.log.len() + pages.len() * roam_snapshot::PAGE_SIZE) as u64;
    let mut m = Manifest {
        snapshot: String::new(),
        taken_ms,
        generation,
        memory_bytes: split.memory_bytes,
        state_len: split.state.len() as u64,
        state_hash,
        log_len: cp.log.len() as u64,
        log_hash: hex(blake3::hash(&cp.log).as_bytes()),
        log_dropped: cp.log_dropped,
        pages,
        sent,
    };
    m.snapshot = kept::digest(&m);
    let snapshot = m.snapshot.clone();
    let body = kept::frame(&m, &split.state, &cp.log, &send);
    let sent_bytes = body.len() as u64;
    holder.put_kept(&id, body).await.map_err(unreachable)?;
    tracing::info!(cell = %id, holder = %req.holder_name, snapshot = %snapshot,
        bytes, sent_bytes, "kept checkpoint sent");
    n.metrics.kept(&id, taken_ms, bytes, sent_bytes);
    Ok(Json(KeepResponse {
        snapshot,
        bytes,
        sent_bytes,
        taken_ms,
    }))
}

/// `POST /v1/kept/{cell}/missing`: `[hash]` → the hashes not held here.
pub(crate) async fn missing(
    State(n): N,
    Path(id): Path<String>,
    Json(hashes): Json<Vec<String>>,
) -> Result<Json<Vec<String>>, AppError> {
    let max_pages = n.cfg.limits.max_cell_memory / roam_snapshot::PAGE_SIZE as u64;
    if hashes.len() as u64 > max_pages {
        return Err(bad(format!(
            "{} hashes: more pages than this node's largest cell memory holds",
            hashes.len()
        )));
    }
    if let Some(h) = hashes
        .iter()
        .find(|h| roam_wire::ident::parse_module_hash(h).is_err())
    {
        return Err(bad(format!("`{h}` is not a BLAKE3 hash in hex")));
    }
    let max = n.cfg.limits.max_cell_memory;
    tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).missing(&id, &hashes, max))
        .await
        .map_err(internal)?
        .map(Json)
        .map_err(kept_err)
}

/// `PUT /v1/kept/{cell}`: store a kept checkpoint; `{snapshot, bytes}`.
pub(crate) async fn put(
    State(n): N,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<serde_json::Value>, AppError> {
    let max = n.cfg.limits.max_cell_memory;
    let m = tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).put(&id, &body, max))
        .await
        .map_err(internal)?
        .map_err(kept_err)?;
    tracing::info!(snapshot = %m.snapshot, pages = m.pages.len(), "kept checkpoint stored");
    Ok(Json(serde_json::json!({
        "snapshot": m.snapshot,
        "bytes": m.state_len + m.log_len + (m.pages.len() * roam_snapshot::PAGE_SIZE) as u64,
    })))
}

/// `GET /v1/kept/{cell}`: the stored kept checkpoint.
pub(crate) async fn get(State(n): N, Path(id): Path<String>) -> Result<Response, AppError> {
    let nid = id.clone();
    let b = tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).read(&nid))
        .await
        .map_err(internal)?
        .map_err(kept_err)?
        .ok_or_else(|| {
            AppError(
                StatusCode::NOT_FOUND,
                format!("no kept checkpoint of cell {id} on this node"),
            )
        })?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], b).into_response())
}

/// `POST /v1/cells/restore`.
pub(crate) async fn restore(
    State(n): N,
    Json(req): Json<RestoreRequest>,
) -> Result<Json<CellInfo>, AppError> {
    roam_wire::ident::check_cell_id(&req.id).map_err(|e| bad(e.to_string()))?;
    let hash = parse_hash(&req.module)?;
    roam_wire::ident::parse_module_hash(&req.snapshot).map_err(|_| {
        bad(format!(
            "snapshot `{}` is not a BLAKE3 hash in hex",
            req.snapshot
        ))
    })?;
    if req.args.is_empty() {
        return Err(bad("args must hold at least the program name"));
    }
    roam_wire::ident::check_guest_dirs(&req.dirs).map_err(|e| bad(e.to_string()))?;
    if let Some(service) = &req.service {
        roam_wire::ident::check_service_name(service).map_err(|e| bad(e.to_string()))?;
        n.check_can_serve(service).map_err(bad)?;
    }
    let running = n
        .cells()
        .get(&req.id)
        .is_some_and(|e| matches!(e.state, CellState::Running | CellState::Migrating));
    if running {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {} already runs on node {}", req.id, n.cfg.name),
        ));
    }
    let max = n.cfg.limits.max_cell_memory;
    // Its own copy if this node holds the checkpoint asked for, else the
    // holder's.
    let (nn, id) = (n.clone(), req.id.clone());
    let local = tokio::task::spawn_blocking(move || Holder::new(&nn.cfg.state_dir).read(&id))
        .await
        .map_err(internal)?
        .map_err(kept_err)?
        .filter(|b| kept::unframe(b, max).is_ok_and(|f| f.m.snapshot == req.snapshot));
    let file = match local {
        Some(b) => b,
        None => n
            .client(&req.holder)
            .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?
            .get_kept(&req.id)
            .await
            .map_err(|e| {
                AppError(
                    StatusCode::BAD_GATEWAY,
                    format!("cannot fetch the kept checkpoint from {}: {e}", req.holder),
                )
            })?,
    };
    let max_memory = req.max_memory.unwrap_or(n.cfg.limits.cell_memory);
    let admission = crate::limits::admit(&n, &req.id, max_memory)
        .map_err(|e| AppError(StatusCode::CONFLICT, e))?;
    let node = n.clone();
    let id = req.id.clone();
    tokio::task::spawn_blocking(move || {
        let f = kept::unframe(&file, max).map_err(kept_err)?;
        let m = &f.m;
        if m.snapshot != req.snapshot {
            return Err(bad(format!(
                "the holder has kept checkpoint {}, not {}",
                m.snapshot, req.snapshot
            )));
        }
        let module = node
            .rt
            .load_by_hash(&hash, None)
            .map_err(|e| AppError(StatusCode::NOT_FOUND, e.to_string()))?;
        let snap = kept::rebuild(&f, module.initial_image()).map_err(bad)?;
        let preopens = make_preopens(&node, &req.id, &req.dirs).map_err(internal)?;
        let opts = CellOptions {
            with_files: !req.dirs.is_empty(),
            max_memory,
            ..CellOptions::default()
        };
        let cell = Cell::restore(&node.rt, module, &snap, preopens, opts)
            .map_err(|e| bad(format!("cannot restore cell {}: {e}", req.id)))?;
        let spec = CellSpec {
            id: req.id.clone(),
            module_hash: hash,
            args: req.args,
            env: req.env,
            dirs: req.dirs,
            launched_unix_ms: unix_ms(),
            hops: 0,
            max_memory,
            service: req.service,
            generation: Some(req.generation),
        };
        tracing::info!(cell = %spec.id, snapshot = %m.snapshot, taken_ms = m.taken_ms,
            generation = req.generation, "restored from a kept checkpoint");
        // Its output before the checkpoint; what it wrote after, it writes
        // again.
        let log = Arc::new(CellLog::with_history(
            node.log_capacity(),
            f.log,
            m.log_dropped,
        ));
        let r = register_and_spawn(&node, spec, log, cell);
        drop(admission);
        r
    })
    .await
    .map_err(internal)??;
    let info = n.cells().get(&id).map(crate::api::info);
    info.map(Json)
        .ok_or_else(|| internal(format!("cell {id} vanished after its restore")))
}
