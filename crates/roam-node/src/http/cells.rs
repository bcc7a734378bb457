//! Handlers of the node, its modules and its cells.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{Answer, AppError, N};
use crate::cells::{self as core, Logs};
use crate::error::NodeError;
use crate::types::*;

pub(super) async fn node_info(State(n): N) -> Json<NodeInfo> {
    Json(core::node_info(&n))
}

/// `GET /metrics`: Prometheus text (see [`crate::metrics`]).
pub(super) async fn metrics(State(n): N) -> Response {
    let text = n.metrics.render(
        &n.cells(),
        n.gateway.as_ref(),
        n.power.as_ref(),
        n.far_server.as_ref(),
    );
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

pub(super) async fn upload_module(
    State(n): N,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Answer<Json<ModuleInfo>> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            NodeError::TooLarge(format!(
                "the module is larger than node {}'s limit of {} \
                 (raise it with roam node --max-module-size)",
                n.cfg.name,
                crate::size::human(n.cfg.limits.max_module_bytes)
            ))
        } else {
            NodeError::bad(e.body_text())
        }
    })?;
    Ok(Json(core::upload_module(n, body).await?))
}

pub(super) async fn launch(
    State(n): N,
    Json(mut req): Json<LaunchRequest>,
) -> Answer<Json<LaunchResponse>> {
    let far = match req.far.take() {
        Some(f) => {
            // The memory server keeps the pages under the cell's id.
            let id = req
                .id
                .get_or_insert_with(|| crate::ids::new_id("c-"))
                .clone();
            roam_wire::ident::check_cell_id(&id).map_err(NodeError::bad)?;
            let max_memory = req.max_memory.unwrap_or(n.cfg.limits.cell_memory);
            Some(crate::migrate::far::plan(&n, &f, &id, max_memory).await?)
        }
        None => None,
    };
    Ok(Json(core::launch(&n, req, far).await?))
}

pub(super) async fn list(State(n): N) -> Json<Vec<CellInfo>> {
    Json(core::list(&n))
}

pub(super) async fn status(State(n): N, Path(id): Path<String>) -> Answer<Json<CellInfo>> {
    Ok(Json(core::status(&n, &id)?))
}

pub(super) async fn logs(State(n): N, Path(id): Path<String>) -> Answer<Response> {
    Ok(match core::logs(&n, &id)? {
        Logs::Moved(url) => {
            (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, url)]).into_response()
        }
        Logs::Here(body) => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
        }
    })
}

pub(super) async fn kill(State(n): N, Path(id): Path<String>) -> Answer<Json<CellInfo>> {
    Ok(Json(core::kill(&n, &id).await?))
}

pub(super) async fn checkpoint(
    State(n): N,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    let (path, bytes) = core::checkpoint(&n, &id).await?;
    Ok(Json(serde_json::json!({ "path": path, "bytes": bytes })))
}
