//! The operations on kept checkpoints (the format is in [`super::store`]):
//!
//! - on the owner, `POST /v1/cells/{id}/keep {holder, holder_name}`:
//!   checkpoint and continue, send the snapshot to the holder, deduplicated;
//! - on the holder, `POST /v1/kept/{cell}/missing`, `PUT /v1/kept/{cell}`
//!   and `GET /v1/kept/{cell}`, each for the node the planner granted it
//!   (`POST /v1/kept/{cell}/grant`, [`crate::grants`]);
//! - on any node, `POST /v1/cells/restore`: run a cell from a kept
//!   checkpoint, under the same id, as its owner at the given generation.

use std::sync::Arc;

use crate::cells::{self, Begin, Start};
use crate::error::NodeError;
use crate::ids::unix_ms;
use crate::log::CellLog;
use crate::state::NodeInner;
use crate::types::*;

use super::file;
use super::holder::Holder;
use super::store::{self as kept, KeptError, Manifest, PageHash};
use crate::grants::Access;

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
    // The checkpoint is one more copy of the cell's memory; admission
    // keeps room for one at a time (`cells::admit`).
    let _copy = n.copies.acquire().await.map_err(NodeError::internal)?;
    let cp = cells::checkpoint_now(&h).await?;
    let taken_ms = unix_ms();
    let module = h.module.clone();
    let snap = Arc::new(cp.snapshot);
    let (s, m) = (snap.clone(), module.clone());
    let split = tokio::task::spawn_blocking(move || kept::split(&s, m.initial_image()))
        .await?
        .map_err(NodeError::Internal)?;
    let hex = |h: &[u8; 32]| roam_runtime::cache::hex(h);
    let pages = split.pages;
    let state_hash = hex(blake3::hash(&split.state).as_bytes());
    let holder = n
        .client(&req.holder)
        .map_err(|e| NodeError::Upstream(e.to_string()))?;
    let mut unique: Vec<PageHash> = pages.iter().map(|(_, h)| *h).collect();
    unique.sort();
    unique.dedup();
    let unreachable = |e: crate::client::ClientError| {
        NodeError::Upstream(format!("holder {} ({}): {e}", req.holder_name, req.holder))
    };
    let missing: std::collections::HashSet<PageHash> = holder
        .kept_missing(id, &unique)
        .await
        .map_err(unreachable)?
        .into_iter()
        .collect();
    // Each missing page once, in the order of the manifest.
    let mut sent = Vec::new();
    let mut send = Vec::new();
    let mut queued = std::collections::HashSet::new();
    for (i, hash) in &pages {
        if missing.contains(hash) && queued.insert(*hash) {
            sent.push(*hash);
            send.push(*i);
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
    // The body is streamed: its head, then the pages read from the
    // snapshot a chunk at a time as the holder takes them.
    let head = file::head_bytes(&m, &split.state, &cp.log);
    let sent_bytes = (head.len() + send.len() * roam_snapshot::PAGE_SIZE) as u64;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(Ok(head.into()))
        .await
        .map_err(|_| NodeError::internal("the body's channel closed"))?;
    let producer = tokio::task::spawn_blocking(move || {
        let r = kept::send_pages(&snap, module.initial_image(), &send, &tx);
        if let Err(e) = &r {
            let _ = tx.blocking_send(Err(std::io::Error::other(e.clone())));
        }
        r
    });
    let put = holder.put_kept(id, rx).await;
    let produced = producer.await?;
    put.map_err(unreachable)?;
    produced.map_err(NodeError::Internal)?;
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

/// `POST /v1/kept/{cell}/grant`.
pub(crate) fn grant(n: &NodeInner, id: &str, g: KeptGrant) -> Result<(), NodeError> {
    roam_wire::ident::check_node_name(&g.node).map_err(NodeError::bad)?;
    match (g.access, &g.snapshot) {
        (Access::Store, Some(_)) => {
            return Err(NodeError::bad(
                "a grant to store names no snapshot: the owner makes the next one",
            ))
        }
        (_, Some(s)) => check_snapshot(s)?,
        _ => {}
    }
    n.grants
        .grant(id, &g.node, g.access, g.snapshot.as_deref())?;
    tracing::info!(cell = %id, node = %g.node, access = ?g.access,
        snapshot = g.snapshot.as_deref().unwrap_or("any"), "kept checkpoint access granted");
    Ok(())
}

fn check_snapshot(s: &str) -> Result<(), NodeError> {
    roam_wire::ident::parse_module_hash(s)
        .map(drop)
        .map_err(|_| NodeError::bad(format!("snapshot `{s}` is not a BLAKE3 hash in hex")))
}

/// `POST /v1/kept/{cell}/missing`: `[hash]` → the hashes not held here.
/// `from` is the calling node (`None` without TLS).
pub(crate) async fn missing(
    n: Arc<NodeInner>,
    id: String,
    from: Option<&str>,
    hashes: Vec<PageHash>,
) -> Result<Vec<PageHash>, NodeError> {
    // What a holder has tells about a cell's memory: only its owner asks.
    n.grants.check(&id, from, Access::Store, None)?;
    let max_pages = n.cfg.limits.max_cell_memory / roam_snapshot::PAGE_SIZE as u64;
    if hashes.len() as u64 > max_pages {
        return Err(NodeError::bad(format!(
            "{} hashes: more pages than this node's largest cell memory holds",
            hashes.len()
        )));
    }
    let max = n.cfg.limits.max_cell_memory;
    Ok(tokio::task::spawn_blocking(move || {
        let r = Holder::new(&n.cfg.state_dir).missing(&id, &hashes, max);
        drop(hashes);
        super::give_back_memory();
        r
    })
    .await??)
}

/// Largest body of a kept checkpoint: the largest cell memory, plus room
/// for its state and manifest.
pub(crate) fn body_limit(n: &NodeInner) -> u64 {
    n.cfg.limits.max_cell_memory.saturating_add(256 << 20)
}

/// `PUT /v1/kept/{cell}`: store a kept checkpoint; `{snapshot, bytes}`.
/// The body goes to a file as it arrives (at most [`body_limit`] bytes),
/// and is checked and stored from there. `from` is the calling node
/// (`None` without TLS): the cell's owner, granted by the planner.
pub(crate) async fn put<E: std::fmt::Display>(
    n: Arc<NodeInner>,
    id: String,
    from: Option<&str>,
    mut body: impl futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
) -> Result<serde_json::Value, NodeError> {
    use futures_util::StreamExt;
    use tokio::io::AsyncWriteExt;
    n.grants.check(&id, from, Access::Store, None)?;
    let _upload = n.uploads.acquire().await.map_err(NodeError::internal)?;
    let holder = Holder::new(&n.cfg.state_dir);
    let tmp = tokio::task::spawn_blocking(move || holder.temp()).await??;
    let mut out = tokio::io::BufWriter::new(tokio::fs::File::from_std(
        tmp.file.try_clone().map_err(NodeError::internal)?,
    ));
    let limit = body_limit(&n);
    let mut written = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| NodeError::bad(format!("the kept checkpoint broke off: {e}")))?;
        written = written.saturating_add(chunk.len() as u64);
        if written > limit {
            return Err(NodeError::TooLarge(format!(
                "the kept checkpoint is over this node's limit of {} \
                 (its largest cell memory and 256 MiB)",
                crate::size::human(limit)
            )));
        }
        out.write_all(&chunk).await.map_err(NodeError::internal)?;
    }
    out.flush().await.map_err(NodeError::internal)?;
    drop(out);
    let (max, dir) = (n.cfg.limits.max_cell_memory, n.cfg.state_dir.clone());
    let m = tokio::task::spawn_blocking(move || {
        let r = Holder::new(&dir).put(&id, &tmp.file, max);
        super::give_back_memory();
        r
    })
    .await??;
    tracing::info!(snapshot = %m.snapshot, pages = m.pages.len(), "kept checkpoint stored");
    Ok(serde_json::json!({
        "snapshot": m.snapshot,
        "bytes": m.state_len + m.log_len + (m.pages.len() * roam_snapshot::PAGE_SIZE) as u64,
    }))
}

/// `GET /v1/kept/{cell}[?snapshot=NAME]`: a stored kept checkpoint (by
/// name; without one, the committed one, else the newest), opened, to be
/// streamed.
/// `from` is the calling node (`None` without TLS): the node the planner
/// restores the cell on, granted that version.
pub(crate) async fn get(
    n: Arc<NodeInner>,
    id: String,
    from: Option<&str>,
    snapshot: Option<String>,
) -> Result<std::fs::File, NodeError> {
    if let Some(s) = &snapshot {
        check_snapshot(s)?;
    }
    n.grants
        .check(&id, from, Access::Read, snapshot.as_deref())?;
    let (nid, ns) = (id.clone(), snapshot.clone());
    tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).open(&nid, ns.as_deref()))
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
    check_snapshot(&snapshot)?;
    tokio::task::spawn_blocking(move || Holder::new(&n.cfg.state_dir).commit(&id, &snapshot))
        .await??;
    Ok(())
}

/// `POST /v1/cells/restore`. A far-memory cell comes with its page space
/// already opened on the memory server (`far`, made by the HTTP layer with
/// `migrate::far::plan`), so its memory is written there as it is rebuilt.
pub(crate) async fn restore(
    n: &Arc<NodeInner>,
    req: RestoreRequest,
    far: Option<cells::FarPlan>,
) -> Result<CellInfo, NodeError> {
    roam_wire::ident::check_cell_id(&req.id).map_err(NodeError::bad)?;
    let module = cells::parse_hash(&req.module)?;
    check_snapshot(&req.snapshot)?;
    cells::check(n, &req.args, &req.dirs, req.service.as_deref())?;
    cells::cpu_limits(req.cpu).check().map_err(NodeError::bad)?;
    let max = n.cfg.limits.max_cell_memory;
    // Rebuilding the memory is one more copy of it (see `keep`).
    let copy = n
        .copies
        .clone()
        .acquire_owned()
        .await
        .map_err(NodeError::internal)?;
    // Its own copy if this node holds the checkpoint asked for, else the
    // holder's, downloaded to a file as it arrives.
    let (nn, id, want) = (n.clone(), req.id.clone(), req.snapshot.clone());
    let local =
        tokio::task::spawn_blocking(move || Holder::new(&nn.cfg.state_dir).open(&id, Some(&want)))
            .await??;
    let (file, _download) = match local {
        Some(f) => (f, None),
        None => {
            let nn = n.clone();
            let tmp = tokio::task::spawn_blocking(move || Holder::new(&nn.cfg.state_dir).temp())
                .await??;
            let mut out =
                tokio::fs::File::from_std(tmp.file.try_clone().map_err(NodeError::internal)?);
            n.client(&req.holder)
                .map_err(|e| NodeError::Upstream(e.to_string()))?
                .get_kept(&req.id, &req.snapshot, &mut out, body_limit(n))
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
                })?;
            (
                tmp.file.try_clone().map_err(NodeError::internal)?,
                Some(tmp),
            )
        }
    };
    let (want, generation, capacity) = (req.snapshot.clone(), req.generation, n.log_capacity());
    let rebuild: cells::Rebuild = Box::new(move |module| {
        let _copy = copy;
        let len = file.metadata().map_err(NodeError::internal)?.len();
        let head = file::read_head(&file, len, max)?;
        let m = &head.m;
        if m.snapshot != want {
            return Err(NodeError::bad(format!(
                "the holder has kept checkpoint {}, not {want}",
                m.snapshot
            )));
        }
        let (snap, log) = kept::rebuild(&file, &head, module.initial_image())?;
        tracing::info!(snapshot = %m.snapshot, taken_ms = m.taken_ms, generation,
            "restoring from a kept checkpoint");
        // Its output before the checkpoint; what it wrote after, it writes
        // again.
        let log = CellLog::with_history(capacity, &log, m.log_dropped);
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
            cpu: cells::cpu_limits(req.cpu),
            begin: Begin::Restore(rebuild),
            far,
        },
    )
    .await?;
    cells::status(n, &id)
        .map_err(|_| NodeError::internal(format!("cell {id} vanished after its restore")))
}
