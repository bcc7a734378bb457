//! The planner's HTTP/JSON API (`docs/control-plane.md`): the routes, the
//! checks every request passes before a handler runs, and the node,
//! module, policy, event and metrics handlers. The cell handlers are in
//! `cells.rs`.
//!
//! Everything that arrives here is hostile until checked: identifiers in
//! paths are checked by one middleware before any handler, and bodies are
//! bounded and checked field by field before anything is stored.

use std::sync::{Arc, PoisonError};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use roam_api::planner::{
    HeartbeatRequest, HeartbeatResponse, PoliciesResponse, PolicyInfo, PolicyRequest,
    RegisterRequest,
};
use roam_api::types::{ApiError, ModuleInfo};
use roam_cluster::{CellState, NodeRecord, NodeState, NodeStatus, StoreError};

use crate::caller::{self, Caller};
use crate::events::Event;
use crate::{cells, policy, unix_ms, Inner};

pub(crate) type P = State<Arc<Inner>>;

/// Most cells a node may report running.
pub(crate) const MAX_REPORTED_CELLS: usize = 65_536;
/// Longest address (`host:port` or URL) a node may register.
const MAX_ADDR_LEN: usize = 256;
/// Longest version string.
const MAX_VERSION_LEN: usize = 64;
/// The ISAs roam runs on.
const ISAS: [&str; 3] = ["x86_64", "aarch64", "riscv64"];

/// An error answer: status and message.
#[derive(Debug)]
pub(crate) struct AppError(pub StatusCode, pub String);

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        (self.0, Json(ApiError { error: self.1 })).into_response()
    }
}

impl From<StoreError> for AppError {
    fn from(e: StoreError) -> Self {
        let status = match &e {
            StoreError::Conflict { .. } | StoreError::Exists(_) => StatusCode::CONFLICT,
            StoreError::NotFound(_) => StatusCode::NOT_FOUND,
            StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
            StoreError::Expired(_) => StatusCode::GONE,
            StoreError::Backend { .. } => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::Corrupt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        AppError(status, e.to_string())
    }
}

pub(crate) fn bad(msg: impl Into<String>) -> AppError {
    AppError(StatusCode::BAD_REQUEST, msg.into())
}

pub(crate) fn router(n: Arc<Inner>) -> Router {
    let limit = usize::try_from(n.cfg.max_module_bytes).unwrap_or(usize::MAX);
    let router = Router::new()
        .route("/v1/nodes", post(register).get(list_nodes))
        .route("/v1/nodes/{name}/heartbeat", post(heartbeat))
        .route("/v1/nodes/{name}/drain", post(cells::drain))
        .route("/v1/nodes/{name}/undrain", post(cells::undrain))
        .route(
            "/v1/nodes/{name}/maintenance",
            axum::routing::put(crate::maintenance::declare).delete(crate::maintenance::cancel),
        )
        .route("/v1/modules", post(upload_module))
        .route("/v1/modules/{hash}", get(get_module))
        .route("/v1/cells", post(cells::launch).get(cells::list))
        .route("/v1/cells/{id}", get(cells::status))
        .route("/v1/cells/{id}/logs", get(cells::logs))
        .route("/v1/cells/{id}/kill", post(cells::kill))
        .route("/v1/cells/{id}/migrate", post(cells::migrate))
        .route("/v1/cells/{id}/checkpoint", post(cells::checkpoint))
        .route("/v1/cells/{id}/owner", post(cells::owner))
        .route("/v1/cells/{id}/handoff", post(cells::handoff))
        .route("/v1/services/{service}", get(crate::services::owners))
        .route("/v1/policies", get(policies).put(set_policy))
        .route("/v1/slowdowns", get(slowdowns))
        .route("/v1/events", get(events))
        .route("/metrics", get(metrics));
    let router = crate::dashboard::data(router)
        .route_layer(axum::middleware::from_fn(check_path_ids))
        // Outermost, so it runs first: who is calling, before anything of
        // the request is looked at.
        .route_layer(axum::middleware::from_fn_with_state(
            n.clone(),
            caller::identify,
        ))
        .layer(DefaultBodyLimit::max(limit));
    // The token check wraps every route: no handler runs without it. Only
    // the dashboard's shell and static files, which hold no data, are
    // outside it.
    roam_api::serve::guard(router, n.cfg.token.as_ref())
        .merge(crate::dashboard::public())
        // A gateway's certificate reaches only its one route, whatever the
        // router holds.
        .layer(axum::middleware::from_fn(
            caller::gateways_ask_only_services,
        ))
        // Outermost: a browser's request made by another site's page is
        // refused before anything else.
        .layer(axum::middleware::from_fn(
            crate::dashboard::same_origin_only,
        ))
        .with_state(n)
}

/// Refuse, with 400 and the reason, a request whose path parameters are
/// not valid identifiers, before any handler sees them (they become store
/// keys).
async fn check_path_ids(
    params: axum::extract::RawPathParams,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    for (key, value) in &params {
        let checked = match key {
            "name" => roam_wire::ident::check_node_name(value).map_err(|e| e.to_string()),
            "service" => roam_wire::ident::check_service_name(value).map_err(|e| e.to_string()),
            "hash" => roam_wire::ident::parse_module_hash(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => roam_wire::ident::check_cell_id(value).map_err(|e| e.to_string()),
        };
        if let Err(e) = checked {
            return bad(e).into_response();
        }
    }
    next.run(req).await
}

/// An address a node gives for itself: bounded, printable, no spaces.
fn check_addr(what: &str, s: &str) -> Result<(), AppError> {
    if s.is_empty() || s.len() > MAX_ADDR_LEN {
        return Err(bad(format!(
            "{what} must be 1 to {MAX_ADDR_LEN} characters (host:port or an http(s):// URL)"
        )));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(format!(
            "{what} {s:?} holds spaces or characters outside printable ASCII"
        )));
    }
    Ok(())
}

/// A node's reported status: bounded, and every cell id valid.
/// Most cores a node may report (as many as `roam node --cores` takes).
const MAX_CORES: usize = 65_535;

pub(crate) fn check_status(s: &NodeStatus) -> Result<(), AppError> {
    if s.cells.len() > MAX_REPORTED_CELLS {
        return Err(bad(format!(
            "the status lists {} cells, more than the {MAX_REPORTED_CELLS} a node may run",
            s.cells.len()
        )));
    }
    for id in &s.cells {
        roam_wire::ident::check_cell_id(id).map_err(|e| bad(e.to_string()))?;
    }
    if s.usage.len() > MAX_REPORTED_CELLS {
        return Err(bad(format!(
            "the status reports the usage of {} cells, more than the {MAX_REPORTED_CELLS} a node may run",
            s.usage.len()
        )));
    }
    for u in &s.usage {
        roam_wire::ident::check_cell_id(&u.cell).map_err(|e| bad(e.to_string()))?;
    }
    if let Some(g) = &s.gateway {
        check_addr("gateway address", &g.address)?;
        if let Some(id) = &g.id {
            roam_wire::ident::check_node_name(id)
                .map_err(|e| bad(format!("gateway id {id:?}: {e}")))?;
        }
        if g.services.len() > MAX_REPORTED_CELLS {
            return Err(bad(format!(
                "the status lists {} services, more than the {MAX_REPORTED_CELLS} a node may serve",
                g.services.len()
            )));
        }
        for t in &g.services {
            roam_wire::ident::check_service_name(&t.service).map_err(|e| bad(e.to_string()))?;
            roam_wire::ident::check_cell_id(&t.cell).map_err(|e| bad(e.to_string()))?;
        }
    }
    if s.machine.cores > MAX_CORES {
        return Err(bad(format!(
            "the status reports {} cores, more than {MAX_CORES}",
            s.machine.cores
        )));
    }
    if let Some(p) = &s.power {
        p.check(s.machine.cores)
            .map_err(|e| bad(format!("power: {e}")))?;
    }
    Ok(())
}

fn check_register(r: &RegisterRequest) -> Result<(), AppError> {
    roam_wire::ident::check_node_name(&r.name).map_err(|e| bad(e.to_string()))?;
    if !ISAS.contains(&r.isa.as_str()) {
        return Err(bad(format!(
            "unknown ISA {:?}: roam runs on {}",
            r.isa,
            ISAS.join(", ")
        )));
    }
    check_addr("api", &r.api)?;
    check_addr("migrate", &r.migrate)?;
    if r.version.is_empty()
        || r.version.len() > MAX_VERSION_LEN
        || !r.version.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad(format!(
            "version must be 1 to {MAX_VERSION_LEN} printable characters"
        )));
    }
    check_status(&r.status)
}

/// The answer to a registration or heartbeat of `node` reporting `running`.
async fn answer(n: &Inner, node: &str, running: &[String]) -> Result<HeartbeatResponse, AppError> {
    let lease_ms = n.cfg.lease.as_millis() as u64;
    let stop = stop_list(n, node, running).await?;
    Ok(HeartbeatResponse {
        heartbeat_ms: (lease_ms / 3).max(1),
        lease_ms,
        stop: stop.iter().map(|(id, _)| id.clone()).collect(),
        stop_generations: stop.into_iter().collect(),
    })
}

/// The cells `node` runs but must stop: another node owns them, or they
/// ended (killed while the node was cut off). A cell the cluster does not
/// know (launched on the node directly) is left alone, and so is a cell
/// migrating to `node` (it owns it once the migration commits).
/// Each with the generation of the record it was decided on.
pub(crate) async fn stop_list(
    n: &Inner,
    node: &str,
    running: &[String],
) -> Result<Vec<(String, u64)>, AppError> {
    let mut stop = Vec::new();
    for id in running {
        let Some(c) = n.timed("cell", n.store.cell(id)).await? else {
            continue;
        };
        let c = c.value;
        let arriving = matches!(&c.state, CellState::Migrating { to } if to == node);
        if (c.owner != node && !arriving) || c.state.ended() {
            stop.push((id.clone(), c.generation));
        }
    }
    Ok(stop)
}

async fn register(
    State(n): P,
    Extension(caller): Extension<Caller>,
    Json(r): Json<RegisterRequest>,
) -> Result<Json<HeartbeatResponse>, AppError> {
    check_register(&r)?;
    caller.may_act_as(&r.name)?;
    let nodes = n.timed("nodes", n.store.nodes()).await?;
    // A node that registers again stays draining if it was, and keeps its
    // maintenance window.
    let before = nodes.iter().find(|x| x.name == r.name);
    let state = before.map_or(NodeState::Ready, |x| x.state);
    let maintenance = before.and_then(|x| x.maintenance);
    let now = unix_ms();
    let running = r.status.cells.clone();
    let rec = NodeRecord {
        name: r.name.clone(),
        isa: r.isa.clone(),
        api: r.api,
        migrate: r.migrate,
        version: r.version,
        status: r.status,
        state,
        alive: true,
        registered_ms: now,
        heartbeat_ms: now,
        maintenance,
    };
    n.timed("register_node", n.store.register_node(rec, n.cfg.lease))
        .await?;
    n.events.send(Event::NodeRegistered {
        node: r.name.clone(),
        isa: r.isa,
    });
    Ok(Json(answer(&n, &r.name, &running).await?))
}

async fn heartbeat(
    State(n): P,
    Path(name): Path<String>,
    Extension(caller): Extension<Caller>,
    Json(h): Json<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, AppError> {
    caller.may_act_as(&name)?;
    check_status(&h.status)?;
    let running = h.status.cells.clone();
    n.timed("heartbeat", n.store.heartbeat(&name, h.status))
        .await
        .map_err(|e| match e {
            StoreError::Expired(_) | StoreError::NotFound(_) => AppError(
                StatusCode::GONE,
                format!(
                    "node {name} is not registered or its lease expired: register again \
                     (POST /v1/nodes)"
                ),
            ),
            e => e.into(),
        })?;
    Ok(Json(answer(&n, &name, &running).await?))
}

async fn list_nodes(State(n): P) -> Result<Json<Vec<NodeRecord>>, AppError> {
    let mut nodes = n.timed("nodes", n.store.nodes()).await?;
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(nodes))
}

async fn upload_module(
    State(n): P,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<ModuleInfo>, AppError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the module is larger than the planner's limit of {} (raise it with \
                     roam planner --max-module-size)",
                    policy::human(n.cfg.max_module_bytes)
                ),
            )
        } else {
            AppError(e.status(), e.body_text())
        }
    })?;
    if body.len() < 8 || &body[..4] != b"\0asm" {
        return Err(bad(
            "this is not a WebAssembly module (no \\0asm header): upload the .wasm file",
        ));
    }
    let hash = blake3::hash(&body).to_hex().to_string();
    n.timed("put_module", n.store.put_module(&hash, &body))
        .await?;
    Ok(Json(ModuleInfo {
        hash,
        bytes: body.len() as u64,
    }))
}

async fn get_module(State(n): P, Path(hash): Path<String>) -> Result<Response, AppError> {
    let bytes = n
        .timed("module", n.store.module(&hash))
        .await?
        .ok_or_else(|| {
            AppError(
                StatusCode::NOT_FOUND,
                format!("no module {hash} in the repository: upload it with POST /v1/modules"),
            )
        })?;
    Ok(([(header::CONTENT_TYPE, "application/wasm")], bytes).into_response())
}

fn policies_of(n: &Inner) -> PoliciesResponse {
    PoliciesResponse {
        placement: n.placement().to_string(),
        available: policy::all()
            .iter()
            .map(|p| PolicyInfo {
                name: p.name().to_string(),
                description: p.description().to_string(),
            })
            .collect(),
    }
}

async fn slowdowns(State(n): P) -> Json<crate::slowdown::Table> {
    Json(crate::lock(&n.learner).table.clone())
}

async fn policies(State(n): P) -> Json<PoliciesResponse> {
    Json(policies_of(&n))
}

async fn set_policy(
    State(n): P,
    Json(r): Json<PolicyRequest>,
) -> Result<Json<PoliciesResponse>, AppError> {
    let p = policy::by_name(&r.placement).ok_or_else(|| {
        let names: Vec<&str> = policy::all().iter().map(|p| p.name()).collect();
        bad(format!(
            "unknown policy {:?}: choose one of {}",
            r.placement,
            names.join(", ")
        ))
    })?;
    // Stored first: every planner follows the store, so a policy only this
    // planner knew would be undone by its own next refresh.
    n.timed(
        "put_setting",
        n.store.put_setting(crate::placement::SETTING, p.name()),
    )
    .await?;
    *n.placement.write().unwrap_or_else(PoisonError::into_inner) = p.name();
    tracing::info!(placement = p.name(), "placement policy set");
    Ok(Json(policies_of(&n)))
}

async fn events(State(n): P) -> impl IntoResponse {
    n.events.sse()
}

async fn metrics(State(n): P) -> Result<Response, AppError> {
    let nodes = n.timed("nodes", n.store.nodes()).await?;
    let cells: Vec<_> = n
        .timed("cells", n.store.cells())
        .await?
        .into_iter()
        .map(|c| c.value)
        .collect();
    let text = n.metrics.render(&nodes, &cells, unix_ms());
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
