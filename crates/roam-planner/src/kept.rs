//! Kept checkpoints: a cell's owner checkpoints it and continues, and
//! sends the snapshot to another node that keeps it, so that the cell
//! survives its owner (`POST /v1/cells/{id}/checkpoint` now, and the
//! leader on each cell's schedule).
//!
//! Why the holder is chosen here and recorded by compare-and-swap: the
//! record must only name a checkpoint of the cell as its current owner
//! runs it; a checkpoint that raced with a change of owner is dropped.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use roam_api::types::{KeepRequest, KeptAccess, KeptGrant};
use roam_cluster::{CellState, Kept, NodeRecord};

use crate::api::{AppError, P};
use crate::cells::{get_cell, load_view, update};
use crate::events::Event;
use crate::policy::{self, Ctx, Want};
use crate::{lock, unix_ms, Inner};

/// Removes a cell from the busy set when dropped.
pub(crate) struct Busy<'a>(&'a Inner, String);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.0.busy).remove(&self.1);
    }
}

/// Mark `id` busy, or say what holds it.
pub(crate) fn claim<'a>(n: &'a Inner, id: &str) -> Result<Busy<'a>, AppError> {
    if !lock(&n.busy).insert(id.to_string()) {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!("a checkpoint or restore of cell {id} is in progress; try again shortly"),
        ));
    }
    Ok(Busy(n, id.to_string()))
}

/// Resolves once node `name` is no longer alive (checked every 500 ms).
async fn dead(n: &Inner, name: &str) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        if let Ok(nodes) = n.store.nodes().await {
            if !nodes.iter().any(|x| x.name == name && x.alive) {
                return;
            }
        }
    }
}

/// Take a kept checkpoint of cell `id` now: its owner checkpoints it and
/// sends the snapshot to a holder the `evacuate` policy picks (never the
/// owner), and the cell's record names the new checkpoint.
pub(crate) async fn keep_now(n: &Inner, id: &str) -> Result<Kept, AppError> {
    let _busy = claim(n, id)?;
    let r = keep_inner(n, id).await;
    n.metrics
        .checkpoint(if r.is_ok() { "kept" } else { "failed" });
    r
}

async fn keep_inner(n: &Inner, id: &str) -> Result<Kept, AppError> {
    let c = get_cell(n, id).await?.value;
    if c.state != CellState::Running {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "cell {id} is not running ({:?}): nothing to checkpoint",
                c.state
            ),
        ));
    }
    let (nodes, load) = load_view(n).await?;
    let owner = nodes
        .iter()
        .find(|x| x.name == c.owner && x.alive)
        .ok_or_else(|| {
            AppError(
                StatusCode::CONFLICT,
                format!("cell {id}'s owner {} is not alive", c.owner),
            )
        })?;
    let want = Want {
        cell: Some(id.to_string()),
        // A holder keeps a snapshot, not the running cell.
        max_memory: Some(0),
        // Nor its memory server: one failure would take both the far pages
        // and the checkpoint that replaces them.
        exclude: std::iter::once((c.owner.clone(), "the cell's owner"))
            .chain(
                c.far
                    .as_ref()
                    .and_then(|f| f.server.clone())
                    .map(|s| (s, "it holds the cell's far pages")),
            )
            .collect(),
        ..Want::default()
    };
    let ctx = Ctx {
        nodes: &nodes,
        cells: std::slice::from_ref(&c),
        load,
        want: &want,
    };
    let holder = policy::place(&policy::Evacuate, &ctx).map_err(|e| {
        AppError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no node can keep a checkpoint of cell {id}: {e}"),
        )
    })?;
    let client = n
        .node_client(owner)
        .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    let req = KeepRequest {
        holder: holder.api.clone(),
        holder_name: holder.name.clone(),
    };
    // The holder takes a checkpoint of this cell from its owner only.
    let grant = KeptGrant {
        node: owner.name.clone(),
        access: KeptAccess::Store,
        snapshot: None,
    };
    grant_on(n, holder, id, &grant).await?;
    // An owner that stops answering mid-checkpoint (frozen, cut off) must
    // not hold the cell: once its lease runs out, the cell is restored
    // elsewhere, and that waits for this checkpoint to let go of it.
    let resp = tokio::select! {
        r = client.keep(id, &req) => r,
        () = dead(n, &c.owner) => {
            return Err(AppError(
                StatusCode::BAD_GATEWAY,
                format!("node {} died while keeping a checkpoint of cell {id}", owner.name),
            ));
        }
    }
    .map_err(|e| {
        AppError(
            StatusCode::BAD_GATEWAY,
            format!(
                "node {} could not keep a checkpoint of cell {id} on {}: {e}",
                owner.name, holder.name
            ),
        )
    })?;
    roam_wire::ident::parse_module_hash(&resp.snapshot).map_err(|e| {
        AppError(
            StatusCode::BAD_GATEWAY,
            format!("node {} answered a bad snapshot hash: {e}", owner.name),
        )
    })?;
    let kept = Kept {
        holder: holder.name.clone(),
        snapshot: resp.snapshot,
        bytes: resp.bytes,
        taken_ms: if resp.taken_ms == 0 {
            unix_ms()
        } else {
            resp.taken_ms
        },
        generation: c.generation,
    };
    let recorded = update(n, id, |x| {
        let same = x.owner == c.owner && x.generation == c.generation;
        if same {
            x.kept = Some(kept.clone());
        }
        same
    })
    .await?;
    if recorded.is_none() {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id} changed owner during the checkpoint; it was not recorded"),
        ));
    }
    // Recorded: the holder may drop the versions before it. Until it
    // hears this, it keeps them (a failed record leaves the older one
    // named, and still there).
    let committed = match n.node_client(holder) {
        Ok(h) => h
            .commit_kept(id, &kept.snapshot)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = committed {
        tracing::warn!(cell = %id, holder = %holder.name, "cannot tell the holder the checkpoint was recorded; it keeps older ones until the next: {e}");
    }
    n.events.send(Event::Checkpoint {
        cell: id.to_string(),
        owner: c.owner,
        holder: kept.holder.clone(),
        snapshot: kept.snapshot.clone(),
        bytes: kept.bytes,
        sent_bytes: resp.sent_bytes,
    });
    Ok(kept)
}

/// Tell `holder` that `grant.node` may store, or read a version of, cell
/// `id`'s kept checkpoints: a holder refuses every other node.
pub(crate) async fn grant_on(
    n: &Inner,
    holder: &NodeRecord,
    id: &str,
    grant: &KeptGrant,
) -> Result<(), AppError> {
    let client = n
        .node_client(holder)
        .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    client.grant_kept(id, grant).await.map_err(|e| {
        AppError(
            StatusCode::BAD_GATEWAY,
            format!(
                "the holder {} did not take the grant for node {} on cell {id}: {e}",
                holder.name, grant.node
            ),
        )
    })
}

pub(crate) async fn checkpoint(
    State(n): P,
    Path(id): Path<String>,
) -> Result<Json<Kept>, AppError> {
    Ok(Json(keep_now(&n, &id).await?))
}
