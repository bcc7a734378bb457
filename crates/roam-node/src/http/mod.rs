//! The HTTP/JSON control API (`docs/node-api.md`): the only part of the
//! node that knows axum.
//!
//! Each handler takes the request apart, calls one operation of the node's
//! core (`cells`, `kept`, `migrate`) and turns its answer, or its
//! [`NodeError`], into a response. Nothing is decided here but how to
//! speak HTTP: the checks, the state and the rules are below.

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use roam_api::serve::{guard, only, TlsListener};
use roam_auth::Role;
use tokio::net::TcpListener;

use crate::error::NodeError;
use crate::state::NodeInner;
use crate::types::ApiError;

mod cells;
mod kept;
mod migrate;

type N = axum::extract::State<Arc<NodeInner>>;

/// A [`NodeError`] as an HTTP answer.
pub(crate) struct AppError(NodeError);

impl From<NodeError> for AppError {
    fn from(e: NodeError) -> AppError {
        AppError(e)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            NodeError::Forbidden(_) => StatusCode::FORBIDDEN,
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Conflict(_) => StatusCode::CONFLICT,
            NodeError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            NodeError::Upstream(_) => StatusCode::BAD_GATEWAY,
            NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let error = self.0.to_string();
        (status, Json(ApiError { error })).into_response()
    }
}

type Answer<T> = Result<T, AppError>;

/// Operators and the planner: everything that starts, stops, moves or
/// reads out cells.
const OPERATORS: &[Role] = &[Role::Planner, Role::Client];
/// Other nodes only: a migration's source asking its destination, an
/// owner storing a kept checkpoint on its holder, a node restoring from
/// one.
const NODES: &[Role] = &[Role::Node];
/// The planner only: it alone knows which kept checkpoint it recorded.
const PLANNER: &[Role] = &[Role::Planner];

/// The routes, grouped by who may call them (`docs/trust.md`, "The node
/// control API's routes by caller").
fn router(n: Arc<NodeInner>) -> Router {
    // Whoever the listener admitted.
    let anyone = Router::new()
        .route("/v1/node", get(cells::node_info))
        .route("/metrics", get(cells::metrics))
        // A source whose post-copy broke asks its destination too.
        .route("/v1/cells/{id}", get(cells::status));
    let operators = Router::new()
        .route("/v1/modules", post(cells::upload_module))
        .route("/v1/cells", post(cells::launch).get(cells::list))
        .route("/v1/cells/{id}/logs", get(cells::logs))
        .route("/v1/cells/{id}/kill", post(cells::kill))
        .route("/v1/cells/{id}/checkpoint", post(cells::checkpoint))
        .route("/v1/cells/{id}/keep", post(kept::keep))
        .route("/v1/cells/restore", post(kept::restore))
        .route("/v1/cells/{id}/migrate", post(migrate::start))
        .route("/v1/migrations/{id}", get(migrate::status));
    let nodes = Router::new()
        .route("/v1/kept/{id}", get(kept::get).put(kept::put))
        .route("/v1/kept/{id}/missing", post(kept::missing))
        .route("/v1/migrations/{id}/resolve", post(migrate::resolve))
        .route("/v1/migrations/{id}/timings", get(migrate::timings));
    let planner = Router::new().route("/v1/kept/{id}/commit", post(kept::commit));
    // The planner grants a node access to a kept checkpoint; an operator
    // running a cluster by hand may too.
    let granters = Router::new().route("/v1/kept/{id}/grant", post(kept::grant));
    let router = anyone
        .merge(only(operators, OPERATORS))
        .merge(only(nodes, NODES))
        .merge(only(planner, PLANNER))
        .merge(only(granters, OPERATORS))
        .route_layer(axum::middleware::from_fn(check_path_ids))
        .layer(DefaultBodyLimit::max(body_limit(&n)));
    // The token check wraps every route: no handler runs without it.
    guard(router, n.auth.token.as_ref()).with_state(n)
}

/// Serve the control API on `listener` (with TLS when the node has it)
/// until `shutdown` resolves.
pub(crate) async fn serve(
    n: Arc<NodeInner>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = router(n.clone());
    // A request head within 15 s, at most 1,024 connections at once.
    let limits = roam_api::serve::ConnLimits::default();
    match n.auth.control.clone() {
        Some(acceptor) => {
            let l = TlsListener::new(listener, acceptor)
                .map_err(|e| anyhow::anyhow!("control API failed: {e}"))?;
            roam_api::serve::serve(l, app, limits, shutdown).await
        }
        None => roam_api::serve::serve(listener, app, limits, shutdown).await,
    }
    Ok(())
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
            return AppError(NodeError::bad(e)).into_response();
        }
    }
    next.run(req).await
}
