//! How a node is configured: everything `roam node` reads from its flags.
//!
//! Why a module of its own: the configuration is read by every layer (the
//! listeners' security, admission, the planner link), so it sits below all
//! of them and depends on none.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Default [`NodeConfig::planner_timeout`].
pub const DEFAULT_PLANNER_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// How cells' CPU is limited (`--cell-cpu-control`; see `crate::cpu`).
    pub cpu_control: crate::cpu::CpuControl,
    /// The control address of the gateway this node reports its service
    /// cells to (`host:port`). `None`: the node runs no service cells.
    pub gateway: Option<String>,
    /// The planner this node registers with and heartbeats to (`host:port`
    /// or an `http(s)://` URL; several planners on one etcd,
    /// comma-separated, tried in turn); its cells placed by the planner then move
    /// only through ownership transactions (`docs/control-plane.md`).
    /// `None`: a node on its own.
    pub planner: Option<String>,
    /// How long an ownership transaction waits for the planner's answer
    /// ([`DEFAULT_PLANNER_TIMEOUT`]).
    pub planner_timeout: Duration,
    /// The control API's address as others reach it (`host:port` or a
    /// URL), told to the planner. `None`: the bound address.
    pub advertise: Option<String>,
    /// The power model this node declares (`--power`): it then estimates
    /// its draw and energy and reports them to the planner and in
    /// `/metrics`. `None`: no estimate.
    pub power: Option<roam_api::power::PowerModel>,
    /// The cores this node offers its cells (`--cores`), as it reports
    /// them to the planner: the policies count cells per core by it.
    /// `None`: the machine's online CPUs.
    pub cores: Option<usize>,
    /// Keep up to this many bytes of other nodes' far pages
    /// (`--memory-server SIZE`). `None`: not a memory server.
    pub memory_server: Option<u64>,
}
