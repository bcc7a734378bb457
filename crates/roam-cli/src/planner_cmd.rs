//! `roam planner`: the daemon that knows every node and cell of a fleet
//! (`docs/control-plane.md`). Everything it does is in `roam-planner`; this
//! is its command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use roam_planner::roam_cluster::StoreSpec;
use roam_planner::{Planner, PlannerConfig};

use crate::auth_args::ServerAuthArgs;

/// `roam planner`.
#[derive(Args, Debug)]
pub struct PlannerArgs {
    /// The planner API's address (HTTP/JSON).
    #[arg(long, default_value = "127.0.0.1:7600")]
    pub listen: SocketAddr,
    /// Where the cluster state lives: `redb:PATH` (one crash-safe file, for
    /// one planner) or `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` (several
    /// planners, one leads; `etcds://` for etcd over TLS, with --etcd-ca)
    /// [default: redb:$ROAM_STATE_DIR/cluster.redb or
    /// redb:~/.local/state/roam/planner/cluster.redb].
    #[arg(long, value_name = "STORE")]
    pub store: Option<StoreSpec>,
    #[command(flatten)]
    pub etcd: crate::etcd_args::EtcdArgs,
    /// Seconds between kept checkpoints of a cell whose launch names no
    /// interval (0: none).
    #[arg(long, value_name = "SECS", default_value_t = roam_planner::DEFAULT_CHECKPOINT_INTERVAL_S)]
    pub checkpoint_interval: u64,
    /// Most kept checkpoints taken at once in the cluster; the others wait
    /// for a later tick (each costs its owner a copy of the cell's memory
    /// and the network its pages).
    #[arg(long, value_name = "N", default_value_t = roam_planner::DEFAULT_KEPT_PARALLEL as u16,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub kept_parallel: u16,
    /// A node that sends no heartbeat for this many seconds is dead and its
    /// cells are restored elsewhere.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub lease: f64,
    /// This planner's id in leader elections [default: random].
    #[arg(long)]
    pub id: Option<String>,
    /// Largest module the repository accepts.
    #[arg(long, value_name = "SIZE", value_parser = crate::node_args::size, default_value = "256MiB")]
    pub max_module_size: u64,
    /// TLS, token and --insecure: the same for every server.
    #[command(flatten)]
    pub auth: ServerAuthArgs,
}

fn default_store() -> StoreSpec {
    let dir = std::env::var_os("ROAM_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
            home.join(".local/state/roam/planner")
        });
    StoreSpec::Redb(dir.join("cluster.redb"))
}

/// `roam planner`.
pub fn planner(a: PlannerArgs) -> Result<i32> {
    if !(a.lease.is_finite() && a.lease > 0.0 && a.lease <= 3600.0) {
        anyhow::bail!(
            "--lease {}: give a number of seconds above 0 and at most 3600",
            a.lease
        );
    }
    let spec = a.store.unwrap_or_else(default_store);
    let access = a.etcd.load(&spec)?;
    if let StoreSpec::Redb(path) = &spec {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    let tls = a.auth.tls.identity()?;
    let token = a.auth.token()?;
    if token.as_ref().is_some_and(|t| t.loose_permissions) {
        tracing::warn!("the token file can be read by other users: chmod 600 it");
    }
    let mut cfg = PlannerConfig::new(a.listen);
    if let Some(id) = a.id {
        cfg.id = id;
    }
    cfg.checkpoint_interval_s = a.checkpoint_interval;
    cfg.kept_parallel = usize::from(a.kept_parallel);
    cfg.lease = Duration::from_secs_f64(a.lease);
    cfg.max_module_bytes = a.max_module_size;
    cfg.tls = tls;
    cfg.token = token;
    cfg.insecure = a.auth.tls.insecure;
    crate::runtime()?.block_on(async move {
        let store: Arc<dyn roam_planner::roam_cluster::ClusterStore> = spec
            .open_with(&access)
            .await
            .with_context(|| format!("cannot open the cluster store {}", spec))?;
        let lease = cfg.lease;
        let interval = cfg.checkpoint_interval_s;
        let planner = Planner::bind(cfg, store).await?;
        eprintln!(
            "roam planner listening: {} store {}{} (nodes are dead after {} without a heartbeat; {})",
            planner.url(),
            spec,
            access
                .user()
                .map(|u| format!(" as etcd user {u}"))
                .unwrap_or_default(),
            crate::human::secs(lease),
            if interval == 0 {
                "no kept checkpoints by default".to_string()
            } else {
                format!("cells keep a checkpoint every {interval} s by default")
            }
        );
        eprintln!("roam planner dashboard: {}/", planner.url());
        planner
            .serve(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        eprintln!("roam planner stopped");
        Ok(0)
    })
}
