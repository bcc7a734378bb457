//! The operations on kept checkpoints (the format is in [`super::store`]):
//!
//! - on the owner, `POST /v1/cells/{id}/keep {holder, holder_name}`:
//!   checkpoint and continue, send the snapshot to the holder, deduplicated;
//! - on the holder, `POST /v1/kept/{cell}/missing`, `PUT /v1/kept/{cell}`
//!   and `GET /v1/kept/{cell}`;
//! - on any node, `POST /v1/cells/restore`: run a cell from a kept
//!   checkpoint, under the same id, as its owner at the given generation.

use std::sync::Arc;

use crate::cells::{self, Begin, Start};
use crate::error::NodeError;
use crate::ids::unix_ms;
use crate::log::CellLog;
use crate::state::NodeInner;
use crate::types::*;

use super::holder::Holder;
use super::store::{self as kept, KeptError, Manifest};

impl From<KeptError> for NodeError {
    fn from(e: KeptError) -> NodeError {
        match e {
            KeptError::Io { .. } => NodeError::internal(e),
            KeptError::Stale(_) => NodeError::Conflict(e.to_string()),
            KeptError::Unknown(_) => NodeError::NotFound(e.to_string()),
            _ => NodeError::bad(e),
        }
    }
}

/// `POST /v1/cells/{id}/keep`.
pub(crate) async fn keep(
    n: &NodeInner,
    id: &str,
    req: KeepRequest,
) -> Result<KeepResponse, NodeError> {
    roam_wire::ident::check_node_name(&req.holder_name).map_err(NodeError::bad)?;
    if req.holder_name == n.cfg.name {
        return Err(NodeError::bad(format!(
            "node {} owns cell {id}: a kept checkpoint must be held by another node",
            n.cfg.name
        )));
    }
    let h = cells::running_handle(n, id)?;
    let generation = n.cells().get(id).and_then(|e| e.spec.generation);
    let cp = cells::checkpoint_now(&h).await?;
    let taken_ms = unix_ms();
    let module = h.module.clone();
    let snap = cp.snapshot;
    let split = tokio::task::spawn_blocking(move || kept::split(&snap, module.initial_image()))
        .await?
        .map_err(NodeError::Internal)?;
    let hex = |h: &[u8; 32]| roam_runtime::cache::hex(h);
    let pages: Vec<(u32, String)> = split.pages.iter().map(|(i, h, _)| (*i, hex(h))).collect();
    let state_hash = hex(blake3::hash(&split.state).as_bytes());
    let holder = n
        .client(&req.holder)
        .map_err(|e| NodeError::Upstream(e.to_string()))?;
    let mut unique: Vec<String> = pages.iter().map(|(_, h)| h.clone()).collect();
    unique.sort();
    unique.dedup();
    let unreachable = |e: crate::client::ClientError| {
        NodeError::Upstream(format!("holder {} ({}): {e}", req.holder_name, req.holder))
    };
    let missing: std::collections::HashSet<String> = holder
        .kept_missing(id, &unique)
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
    holder.put_kept(id, body).await.map_err(unreachable)?;
    tracing::info!(cell = %id, holder = %req.holder_name, snapshot = %snapshot,
        bytes, sent_bytes, "kept checkpoint sent");
    n.metrics.kept(id, taken_ms, bytes, sent_bytes);
    Ok(KeepResponse {
        snapshot,
        bytes,
        sent_bytes,
        taken_ms,
    })
}

/// `POST /v1/kept/{cell}/missing`: `[hash]` → the hashes not held here.
pub(crate) async fn missing(
    n: Arc<NodeInner>,
    id: String,
    hashes: Vec<String>,
) -> Result<Vec<String>, NodeError> {
    let max_pages = n.cfg.limits.max_cell_memory / roam_snapshot::PAGE_SIZE as u64;
    if hashes.len() as u64 > max_pages {
        return Err(NodeError::bad(format!(
            "{} hashes: more pages than this node's largest cell memory holds",
            hashes.len()
        )));
    }
    if let Some(h) = hashes
        .iter()
        .find(|h| roam_wire::ident::parse_module_hash(h).is_err())
    {
        return Err(NodeError::bad(format!("`{h}` is not a BLAKE3 hash in hex")));
    }
    let max = n.cfg.limits.max_cell_memory;
    Ok(tokio::task::spawn_blocking(move || {
        Holder::new(&n.cfg.state_dir).missing(&id, &hashes, max)
    })
    .await??)
}

/// `PUT /v1/kept/{cell}`: store a kept checkpoint; `{snapshot, bytes}`.
pub(crate) async fn put(
    n: Arc<NodeInner>,
    id: String,
    body: bytes::Bytes,
) -> Result<serde_json::Value, NodeError> {
    let max = n.cfg.limits.max_cell_memory;
    let m = tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).put(&id, &body, max))
        .await??;
    tracing::info!(snapshot = %m.snapshot, pages = m.pages.len(), "kept checkpoint stored");
    Ok(serde_json::json!({
        "snapshot": m.snapshot,
        "bytes": m.state_len + m.log_len + (m.pages.len() * roam_snapshot::PAGE_SIZE) as u64,
    }))
}

/// `GET /v1/kept/{cell}[?snapshot=NAME]`: a stored kept checkpoint (by
/// name; without one, the committed one, else the newest).
pub(crate) async fn get(
    n: Arc<NodeInner>,
    id: String,
    snapshot: Option<String>,
) -> Result<Vec<u8>, NodeError> {
    if let Some(s) = &snapshot {
        roam_wire::ident::parse_module_hash(s)
            .map_err(|_| NodeError::bad(format!("snapshot `{s}` is not a BLAKE3 hash in hex")))?;
    }
    let (nid, ns) = (id.clone(), snapshot.clone());
    tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).read(&nid, ns.as_deref()))
        .await??
        .ok_or_else(|| {
            NodeError::NotFound(match snapshot {
                Some(s) => format!("no kept checkpoint {s} of cell {id} on this node"),
                None => format!("no kept checkpoint of cell {id} on this node"),
            })
        })
}

/// `POST /v1/kept/{cell}/commit {snapshot}`: the planner recorded this
/// version; older ones go.
pub(crate) async fn commit(
    n: Arc<NodeInner>,
    id: String,
    snapshot: String,
) -> Result<(), NodeError> {
    roam_wire::ident::parse_module_hash(&snapshot).map_err(|_| {
        NodeError::bad(format!("snapshot `{snapshot}` is not a BLAKE3 hash in hex"))
    })?;
    tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).commit(&id, &snapshot))
        .await??;
    Ok(())
}

/// `POST /v1/cells/restore`.
pub(crate) async fn restore(
    n: &Arc<NodeInner>,
    req: RestoreRequest,
) -> Result<CellInfo, NodeError> {
    roam_wire::ident::check_cell_id(&req.id).map_err(NodeError::bad)?;
    let module = cells::parse_hash(&req.module)?;
    roam_wire::ident::parse_module_hash(&req.snapshot).map_err(|_| {
        NodeError::bad(format!(
            "snapshot `{}` is not a BLAKE3 hash in hex",
            req.snapshot
        ))
    })?;
    cells::check(n, &req.args, &req.dirs, req.service.as_deref())?;
    let max = n.cfg.limits.max_cell_memory;
    // Its own copy if this node holds the checkpoint asked for, else the
    // holder's.
    let (nn, id, want) = (n.clone(), req.id.clone(), req.snapshot.clone());
    let local =
        tokio::task::spawn_blocking(move || Holder::new(&nn.cfg.state_dir).read(&id, Some(&want)))
            .await??;
    let file = match local {
        Some(b) => b,
        None => n
            .client(&req.holder)
            .map_err(|e| NodeError::Upstream(e.to_string()))?
            .get_kept(&req.id, &req.snapshot)
            .await
            .map_err(|e| match e {
                crate::client::ClientError::NotFound(_) => NodeError::NotFound(format!(
                    "the holder {} has no kept checkpoint {} of cell {}",
                    req.holder, req.snapshot, req.id
                )),
                e => NodeError::Upstream(format!(
                    "cannot fetch the kept checkpoint from {}: {e}",
                    req.holder
                )),
            })?,
    };
    let (want, generation, capacity) = (req.snapshot.clone(), req.generation, n.log_capacity());
    let rebuild: cells::Rebuild = Box::new(move |module| {
        let f = kept::unframe(&file, max)?;
        let m = &f.m;
        if m.snapshot != want {
            return Err(NodeError::bad(format!(
                "the holder has kept checkpoint {}, not {want}",
                m.snapshot
            )));
        }
        let snap = kept::rebuild(&f, module.initial_image()).map_err(NodeError::BadRequest)?;
        tracing::info!(snapshot = %m.snapshot, taken_ms = m.taken_ms, generation,
            "restoring from a kept checkpoint");
        // Its output before the checkpoint; what it wrote after, it writes
        // again.
        let log = CellLog::with_history(capacity, f.log, m.log_dropped);
        Ok((snap, log))
    });
    let id = req.id.clone();
    cells::start(
        n,
        Start {
            id: req.id,
            module,
            args: req.args,
            env: req.env,
            dirs: req.dirs,
            service: req.service,
            max_memory: req.max_memory,
            generation: Some(req.generation),
            begin: Begin::Restore(rebuild),
        },
    )
    .await?;
    cells::status(n, &id)
        .map_err(|_| NodeError::internal(format!("cell {id} vanished after its restore")))
}
