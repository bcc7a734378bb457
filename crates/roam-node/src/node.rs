//! The node: its runtime, its cells, its migrations, and its two listeners.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use roam_runtime::{Runtime, RuntimeConfig};
use roam_transfer::ChunkStore;
use tokio::net::TcpListener;

use crate::cell::CellEntry;
use crate::client::{Client, ClientError};
use crate::migrate::{Inbound, Migration};
use crate::secure::{NodeAuth, TlsListener};
use crate::types::CellState;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The node's name.
    pub name: String,
    /// Control API address.
    pub listen: SocketAddr,
    /// Migration protocol address. Port 0 picks one.
    pub migrate_listen: SocketAddr,
    /// The migration address given to sources, when it is not the bound
    /// one (a NAT, a proxy). `None`: the bound address.
    pub advertise_migrate: Option<String>,
    /// Where cells' directories and checkpoints live.
    pub state_dir: PathBuf,
    /// Module and compiled-code cache.
    pub cache_dir: PathBuf,
    /// How uploaded modules that are not prepared yet capture their stack.
    pub capture: roam_prepare::Capture,
    /// Byte budget of the chunk store used for dedup across migrations.
    pub chunk_store_bytes: u64,
    /// Refuse incoming cells that would leave less than this much memory.
    pub memory_reserve: u64,
    /// Mutual TLS on both listeners and for calls to other nodes, with this
    /// node certificate of the cluster CA. `None`: plain TCP.
    pub tls: Option<roam_auth::Identity>,
    /// The bearer token the control API requires (and that this node sends
    /// to other nodes' control APIs).
    pub token: Option<roam_auth::Token>,
    /// Allow plain, unauthenticated listeners on non-loopback addresses.
    pub insecure: bool,
    /// Caps on cells, memory, modules, files and logs.
    pub limits: crate::limits::NodeLimits,
    /// The control address of the gateway this node reports its service
    /// cells to (`host:port`). `None`: the node runs no service cells.
    pub gateway: Option<String>,
    /// The planner this node registers with and heartbeats to (`host:port`
    /// or an `http(s)://` URL; several planners on one etcd,
    /// comma-separated, tried in turn); its cells placed by the planner then move
    /// only through ownership transactions (`docs/control-plane.md`).
    /// `None`: a node on its own.
    pub planner: Option<String>,
    /// The control API's address as others reach it (`host:port` or a
    /// URL), told to the planner. `None`: the bound address.
    pub advertise: Option<String>,
}

/// State shared by every task of a node.
pub(crate) struct NodeInner {
    pub cfg: NodeConfig,
    pub rt: Runtime,
    pub migrate_addr: SocketAddr,
    pub cells: Mutex<HashMap<String, CellEntry>>,
    pub migrations: Mutex<HashMap<String, Arc<Migration>>>,
    pub inbound: Mutex<HashMap<String, Arc<Inbound>>>,
    pub store: Arc<ChunkStore>,
    pub auth: NodeAuth,
    /// Cells admitted but not in `cells` yet (see [`crate::limits`]).
    pub pending: Arc<crate::limits::Pending>,
    /// The link to the gateway (`--gateway`), told where service cells run
    /// (see [`crate::service`]).
    pub gateway: Option<roam_gateway::link::GatewayLink>,
    /// The planner (`--planner`), with this node's credentials.
    pub planner: Option<roam_api::PlannerClient>,
    /// The node's async runtime, for the receiving threads of migrations
    /// that must ask the planner.
    pub tokio: tokio::runtime::Handle,
    /// The node's counters and histograms (`GET /metrics`).
    pub metrics: crate::metrics::Metrics,
    /// The node's own view of its planner lease (see [`crate::fence`]).
    pub fence: crate::fence::Fence,
}

/// A running node.
pub struct Node {
    inner: Arc<NodeInner>,
    control: TcpListener,
    migrate: TcpListener,
}

impl NodeInner {
    pub(crate) fn cells(&self) -> std::sync::MutexGuard<'_, HashMap<String, CellEntry>> {
        self.cells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Set a cell's state, unless it already ended. A service cell that
    /// stops being here (ended, or moved) leaves the gateway's routing.
    pub(crate) fn set_state(&self, id: &str, state: CellState) {
        let mut left = None;
        if let Some(e) = self.cells().get_mut(id) {
            tracing::info!(cell = id, ?state, "cell state");
            let here = |s: &CellState| matches!(s, CellState::Running | CellState::Migrating);
            if !here(&state) {
                e.handle = None;
                if here(&e.state) && e.spec.service.is_some() {
                    left = Some(e.spec.clone());
                }
            }
            e.state = state.clone();
        }
        match (left, state) {
            (Some(spec), CellState::Moved { .. }) => self.release_service(&spec),
            (Some(spec), _) => self.unserve(&spec),
            (None, _) => {}
        }
    }

    /// Bytes of output kept per cell.
    pub(crate) fn log_capacity(&self) -> usize {
        usize::try_from(self.cfg.limits.log_bytes).unwrap_or(usize::MAX)
    }

    /// The directory of a cell's files. `id` must have passed
    /// [`roam_wire::ident::check_cell_id`] at the boundary it came through;
    /// an unchecked id here is a bug, and it panics rather than hand out a
    /// path outside `state_dir/cells`.
    pub(crate) fn cell_dir(&self, id: &str) -> PathBuf {
        if let Err(e) = roam_wire::ident::check_cell_id(id) {
            panic!("bug: an unchecked cell id reached the file system: {e}");
        }
        self.cfg.state_dir.join("cells").join(id)
    }

    /// A client of another node's control API, with this node's
    /// credentials.
    pub(crate) fn client(&self, addr: &str) -> Result<Client, ClientError> {
        Client::with_auth(addr, &self.auth.client)
    }

    /// Whether a cell serving `service` may run here: the node has a
    /// gateway, and no other cell here serves the same service.
    pub(crate) fn check_can_serve(&self, service: &str) -> Result<(), String> {
        if self.cfg.gateway.is_none() {
            return Err(format!(
                "node {} has no gateway, so a cell serving `{service}` could not be reached: \
                 start the node with roam node --gateway ADDR",
                self.cfg.name
            ));
        }
        let cells = self.cells();
        let other = cells.values().find(|e| {
            e.spec.service.as_deref() == Some(service)
                && matches!(e.state, CellState::Running | CellState::Migrating)
        });
        match other {
            Some(e) => Err(format!(
                "cell {} already serves `{service}` on node {}: stop or move it first",
                e.spec.id, self.cfg.name
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn features(&self) -> roam_wire::Features {
        roam_wire::Features {
            userfaultfd: roam_runtime::userfaultfd_available(),
        }
    }
}

/// Unix milliseconds now.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh random id: `prefix` and 12 hex digits.
pub(crate) fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("the OS random source works");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}{hex}")
}

impl Node {
    /// Bind both listeners and build the runtime.
    pub async fn bind(cfg: NodeConfig) -> anyhow::Result<Node> {
        let auth = NodeAuth::new(&cfg)?;
        if cfg.token.as_ref().is_some_and(|t| t.loose_permissions) {
            tracing::warn!("the token file can be read by other users: chmod 600 it");
        }
        cfg.limits.validate().map_err(anyhow::Error::msg)?;
        roam_wire::ident::check_node_name(&cfg.name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
        std::fs::create_dir_all(cfg.state_dir.join("cells")).map_err(|e| {
            anyhow::anyhow!(
                "cannot create state directory {}: {e}",
                cfg.state_dir.display()
            )
        })?;
        let mut rt_cfg = RuntimeConfig {
            cache_dir: cfg.cache_dir.clone(),
            ..RuntimeConfig::default()
        };
        rt_cfg.prepare.capture = cfg.capture;
        let rt = Runtime::new(rt_cfg)?;
        let control = TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
        let migrate = TcpListener::bind(cfg.migrate_listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.migrate_listen))?;
        let mut cfg = cfg;
        cfg.listen = control.local_addr()?;
        let migrate_addr = migrate.local_addr()?;
        let store = Arc::new(ChunkStore::new(cfg.chunk_store_bytes));
        let gateway = crate::service::connect(&cfg)?;
        let planner = match &cfg.planner {
            Some(p) => Some(
                roam_api::PlannerClient::with_auth(p, &auth.client)
                    .map_err(|e| anyhow::anyhow!("--planner {p}: {e}"))?,
            ),
            None => None,
        };
        let inner = Arc::new(NodeInner {
            cfg,
            rt,
            migrate_addr,
            cells: Mutex::new(HashMap::new()),
            migrations: Mutex::new(HashMap::new()),
            inbound: Mutex::new(HashMap::new()),
            store,
            auth,
            pending: Arc::default(),
            gateway,
            planner,
            tokio: tokio::runtime::Handle::current(),
            metrics: crate::metrics::Metrics::new(),
            fence: crate::fence::Fence::default(),
        });
        Ok(Node {
            inner,
            control,
            migrate,
        })
    }

    /// The control API's address.
    pub fn control_addr(&self) -> SocketAddr {
        self.inner.cfg.listen
    }

    /// The control API's URL (`https://` with TLS).
    pub fn control_url(&self) -> String {
        format!(
            "{}://{}",
            crate::secure::scheme(&self.inner.auth),
            self.inner.cfg.listen
        )
    }

    /// The migration listener's address.
    pub fn migrate_addr(&self) -> SocketAddr {
        self.inner.migrate_addr
    }

    /// Serve until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Node {
            inner,
            control,
            migrate,
        } = self;
        tracing::info!(
            name = %inner.cfg.name,
            isa = roam_runtime::host_isa(),
            control = %inner.cfg.listen,
            migrate = %inner.migrate_addr,
            tls = inner.auth.control.is_some(),
            token = inner.auth.token.is_some(),
            userfaultfd = inner.features().userfaultfd,
            gateway = inner.cfg.gateway.as_deref().unwrap_or("none"),
            "node up"
        );
        let acceptor = tokio::spawn(crate::migrate::dest::accept_loop(inner.clone(), migrate));
        let heartbeats = inner.planner.clone().map(|p| {
            [
                tokio::spawn(crate::planner::heartbeats(inner.clone(), p)),
                tokio::spawn(crate::fence::watch(inner.clone())),
            ]
        });
        let app = crate::api::router(inner.clone());
        let served = match inner.auth.control.clone() {
            Some(acceptor) => {
                axum::serve(TlsListener::new(control, acceptor)?, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
            None => {
                axum::serve(control, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            }
        };
        acceptor.abort();
        for h in heartbeats.iter().flatten() {
            h.abort();
        }
        served.map_err(|e| anyhow::anyhow!("control API failed: {e}"))
    }
}
