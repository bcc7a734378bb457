//! The gateway (`roam gateway`): accepts clients for named services and
//! routes each connection to the node that runs the service's cell now.
//!
//! Why it keeps state: the rules of [`state`] let a client's connection
//! survive its cell moving, pausing, or a migration failing. Clients of a
//! service without a running cell (not launched yet, held for a move, its
//! node's link down) wait up to the wait timeout, then get the documented
//! error. Buffers are bounded per connection and in total; when full, the
//! gateway stops reading from the client (TCP backpressure) and never
//! drops a byte.
//!
//! Who may serve a service: under TLS a node is who its certificate says
//! (checked at `Hello`); with a [`ServeAuthority`] (`roam gateway
//! --planner`), a `Serve` that would change a route must also name the
//! node, cell and generation the planner's records give (`authority.rs`).

mod authority;
mod client;
mod node;
mod outq;
mod report;
mod routing;
mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use roam_auth::tokio_rustls::TlsAcceptor;
use roam_auth::Identity;
use roam_wire::ident::{check_service_name, InvalidIdent};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use state::{Limits, State};

pub use authority::{
    Assignment, AuthorityError, AuthorityFuture, ServeAuthority, ASK_TIMEOUT, CACHE_FOR,
};
pub use report::{encode_report, ClientReport, LinkReport, Report, ServiceReport, Traffic};

/// Default time a client waits for a service's cell.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default client->cell buffer per connection.
pub const DEFAULT_CONN_BUFFER: usize = 1 << 20;
/// Default client->cell buffer over all connections.
pub const DEFAULT_TOTAL_BUFFER: usize = 256 << 20;
/// Default most clients at once.
pub const DEFAULT_MAX_CLIENTS: usize = 10_000;
/// Default window per connection and direction offered to nodes (a node
/// may ask for less).
pub const DEFAULT_WINDOW: u64 = 256 << 10;
/// Default bytes queued to one node link, beyond the client bytes the
/// buffers hold, before the gateway gives up on a node that does not read.
pub const DEFAULT_LINK_BACKLOG: usize = 64 << 20;

/// One service: its name and where its clients connect.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The service's name (`roam launch --service NAME`).
    pub name: String,
    /// Where its clients connect.
    pub listen: SocketAddr,
    /// It speaks RESP: a client whose wait times out gets a `-ERR` line
    /// before the close.
    pub resp: bool,
}

/// What a gateway is started with. Every default is a `DEFAULT_*` constant.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// The services.
    pub services: Vec<ServiceConfig>,
    /// Where nodes connect.
    pub control: SocketAddr,
    /// Mutual TLS on the control port: the gateway's node-style
    /// certificate, and the CA that nodes' certificates must chain to.
    pub tls: Option<Identity>,
    /// Allow a plain control port on a non-loopback address.
    pub insecure: bool,
    /// How long a client waits for a cell.
    pub wait_timeout: Duration,
    /// Client->cell bytes buffered per connection.
    pub conn_buffer: usize,
    /// Client->cell bytes buffered over all connections.
    pub total_buffer: usize,
    /// Most clients at once; more wait in the listen backlog.
    pub max_clients: usize,
    /// Window per connection and direction offered to nodes.
    pub window: u64,
    /// Bytes queued to one node link beyond `total_buffer` before the
    /// gateway closes the link. Frames for connections that are gone (their
    /// data, `Open`, `Gone`) stay queued until the node reads them, so a
    /// node that never reads would otherwise grow the gateway's memory for
    /// as long as clients come and go.
    pub link_backlog: usize,
    /// Who may serve each service (`roam gateway --planner`): every `Serve`
    /// that would change a route must name the node, cell and generation
    /// it answers. `None`: any node that links may serve any service.
    pub authority: Option<Arc<dyn ServeAuthority>>,
}

impl GatewayConfig {
    /// A configuration with one service and every default.
    pub fn new(service: &str, listen: SocketAddr, control: SocketAddr) -> GatewayConfig {
        GatewayConfig {
            services: vec![ServiceConfig {
                name: service.to_string(),
                listen,
                resp: false,
            }],
            control,
            tls: None,
            insecure: false,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            conn_buffer: DEFAULT_CONN_BUFFER,
            total_buffer: DEFAULT_TOTAL_BUFFER,
            max_clients: DEFAULT_MAX_CLIENTS,
            window: DEFAULT_WINDOW,
            link_backlog: DEFAULT_LINK_BACKLOG,
            authority: None,
        }
    }
}

/// Why a gateway cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A service name fails its check.
    #[error("bad service name")]
    Name(#[from] InvalidIdent),
    /// Two services share a name.
    #[error("service {0} is given twice; give each service once")]
    Duplicate(String),
    /// No service.
    #[error("no service: give --service NAME with --listen ADDR, or --route NAME=ADDR")]
    NoService,
    /// A limit is zero or out of range.
    #[error("{0}")]
    Limit(String),
    /// A plain control port on a non-loopback address without `--insecure`.
    #[error("refusing a plain control port on {0}: any host that reaches it could pose as a node and read every client's bytes. Give --tls-ca, --tls-cert and --tls-key (`roam cert gateway NAME`), or listen on 127.0.0.1, or add --insecure if the network itself is trusted (see docs/gateway.md)")]
    Unauthenticated(SocketAddr),
    /// The gateway's certificate is not a gateway's.
    #[error("the gateway's certificate cannot be used: make one with `roam cert gateway NAME --ip ADDR` (see docs/trust.md)")]
    Role(#[source] roam_auth::RoleError),
    /// The TLS configuration could not be built.
    #[error("cannot build the TLS configuration of the control port")]
    Tls(#[from] roam_auth::rustls::Error),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what})")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What it is for.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// This gateway's id in `Pong`: drawn at start, `gw-` and 16 hex
    /// digits.
    id: String,
    identity: Option<Identity>,
    window: u64,
    /// The check of `Serve`s, with `--planner`.
    checker: Option<authority::Checker>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A bound gateway, ready to [`Gateway::run`].
pub struct Gateway {
    shared: Arc<Shared>,
    services: Vec<(String, TcpListener)>,
    control: TcpListener,
    acceptor: Option<TlsAcceptor>,
    wait_timeout: Duration,
    max_clients: usize,
}

/// What the gateway holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Clients connected.
    pub clients: usize,
    /// Client->cell bytes buffered (never above the total buffer).
    pub buffered_up: usize,
    /// Cell->client bytes buffered (at most one window per client).
    pub buffered_down: usize,
    /// Node links open.
    pub links: usize,
}

/// A handle to a running gateway's state, for status and tests.
#[derive(Clone)]
pub struct GatewayHandle(Arc<Shared>);

impl GatewayHandle {
    /// What the gateway holds now.
    pub fn stats(&self) -> Stats {
        let s = self.0.lock();
        Stats {
            clients: s.conns.len(),
            buffered_up: s.total_up,
            buffered_down: s.conns.values().map(|c| c.down.len()).sum(),
            links: s.links.len(),
        }
    }

    /// Where `service` runs: (node, cell, generation, held), if it has a
    /// cell whose node is connected.
    pub fn route(&self, service: &str) -> Option<(String, String, u64, bool)> {
        let s = self.0.lock();
        let svc = s.services.get(service)?;
        let r = svc.route.as_ref()?;
        r.link?;
        Some((r.node.clone(), r.cell.clone(), r.generation, svc.held))
    }
}

impl Gateway {
    /// Check the configuration and bind every listener.
    pub async fn bind(cfg: GatewayConfig) -> Result<Gateway, BindError> {
        if cfg.services.is_empty() {
            return Err(BindError::NoService);
        }
        for (i, s) in cfg.services.iter().enumerate() {
            check_service_name(&s.name)?;
            if cfg.services[..i].iter().any(|o| o.name == s.name) {
                return Err(BindError::Duplicate(s.name.clone()));
            }
        }
        if cfg.conn_buffer == 0 || cfg.total_buffer < cfg.conn_buffer {
            return Err(BindError::Limit(format!(
                "--conn-buffer ({}) must be at least 1 byte and at most --total-buffer ({})",
                cfg.conn_buffer, cfg.total_buffer
            )));
        }
        if cfg.max_clients == 0 {
            return Err(BindError::Limit("--max-clients must be at least 1".into()));
        }
        if !(crate::proto::MIN_WINDOW..=crate::proto::MAX_WINDOW).contains(&cfg.window) {
            return Err(BindError::Limit(format!(
                "the window must lie in {}..={} bytes",
                crate::proto::MIN_WINDOW,
                crate::proto::MAX_WINDOW
            )));
        }
        if cfg.tls.is_none() && !cfg.insecure && !cfg.control.ip().is_loopback() {
            return Err(BindError::Unauthenticated(cfg.control));
        }
        if let Some(id) = &cfg.tls {
            // A gateway started with a node's (or the planner's)
            // certificate would hold a key that opens nodes' control APIs.
            id.check_own_role(roam_auth::Role::Gateway)
                .map_err(BindError::Role)?;
        }
        let acceptor = cfg
            .tls
            .as_ref()
            .map(|id| id.server_config(crate::ALPN_GATEWAY).map(TlsAcceptor::from))
            .transpose()?;
        let bind = |addr: SocketAddr, what: String| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| BindError::Listen { addr, what, source })
        };
        let control = bind(cfg.control, "the control port for nodes".into()).await?;
        let mut services = Vec::new();
        for s in &cfg.services {
            let l = bind(s.listen, format!("clients of service {}", s.name)).await?;
            services.push((s.name.clone(), l));
        }
        let limits = Limits {
            conn_buffer: cfg.conn_buffer,
            total_buffer: cfg.total_buffer,
            link_queue: cfg.total_buffer.saturating_add(cfg.link_backlog),
        };
        let state = State::new(
            limits,
            cfg.services.iter().map(|s| (s.name.clone(), s.resp)),
        );
        Ok(Gateway {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                id: format!("gw-{:016x}", getrandom::u64().unwrap_or(0x5eed)),
                identity: cfg.tls,
                window: cfg.window,
                checker: cfg.authority.map(authority::Checker::new),
            }),
            services,
            control,
            acceptor,
            wait_timeout: cfg.wait_timeout,
            max_clients: cfg.max_clients,
        })
    }

    /// Where nodes connect.
    pub fn control_addr(&self) -> SocketAddr {
        self.control.local_addr().expect("a bound listener")
    }

    /// Where `service`'s clients connect.
    pub fn service_addr(&self, service: &str) -> Option<SocketAddr> {
        self.services
            .iter()
            .find(|(n, _)| n == service)
            .and_then(|(_, l)| l.local_addr().ok())
    }

    /// A handle for status.
    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle(self.shared.clone())
    }

    /// Serve until `shutdown` completes. When the gateway stops, clients
    /// lose their connections; cells keep theirs (see `docs/gateway.md`).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tasks = tokio::task::JoinSet::new();
        // Every client and node task ends when the gateway stops.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let spawn = move |f: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = f => {}
                    _ = stopped.wait_for(|s| *s) => {}
                }
            });
        };
        let slots = Arc::new(Semaphore::new(self.max_clients));
        for (name, l) in self.services {
            let shared = self.shared.clone();
            let slots = slots.clone();
            let spawn = spawn.clone();
            tasks.spawn(async move {
                loop {
                    // At the client limit, stop accepting: more clients
                    // wait in the kernel's listen backlog.
                    let Ok(permit) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    match l.accept().await {
                        Ok((sock, peer)) => {
                            let (shared, name) = (shared.clone(), name.clone());
                            spawn(Box::pin(async move {
                                client::serve(shared, name, sock, peer.to_string()).await;
                                drop(permit);
                            }));
                        }
                        Err(e) => {
                            tracing::warn!(service = %name, "accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            });
        }
        let (shared, control, acceptor) = (self.shared.clone(), self.control, self.acceptor);
        tasks.spawn(async move {
            loop {
                match control.accept().await {
                    Ok((sock, peer)) => {
                        spawn(Box::pin(node::serve(
                            shared.clone(),
                            sock,
                            peer.to_string(),
                            acceptor.clone(),
                        )));
                    }
                    Err(e) => {
                        tracing::warn!("control accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        let (shared, timeout) = (self.shared.clone(), self.wait_timeout);
        tasks.spawn(async move {
            let tick = (timeout / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
            loop {
                tokio::time::sleep(tick).await;
                let mut s = shared.lock();
                s.expire(Instant::now(), timeout);
                s.flush_acks();
            }
        });
        shutdown.await;
        tracing::info!("gateway stopping: clients lose their connections, cells keep theirs");
        let _ = stop.send(true);
        tasks.shutdown().await;
    }
}
