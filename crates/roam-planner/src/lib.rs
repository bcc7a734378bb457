//! The planner: the one place that knows every node and cell of a fleet.
//! Nodes register and heartbeat; users launch, list, move and kill cells
//! through it; it places cells by policy, keeps periodic checkpoints of
//! each cell on another node, and restores a dead node's cells elsewhere
//! (`docs/control-plane.md`).
//!
//! Why a crate of its own: the planner is a daemon of its own that drives
//! nodes only through their public API (`roam_api::Client`) and keeps its
//! state only in a `roam_cluster::ClusterStore`, so it can run on another
//! machine than any node, and several planners can share an etcd store.
//!
//! ```text
//!   roam CLI ──► api (axum) ──► cells: place, kill, migrate, keep ──► node API
//!   nodes ─────►   │                         ▲
//!   (register,     ▼                         │
//!    heartbeat) ClusterStore ◄── leader: liveness, evacuation, periodic checkpoints
//! ```
//!
//! Every planner answers the API; only the leader ([`ClusterStore::lead`])
//! acts on its own.

#![deny(missing_docs)]

mod api;
mod auto;
mod caller;
mod cells;
mod dashboard;
pub mod energy;
#[cfg(test)]
mod evac_tests;
pub mod events;
mod far;
pub mod follow;
pub mod history;
mod kept;
#[cfg(test)]
mod kept_tests;
mod leader;
mod maintenance;
pub mod metrics;
mod moves;
pub mod offload;
mod ownership;
mod placement;
pub mod policy;
#[cfg(test)]
mod role_tests;
mod services;
pub mod slowdown;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use roam_api::{Client, ClientAuth, ClientError};
use roam_auth::tokio_rustls::TlsAcceptor;
use roam_auth::{Identity, Role, Token, ALPN_HTTP};
use roam_cluster::{ClusterStore, NodeRecord, StoreResult};
use tokio::net::TcpListener;

pub use roam_cluster;

/// Default `--lease`: a node without a heartbeat for this long is dead.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);
/// Default `--checkpoint-interval`, seconds (0: no kept checkpoints).
pub const DEFAULT_CHECKPOINT_INTERVAL_S: u64 = 30;
/// Default largest module accepted by `POST /v1/modules`.
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 256 << 20;

/// Default [`PlannerConfig::kept_parallel`]. Each kept checkpoint costs
/// its owner one more copy of the cell's memory while it is sent, and the
/// network its pages: started all at once on a tick, they would add up.
pub const DEFAULT_KEPT_PARALLEL: usize = 2;

/// How long open connections (event streams) get to close after the
/// shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How a planner runs.
#[derive(Debug, Clone)]
pub struct PlannerConfig {
    /// The API's address.
    pub listen: SocketAddr,
    /// This planner's id in leader elections (unique among planners).
    pub id: String,
    /// Seconds between a cell's kept checkpoints when its launch names
    /// none ([`DEFAULT_CHECKPOINT_INTERVAL_S`]; 0: none).
    pub checkpoint_interval_s: u64,
    /// A node without a heartbeat for this long is dead ([`DEFAULT_LEASE`]).
    pub lease: Duration,
    /// Most kept checkpoints the leader takes at once
    /// ([`DEFAULT_KEPT_PARALLEL`]); a cell whose checkpoint is due waits
    /// for a later tick when this many are under way.
    pub kept_parallel: usize,
    /// Mutual TLS: the planner's certificate (`roam cert planner NAME`,
    /// role `planner`), also presented to nodes when it calls them.
    pub tls: Option<Identity>,
    /// The bearer token the API requires and the planner sends to nodes.
    pub token: Option<Token>,
    /// Allow an unauthenticated API on a non-loopback address.
    pub insecure: bool,
    /// Largest module `POST /v1/modules` accepts
    /// ([`DEFAULT_MAX_MODULE_BYTES`]).
    pub max_module_bytes: u64,
}

impl PlannerConfig {
    /// A configuration with every default, listening on `listen`.
    pub fn new(listen: SocketAddr) -> PlannerConfig {
        PlannerConfig {
            listen,
            id: format!("planner-{}", random_hex(4)),
            checkpoint_interval_s: DEFAULT_CHECKPOINT_INTERVAL_S,
            lease: DEFAULT_LEASE,
            kept_parallel: DEFAULT_KEPT_PARALLEL,
            tls: None,
            token: None,
            insecure: false,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
        }
    }
}

/// Why a planner cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// An unauthenticated API on a non-loopback address.
    #[error(
        "refusing to serve the planner API on {addr} without authentication: anyone who can \
         reach it could launch, move and kill cells on every node. Give --tls-ca, --tls-cert \
         and --tls-key (make them with `roam cert`), or --token-file, or listen on 127.0.0.1, \
         or add --insecure if the network itself is trusted (see docs/trust.md)"
    )]
    Unauthenticated {
        /// The address.
        addr: SocketAddr,
    },
    /// The certificate is not a planner's.
    #[error(
        "the planner's certificate cannot be used: make one with `roam cert planner NAME` \
         (see docs/trust.md)"
    )]
    Role(#[source] roam_auth::RoleError),
    /// The TLS configuration could not be built.
    #[error("cannot build the TLS configuration")]
    Tls(#[from] roam_auth::rustls::Error),
    /// The address could not be bound.
    #[error("cannot listen on {addr} (is another planner or program using it?)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// Why a planner stopped serving.
#[derive(Debug, thiserror::Error)]
#[error("the planner API failed")]
pub struct ServeError(#[from] std::io::Error);

/// A planner, bound and ready to serve.
pub struct Planner {
    inner: Arc<Inner>,
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
}

/// What every part of the planner shares.
pub(crate) struct Inner {
    pub store: Arc<dyn ClusterStore>,
    pub cfg: PlannerConfig,
    pub client_auth: ClientAuth,
    pub events: events::Events,
    pub metrics: metrics::Metrics,
    /// Recent migrations and decisions, for the dashboard.
    pub history: history::History,
    /// The active placement policy's name.
    pub placement: RwLock<&'static str>,
    /// Cells the leader is working on (a kept checkpoint, a restore): one
    /// operation per cell at a time.
    pub busy: Mutex<HashSet<String>>,
    /// (node, repository hash) → the hash the node gave the module (it
    /// prepares unprepared modules, which changes the hash).
    pub uploaded: Mutex<HashMap<(String, String), String>>,
    /// Cell → when its last kept checkpoint failed (Unix ms): the next try
    /// waits a full interval.
    pub keep_failed: Mutex<HashMap<String, u64>>,
    /// Kept checkpoints the leader may still start ([`PlannerConfig::kept_parallel`]).
    pub keeping: Arc<tokio::sync::Semaphore>,
    /// The owners of the cells that have not ended, for placements (see
    /// [`cells::Owners`]).
    pub owners: Mutex<cells::Owners>,
    /// What the planner learned of each program's time per ISA, and the
    /// runs it follows to learn more.
    pub learner: Mutex<slowdown::Learner>,
}

impl Inner {
    /// Run a store operation, recording its latency as `op`.
    pub async fn timed<T>(
        &self,
        op: &str,
        f: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let t = Instant::now();
        let r = f.await;
        self.metrics.store_op(op, t.elapsed());
        r
    }

    /// A client of `node`'s API with the planner's credentials.
    pub fn node_client(&self, node: &NodeRecord) -> Result<Client, ClientError> {
        Client::with_auth(&node.api, &self.client_auth)
    }

    /// The active placement policy's name.
    pub fn placement(&self) -> &'static str {
        *self
            .placement
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Lock a mutex, whatever a panicking holder left.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Now, Unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `n` random bytes as hex.
pub(crate) fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the OS random source works");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Planner {
    /// Check the configuration against the exposure rule, and bind.
    pub async fn bind(
        cfg: PlannerConfig,
        store: Arc<dyn ClusterStore>,
    ) -> Result<Planner, BindError> {
        if !cfg.insecure
            && cfg.tls.is_none()
            && cfg.token.is_none()
            && !cfg.listen.ip().is_loopback()
        {
            return Err(BindError::Unauthenticated { addr: cfg.listen });
        }
        if let Some(id) = &cfg.tls {
            id.check_own_role(Role::Planner).map_err(BindError::Role)?;
        }
        let acceptor = match &cfg.tls {
            Some(id) => Some(TlsAcceptor::from(id.server_config(ALPN_HTTP)?)),
            None => None,
        };
        let client_auth = ClientAuth {
            tls: cfg.tls.as_ref().map(|id| id.client().clone()),
            token: cfg.token.clone(),
        };
        let kept_parallel = cfg.kept_parallel.max(1);
        let listener = TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| BindError::Bind {
                addr: cfg.listen,
                source,
            })?;
        // The placement policy a planner (this or another) set last.
        let placement = placement::stored(&*store).await;
        let learned = slowdown::stored(&*store).await;
        let inner = Arc::new(Inner {
            store,
            cfg,
            client_auth,
            events: events::Events::default(),
            metrics: metrics::Metrics::default(),
            history: history::History::default(),
            placement: RwLock::new(placement),
            busy: Mutex::default(),
            uploaded: Mutex::default(),
            keep_failed: Mutex::default(),
            keeping: Arc::new(tokio::sync::Semaphore::new(kept_parallel)),
            owners: Mutex::default(),
            learner: Mutex::new(slowdown::Learner::new(learned)),
        });
        Ok(Planner {
            inner,
            listener,
            acceptor,
        })
    }

    /// The address the API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The API's URL.
    pub fn url(&self) -> String {
        let scheme = if self.acceptor.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.local_addr())
    }

    /// Serve the API, and lead when elected, until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Planner {
            inner,
            listener,
            acceptor,
        } = self;
        tracing::info!(
            id = %inner.cfg.id,
            store = inner.store.backend(),
            lease_ms = inner.cfg.lease.as_millis() as u64,
            checkpoint_interval_s = inner.cfg.checkpoint_interval_s,
            tls = acceptor.is_some(),
            token = inner.cfg.token.is_some(),
            "planner up"
        );
        let leader = tokio::spawn(leader::run(inner.clone()));
        let follow = tokio::spawn(placement::follow(inner.clone()));
        let app = api::router(inner);
        // Event streams never end on their own: after Ctrl-C, open
        // connections get SHUTDOWN_GRACE to finish, then are dropped.
        let limits = roam_api::serve::ConnLimits {
            grace: SHUTDOWN_GRACE,
            ..Default::default()
        };
        match acceptor {
            Some(acceptor) => {
                let l =
                    roam_api::serve::TlsListener::admitting(listener, acceptor, caller::ADMITTED)?;
                roam_api::serve::serve(l, app, limits, shutdown).await;
            }
            None => roam_api::serve::serve(listener, app, limits, shutdown).await,
        }
        leader.abort();
        follow.abort();
        Ok(())
    }
}
