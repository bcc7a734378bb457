//! The accept loop of a roam API: every connection under a cap, and every
//! request head under a deadline.
//!
//! Why not `axum::serve`: it sets no timer, so hyper never times out a
//! request head, and it accepts without bound. A client that opens
//! connections and sends a byte a minute (slowloris) would hold a task and
//! a socket each until the process runs out of file descriptors. Here
//! hyper's HTTP/1 connection gets a timer and a header deadline, and a
//! semaphore caps the connections open at once: at the cap the loop stops
//! accepting (new clients wait in the kernel's backlog) until one closes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{watch, Semaphore};

use super::Peer;

/// Caps of an API's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long a client may take to send a request's head (line and
    /// headers), on a new connection or between requests of a kept-alive
    /// one.
    pub header_timeout: Duration,
    /// After shutdown, how long open connections get to finish.
    pub grace: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(15),
            grace: Duration::from_secs(2),
        }
    }
}

/// An address a listener hands out, as the [`Peer`] handlers see.
pub trait IntoPeer {
    /// The peer.
    fn into_peer(self) -> Peer;
}

impl IntoPeer for Peer {
    fn into_peer(self) -> Peer {
        self
    }
}

impl IntoPeer for std::net::SocketAddr {
    fn into_peer(self) -> Peer {
        Peer {
            addr: self,
            id: None,
        }
    }
}

/// Serve `app` on `listener` until `shutdown` resolves, under `limits`.
/// Handlers find the caller as `ConnectInfo<Peer>`. After shutdown, open
/// connections finish their request in flight (at most `limits.grace`).
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send,
) where
    L: axum::serve::Listener,
    L::Addr: IntoPeer,
{
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (io, addr) = tokio::select! {
            x = listener.accept() => x,
            () = &mut shutdown => break,
        };
        let peer = addr.into_peer();
        let svc = TowerToHyperService::new(app.clone().layer(axum::Extension(ConnectInfo(peer))));
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = b.serve_connection(TokioIo::new(io), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("API connection ended: {e}");
                    }
                }
                _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every permit back: every connection closed, or the grace is over.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(limits.grace, open.acquire_many(all)).await;
}

#[cfg(test)]
#[path = "conns_tests.rs"]
mod tests;
