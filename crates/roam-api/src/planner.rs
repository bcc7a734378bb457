//! The planner's API types (`docs/control-plane.md`). The cluster store
//! keeps the same records.

use serde::{Deserialize, Serialize};

use crate::sysinfo::Machine;

/// A node as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Its `--name`, unique in the cluster.
    pub name: String,
    /// `x86_64`, `aarch64` or `riscv64`.
    pub isa: String,
    /// Its control API, as the planner and other nodes reach it
    /// (`host:port` or an `http(s)://` URL).
    pub api: String,
    /// Its migration listener, `host:port`.
    pub migrate: String,
    /// The roam version it runs.
    pub version: String,
    /// Its latest reported status.
    pub status: NodeStatus,
    /// Ready, or draining.
    pub state: NodeState,
    /// Whether its liveness lease holds (computed by the store on read).
    #[serde(default)]
    pub alive: bool,
    /// When it (last) registered, Unix milliseconds.
    pub registered_ms: u64,
    /// When its last heartbeat arrived, Unix milliseconds.
    pub heartbeat_ms: u64,
    /// Its declared maintenance window, if any (`roam maintenance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Maintenance>,
}

/// A maintenance window declared for a node: the leading planner drains
/// the node `lead_ms` before `start_ms`, so that its cells have left when
/// the work begins, keeps it drained until `end_ms`, then puts it back in
/// service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Maintenance {
    /// When the work begins, Unix milliseconds.
    pub start_ms: u64,
    /// When the node is back, Unix milliseconds.
    pub end_ms: u64,
    /// How long before `start_ms` the drain begins, ms.
    pub lead_ms: u64,
    /// Whether the planner drained the node for this window. It then puts
    /// the node back in service at the end; a node drained by hand
    /// before the window stays drained.
    #[serde(default)]
    pub drained: bool,
}

/// Longest maintenance window, ms (30 days).
pub const MAX_MAINTENANCE_MS: u64 = 30 * 24 * 3_600_000;
/// Longest lead before a window, ms (a day).
pub const MAX_MAINTENANCE_LEAD_MS: u64 = 24 * 3_600_000;
/// Farthest a window may start from now, ms (a year).
pub const MAX_MAINTENANCE_AHEAD_MS: u64 = 366 * 24 * 3_600_000;

/// The body of `PUT /v1/nodes/{name}/maintenance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaintenanceRequest {
    /// When the work begins, Unix milliseconds.
    pub start_ms: u64,
    /// When the node is back, Unix milliseconds.
    pub end_ms: u64,
    /// How long before the start the drain begins, ms.
    pub lead_ms: u64,
}

impl MaintenanceRequest {
    /// Whether the window makes sense at `now_ms`: it ends after it starts
    /// and after now, lasts at most [`MAX_MAINTENANCE_MS`], starts within
    /// [`MAX_MAINTENANCE_AHEAD_MS`], with a lead of at most
    /// [`MAX_MAINTENANCE_LEAD_MS`].
    pub fn check(&self, now_ms: u64) -> Result<(), String> {
        if self.end_ms <= self.start_ms {
            return Err("the window must end after it starts".into());
        }
        if self.end_ms <= now_ms {
            return Err("the window has already ended".into());
        }
        if self.end_ms - self.start_ms > MAX_MAINTENANCE_MS {
            return Err("a window lasts at most 30 days".into());
        }
        if self.start_ms > now_ms.saturating_add(MAX_MAINTENANCE_AHEAD_MS) {
            return Err("a window starts within a year".into());
        }
        if self.lead_ms > MAX_MAINTENANCE_LEAD_MS {
            return Err("the lead is at most a day".into());
        }
        Ok(())
    }
}

/// What a node reports with each heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeStatus {
    /// Its machine: cores, memory, load.
    pub machine: Machine,
    /// The cells running on it now.
    pub cells: Vec<String>,
    /// Its path to its gateway, when it has one (`roam node --gateway`):
    /// what the follow-the-client policy compares nodes by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayPath>,
    /// What each running cell uses here: the signals the planner's
    /// policies read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<CellUsage>,
    /// Its declared power model and the energy estimated from it, when it
    /// has one (`roam node --power`): what the energy policies read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<crate::power::PowerReport>,
    /// What it offers as a memory server (`roam node --memory-server`):
    /// where the planner puts far-memory cells' pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_server: Option<MemoryServer>,
}

/// A node's memory offered to other nodes' far-memory cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MemoryServer {
    /// Bytes offered in all (`--memory-server SIZE`).
    pub capacity: u64,
    /// Bytes not holding pages now.
    pub free: u64,
}

/// Far memory asked for at a launch through the planner (`roam launch
/// --local-memory`): the planner picks the memory server unless one is
/// named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FarPlace {
    /// Bytes of the cell's memory resident on its node at most.
    pub local_memory: u64,
    /// `clock` (the default) or `random`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<String>,
    /// The memory server's node name; `None`: the planner picks the node
    /// with the most free memory-server room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// What one running cell uses on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CellUsage {
    /// The cell.
    pub cell: String,
    /// CPU time its thread has used on this node, ms (a counter: it starts
    /// again on each node).
    pub cpu_ms: u64,
    /// Its linear memory, bytes.
    pub memory_bytes: u64,
}

/// A node's path to its gateway, as the node measures it on the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GatewayPath {
    /// The gateway's control address, as the node was given it.
    pub address: String,
    /// The id the gateway answers pings with: nodes that report the same
    /// id reach the same gateway, and so the same clients, whatever
    /// address each dialed. Absent until the first answer (and from a
    /// gateway older than protocol 3); then the address stands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Whether the link is up now.
    pub connected: bool,
    /// Round-trip time, microseconds: the smallest of the last few pings
    /// on the link (the path's floor, not the link's load), or the oldest
    /// unanswered ping's wait if longer. Absent until measured (a gateway
    /// older than protocol 3 never answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_us: Option<u64>,
    /// The services served through it here, with their traffic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceTraffic>,
}

/// One service a node serves, and its client traffic through the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ServiceTraffic {
    /// The service.
    pub service: String,
    /// The cell serving it.
    pub cell: String,
    /// Client connections open.
    pub conns: u64,
    /// Client->cell messages since the cell started serving here (a
    /// counter: it starts again at 0 on each node).
    pub frames: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// A node's administrative state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// It takes new cells.
    #[default]
    Ready,
    /// It takes no new cells; its cells are being moved away.
    Draining,
}

/// A cell as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    /// Its id, the same on every node it runs on.
    pub id: String,
    /// The module's BLAKE3 hash (in the module repository).
    pub module: String,
    /// Program name and arguments.
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// Guest directories.
    pub dirs: Vec<String>,
    /// Memory limit, bytes (`None`: the node's default).
    pub max_memory: Option<u64>,
    /// The gateway service it serves, if any.
    pub service: Option<String>,
    /// The node that owns it: the only node that may run it.
    pub owner: String,
    /// Bumped on every change of owner; a node acts on ownership only
    /// with the generation it was given.
    pub generation: u64,
    /// Where it stands.
    pub state: CellState,
    /// Seconds between kept checkpoints (0: none).
    pub checkpoint_interval_s: u64,
    /// Its newest kept checkpoint.
    pub kept: Option<Kept>,
    /// When it was launched, Unix milliseconds.
    pub created_ms: u64,
    /// The last hand-off its owner announced: the node that may take it
    /// at a migration's commit point. Kept after the move, so that the
    /// source can take the cell back after an ambiguous commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    /// Far memory, as asked at its launch; `server` is the memory server
    /// the planner chose, by node name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far: Option<FarPlace>,
}

/// A hand-off of a cell, announced by its owner before a migration
/// (`POST /v1/cells/{id}/handoff`). Without one, no node but the owner may
/// take the cell: knowing its owner and generation is not enough.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handoff {
    /// The owner that announced it.
    pub from: String,
    /// The node that may take the cell.
    pub to: String,
    /// The generation the cell had when it was announced.
    pub generation: u64,
}

/// Where a cell stands, as far as the planner knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum CellState {
    /// Being started on its owner.
    Placing,
    /// Running on its owner.
    Running,
    /// Moving to another node.
    Migrating {
        /// The destination's name.
        to: String,
    },
    /// Its owner died; being restored from its kept checkpoint.
    Restoring,
    /// The program exited.
    Exited {
        /// Its exit code.
        code: i32,
    },
    /// It failed.
    Failed {
        /// Why.
        error: String,
    },
    /// Killed by a user.
    Killed,
    /// Its owner died and there was no kept checkpoint to restore it from.
    Lost {
        /// Why it could not be restored.
        error: String,
    },
}

impl CellState {
    /// Whether the cell has ended for good.
    pub fn ended(&self) -> bool {
        matches!(
            self,
            CellState::Exited { .. }
                | CellState::Failed { .. }
                | CellState::Killed
                | CellState::Lost { .. }
        )
    }
}

/// A checkpoint of a cell kept on another node than its owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    /// The node that holds it.
    pub holder: String,
    /// The snapshot's BLAKE3 hash.
    pub snapshot: String,
    /// Its size, bytes.
    pub bytes: u64,
    /// When it was taken, Unix milliseconds.
    pub taken_ms: u64,
    /// The owner generation it was taken under.
    pub generation: u64,
}

/// `GET /v1/services/{service}`: who may serve a gateway service now, read
/// from the cell records (the one question a gateway asks the planner).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceOwners {
    /// The service.
    pub service: String,
    /// Every cell of the service that has not ended (normally one), with
    /// its owner and generation. Empty: no cell serves it.
    pub cells: Vec<ServiceCell>,
}

/// One cell of a service, as its record says now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCell {
    /// The cell's id.
    pub cell: String,
    /// The node that owns it: the only node that may serve it.
    pub owner: String,
    /// Its ownership generation.
    pub generation: u64,
}

/// A module in the repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRecord {
    /// Its BLAKE3 hash.
    pub hash: String,
    /// Its size, bytes.
    pub bytes: u64,
}

/// `POST /v1/nodes`: a node registers (again).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RegisterRequest {
    /// Its name.
    pub name: String,
    /// Its ISA.
    pub isa: String,
    /// Its control API address, as others reach it.
    pub api: String,
    /// Its migration listener, as others reach it.
    pub migrate: String,
    /// Its roam version.
    pub version: String,
    /// Its status now.
    pub status: NodeStatus,
}

/// The answer to a registration or a heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct HeartbeatResponse {
    /// Send the next heartbeat within this many milliseconds.
    pub heartbeat_ms: u64,
    /// The lease: without a heartbeat for this long the node is dead.
    pub lease_ms: u64,
    /// Cells the node runs but does not own (it lost them while cut off):
    /// it must stop them now, without telling anyone else.
    pub stop: Vec<String>,
    /// For each cell of `stop`, the generation of the record the planner
    /// decided it on. A node that owns the cell at a later generation (it
    /// took the cell back after this answer was decided) ignores the stop.
    #[serde(default)]
    pub stop_generations: std::collections::BTreeMap<String, u64>,
}

/// `POST /v1/nodes/{name}/heartbeat`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HeartbeatRequest {
    /// The node's status now.
    pub status: NodeStatus,
}

/// `POST /v1/cells/{id}/handoff`: the owner says which node may take the
/// cell (at a migration's start, before the destination's
/// [`OwnerRequest`]). Only the owner, at its generation, may announce it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandoffRequest {
    /// The owner making the announcement.
    pub from: String,
    /// The generation the owner holds the cell at.
    pub generation: u64,
    /// The node that may take it.
    pub to: String,
}

/// `POST /v1/cells/{id}/owner`: the ownership transaction a node asks for
/// at a migration's commit point (the destination takes the cell) or after
/// an ambiguous failure (the source takes it back).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnerRequest {
    /// The owner the caller believes holds the cell.
    pub from: String,
    /// The generation the caller believes is current.
    pub generation: u64,
    /// The new owner.
    pub to: String,
}

/// The answer to an [`OwnerRequest`] that won: `409` otherwise, with the
/// current owner and generation in the error.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnerResponse {
    /// The owner now.
    pub owner: String,
    /// The generation now.
    pub generation: u64,
}

/// `POST /v1/cells` on the planner.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PlaceRequest {
    /// The module's hash (uploaded with `POST /v1/modules` first).
    pub module: String,
    /// Program name and arguments.
    pub args: Vec<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Guest directories.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Memory limit, bytes.
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// A gateway service.
    #[serde(default)]
    pub service: Option<String>,
    /// Run it on this node (the `manual` policy); otherwise the placement
    /// policy chooses.
    #[serde(default)]
    pub node: Option<String>,
    /// Seconds between kept checkpoints; `None`: the planner's default;
    /// 0: none.
    #[serde(default)]
    pub checkpoint_interval_s: Option<u64>,
    /// Far memory: keep at most this much of the cell's memory on its node
    /// and the rest on a memory server (`docs/far-memory.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far: Option<FarPlace>,
}

/// `POST /v1/cells/{id}/migrate` on the planner.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct MoveRequest {
    /// The destination node's name; `None`: the placement policy chooses.
    #[serde(default)]
    pub to: Option<String>,
    /// `stop-and-copy`, `pre-copy` or `post-copy`; `None`: pre-copy.
    #[serde(default)]
    pub mode: Option<String>,
}

/// The answer to `POST /v1/cells/{id}/migrate` on the planner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveResponse {
    /// The migration's id on the source node (`GET /v1/migrations/{id}`
    /// there).
    pub migration: String,
    /// The destination node's name.
    pub to: String,
}

/// The answer to `POST /v1/nodes/{name}/drain`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct DrainResponse {
    /// The node drained.
    pub node: String,
    /// One entry per cell it owned.
    pub moves: Vec<DrainMove>,
}

/// One cell of a drained node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainMove {
    /// The cell.
    pub cell: String,
    /// Where it goes, when a migration started.
    #[serde(default)]
    pub to: Option<String>,
    /// The migration's id on the drained node, when one started.
    #[serde(default)]
    pub migration: Option<String>,
    /// Why it could not be moved.
    #[serde(default)]
    pub error: Option<String>,
}

/// `GET /v1/policies` and the answer to `PUT /v1/policies`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PoliciesResponse {
    /// The placement policy of launches and migrations that name no node.
    pub placement: String,
    /// Every policy there is.
    pub available: Vec<PolicyInfo>,
}

/// `GET /v1/slowdowns`: what the planner learned of each program's CPU
/// time per ISA, from the runs it saw end (`offload-by-slowdown`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Slowdowns {
    /// Module hash → the program.
    pub programs: std::collections::BTreeMap<String, LearnedProgram>,
}

/// What the planner learned of one program.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedProgram {
    /// Its name, as launched (the first argument), for people.
    pub name: String,
    /// ISA → its time there.
    pub isas: std::collections::BTreeMap<String, LearnedTime>,
}

impl LearnedProgram {
    /// Each pair of ISAs with a time, as (slower, faster, slowdown ≥ 1).
    pub fn slowdowns(&self) -> Vec<(&str, &str, f64)> {
        let known: Vec<(&str, f64)> = self
            .isas
            .iter()
            .filter(|(_, e)| e.cpu_ms > 0.0)
            .map(|(i, e)| (i.as_str(), e.cpu_ms))
            .collect();
        let mut out = Vec::new();
        for (i, &(a, ta)) in known.iter().enumerate() {
            for &(b, tb) in &known[i + 1..] {
                out.push(if tb >= ta {
                    (b, a, tb / ta)
                } else {
                    (a, b, ta / tb)
                });
            }
        }
        out
    }
}

/// One program's time on one ISA.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LearnedTime {
    /// CPU time of one whole run, ms.
    pub cpu_ms: f64,
    /// Runs behind it (a run split across ISAs counts as its share).
    pub runs: f64,
}

/// One policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
}

/// `PUT /v1/policies`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PolicyRequest {
    /// The placement policy to use from now on.
    pub placement: String,
}
