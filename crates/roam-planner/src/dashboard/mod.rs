//! The web dashboard (`docs/dashboard.md`): the planner serves a page at
//! `/` that shows the nodes, the cells, a timeline of the migrations it
//! started and the placement decisions it took, with buttons for the safe
//! actions (migrate, drain, undrain, kill).
//!
//! Why server-rendered fragments and one hand-written script: nothing to
//! build beyond cargo, nothing fetched from elsewhere, and every string
//! from the store or a node (hostile until shown otherwise) is escaped in
//! one place, in Rust, where it is tested (`fmt::esc`). The script only
//! fetches fragments, puts them in the page, and sends the actions.
//!
//! How a browser is let in: the shell (`/`) and its two static files hold
//! no data and are served to anyone who reaches the listener (under TLS,
//! only a node or client certificate does). Everything else, the
//! fragments (`GET /v1/dashboard/{view}`) and the actions, which are the
//! API's own routes, pass the same token check and caller check as the
//! API: the script sends the bearer token the operator pasted (kept in the
//! tab's `sessionStorage`), and under mutual TLS the browser presents its
//! client certificate. Because a browser sends a client certificate on its
//! own, [`same_origin_only`] refuses every request another site's page
//! makes, so such a page cannot make the browser drain a node.

mod cells;
mod decisions;
mod fmt;
mod migrations;
mod nodes;
mod slowdowns;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::api::{AppError, P};
use crate::{unix_ms, Inner};

const SHELL: &str = include_str!("shell.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

/// What a page from the planner may load and do: its own script and
/// style, nothing inline, no frames (no clickjacking of the buttons).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
                   form-action 'none'";

/// The public part: the shell and its static files, no data.
pub(crate) fn public() -> Router<Arc<Inner>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset(SHELL, "text/html; charset=utf-8") }),
        )
        .route(
            "/dashboard/app.js",
            get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/dashboard/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
}

/// The data routes, added to the API's router so that they pass its
/// token and caller checks.
pub(crate) fn data(r: Router<Arc<Inner>>) -> Router<Arc<Inner>> {
    r.route("/v1/dashboard/nodes", get(nodes_view))
        .route("/v1/dashboard/cells", get(cells_view))
        .route("/v1/dashboard/migrations", get(migrations_view))
        .route("/v1/dashboard/decisions", get(decisions_view))
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, kind)], body).into_response();
    harden(r.headers_mut());
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn harden(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
}

/// A fragment of HTML, never cached (it is live data).
fn fragment(html: String) -> Response {
    let mut r = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response();
    harden(r.headers_mut());
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn nodes_view(State(n): P) -> Result<Response, AppError> {
    let (nodes, cells) = crate::cells::snapshot(&n).await?;
    Ok(fragment(nodes::render(&nodes, &cells, unix_ms())))
}

async fn cells_view(State(n): P) -> Result<Response, AppError> {
    let (nodes, cells) = crate::cells::snapshot(&n).await?;
    Ok(fragment(cells::render(&nodes, &cells, unix_ms())))
}

async fn migrations_view(State(n): P) -> Response {
    fragment(migrations::render(&n.history.migrations(), unix_ms()))
}

async fn decisions_view(State(n): P) -> Response {
    let active = n.placement();
    let description = crate::policy::by_name(active).map(|p| p.description());
    let table = crate::lock(&n.learner).table.clone();
    let mut h = decisions::render(active, description, &n.history.decisions(), unix_ms());
    h.push_str(&slowdowns::render(&table));
    fragment(h)
}

/// Middleware on every route of the planner: refuse a request a browser
/// makes on behalf of another site's page (`Sec-Fetch-Site` other than
/// `same-origin` or `none`, or an `Origin` that is not this host).
///
/// Why: under mutual TLS a browser that holds an operator's certificate
/// presents it to any request, including one a hostile page sends with a
/// form or `fetch`; without this, that page could drain a node or kill a
/// cell. The `roam` commands and other programs send neither header and
/// are not affected.
pub(crate) async fn same_origin_only(req: Request, next: Next) -> Response {
    if let Err(why) = same_origin(req.headers()) {
        return AppError(StatusCode::FORBIDDEN, why).into_response();
    }
    next.run(req).await
}

fn same_origin(h: &HeaderMap) -> Result<(), String> {
    let refuse = |what: &str| {
        Err(format!(
            "refused: {what}; the planner answers browsers only from its own pages \
             (docs/dashboard.md)"
        ))
    };
    if let Some(site) = h.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return refuse("a request from another site's page (Sec-Fetch-Site)");
        }
    }
    if let Some(origin) = h.get(header::ORIGIN) {
        let host = h.get(header::HOST).map(HeaderValue::as_bytes);
        let origin = origin.as_bytes();
        let ours = host.is_some_and(|host| {
            [&b"http://"[..], b"https://"]
                .iter()
                .any(|scheme| origin.strip_prefix(*scheme) == Some(host))
        });
        if !ours {
            return refuse("a request whose Origin is not this planner");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
