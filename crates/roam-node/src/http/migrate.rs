//! Handlers of migrations (the protocol itself runs on the migration port,
//! `crate::migrate`).

use axum::extract::{Path, State};
use axum::Json;

use super::{Answer, N};
use crate::migrate::{dest, source};
use crate::types::*;

pub(super) async fn start(
    State(n): N,
    Path(id): Path<String>,
    Json(req): Json<MigrateRequest>,
) -> Answer<Json<MigrateResponse>> {
    Ok(Json(source::start(&n, &id, req).await?))
}

pub(super) async fn status(State(n): N, Path(id): Path<String>) -> Answer<Json<MigrationStatus>> {
    Ok(Json(crate::migrate::status(&n, &id)?))
}

pub(super) async fn resolve(State(n): N, Path(id): Path<String>) -> Json<Resolution> {
    Json(dest::resolve(&n, &id))
}

pub(super) async fn timings(State(n): N, Path(id): Path<String>) -> Answer<Json<DestTimings>> {
    Ok(Json(dest::timings_of(&n, &id)?))
}
