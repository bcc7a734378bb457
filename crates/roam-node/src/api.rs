//! The HTTP/JSON control API (see `docs/node-api.md`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::handler::Handler;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use roam_runtime::{Cell, CellOptions};
use roam_wasi::{Preopen, WasiConfig};
use roam_wire::CellSpec;

use crate::cell::{self, CellEntry, KILL_WAIT, PAUSE_TIMEOUT};
use crate::log::CellLog;
use crate::node::{new_id, unix_ms, NodeInner};
use crate::types::*;

type N = State<Arc<NodeInner>>;

/// An error answer: status and message.
pub(crate) struct AppError(pub StatusCode, pub String);

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

fn bad(msg: impl Into<String>) -> AppError {
    AppError(StatusCode::BAD_REQUEST, msg.into())
}
fn not_found(what: &str) -> AppError {
    AppError(StatusCode::NOT_FOUND, format!("no {what} on this node"))
}
fn internal(msg: impl std::fmt::Display) -> AppError {
    AppError(StatusCode::INTERNAL_SERVER_ERROR, msg.to_string())
}

pub(crate) fn router(n: Arc<NodeInner>) -> Router {
    let router = Router::new()
        .route("/v1/node", get(node_info))
        .route("/metrics", get(metrics))
        .route("/v1/modules", post(upload_module))
        .route("/v1/cells", post(launch).get(list))
        .route("/v1/cells/{id}", get(status))
        .route("/v1/cells/{id}/logs", get(logs))
        .route("/v1/cells/{id}/kill", post(kill))
        .route("/v1/cells/{id}/checkpoint", post(checkpoint))
        .route("/v1/cells/{id}/keep", post(crate::kept_api::keep))
        .route("/v1/cells/restore", post(crate::kept_api::restore))
        .route(
            "/v1/kept/{id}",
            get(crate::kept_api::get).put(
                crate::kept_api::put.layer(DefaultBodyLimit::max(crate::kept_api::body_limit(&n))),
            ),
        )
        .route("/v1/kept/{id}/missing", post(crate::kept_api::missing))
        .route(
            "/v1/cells/{id}/migrate",
            post(crate::migrate::source::start),
        )
        .route("/v1/migrations/{id}", get(crate::migrate::status))
        .route(
            "/v1/migrations/{id}/resolve",
            post(crate::migrate::dest::resolve),
        )
        .route(
            "/v1/migrations/{id}/timings",
            get(crate::migrate::dest::timings_of),
        )
        .route_layer(axum::middleware::from_fn(check_path_ids))
        .layer(DefaultBodyLimit::max(body_limit(&n)));
    // The token check wraps every route: no handler runs without it.
    crate::secure::guard(router, n.auth.token.as_ref()).with_state(n)
}

/// Largest request body: a module of the node's largest size.
fn body_limit(n: &NodeInner) -> usize {
    usize::try_from(n.cfg.limits.max_module_bytes).unwrap_or(usize::MAX)
}

/// Refuse, with 400 and the reason, a request whose `{id}` path parameter
/// is not a valid cell or migration id, before any handler sees it (ids
/// become host paths: `state_dir/cells/{id}`).
async fn check_path_ids(
    params: axum::extract::RawPathParams,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let migration = req.uri().path().starts_with("/v1/migrations/");
    for (_, value) in &params {
        let checked = if migration {
            roam_wire::ident::check_migration_id(value)
        } else {
            roam_wire::ident::check_cell_id(value)
        };
        if let Err(e) = checked {
            return bad(e.to_string()).into_response();
        }
    }
    next.run(req).await
}

pub(crate) fn node_info_of(n: &NodeInner) -> NodeInfo {
    let running = n
        .cells()
        .values()
        .filter(|e| matches!(e.state, CellState::Running | CellState::Migrating))
        .count();
    NodeInfo {
        name: n.cfg.name.clone(),
        isa: roam_runtime::host_isa().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        migrate_addr: n
            .cfg
            .advertise_migrate
            .clone()
            .unwrap_or_else(|| n.migrate_addr.to_string()),
        userfaultfd: n.features().userfaultfd,
        cells_running: running,
        machine: crate::sysinfo::Machine::read(),
    }
}

async fn node_info(State(n): N) -> Json<NodeInfo> {
    Json(node_info_of(&n))
}

/// `GET /metrics`: Prometheus text (see [`crate::metrics`]).
async fn metrics(State(n): N) -> Response {
    let text = n.metrics.render(&n);
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

async fn upload_module(
    State(n): N,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ModuleInfo>, AppError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the module is larger than node {}'s limit of {} \
                     (raise it with roam node --max-module-size)",
                    n.cfg.name,
                    crate::size::human(n.cfg.limits.max_module_bytes)
                ),
            )
        } else {
            AppError(e.status(), e.body_text())
        }
    })?;
    let module = tokio::task::spawn_blocking(move || n.rt.load_bytes(&body))
        .await
        .map_err(internal)?
        .map_err(|e| bad(format!("module refused: {e}")))?;
    Ok(Json(ModuleInfo {
        hash: roam_runtime::cache::hex(module.hash()),
        bytes: module.bytes().len() as u64,
    }))
}

pub(crate) fn parse_hash(s: &str) -> Result<[u8; 32], AppError> {
    roam_wire::ident::parse_module_hash(s).map_err(|e| bad(e.to_string()))
}

/// Host directories for a cell's guest directories, created empty.
pub(crate) fn make_preopens(
    n: &NodeInner,
    id: &str,
    dirs: &[String],
) -> std::io::Result<Vec<Preopen>> {
    dirs.iter()
        .enumerate()
        .map(|(i, guest)| {
            let host = n.cell_dir(id).join("dirs").join(i.to_string());
            std::fs::create_dir_all(&host)?;
            Ok(Preopen {
                host,
                guest: guest.clone(),
            })
        })
        .collect()
}

/// Put a cell into the table with its handle, and route its service's
/// clients to it. The caller then runs it.
pub(crate) fn register(
    n: &Arc<NodeInner>,
    spec: CellSpec,
    log: Arc<CellLog>,
    cell: &mut Cell,
) -> Arc<cell::CellHandle> {
    let handle = cell::handle_for(cell, log.clone());
    n.cells().insert(
        spec.id.clone(),
        CellEntry {
            spec: spec.clone(),
            state: CellState::Running,
            log,
            handle: Some(handle.clone()),
        },
    );
    n.serve(&spec, handle.net.as_ref());
    handle
}

/// What to do when a cell's thread ends: record the state it ended in.
pub(crate) fn on_end(n: &Arc<NodeInner>, id: &str) -> cell::OnEnd {
    let node = n.clone();
    let id = id.to_string();
    Box::new(move |st| {
        if let Some(st) = st {
            node.set_state(&id, st);
        }
    })
}

/// Put a cell into the table and start its thread.
pub(crate) fn register_and_spawn(
    n: &Arc<NodeInner>,
    spec: CellSpec,
    log: Arc<CellLog>,
    mut cell: Cell,
) -> Result<(), AppError> {
    let id = spec.id.clone();
    let handle = register(n, spec, log, &mut cell);
    cell::spawn(&id, cell, handle, on_end(n, &id)).map_err(|e| {
        n.set_state(
            &id,
            CellState::Failed {
                error: e.to_string(),
            },
        );
        internal(e)
    })
}

async fn launch(
    State(n): N,
    Json(req): Json<LaunchRequest>,
) -> Result<Json<LaunchResponse>, AppError> {
    let hash = parse_hash(&req.module)?;
    if req.args.is_empty() {
        return Err(bad("args must hold at least the program name"));
    }
    roam_wire::ident::check_guest_dirs(&req.dirs).map_err(|e| bad(e.to_string()))?;
    if let Some(service) = &req.service {
        roam_wire::ident::check_service_name(service).map_err(|e| bad(e.to_string()))?;
        n.check_can_serve(service).map_err(bad)?;
    }
    let id = match &req.id {
        Some(id) => {
            roam_wire::ident::check_cell_id(id).map_err(|e| bad(e.to_string()))?;
            if n.cells().contains_key(id) {
                return Err(AppError(
                    StatusCode::CONFLICT,
                    format!("a cell {id} already exists on this node: choose another id"),
                ));
            }
            id.clone()
        }
        None => new_id("c-"),
    };
    let max_memory = req.max_memory.unwrap_or(n.cfg.limits.cell_memory);
    let admission = crate::limits::admit(&n, &id, max_memory).map_err(|e| {
        if max_memory > n.cfg.limits.max_cell_memory {
            bad(e)
        } else {
            AppError(StatusCode::CONFLICT, e)
        }
    })?;
    let node = n.clone();
    let cid = id.clone();
    tokio::task::spawn_blocking(move || {
        let module = node
            .rt
            .load_by_hash(&hash, None)
            .map_err(|e| AppError(StatusCode::NOT_FOUND, e.to_string()))?;
        let preopens = make_preopens(&node, &cid, &req.dirs).map_err(internal)?;
        let wasi = WasiConfig {
            args: req.args.clone(),
            env: req.env.clone(),
            preopens,
            listeners: req.service.iter().cloned().collect(),
        };
        let opts = CellOptions {
            with_files: !req.dirs.is_empty(),
            max_memory,
            ..CellOptions::default()
        };
        let cell = Cell::start(&node.rt, module, wasi, opts).map_err(|e| bad(e.to_string()))?;
        let spec = CellSpec {
            id: cid.clone(),
            module_hash: hash,
            args: req.args,
            env: req.env,
            dirs: req.dirs,
            launched_unix_ms: unix_ms(),
            hops: 0,
            max_memory,
            service: req.service,
            generation: req.generation,
        };
        tracing::info!(cell = %cid, program = %spec.args[0], max_memory, "launched");
        let log = Arc::new(CellLog::new(node.log_capacity()));
        let r = register_and_spawn(&node, spec, log, cell);
        drop(admission);
        r
    })
    .await
    .map_err(internal)??;
    Ok(Json(LaunchResponse { id }))
}

pub(crate) fn info(e: &CellEntry) -> CellInfo {
    CellInfo {
        id: e.spec.id.clone(),
        state: e.state.clone(),
        program: e.spec.args.first().cloned().unwrap_or_default(),
        module: roam_runtime::cache::hex(&e.spec.module_hash),
        memory_bytes: e.handle.as_ref().map_or(0, |h| h.memory.len() as u64),
        max_memory: e.spec.max_memory,
        log_dropped_bytes: e.log.dropped(),
        uptime_ms: unix_ms().saturating_sub(e.spec.launched_unix_ms),
        hops: e.spec.hops,
        service: e.spec.service.clone(),
    }
}

async fn list(State(n): N) -> Json<Vec<CellInfo>> {
    let mut v: Vec<CellInfo> = n.cells().values().map(info).collect();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    Json(v)
}

async fn status(State(n): N, Path(id): Path<String>) -> Result<Json<CellInfo>, AppError> {
    n.cells()
        .get(&id)
        .map(info)
        .map(Json)
        .ok_or_else(|| not_found(&format!("cell {id}")))
}

async fn logs(State(n): N, Path(id): Path<String>) -> Result<Response, AppError> {
    let cells = n.cells();
    let e = cells
        .get(&id)
        .ok_or_else(|| not_found(&format!("cell {id}")))?;
    if let CellState::Moved { to } = &e.state {
        let url = if to.contains("://") {
            format!("{}/v1/cells/{id}/logs", to.trim_end_matches('/'))
        } else {
            format!(
                "{}://{to}/v1/cells/{id}/logs",
                crate::secure::scheme(&n.auth)
            )
        };
        return Ok((StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, url)]).into_response());
    }
    let mut body = Vec::new();
    let dropped = e.log.dropped();
    if dropped > 0 {
        body.extend_from_slice(
            format!(
                "[roam: {} of earlier output dropped]\n",
                crate::size::human(dropped)
            )
            .as_bytes(),
        );
    }
    body.extend(e.log.contents());
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

pub(crate) fn running_handle(n: &NodeInner, id: &str) -> Result<Arc<cell::CellHandle>, AppError> {
    let cells = n.cells();
    let e = cells
        .get(id)
        .ok_or_else(|| not_found(&format!("cell {id}")))?;
    match (&e.state, &e.handle) {
        (CellState::Running, Some(h)) => Ok(h.clone()),
        (state, _) => Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id} is not running here (state: {state:?})"),
        )),
    }
}

async fn kill(State(n): N, Path(id): Path<String>) -> Result<Json<CellInfo>, AppError> {
    let h = running_handle(&n, &id)?;
    if n.fence.release(&id) {
        // Held by the fence: already paused.
        n.set_state(&id, CellState::Killed);
        return status(State(n), Path(id)).await;
    }
    // A kill keeps nothing of the program, so it needs no checkpoint: end
    // it at its next loop header, function entry or point, whatever it runs.
    n.set_state(&id, CellState::Migrating);
    if !h.kill(KILL_WAIT).await {
        tracing::warn!(
            cell = %id,
            "the killed cell's thread is still in a host call; it runs no more wasm code"
        );
    }
    n.set_state(&id, CellState::Killed);
    status(State(n), Path(id)).await
}

async fn checkpoint(
    State(n): N,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AppError> {
    let h = running_handle(&n, &id)?;
    let snap = tokio::time::timeout(PAUSE_TIMEOUT, h.checkpoint())
        .await
        .map_err(|_| internal("the cell did not reach a migration point in time"))?
        .map_err(|_| internal("the cell ended before the checkpoint"))?
        .map_err(internal)?
        .snapshot;
    let dir = n.cell_dir(&id).join("checkpoints");
    let path = dir.join(format!("{}.roamsnap", unix_ms()));
    let bytes = tokio::task::spawn_blocking({
        let path = path.clone();
        move || -> Result<u64, String> {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            snap.write_file(&path).map_err(|e| e.to_string())
        }
    })
    .await
    .map_err(internal)?
    .map_err(internal)?;
    Ok(Json(serde_json::json!({ "path": path, "bytes": bytes })))
}
