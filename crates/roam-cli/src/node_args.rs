//! Arguments of the node and cluster commands (`node`, `launch`, `cells`,
//! `migrate`, `logs`, `kill`, `nodes`, `drain`, `undrain`). Names are a
//! contract: add, never rename. The TLS and token flags are
//! `auth_args`'s, shared with the planner and the gateway.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::auth_args::{ClientAuthArgs, ServerAuthArgs};

/// `roam node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Control API address (HTTP/JSON).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// This node's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Migration protocol address [default: the control port + 1000 on the
    /// same host].
    #[arg(long)]
    pub migrate_listen: Option<SocketAddr>,
    /// Migration address to advertise to sources (`host:port`) when they
    /// must connect through something else than --migrate-listen (a NAT, a
    /// proxy) [default: the address --migrate-listen bound].
    #[arg(long)]
    pub advertise_migrate: Option<String>,
    /// Cells' directories and checkpoints [default: $ROAM_STATE_DIR or
    /// ~/.local/state/roam/<name>].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Module and compiled-code cache [default: $ROAM_CACHE_DIR or ~/.cache/roam].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// How uploaded modules that are not prepared yet capture their stack:
    /// `returns`, `eh` (exceptions) or `asyncify` [default: $ROAM_CAPTURE
    /// or returns].
    #[arg(long, value_name = "HOW")]
    pub capture: Option<roam_prepare::Capture>,
    /// Chunk store budget for dedup across migrations, MiB.
    #[arg(long, default_value_t = 1024)]
    pub chunk_store_mib: u64,
    /// Refuse incoming cells that would leave less memory than this, MiB.
    #[arg(long, default_value_t = 256)]
    pub memory_reserve_mib: u64,
    /// TLS, token and --insecure: the same for every server.
    #[command(flatten)]
    pub auth: ServerAuthArgs,
    /// Most cells running or arriving at once.
    #[arg(long, default_value_t = roam_node::limits::DEFAULT_MAX_CELLS)]
    pub max_cells: usize,
    /// Most memory the cells' memory limits may add up to (e.g. 16GiB)
    /// [default: the machine's memory less --memory-reserve-mib].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub max_total_memory: Option<u64>,
    /// Memory limit of a launched cell that asks for none.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "1GiB")]
    pub cell_memory: u64,
    /// Largest memory limit a cell may have, launched or arriving.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "4GiB")]
    pub max_cell_memory: u64,
    /// Largest module accepted by upload or migration.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "256MiB")]
    pub max_module_size: u64,
    /// Most bytes of sandbox files a cell may hold (a write past it fails
    /// with EDQUOT), keep in a checkpoint or bring when it arrives.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "1GiB")]
    pub max_files_size: u64,
    /// Most sandbox file-tree entries an arriving cell may bring.
    #[arg(long, default_value_t = roam_node::limits::DEFAULT_MAX_FILE_ENTRIES)]
    pub max_file_entries: u64,
    /// Output kept per cell; older output is dropped and counted.
    #[arg(long, value_name = "SIZE", value_parser = size, default_value = "4MiB")]
    pub log_size: u64,
    /// CPU weight of a cell that asks for none, 1 to 10000: cells share
    /// the CPU by weight when it is contended.
    #[arg(long, value_name = "N", default_value_t = roam_node::cpu::DEFAULT_CPU_WEIGHT,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub cell_cpu_weight: u32,
    /// Most CPU a cell that asks for none may use, in cores (`0.5`, `2`,
    /// `250m`) [default: no cap]. Needs a cgroup cpu controller.
    #[arg(long, value_name = "CORES", value_parser = cores)]
    pub cell_cpu_max: Option<u32>,
    /// How cells' CPU is limited: `auto` (a cgroup v2 group per cell, else
    /// cgroup v1, else nice values), `cgroup-v2`, `cgroup-v1` or `nice`
    /// (the node does not start if the one named is not available).
    #[arg(
        long,
        value_name = "HOW",
        default_value = "auto",
        env = "ROAM_CELL_CPU_CONTROL"
    )]
    pub cell_cpu_control: roam_node::cpu::CpuControl,
    /// The control address of a `roam gateway` (`host:port`): the node
    /// connects to it and tells it where its service cells (`roam launch
    /// --service`) run. With --tls-ca/--tls-cert/--tls-key the link uses
    /// mutual TLS with this node's certificate.
    #[arg(long, value_name = "ADDR")]
    pub gateway: Option<String>,
    /// The planner to register with and heartbeat to (`host:port` or an
    /// `http(s)://` URL; TLS and token as for other nodes). Several
    /// planners on one etcd: comma-separated, tried in turn when one cannot
    /// be reached. Cells it places here then move only through its
    /// ownership transactions.
    #[arg(long, value_name = "URL[,URL...]")]
    pub planner: Option<String>,
    /// Seconds an ownership transaction waits for the planner's answer
    /// before the migration it belongs to gives up (the source then asks
    /// the planner for the cell back).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub planner_timeout: u64,
    /// This node's control API address as the planner and other nodes
    /// reach it (`host:port` or a URL) [default: the address --listen
    /// bound].
    #[arg(long, value_name = "ADDR")]
    pub advertise: Option<String>,
    /// This node's power model, for the energy estimate it reports and the
    /// planner's energy policies: `idle=W,busy=W[,speed=X]`, its draw idle,
    /// its extra draw per busy core, and its work per core-second relative
    /// to the cluster's reference machine [default: no estimate].
    #[arg(long, value_name = "MODEL")]
    pub power: Option<roam_api::power::PowerModel>,
    /// The cores this node offers its cells, as it reports them to the
    /// planner (whose policies count cells per core) [default: the
    /// machine's online CPUs].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub cores: Option<u16>,
    /// Offer up to SIZE of this node's RAM to other nodes' cells as far
    /// memory (`roam launch --local-memory`): their pages live here while
    /// the cell runs elsewhere [default: not a memory server].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub memory_server: Option<u64>,
}

/// A CPU amount in cores (`0.5`, `2`, `250m` for thousandths), as
/// thousandths of a core.
pub fn cores(s: &str) -> Result<u32, String> {
    let bad = || format!("{s:?}: give cores such as 0.5, 2 or 250m");
    let milli = match s.strip_suffix('m') {
        Some(m) => m.parse::<u32>().map_err(|_| bad())?,
        None => {
            let c: f64 = s.parse().map_err(|_| bad())?;
            if !c.is_finite() || c <= 0.0 || c > 1024.0 {
                return Err(format!("{s:?}: give more than 0 and at most 1024 cores"));
            }
            (c * 1000.0).round() as u32
        }
    };
    roam_node::cpu::CpuLimits {
        weight: None,
        max_millicores: Some(milli),
    }
    .check()?;
    Ok(milli)
}

/// A size flag (`64MiB`, `1GiB`, `4096`).
pub fn size(s: &str) -> Result<u64, String> {
    roam_node::size::parse_size(s).map_err(|e| e.to_string())
}

/// `roam launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Node to launch on (`host:port` of its control API); without it,
    /// the planner places the cell.
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    /// Run it on the node of this name (planner only: the manual policy).
    #[arg(long, value_name = "NAME", conflicts_with = "node")]
    pub on: Option<String>,
    /// Seconds between kept checkpoints of the cell (planner only)
    /// [default: the planner's].
    #[arg(long, value_name = "SECS")]
    pub checkpoint_interval: Option<u64>,
    /// Give the cell a sandbox directory seen as GUEST (repeatable); its
    /// files travel with the cell.
    #[arg(long = "dir", value_name = "GUEST")]
    pub dirs: Vec<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The cell's memory limit (e.g. 64MiB) [default: the node's
    /// --cell-memory].
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub max_memory: Option<u64>,
    /// Serve the network service NAME behind the node's gateway: the cell
    /// gets one listening socket, and clients of the gateway's NAME port
    /// reach it wherever it moves (the node needs --gateway).
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// The cell's CPU weight against the node's other cells, 1 to 10000
    /// [default: the node's --cell-cpu-weight]; it keeps it when it moves.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub cpu_weight: Option<u32>,
    /// Most CPU the cell may use, in cores (`0.5`, `250m`) [default: the
    /// node's --cell-cpu-max]; it keeps it when it moves.
    #[arg(long, value_name = "CORES", value_parser = cores)]
    pub cpu_max: Option<u32>,
    /// Far memory: keep at most SIZE of the cell's memory on its node
    /// (at least 256KiB), and the rest on a memory server
    /// (`docs/far-memory.md`).
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub local_memory: Option<u64>,
    /// The memory server for --local-memory, a node started with
    /// --memory-server: its control address with --node (required there),
    /// its name through the planner [default: the planner picks].
    #[arg(long, value_name = "NODE", requires = "local_memory")]
    pub memory_server: Option<String>,
    /// Which page leaves the node when its local memory is full.
    #[arg(long, value_name = "POLICY", value_parser = ["clock", "random"], requires = "local_memory")]
    pub eviction: Option<String>,
    /// The module (prepared or not).
    pub module: PathBuf,
    /// Arguments for the program.
    #[arg(last = true)]
    pub args: Vec<String>,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// What `roam launch` sends, node or planner: the module's bytes, the
/// program's arguments (its name first), its environment.
pub type LaunchParts = (Vec<u8>, Vec<String>, Vec<(String, String)>);

impl LaunchArgs {
    /// The far-memory request, when --local-memory is given.
    pub fn far(&self) -> Option<roam_node::types::FarRequest> {
        Some(roam_node::types::FarRequest {
            local_memory: self.local_memory?,
            server: self.memory_server.clone()?,
            eviction: self.eviction.clone(),
        })
    }

    /// Read the module and split the environment into pairs.
    pub fn parts(&self) -> Result<LaunchParts> {
        let bytes = std::fs::read(&self.module)
            .with_context(|| format!("cannot read {}", self.module.display()))?;
        let env = self
            .env
            .iter()
            .map(|kv| {
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .with_context(|| format!("--env {kv}: expected KEY=VALUE"))
            })
            .collect::<Result<Vec<_>>>()?;
        let program = self
            .module
            .file_stem()
            .map_or_else(|| "program".into(), |s| s.to_string_lossy().into_owned());
        let mut args = vec![program];
        args.extend(self.args.iter().cloned());
        Ok((bytes, args, env))
    }
}

/// `roam cells`.
#[derive(Args, Debug)]
pub struct CellsArgs {
    /// Node to ask; without it, the planner lists every cell of the cluster.
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The cell.
    pub cell: String,
    /// Node it runs on (`host:port`); without it, the planner moves the
    /// cell.
    #[arg(long)]
    pub from: Option<String>,
    /// Node to move it to: its `host:port` with --from, its name through
    /// the planner (omit it there to let the planner choose).
    #[arg(long)]
    pub to: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    /// stop-and-copy, pre-copy or post-copy.
    #[arg(long, default_value = "pre-copy")]
    pub mode: String,
    /// adaptive, none, lz4, zstd1 ... zstd19.
    #[arg(long, default_value = "adaptive")]
    pub codec: String,
    /// Do not delta-encode pages sent before (static codecs).
    #[arg(long)]
    pub no_delta: bool,
    /// Shape the migration stream to this rate (e.g. 10mbit, 1gbit).
    #[arg(long)]
    pub bandwidth: Option<String>,
    /// Randomise page order.
    #[arg(long)]
    pub randomize: bool,
    /// Pre-copy: start a new round once this much memory is dirty, MB.
    #[arg(long, default_value_t = 10)]
    pub max_remaining_mb: u64,
    /// Pre-copy: also stop iterating once a round takes at most this long,
    /// ms (VM handoff used 2000; 0 = off).
    #[arg(long, default_value_t = 0)]
    pub max_round_ms: u64,
    /// Pre-copy: stop iterating once what is dirty would take at most this
    /// long to send, ms.
    #[arg(long, default_value_t = 30)]
    pub max_downtime_ms: u64,
    /// Pre-copy: most rounds.
    #[arg(long, default_value_t = 30)]
    pub max_rounds: u32,
    /// Pre-copy dirty tracking: auto, write-protect or hash.
    #[arg(long, default_value = "auto")]
    pub tracking: String,
    /// Pre-copy's final round, sent while paused: lz4, none or zstd1 ...
    /// zstd19 encode on one thread straight into the connection; pipeline
    /// sends it through the transfer pipeline like the other rounds.
    #[arg(long, default_value = "lz4", help_heading = "Ablation and tuning")]
    pub final_round: String,
    /// Print the final status as JSON (no progress bar).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam logs`.
#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The cell.
    pub cell: String,
    /// A node that runs or ran it (the log is followed to where it runs
    /// now); without it, the planner asks the cell's owner.
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam kill`.
#[derive(Args, Debug)]
pub struct KillArgs {
    /// The cell.
    pub cell: String,
    /// Node it runs on; without it, the planner kills it wherever it runs.
    #[arg(long)]
    pub node: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// The planner a cluster command talks to when no node is named.
#[derive(Args, Debug, Clone, Default)]
pub struct PlannerArg {
    /// The planner (`host:port` or URL; several, comma-separated, are
    /// tried in turn), used when no node is named.
    #[arg(long, env = "ROAM_PLANNER", value_name = "URL[,URL...]")]
    pub planner: Option<String>,
}

impl PlannerArg {
    /// The planner, or an error saying what to give instead.
    pub fn get(&self, what: &str) -> anyhow::Result<&str> {
        self.planner.as_deref().ok_or_else(|| {
            anyhow::anyhow!(
                "{what}: give --node ADDR, or --planner URL (or set ROAM_PLANNER, e.g. as `roam up` prints)"
            )
        })
    }
}

/// `roam nodes`.
#[derive(Args, Debug)]
pub struct NodesArgs {
    #[command(flatten)]
    pub planner: PlannerArg,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam undrain`.
#[derive(Args, Debug)]
pub struct UndrainArgs {
    /// The node's name.
    pub node: String,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam policy`.
#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// The placement policy to set (`least-loaded`, `follow-the-client`,
    /// ...); without it, list them and show the one in force.
    pub name: Option<String>,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam slowdowns`.
#[derive(Args, Debug)]
pub struct SlowdownsArgs {
    /// Print the planner's JSON answer.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `roam drain`.
#[derive(Args, Debug)]
pub struct DrainArgs {
    /// The node's name.
    pub node: String,
    #[command(flatten)]
    pub planner: PlannerArg,
    /// Give up waiting for the node to be empty after this many seconds
    /// (the moves go on).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}
