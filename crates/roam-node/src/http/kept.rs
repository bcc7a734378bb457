//! Handlers of kept checkpoints (the operations are in `crate::kept::ops`).

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use roam_api::serve::Peer;
use tokio::io::AsyncReadExt;

use super::{Answer, N};
use crate::error::NodeError;
use crate::kept::ops;
use crate::kept::store::PageHash;
use crate::types::*;

pub(super) async fn keep(
    State(n): N,
    Path(id): Path<String>,
    Json(req): Json<KeepRequest>,
) -> Answer<Json<KeepResponse>> {
    Ok(Json(ops::keep(&n, &id, req).await?))
}

/// The calling node's name, as its certificate gives it; `None` without
/// TLS (no identity to check). Only nodes reach the routes that ask.
fn node_of(peer: &Peer) -> Option<String> {
    peer.id.as_ref().map(|id| id.name.clone())
}

pub(super) async fn missing(
    State(n): N,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    Json(hashes): Json<Vec<PageHash>>,
) -> Answer<Json<Vec<PageHash>>> {
    Ok(Json(
        ops::missing(n, id, node_of(&peer).as_deref(), hashes).await?,
    ))
}

/// The body is streamed to the holder's disk (`ops::put` bounds it).
pub(super) async fn put(
    State(n): N,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    body: Body,
) -> Answer<Json<serde_json::Value>> {
    let from = node_of(&peer);
    Ok(Json(
        ops::put(n, id, from.as_deref(), body.into_data_stream()).await?,
    ))
}

/// `POST /v1/kept/{id}/grant`: the planner lets a node store, or read one
/// version of, this cell's kept checkpoints.
pub(super) async fn grant(
    State(n): N,
    Path(id): Path<String>,
    Json(g): Json<KeptGrant>,
) -> Answer<Json<serde_json::Value>> {
    ops::grant(&n, &id, g)?;
    Ok(Json(serde_json::json!({})))
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
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    Query(w): Query<Which>,
) -> Answer<Response> {
    let f = ops::get(n, id, node_of(&peer).as_deref(), w.snapshot).await?;
    let len = f.metadata().map_err(NodeError::internal)?.len();
    // Streamed from the file, 64 KiB at a time.
    let chunks = futures_util::stream::unfold(tokio::fs::File::from_std(f), |mut f| async move {
        let mut buf = vec![0u8; 1 << 16];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(k) => {
                buf.truncate(k);
                Some((Ok::<_, std::io::Error>(Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        Body::from_stream(chunks),
    )
        .into_response())
}

pub(super) async fn restore(
    State(n): N,
    Json(req): Json<RestoreRequest>,
) -> Answer<Json<CellInfo>> {
    // A far-memory cell gets a page space of its own on its memory server
    // before its memory is written, which then goes there as it is.
    let far = match &req.far {
        Some(f) => {
            roam_wire::ident::check_cell_id(&req.id).map_err(NodeError::bad)?;
            let limit = req.max_memory.unwrap_or(n.cfg.limits.cell_memory);
            Some(crate::migrate::far::plan(&n, f, &req.id, limit).await?)
        }
        None => None,
    };
    Ok(Json(ops::restore(&n, req, far).await?))
}

pub(super) async fn commit(
    State(n): N,
    Path(id): Path<String>,
    Json(c): Json<Commit>,
) -> Answer<Json<serde_json::Value>> {
    ops::commit(n, id, c.snapshot).await?;
    Ok(Json(serde_json::json!({})))
}
