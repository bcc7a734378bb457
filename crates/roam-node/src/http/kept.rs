//! Handlers of kept checkpoints (the operations are in `crate::kept::ops`).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::{Answer, N};
use crate::kept::ops;
use crate::state::NodeInner;
use crate::types::*;

/// Largest body of a kept checkpoint: the largest cell memory, plus room
/// for its state and manifest.
pub(super) fn body_limit(n: &NodeInner) -> usize {
    usize::try_from(n.cfg.limits.max_cell_memory.saturating_add(256 << 20)).unwrap_or(usize::MAX)
}

pub(super) async fn keep(
    State(n): N,
    Path(id): Path<String>,
    Json(req): Json<KeepRequest>,
) -> Answer<Json<KeepResponse>> {
    Ok(Json(ops::keep(&n, &id, req).await?))
}

pub(super) async fn missing(
    State(n): N,
    Path(id): Path<String>,
    Json(hashes): Json<Vec<String>>,
) -> Answer<Json<Vec<String>>> {
    Ok(Json(ops::missing(n, id, hashes).await?))
}

pub(super) async fn put(
    State(n): N,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer<Json<serde_json::Value>> {
    Ok(Json(ops::put(n, id, body).await?))
}

/// The query of `GET /v1/kept/{cell}`.
#[derive(serde::Deserialize)]
pub(super) struct Which {
    snapshot: Option<String>,
}

/// The body of `POST /v1/kept/{cell}/commit`.
#[derive(serde::Deserialize)]
pub(super) struct Commit {
    snapshot: String,
}

pub(super) async fn get(
    State(n): N,
    Path(id): Path<String>,
    Query(w): Query<Which>,
) -> Answer<Response> {
    let b = ops::get(n, id, w.snapshot).await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], b).into_response())
}

pub(super) async fn restore(
    State(n): N,
    Json(req): Json<RestoreRequest>,
) -> Answer<Json<CellInfo>> {
    Ok(Json(ops::restore(&n, req).await?))
}

pub(super) async fn commit(
    State(n): N,
    Path(id): Path<String>,
    Json(c): Json<Commit>,
) -> Answer<Json<serde_json::Value>> {
    ops::commit(n, id, c.snapshot).await?;
    Ok(Json(serde_json::json!({})))
}
