//! Serving a roam API: the TLS listener, with the certificate roles it
//! admits, and the bearer-token check that a node's control API and the
//! planner's API share (`docs/trust.md`).
//!
//! Why here: both daemons must admit exactly the same callers under the
//! same rules; one copy of the code keeps one reading of them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::serve::IncomingStream;
use roam_auth::tokio_rustls::{server::TlsStream, TlsAcceptor};
use roam_auth::{PeerId, Role, Token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

mod conns;

pub use conns::{serve, ConnLimits, IntoPeer};

/// How long a peer may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The roles a node's control API admits: other nodes (a source calls
/// the destination's `resolve`, an owner stores kept checkpoints on a
/// holder), the planner and operators. Never a gateway: the part of the
/// cluster that faces the internet must not be able to launch or push
/// cells.
pub const NODE_API_ROLES: &[Role] = &[Role::Node, Role::Planner, Role::Client];

/// Who is at the other end of an API connection: its address and, under
/// TLS, what its certificate says (already admitted by the listener). The
/// `ConnectInfo` of both listeners, for handlers that check more than the
/// role.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The remote address.
    pub addr: SocketAddr,
    /// The certificate's role and name; `None` without TLS.
    pub id: Option<PeerId>,
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        stream.remote_addr().clone()
    }
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer {
            addr: *stream.remote_addr(),
            id: None,
        }
    }
}

/// An API's listener over TLS, for `axum::serve`. Handshakes run in tasks
/// of their own (with a timeout), so a client that connects and says
/// nothing holds up no one else. A peer whose certificate's role is not
/// admitted gets `403` and the reason, and its connection never reaches
/// the router.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, Peer)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accept TLS connections on `l` with `acceptor`, admitting the roles
    /// of a node's control API ([`NODE_API_ROLES`]).
    pub fn new(l: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        TlsListener::admitting(l, acceptor, NODE_API_ROLES)
    }

    /// Accept TLS connections on `l` with `acceptor`, admitting peers whose
    /// certificate carries one of `roles`.
    pub fn admitting(
        l: TcpListener,
        acceptor: TlsAcceptor,
        roles: &'static [Role],
    ) -> std::io::Result<TlsListener> {
        let local = l.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(async move {
            loop {
                let (sock, peer) = match l.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!("accepting a control connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let s = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, "API: TLS handshake refused: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(%peer, "API: TLS handshake timed out");
                            return;
                        }
                    };
                    let cert = s.get_ref().1.peer_certificates().and_then(|c| c.first());
                    let admitted = match cert {
                        Some(c) => roam_auth::role::admit(c, roles),
                        // The acceptor requires a certificate; this is a bug.
                        None => {
                            tracing::error!(%peer, "API: a TLS peer without a certificate");
                            return;
                        }
                    };
                    match admitted {
                        Ok(id) => {
                            let _ = tx
                                .send((
                                    s,
                                    Peer {
                                        addr: peer,
                                        id: Some(id),
                                    },
                                ))
                                .await;
                        }
                        Err(e) => {
                            tracing::warn!(%peer, "API: refused: {e}");
                            forbid(s, &e.to_string()).await;
                        }
                    }
                });
            }
        });
        Ok(TlsListener { rx, local, task })
    }
}

/// Answer a refused peer's first request with `403` and `why`, then
/// close. The request head is read first (bounded in size and time), so
/// the answer is not lost to a reset from unread bytes.
async fn forbid(mut s: TlsStream<TcpStream>, why: &str) {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let body = serde_json::to_vec(&crate::types::ApiError {
        error: format!("forbidden: {why}"),
    })
    .unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        s.write_all(&out).await?;
        s.shutdown().await
    })
    .await;
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (it does not, short of a panic).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.local,
            id: None,
        })
    }
}

/// Middleware: without the node's token in `Authorization: Bearer`, a
/// request gets `401` and a JSON error, and reaches no handler.
pub async fn require_token(State(token): State<Token>, req: Request, next: Next) -> Response {
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|h| token.matches_header(h.as_bytes()));
    if ok {
        return next.run(req).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(crate::types::ApiError {
            error: "missing or wrong bearer token: give the token with --token-file \
                    or ROAM_TOKEN"
                .into(),
        }),
    )
        .into_response()
}

/// Let only `roles` call the routes of `router` (a route layer, so it
/// applies to the routes already added). Under TLS a caller whose
/// certificate holds another role gets `403`, naming the roles that may;
/// without TLS there is no role to check, and every caller that passed the
/// token check is trusted alike (`docs/trust.md`).
///
/// Why per route: the listener admits every role that calls *some* route
/// ([`NODE_API_ROLES`]), but each route has its own callers. Another
/// node has no business launching or killing cells, and an operator none
/// storing a kept checkpoint on a holder.
pub fn only<S>(router: axum::Router<S>, roles: &'static [Role]) -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    router.route_layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let refused = req
                .extensions()
                .get::<axum::extract::ConnectInfo<Peer>>()
                .and_then(|c| c.0.id.as_ref())
                .filter(|id| !roles.contains(&id.role))
                .map(|id| {
                    let may: Vec<&str> = roles.iter().map(|r| r.name()).collect();
                    format!(
                        "forbidden: {id} may not call {} {}; only a {} certificate may",
                        req.method(),
                        req.uri().path(),
                        may.join(" or ")
                    )
                });
            async move {
                match refused {
                    None => next.run(req).await,
                    Some(error) => (
                        StatusCode::FORBIDDEN,
                        axum::Json(crate::types::ApiError { error }),
                    )
                        .into_response(),
                }
            }
        },
    ))
}

/// Wrap `router` in the token check when the node has a token.
pub fn guard<S>(router: axum::Router<S>, token: Option<&Token>) -> axum::Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    match token {
        Some(t) => router.layer(axum::middleware::from_fn_with_state(
            t.clone(),
            require_token,
        )),
        None => router,
    }
}

#[cfg(test)]
mod tests;
