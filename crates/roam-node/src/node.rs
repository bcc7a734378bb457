//! The node process: binds its listeners, builds its state and starts the
//! tasks that serve it.
//!
//! Why at the top: this is the one place that knows every part of the node
//! (the HTTP API, the migration listener, the planner link and the fence)
//! and wires them together; none of them knows this module.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use roam_runtime::{Runtime, RuntimeConfig};
use roam_transfer::ChunkStore;
use tokio::net::TcpListener;

use crate::config::NodeConfig;
use crate::secure::NodeAuth;
use crate::state::NodeInner;

/// A running node.
pub struct Node {
    inner: Arc<NodeInner>,
    control: TcpListener,
    migrate: TcpListener,
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
        let cpu = crate::cpu::Cpu::new(
            &cfg.name,
            cfg.cpu_control,
            cfg.limits.cell_cpu_weight,
            cfg.limits.cell_cpu_max_millicores,
        )?;
        let store = Arc::new(ChunkStore::new(cfg.chunk_store_bytes));
        let gateway = crate::state::connect_gateway(&cfg)?;
        let planner = match &cfg.planner {
            Some(p) => Some(
                roam_api::PlannerClient::with_auth(p, &auth.client)
                    .map_err(|e| anyhow::anyhow!("--planner {p}: {e}"))?,
            ),
            None => None,
        };
        let power = cfg.power.map(|m| {
            crate::power::Meter::new(m, cfg.cores.unwrap_or_else(crate::power::online_cores))
        });
        let metrics = crate::metrics::Metrics::new(cfg.power.is_some());
        let far_server = cfg.memory_server.map(crate::limits::FarServer::new);
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
            metrics,
            fence: crate::state::Fence::default(),
            copies: Arc::new(tokio::sync::Semaphore::new(1)),
            uploads: tokio::sync::Semaphore::new(crate::state::UPLOADS),
            grants: Default::default(),
            cpu: Arc::new(cpu),
            power,
            far_server,
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
            cell_cpu = %inner.cpu.info().mechanism,
            gateway = inner.cfg.gateway.as_deref().unwrap_or("none"),
            "node up"
        );
        let acceptor = tokio::spawn(crate::migrate::dest::accept_loop(inner.clone(), migrate));
        let heartbeats = inner.planner.clone().map(|p| {
            [
                tokio::spawn(crate::cluster::planner::heartbeats(inner.clone(), p)),
                tokio::spawn(crate::cluster::fence::watch(inner.clone())),
            ]
        });
        let cpu = inner.cpu.clone();
        let served = crate::http::serve(inner, control, shutdown).await;
        cpu.shutdown();
        acceptor.abort();
        for h in heartbeats.iter().flatten() {
            h.abort();
        }
        served
    }
}
