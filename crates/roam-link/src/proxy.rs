//! The TCP proxy that stands in for a slow, unreliable network.
//!
//! roam's migration protocol is tested against links that are slow, far and
//! broken. Rather than needing root and kernel qdiscs in every test, the
//! test puts a [`LinkProxy`] between the two ends: it accepts on a local
//! port, connects each accepted client to the real target and forwards both
//! directions through [`pipe`](crate::pipe), while a
//! [`LinkHandle`] injects cuts and corruption.
//!
//! Every task the proxy spawns ends on [`LinkProxy::shutdown`] (or when the
//! proxy is dropped): the accept loop stops, open connections are reset and
//! awaited.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::config::{Direction, LinkConfig};
use crate::control::{LinkHandle, Shared};
use crate::pipe::{pipe, PipeSpec};

/// Why a proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The bound socket has no readable local address.
    #[error("cannot read the local address of the socket bound to {addr}: {source}")]
    LocalAddr {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's reason.
        source: io::Error,
    },
}

/// A TCP forwarder with an emulated link in each direction.
///
/// ```no_run
/// # async fn demo(server: std::net::SocketAddr) -> Result<(), roam_link::LinkError> {
/// use std::time::Duration;
/// use roam_link::{parse_rate, LinkConfig, LinkProxy};
/// let link = LinkConfig::symmetric(parse_rate("10mbit").unwrap(), Duration::from_millis(20));
/// let proxy = LinkProxy::start("127.0.0.1:0".parse().unwrap(), server, link).await?;
/// // Connect to proxy.local_addr() instead of server ...
/// proxy.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LinkProxy {
    local_addr: SocketAddr,
    handle: LinkHandle,
    task: Option<JoinHandle<()>>,
}

impl LinkProxy {
    /// Listens on `listen` (port 0 picks a free port) and forwards every
    /// accepted connection to `target` through the link described by
    /// `config`. Must be called inside a tokio runtime with timers enabled.
    pub async fn start(
        listen: SocketAddr,
        target: SocketAddr,
        config: LinkConfig,
    ) -> Result<LinkProxy, LinkError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| LinkError::Bind {
                addr: listen,
                source,
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| LinkError::LocalAddr {
                addr: listen,
                source,
            })?;
        let shared = Shared::new();
        let task = tokio::spawn(accept_loop(listener, target, config, Arc::clone(&shared)));
        Ok(LinkProxy {
            local_addr,
            handle: LinkHandle { shared },
            task: Some(task),
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle for faults and counters; it stays usable after shutdown.
    pub fn handle(&self) -> LinkHandle {
        self.handle.clone()
    }

    /// Stops accepting, resets every open connection and waits until all
    /// of the proxy's tasks have ended.
    pub async fn shutdown(mut self) {
        self.handle.shared.request_shutdown();
        if let Some(task) = self.task.take() {
            // A panic in the accept loop has nothing left to clean up.
            let _ = task.await;
        }
    }
}

impl Drop for LinkProxy {
    /// Dropping without [`LinkProxy::shutdown`] still stops every task,
    /// only without waiting for them.
    fn drop(&mut self) {
        self.handle.shared.request_shutdown();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    config: LinkConfig,
    shared: Arc<Shared>,
) {
    let mut stop = shared.shutdown_watch();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // wait_for returns at once if shutdown was already requested,
            // and also ends the loop if every sender is gone.
            _ = stop.wait_for(|stopped| *stopped) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                // Accept errors (e.g. out of descriptors) are per-connection:
                // keep listening.
                let Ok((client, _)) = accepted else { continue };
                if shared.is_refusing() {
                    shared.note_refused();
                    reset(client);
                    continue;
                }
                shared.note_accepted();
                let cuts = shared.cut_watch();
                connections.spawn(connection(client, target, config, Arc::clone(&shared), cuts));
            }
        }
    }
    drop(listener);
    shared.cut_all();
    while connections.join_next().await.is_some() {}
}

/// Closes `stream` with a TCP reset instead of an orderly FIN.
fn reset(stream: TcpStream) {
    // If SO_LINGER cannot be set the close is orderly, which the peer still
    // sees as the end of the connection.
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn connection(
    mut client: TcpStream,
    target: SocketAddr,
    config: LinkConfig,
    shared: Arc<Shared>,
    mut cuts: watch::Receiver<u64>,
) {
    let _active = shared.active_guard();
    cuts.borrow_and_update();
    let server = tokio::select! {
        connected = TcpStream::connect(target) => connected,
        _ = cuts.changed() => Err(io::Error::other("cut while connecting")),
    };
    let mut server = match server {
        Ok(server) => server,
        Err(_) => {
            shared.note_connect_failure();
            reset(client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let up = Direction::ClientToServer;
    let down = Direction::ServerToClient;
    let spec = |dir| PipeSpec {
        dir,
        config: *config.direction(dir),
        in_flight: config.in_flight_limit(dir),
        corrupt_at: shared.claim_corruption(dir),
        shared: &shared,
    };
    let (up_spec, down_spec) = (spec(up), spec(down));
    let clean = {
        let (client_rd, client_wr) = client.split();
        let (server_rd, server_wr) = server.split();
        let both = async {
            tokio::try_join!(
                pipe(client_rd, server_wr, up_spec),
                pipe(server_rd, client_wr, down_spec)
            )
        };
        tokio::select! {
            result = both => result.is_ok(),
            _ = cuts.changed() => false,
        }
    };
    if !clean {
        // A cut, or one side failed: the other side must not mistake what
        // it received for a complete stream, so reset both.
        reset(client);
        reset(server);
    }
}
