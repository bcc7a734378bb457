//! Serving a roam API: the TLS listener and the bearer-token check that
//! a node's control API and the planner's API share (`docs/trust.md`).
//!
//! Why here: both daemons must admit exactly the same callers under the
//! same rules; one copy of the code keeps one reading of them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use roam_auth::tokio_rustls::{server::TlsStream, TlsAcceptor};
use roam_auth::Token;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// How long a peer may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The control API's listener over TLS, for `axum::serve`. Handshakes run
/// in tasks of their own (with a timeout), so a client that connects and
/// says nothing holds up no one else.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accept TLS connections on `l` with `acceptor`.
    pub fn new(l: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
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
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, "control API: TLS handshake refused: {e}")
                        }
                        Err(_) => tracing::warn!(%peer, "control API: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local, task })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (it does not, short of a panic).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
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
