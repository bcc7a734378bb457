//! The ownership transaction: at a migration's commit point the node that
//! takes a cell asks the planner to record it as the owner, and before it
//! the owner names the node that may take it (the handoff).
//!
//! Why apart from `cells.rs`: this is the one place where a node, not a
//! person, changes a cell's record, so its checks (who may act as whom,
//! which generation wins) are read on their own.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use roam_api::planner::{Handoff, HandoffRequest, OwnerRequest, OwnerResponse};
use roam_cluster::{CellRecord, CellState};

use crate::api::{bad, AppError, P};
use crate::cells::{get_node, update};
use crate::Inner;

/// `POST /v1/cells/{id}/owner`: the ownership transaction. It wins only if
/// the cell is owned by `from` at `generation`; then `to` owns it at the
/// next generation and the cell is running there.
pub(crate) async fn owner(
    State(n): P,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<crate::caller::Caller>,
    Json(r): Json<OwnerRequest>,
) -> Result<Json<OwnerResponse>, AppError> {
    roam_wire::ident::check_node_name(&r.to).map_err(|e| bad(e.to_string()))?;
    // A node takes a cell only to itself (at a migration's commit point,
    // or back after an ambiguous one); never to another node.
    caller.may_act_as(&r.to)?;
    owner_change(&n, &id, &r).await.map(Json)
}

/// `POST /v1/cells/{id}/handoff`: the owner names the node that may take
/// the cell at a migration's commit point. Only the owner at its current
/// generation may (its certificate's name, under TLS).
pub(crate) async fn handoff(
    State(n): P,
    Path(id): Path<String>,
    axum::Extension(caller): axum::Extension<crate::caller::Caller>,
    Json(r): Json<HandoffRequest>,
) -> Result<Json<serde_json::Value>, AppError> {
    for name in [&r.from, &r.to] {
        roam_wire::ident::check_node_name(name).map_err(|e| bad(e.to_string()))?;
    }
    caller.may_act_as(&r.from)?;
    if r.from == r.to {
        return Err(bad(format!(
            "node {} cannot hand cell {id} to itself",
            r.to
        )));
    }
    let mut lost = None;
    let won = update(&n, &id, |c| {
        if c.state.ended() || c.owner != r.from || c.generation != r.generation {
            lost = Some((c.owner.clone(), c.generation));
            return false;
        }
        c.handoff = Some(Handoff {
            from: r.from.clone(),
            to: r.to.clone(),
            generation: r.generation,
        });
        true
    })
    .await?;
    match (won, lost) {
        (Some(_), _) => {
            tracing::info!(cell = %id, from = %r.from, to = %r.to, generation = r.generation, "hand-off announced");
            Ok(Json(serde_json::json!({})))
        }
        (None, Some((owner, generation))) => Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "cell {id} is owned by {owner} at generation {generation}, not by {} at \
                 generation {}: only its owner may hand it over",
                r.from, r.generation
            ),
        )),
        (None, None) => Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id}: the hand-off lost"),
        )),
    }
}

/// Whether `r` may move cell `c`: a node takes its own cell (again, after
/// an ambiguous commit), the node its owner handed it to takes it, or the
/// owner that handed it over takes it back from that node one generation
/// on. Knowing the owner and generation is not enough: they are no secret
/// (`GET /v1/cells`), and without this any node could take any cell.
fn handed_over(c: &CellRecord, r: &OwnerRequest) -> bool {
    r.from == r.to
        || c.handoff.as_ref().is_some_and(|h| {
            (h.from == r.from && h.to == r.to && h.generation == r.generation)
                || (h.to == r.from && h.from == r.to && h.generation + 1 == r.generation)
        })
}

pub(crate) async fn owner_change(
    n: &Inner,
    id: &str,
    r: &OwnerRequest,
) -> Result<OwnerResponse, AppError> {
    for name in [&r.from, &r.to] {
        roam_wire::ident::check_node_name(name).map_err(|e| bad(e.to_string()))?;
    }
    let to = get_node(n, &r.to).await?;
    if !to.alive {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "node {} is not alive (its lease expired): it cannot take cell {id}",
                r.to
            ),
        ));
    }
    let mut lost = None;
    let mut refused = false;
    let won = update(n, id, |c| {
        if c.state.ended() || c.owner != r.from || c.generation != r.generation {
            lost = Some((c.owner.clone(), c.generation, c.state.clone()));
            return false;
        }
        if !handed_over(c, r) {
            refused = true;
            return false;
        }
        c.owner = r.to.clone();
        c.generation += 1;
        c.state = CellState::Running;
        true
    })
    .await?;
    if refused {
        return Err(AppError(
            StatusCode::FORBIDDEN,
            format!(
                "{} did not hand cell {id} to {} at generation {}: a node takes a cell only \
                 when its owner announced the hand-off (POST /v1/cells/{id}/handoff)",
                r.from, r.to, r.generation
            ),
        ));
    }
    match (won, lost) {
        (Some(c), _) => {
            tracing::info!(cell = %id, from = %r.from, to = %c.owner, generation = c.generation, "ownership moved");
            Ok(OwnerResponse {
                owner: c.owner,
                generation: c.generation,
            })
        }
        (None, Some((owner, generation, state))) => Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "the transaction lost: cell {id} is owned by {owner} at generation \
                 {generation} ({}), not by {} at generation {}; do not run it",
                crate::metrics::state_name(&state),
                r.from,
                r.generation
            ),
        )),
        (None, None) => Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id}: the transaction lost"),
        )),
    }
}
