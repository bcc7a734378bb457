//! Evacuation before a declared maintenance: an operator declares when a
//! node goes down for work (`PUT /v1/nodes/{name}/maintenance`, `roam
//! maintenance`), and the leading planner empties it beforehand, with live
//! migrations while its cells still run, instead of restoring them from
//! kept checkpoints after the node has gone.
//!
//! The window is kept in the node's record ([`Maintenance`]), so that
//! every planner, and a leader elected halfway through, acts on it. The
//! leader, every tick ([`tick`]):
//! - from `start − lead`: drains the node (no new cells or kept
//!   checkpoints there; every cell live-migrates where `evacuate` puts
//!   it) and marks the window drained; cells still there are tried again
//!   every [`RETRY_MS`] (a move that failed, a cell that arrived);
//! - at `start`: logs and announces the cells still on the node, if any;
//! - from `end`: puts the node back in service if the planner drained it,
//!   and clears the window. A node an operator drained by hand before the
//!   window stays drained.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use roam_api::planner::{MaintenanceRequest, NodeRecord};
use roam_cluster::{CellRecord, CellState, Maintenance, NodeState};

use crate::api::{bad, AppError, P};
use crate::events::Event;
use crate::{unix_ms, Inner};

/// Cells still on a draining node are tried again this often, ms.
pub const RETRY_MS: u64 = 15_000;

/// `PUT /v1/nodes/{name}/maintenance`: declare (or replace) the node's
/// window. Its record.
pub(crate) async fn declare(
    State(n): P,
    Path(name): Path<String>,
    Json(r): Json<MaintenanceRequest>,
) -> Result<Json<NodeRecord>, AppError> {
    let now = unix_ms();
    r.check(now).map_err(bad)?;
    let node = crate::cells::get_node(&n, &name).await?;
    // The planner drained the node for the window this one replaces: it
    // stays drained only if the new window's drain has begun too.
    let ours = node.maintenance.is_some_and(|m| m.drained) && node.state == NodeState::Draining;
    let keep = ours && now >= r.start_ms.saturating_sub(r.lead_ms);
    let window = Maintenance {
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        lead_ms: r.lead_ms,
        drained: keep,
    };
    let state = (ours && !keep).then_some(NodeState::Ready);
    swap(&n, &node, Some(window), state).await?;
    tracing::info!(node = %name, start_ms = r.start_ms, end_ms = r.end_ms, "maintenance declared");
    Ok(Json(crate::cells::get_node(&n, &name).await?))
}

/// `DELETE /v1/nodes/{name}/maintenance`: cancel the node's window; if the
/// planner had drained the node for it, the node takes cells again. Its
/// record.
pub(crate) async fn cancel(
    State(n): P,
    Path(name): Path<String>,
) -> Result<Json<NodeRecord>, AppError> {
    let node = crate::cells::get_node(&n, &name).await?;
    finish(&n, &node).await?;
    Ok(Json(crate::cells::get_node(&n, &name).await?))
}

/// Replace `node`'s window (as read) with `new`, and its state if given,
/// in one change; `409` if the window changed since it was read.
async fn swap(
    n: &Arc<Inner>,
    node: &NodeRecord,
    new: Option<Maintenance>,
    state: Option<NodeState>,
) -> Result<(), AppError> {
    let swapped = n
        .timed(
            "swap_node_maintenance",
            n.store
                .swap_node_maintenance(&node.name, node.maintenance, new, state),
        )
        .await?;
    if !swapped {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "node {}'s maintenance window changed meanwhile; look again and retry",
                node.name
            ),
        ));
    }
    match state {
        Some(NodeState::Ready) => n.events.send(Event::Undrain {
            node: node.name.clone(),
        }),
        Some(NodeState::Draining) => n.events.send(Event::Drain {
            node: node.name.clone(),
        }),
        None => {}
    }
    Ok(())
}

/// Clear `node`'s window, and undrain it (in the same change) if the
/// planner drained it.
async fn finish(n: &Arc<Inner>, node: &NodeRecord) -> Result<(), AppError> {
    let ours = node.maintenance.is_some_and(|m| m.drained) && node.state == NodeState::Draining;
    swap(n, node, None, ours.then_some(NodeState::Ready)).await
}

/// What the leader remembers between ticks.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Node → when its cells were last sent away.
    tried: HashMap<String, u64>,
    /// Nodes whose window began with cells on them, already announced.
    warned: HashMap<String, u64>,
}

/// One leader tick over every node's window.
pub(crate) async fn tick(
    n: &Arc<Inner>,
    nodes: &[NodeRecord],
    cells: &[CellRecord],
    seen: &mut Seen,
    now: u64,
) {
    seen.tried.retain(|name, _| {
        nodes
            .iter()
            .any(|x| &x.name == name && x.maintenance.is_some())
    });
    seen.warned.retain(|name, _| {
        nodes
            .iter()
            .any(|x| &x.name == name && x.maintenance.is_some())
    });
    for node in nodes {
        let Some(m) = node.maintenance else { continue };
        if let Err(e) = one(n, node, m, cells, seen, now).await {
            tracing::warn!(node = %node.name, "maintenance: {}", e.1);
        }
    }
}

async fn one(
    n: &Arc<Inner>,
    node: &NodeRecord,
    m: Maintenance,
    cells: &[CellRecord],
    seen: &mut Seen,
    now: u64,
) -> Result<(), AppError> {
    let name = &node.name;
    if now >= m.end_ms {
        tracing::info!(node = %name, "maintenance window over");
        return finish(n, node).await;
    }
    if now < m.start_ms.saturating_sub(m.lead_ms) {
        return Ok(());
    }
    let draining = if !m.drained && node.state == NodeState::Ready {
        // The window (as read) and the state change together, or not at
        // all: a window replaced or cancelled meanwhile wins.
        let drained = Maintenance { drained: true, ..m };
        swap(n, node, Some(drained), Some(NodeState::Draining)).await?;
        tracing::info!(node = %name, "maintenance: draining before the window");
        true
    } else {
        // Drained by hand before the window (it stays the operator's to
        // undrain), or drained by the planner; an operator who undrained
        // it since wants it in service: leave its cells alone.
        node.state == NodeState::Draining
    };
    if !draining {
        return Ok(());
    }
    let left: Vec<&CellRecord> = cells
        .iter()
        .filter(|c| &c.owner == name && !c.state.ended())
        .collect();
    if left.is_empty() {
        return Ok(());
    }
    if now >= m.start_ms && seen.warned.get(name) != Some(&m.start_ms) {
        seen.warned.insert(name.clone(), m.start_ms);
        let ids: Vec<&str> = left.iter().map(|c| c.id.as_str()).collect();
        tracing::warn!(node = %name, cells = ?ids,
            "maintenance began with cells still on the node: they could not be moved in time");
    }
    // Cells already on their way are the migrations' to finish.
    let due = left.iter().any(|c| c.state == CellState::Running)
        && seen
            .tried
            .get(name)
            .is_none_or(|t| now.saturating_sub(*t) >= RETRY_MS);
    if due {
        seen.tried.insert(name.clone(), now);
        let (n, name) = (n.clone(), name.clone());
        tokio::spawn(async move {
            match crate::moves::move_all_off(&n, &name, "maintenance").await {
                Ok(moves) => {
                    for m in moves.iter().filter(|m| m.error.is_some()) {
                        tracing::warn!(node = %name, cell = %m.cell,
                            "maintenance: cannot move the cell yet: {}",
                            m.error.as_deref().unwrap_or_default());
                    }
                }
                Err(e) => tracing::warn!(node = %name, "maintenance: {}", e.1),
            }
        });
    }
    Ok(())
}

#[cfg(test)]
#[path = "maintenance_tests.rs"]
mod tests;
