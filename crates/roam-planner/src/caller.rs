//! Who may call which planner route (`docs/trust.md`).
//!
//! Why a module of its own: the planner serves two kinds of caller with
//! one API. Nodes register, heartbeat and take the ownership of cells that
//! migrate to them; operators do everything else. Under TLS each call is
//! tied to the certificate that made it, so a node can speak only for
//! itself (its certificate's name must be the node the request names) and
//! can do nothing an operator does, and an operator cannot pose as a node
//! (heartbeat for a dead one, overwrite its addresses). The listener has
//! already refused every role but `node`, `client` and `gateway`
//! ([`ADMITTED`]). A gateway asks exactly one question, who may serve a
//! service (`GET /v1/services/{service}`), so that a rogue node cannot take
//! a service's clients; [`gateways_ask_only_services`] answers its
//! certificate `403` on every other path, the dashboard's and unknown ones
//! included.
//!
//! Without TLS (plain or token mode) there is no identity to check: every
//! caller that passed the token check is trusted alike.

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use roam_api::serve::Peer;
use roam_auth::Role;

use crate::api::{AppError, P};

/// The roles the planner's listener admits.
pub(crate) const ADMITTED: &[Role] = &[Role::Node, Role::Client, Role::Gateway];

/// Who made a request, as the route handlers see it.
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// No TLS: no identity to check.
    Anyone,
    /// A node, by its certificate's name.
    Node(String),
    /// An operator, by its certificate's name.
    Operator(String),
    /// A gateway, by its certificate's name (on its one route only).
    Gateway(String),
}

impl Caller {
    /// May this caller speak for node `node` (register it, heartbeat for
    /// it, take a cell's ownership to it)? Only that node itself, or
    /// anyone without TLS.
    pub(crate) fn may_act_as(&self, node: &str) -> Result<(), AppError> {
        match self {
            Caller::Anyone => Ok(()),
            Caller::Node(me) if me == node => Ok(()),
            Caller::Node(me) => Err(AppError(
                StatusCode::FORBIDDEN,
                format!(
                    "the certificate is node `{me}`'s: it may speak only for `{me}`, \
                     not for `{node}`"
                ),
            )),
            Caller::Operator(who) => Err(AppError(
                StatusCode::FORBIDDEN,
                format!("`{who}` holds a client certificate: only node `{node}` may do this"),
            )),
            Caller::Gateway(who) => Err(AppError(
                StatusCode::FORBIDDEN,
                format!("`{who}` holds a gateway certificate: only node `{node}` may do this"),
            )),
        }
    }
}

/// The routes only nodes call: `POST /v1/nodes`,
/// `POST /v1/nodes/{name}/heartbeat`, `POST /v1/cells/{id}/owner` and
/// `POST /v1/cells/{id}/handoff`. `path`
/// is a path the router matched (this runs as a route layer), so each
/// `{...}` is exactly one segment.
fn node_route(method: &Method, path: &str) -> bool {
    let seg: Vec<&str> = path.split('/').collect();
    method == Method::POST
        && matches!(
            seg.as_slice(),
            ["", "v1", "nodes"]
                | ["", "v1", "nodes", _, "heartbeat"]
                | ["", "v1", "cells", _, "owner"]
                | ["", "v1", "cells", _, "handoff"]
        )
}

/// The one route a gateway calls: `GET /v1/services/{service}`.
fn gateway_route(method: &Method, path: &str) -> bool {
    let seg: Vec<&str> = path.split('/').collect();
    method == Method::GET && matches!(seg.as_slice(), ["", "v1", "services", s] if !s.is_empty())
}

/// Middleware around the whole API (dashboard and unknown paths included):
/// a gateway's certificate gets `403` anywhere but its one route. Before
/// the router, so that no route added later is open to gateways by
/// accident.
pub(crate) async fn gateways_ask_only_services(req: Request, next: Next) -> Response {
    let role = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .and_then(|c| c.0.id.as_ref())
        .map(|id| (id.role, id.name.clone()));
    if let Some((Role::Gateway, name)) = role {
        if !gateway_route(req.method(), req.uri().path()) {
            return forbidden(format!(
                "gateway `{name}`'s certificate may only ask who serves a service \
                 (GET /v1/services/NAME)"
            ));
        }
    }
    next.run(req).await
}

/// Middleware: tell who the caller is, refuse a node on an operator's
/// route and an operator on a node's, and give the handlers the
/// [`Caller`].
pub(crate) async fn identify(State(n): P, mut req: Request, next: Next) -> Response {
    let caller = if n.cfg.tls.is_none() {
        Caller::Anyone
    } else {
        let id = req
            .extensions()
            .get::<ConnectInfo<Peer>>()
            .and_then(|c| c.0.id.clone());
        match id {
            Some(id) if id.role == Role::Node => Caller::Node(id.name),
            Some(id) if id.role == Role::Client => Caller::Operator(id.name),
            Some(id) if id.role == Role::Gateway => Caller::Gateway(id.name),
            Some(id) => return forbidden(format!("a {id} certificate may not call the planner")),
            // Under TLS every connection carries its peer's certificate;
            // without one, refuse rather than guess.
            None => {
                return AppError(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "bug: a request without its peer's certificate on a TLS planner".into(),
                )
                .into_response()
            }
        }
    };
    let for_nodes = node_route(req.method(), req.uri().path());
    let for_gateways = gateway_route(req.method(), req.uri().path());
    match (&caller, for_nodes) {
        // Operators may ask too (a read of the cell records); nodes not.
        (Caller::Gateway(_) | Caller::Operator(_) | Caller::Anyone, _) if for_gateways => {}
        (Caller::Node(name), _) if for_gateways => {
            return forbidden(format!(
                "node `{name}`'s certificate may not ask who serves a service: gateways and \
                 operators do"
            ))
        }
        (Caller::Gateway(name), _) => {
            return forbidden(format!(
                "gateway `{name}`'s certificate may only ask who serves a service \
                 (GET /v1/services/NAME)"
            ))
        }
        (Caller::Node(name), false) => {
            return forbidden(format!(
                "node `{name}`'s certificate may only register, heartbeat, hand over \
                 and take ownership of cells; this call needs an operator's client certificate \
                 (`roam cert client NAME`)"
            ))
        }
        (Caller::Operator(name), true) => {
            return forbidden(format!(
                "`{name}` holds a client certificate: registering, heartbeats and ownership \
                 changes are made by nodes, with their own node certificates"
            ))
        }
        _ => {}
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

fn forbidden(why: String) -> Response {
    AppError(StatusCode::FORBIDDEN, why).into_response()
}
