//! `GET /v1/services/{service}`: who may serve a gateway service now.
//!
//! Why: a gateway (`roam gateway --planner`) routes a service's clients to
//! whichever node says `Serve` for it. A node holding a valid certificate
//! but not the cell (a rogue or compromised node) could say it too, at a
//! generation above the real one, and receive every client's bytes. The
//! cell records already say which node owns the cell that serves a service,
//! at which generation (a migration's destination takes ownership here
//! before it starts the cell, a restore bumps the generation before the
//! node restores), so the gateway asks here and routes only to that owner.
//!
//! The answer is read straight from the store, without asking any node:
//! it has no side effect, and it is the same on every planner of one etcd.
//! It is the only route a gateway's certificate may call (`caller.rs`).

use axum::extract::{Path, State};
use axum::Json;
use roam_api::planner::{ServiceCell, ServiceOwners};

use crate::api::{AppError, P};

/// `GET /v1/services/{service}`: the cells of `service` that have not
/// ended, with their owners and generations (an empty list: none).
pub(crate) async fn owners(
    State(n): P,
    Path(service): Path<String>,
) -> Result<Json<ServiceOwners>, AppError> {
    let cells = n.timed("cells", n.store.cells()).await?;
    let mut cells: Vec<ServiceCell> = cells
        .into_iter()
        .map(|c| c.value)
        .filter(|c| c.service.as_deref() == Some(service.as_str()) && !c.state.ended())
        .map(|c| ServiceCell {
            cell: c.id,
            owner: c.owner,
            generation: c.generation,
        })
        .collect();
    cells.sort_by(|a, b| a.cell.cmp(&b.cell));
    Ok(Json(ServiceOwners { service, cells }))
}
