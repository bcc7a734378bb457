//! The JSON types of the control API, shared by the node and its clients.
//!
//! Documented field by field in `docs/node-api.md`; changing a field name is
//! an API break.

use serde::{Deserialize, Serialize};

use crate::sysinfo::Machine;

/// `GET /v1/node`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's name.
    pub name: String,
    /// Its ISA.
    pub isa: String,
    /// roam version.
    pub version: String,
    /// Where the node accepts migrations (`host:port`).
    pub migrate_addr: String,
    /// userfaultfd works here (post-copy destination, write-protect dirty tracking).
    pub userfaultfd: bool,
    /// Cells running here now.
    pub cells_running: usize,
    /// The machine.
    pub machine: Machine,
    /// How cells' CPU is limited here, and the node's defaults (`None`
    /// from a node before CPU limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<NodeCpu>,
}

/// A node's CPU limits for its cells, in [`NodeInfo`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeCpu {
    /// `cgroup-v2`, `cgroup-v1` or `nice` (`docs/trust.md`, "Guest limits").
    pub mechanism: String,
    /// The weight of a cell that asks for none (`--cell-cpu-weight`).
    pub cell_weight: u32,
    /// The cap of a cell that asks for none, thousandths of a core
    /// (`--cell-cpu-max`); `None`: no cap.
    #[serde(default)]
    pub cell_max_millicores: Option<u32>,
    /// The weight of all cells together against one node thread's 100
    /// (cgroups only).
    #[serde(default)]
    pub cells_weight: Option<u32>,
    /// The cgroup that holds the cells' groups (cgroups only).
    #[serde(default)]
    pub group: Option<String>,
}

/// A cell's CPU settings as asked for at launch or restore; what is not
/// set is the default of the node the cell runs on, wherever it moves.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CpuRequest {
    /// Its share of the CPU against the node's other cells, 1 to 10000
    /// (100 is the usual default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Most CPU it may use, thousandths of a core (500: half a core), 10 to
    /// 1024000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_millicores: Option<u32>,
}

impl CpuRequest {
    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self.weight.is_none() && self.max_millicores.is_none()
    }
}

/// The CPU limits a running cell got, in [`CellInfo`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellCpu {
    /// `cgroup-v2`, `cgroup-v1`, or `nice` (the node's mechanism, or its
    /// fallback when the cell's group could not be made).
    pub mechanism: String,
    /// Its weight.
    pub weight: u32,
    /// Its cap, thousandths of a core; `None`: no cap.
    #[serde(default)]
    pub max_millicores: Option<u32>,
    /// Whether the cap is enforced (not with `nice`).
    pub max_enforced: bool,
    /// Its thread's nice value (`nice` only).
    #[serde(default)]
    pub nice: Option<i32>,
    /// Its cgroup's directory (cgroups only).
    #[serde(default)]
    pub group: Option<String>,
}

/// `POST /v1/modules` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModuleInfo {
    /// BLAKE3 of the prepared module, hex.
    pub hash: String,
    /// Its size.
    pub bytes: u64,
}

/// `POST /v1/cells` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Hash of a module uploaded with `POST /v1/modules`.
    pub module: String,
    /// argv, program name first.
    pub args: Vec<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Guest paths of sandbox directories to give the cell (each gets an
    /// empty directory on the node, and travels with the cell).
    #[serde(default)]
    pub dirs: Vec<String>,
    /// The cell's memory limit in bytes: a `memory.grow` past it fails
    /// (`malloc` returns NULL). Default: the node's `--cell-memory`; more
    /// than its `--max-cell-memory` is refused.
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// Serve the network service of this name behind the node's gateway:
    /// the cell gets one listening socket labelled with it (the first fd
    /// after its directories). Needs a node started with `--gateway`.
    #[serde(default)]
    pub service: Option<String>,
    /// The cell's id, chosen by the caller (the planner, so that the id is
    /// the same in the cluster's records and on every node); `None`: the
    /// node chooses one. A taken id is refused with `409`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The cell's CPU weight and cap; they travel with it when it moves.
    #[serde(default, skip_serializing_if = "CpuRequest::is_empty")]
    pub cpu: CpuRequest,
    /// The cell's ownership generation, when a planner placed it: with a
    /// planner, migrations of the cell are ownership transactions naming
    /// it (`docs/control-plane.md`). `None`: a cell no planner knows.
    #[serde(default)]
    pub generation: Option<u64>,
    /// Far memory: keep at most this much of the cell's memory on the node
    /// and the rest on a memory server (`docs/far-memory.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far: Option<FarRequest>,
}

/// How a cell's memory is split between its node and a memory server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FarRequest {
    /// Bytes of the cell's memory resident on its node at most (at least
    /// 256 KiB).
    pub local_memory: u64,
    /// The memory server's control address (`host:port` or URL): a node
    /// started with `--memory-server`.
    pub server: String,
    /// Which page leaves when the local memory is full: `clock` (the
    /// default) or `random`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<String>,
}

/// Where a far-memory cell's pages are now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct FarInfo {
    /// The memory server's name.
    pub server: String,
    /// The local budget, bytes.
    pub local_memory: u64,
    /// Bytes resident on the node now.
    pub resident_bytes: u64,
    /// Bytes whose only copy is on the memory server now.
    pub far_bytes: u64,
    /// Faults that waited for the memory server.
    pub far_faults: u64,
    /// Bytes fetched from the memory server so far.
    pub bytes_in: u64,
    /// Bytes written to the memory server so far.
    pub bytes_out: u64,
}

/// `POST /v1/cells/restore` body (asked of a node by the planner): start a
/// cell from a checkpoint kept on another node, as the cell's owner at
/// `generation`. Answered with the new cell's [`CellInfo`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// The cell's id (the same as before).
    pub id: String,
    /// Its module's hash (uploaded to this node first).
    pub module: String,
    /// argv, program name first.
    pub args: Vec<String>,
    /// Environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Guest directories.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Memory limit, bytes (`None`: the node's default).
    #[serde(default)]
    pub max_memory: Option<u64>,
    /// The gateway service it serves, if any.
    #[serde(default)]
    pub service: Option<String>,
    /// The owner generation this node runs it under.
    pub generation: u64,
    /// Its CPU weight and cap (unset: this node's defaults).
    #[serde(default, skip_serializing_if = "CpuRequest::is_empty")]
    pub cpu: CpuRequest,
    /// The control API address of the node that holds the checkpoint.
    pub holder: String,
    /// The kept snapshot's BLAKE3 hash.
    pub snapshot: String,
    /// Far memory: the restored cell keeps at most this much of its memory
    /// here, and the rest on this memory server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far: Option<FarRequest>,
}

/// `POST /v1/cells/{id}/keep` body (asked of a cell's owner by the
/// planner): checkpoint the cell and continue, and send the snapshot to
/// `holder`, which keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeepRequest {
    /// The holder's control API address.
    pub holder: String,
    /// The holder's node name.
    pub holder_name: String,
}

/// What a holder lets a node do with a cell's kept checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeptAccess {
    /// Store a new version (the cell's owner).
    Store,
    /// Read one version back (the node a cell is restored on).
    Read,
}

/// `POST /v1/kept/{id}/grant` (the planner, to a holder): let `node` store
/// a kept checkpoint of the cell, or read version `snapshot` of it, for
/// the next few minutes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeptGrant {
    /// The node's name, as its certificate gives it.
    pub node: String,
    /// What it may do.
    pub access: KeptAccess,
    /// For a read: the one version it may fetch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// `POST /v1/cells/{id}/keep` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeepResponse {
    /// The snapshot's BLAKE3 hash.
    pub snapshot: String,
    /// Its size, bytes.
    pub bytes: u64,
    /// Bytes sent to the holder (chunks it already had are not sent).
    pub sent_bytes: u64,
    /// When it was taken, Unix milliseconds.
    pub taken_ms: u64,
}

/// `POST /v1/cells` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchResponse {
    /// The new cell's id.
    pub id: String,
}

/// Where a cell is in its life, as seen by one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum CellState {
    /// Running here.
    Running,
    /// Paused here for a migration in progress.
    Migrating,
    /// Exited here with this status.
    Exited {
        /// Exit status.
        code: i32,
    },
    /// Failed here (trap, or lost pages after a failed post-copy).
    Failed {
        /// What happened.
        error: String,
    },
    /// Killed by `roam kill`.
    Killed,
    /// Moved to another node.
    Moved {
        /// The node's control address.
        to: String,
    },
}

/// One cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellInfo {
    /// Id.
    pub id: String,
    /// Its state.
    #[serde(flatten)]
    pub state: CellState,
    /// Program name.
    pub program: String,
    /// Module hash, hex.
    pub module: String,
    /// Linear memory, bytes (0 when not running here).
    pub memory_bytes: u64,
    /// The cell's memory limit, bytes.
    #[serde(default)]
    pub max_memory: u64,
    /// Bytes of output dropped from the log (it keeps the last
    /// `--log-size` bytes), on this node and earlier ones.
    #[serde(default)]
    pub log_dropped_bytes: u64,
    /// Milliseconds since the cell was first launched (anywhere).
    pub uptime_ms: u64,
    /// Migrations so far.
    pub hops: u32,
    /// The network service the cell serves behind a gateway, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The CPU limits it runs under here (running cells only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CellCpu>,
    /// Far memory (running cells launched with it only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far: Option<FarInfo>,
    /// It failed because pages of its memory were lost (its memory server
    /// died, or a post-copy source): a kept checkpoint can bring it back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_lost: bool,
    /// CPU time the cell's thread used on this node, ms: so far while it
    /// runs here, all of it once it ended or moved on. Absent before it
    /// runs, and from an older node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Threads the program runs now (cells with a program here only; 0
    /// before its first instance exists, more than one for a threaded
    /// program while its workers live). Absent from an older node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// `POST /v1/cells/{id}/migrate` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateRequest {
    /// Destination node's control address (`host:port`).
    pub to: String,
    /// `stop-and-copy`, `pre-copy` or `post-copy`.
    pub mode: String,
    /// Transfer options.
    #[serde(default)]
    pub transfer: TransferOptions,
}

/// How the transfer pipeline runs.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct TransferOptions {
    /// `adaptive` (default), `none`, `lz4`, `zstd1` ... `zstd19`.
    #[serde(default)]
    pub codec: Option<String>,
    /// Delta against pages sent earlier (static modes only; default on).
    #[serde(default)]
    pub delta: Option<bool>,
    /// Shape the migration stream to this rate (`10mbit`, `1gbit`).
    #[serde(default)]
    pub bandwidth: Option<String>,
    /// Randomise page order (workload levelling).
    #[serde(default)]
    pub randomize: bool,
    /// Pre-copy: stop the rounds when at most this many dirty bytes remain
    /// (default 10 MB).
    #[serde(default)]
    pub max_remaining_bytes: Option<u64>,
    /// Pre-copy: also stop the rounds once a round takes at most this long
    /// (VM handoff's rule with 2000 ms; default off).
    #[serde(default)]
    pub max_round_ms: Option<u64>,
    /// Pre-copy: stop the rounds once the pages dirty now would take at
    /// most this long to send at the last round's rate (default 30 ms).
    #[serde(default)]
    pub max_downtime_ms: Option<u64>,
    /// Pre-copy: most rounds (default 30).
    #[serde(default)]
    pub max_rounds: Option<u32>,
    /// Pre-copy dirty tracking: `auto` (default), `write-protect`, `hash`.
    #[serde(default)]
    pub tracking: Option<String>,
    /// Pre-copy's final round, sent while paused: `lz4` (default), `none`
    /// or `zstd1` ... `zstd19` encode on one thread straight into the
    /// connection; `pipeline` sends it through the transfer pipeline like
    /// the other rounds.
    #[serde(default)]
    pub final_round: Option<String>,
}

/// `POST /v1/cells/{id}/migrate` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MigrateResponse {
    /// Poll `GET /v1/migrations/{id}` for progress.
    pub migration: String,
}

/// `GET /v1/migrations/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct MigrationStatus {
    /// Migration id.
    pub id: String,
    /// Cell id.
    pub cell: String,
    /// Mode.
    pub mode: String,
    /// `connecting`, `offering`, `sending-module`, `preparing`, `round N`,
    /// `paused`, `final`, `committing`, `post-copy`, `done`, `failed`.
    pub phase: String,
    /// Pre-copy round (0 before the first).
    pub round: u32,
    /// Memory pages handed to the pipeline so far.
    pub pages_in: u64,
    /// Bytes written to the connection so far.
    pub wire_bytes: u64,
    /// Memory size of the cell, bytes.
    pub memory_bytes: u64,
    /// Milliseconds since the migration started.
    pub elapsed_ms: u64,
    /// Finished (successfully or not).
    pub done: bool,
    /// Why it failed; the cell then still runs on the source.
    pub error: Option<String>,
    /// Set when done and successful.
    pub summary: Option<MigrationSummary>,
}

/// The outcome of a migration.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct MigrationSummary {
    /// Mode.
    pub mode: String,
    /// Source and destination ISAs.
    pub from_isa: String,
    /// Destination ISA.
    pub to_isa: String,
    /// From the request to the destination confirming the cell runs.
    pub total_ms: f64,
    /// From the cell's pause to the destination confirming it runs.
    pub downtime_ms: f64,
    /// Part of the downtime spent sending pages while paused (the final
    /// round; all of memory for stop-and-copy).
    #[serde(default)]
    pub paused_pages_ms: f64,
    /// Part of the downtime from the final state going out to `Running`
    /// coming back (encoding, the destination finishing the instance).
    #[serde(default)]
    pub commit_ms: f64,
    /// Bytes written to the connection, framing included.
    pub wire_bytes: u64,
    /// Bytes of memory that differ from zero and from the module's initial
    /// image at the end (the modified state).
    pub modified_bytes: u64,
    /// Linear memory size at the end.
    pub memory_bytes: u64,
    /// Pre-copy rounds (1 for stop-and-copy).
    pub rounds: u32,
    /// Dirty-page tracking method used by pre-copy.
    pub tracking: Option<String>,
    /// Bytes of sandbox files sent while the cell ran (pre-copy).
    #[serde(default)]
    pub files_bytes_before_pause: u64,
    /// Bytes of sandbox files sent during the pause (those that changed,
    /// for pre-copy; all of them otherwise).
    #[serde(default)]
    pub files_bytes_paused: u64,
    /// Bytes of log sent (during the pause).
    #[serde(default)]
    pub log_bytes: u64,
    /// Post-copy: pages fetched on demand / pushed in the background.
    pub post_copy: Option<PostCopyStats>,
    /// What each pipeline stage removed (transfer-pipeline statistics).
    pub pipeline: serde_json::Value,
    /// Where the downtime went, phase by phase.
    #[serde(default)]
    pub pause: Option<PauseBreakdown>,
}

/// The downtime of a migration, phase by phase, in milliseconds. The
/// phases follow each other, so `to_driver_ms` through `commit_ms` add up to
/// the downtime (up to rounding).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PauseBreakdown {
    /// From the pause request to the migration point (the cell still runs
    /// meanwhile: not downtime).
    pub request_to_point_ms: f64,
    /// From the migration point to the migration holding the paused state:
    /// unwinding and capture of the execution state, the handoff, the
    /// gateway told to hold.
    pub to_driver_ms: f64,
    /// Pages sent while paused (the final round in pre-copy).
    pub final_pages: u64,
    /// Collecting the last dirty pages (write-protect scan or hashes).
    pub collect_ms: f64,
    /// Reading the paused pages into the pipeline and closing it (the last
    /// records compressed and batched).
    pub encode_ms: f64,
    /// From the pipeline closed to its last batch on the wire.
    pub wire_ms: f64,
    /// Changed sandbox files and the log.
    pub files_log_ms: f64,
    /// Encoding the execution state (everything but memory).
    pub state_encode_ms: f64,
    /// Its size on the wire, bytes.
    pub state_bytes: u64,
    /// From the final state queued to `Running` back: its transmission,
    /// the destination's work (see `destination`), the answer's trip.
    pub commit_ms: f64,
    /// The destination's share of the commit, as it measured it (absent
    /// when it is a node that does not report it).
    pub destination: Option<DestTimings>,
    /// How the pages sent while paused were encoded: `pipeline`, or
    /// `direct` with the codec (`direct lz4`).
    #[serde(default)]
    pub final_encoding: String,
    /// Bytes put on the wire while paused (pages, files, log, state).
    #[serde(default)]
    pub paused_wire_bytes: u64,
    /// Those bytes at the shaped bandwidth, ms: the floor of the pause's
    /// wire time (0 when the stream is not shaped).
    #[serde(default)]
    pub paused_wire_floor_ms: f64,
    /// How long after the pause the destination still read the earlier
    /// rounds (it reads its last `RoundDone` this late): pages already
    /// written to the connection but still in socket buffers and queues.
    /// Wall clocks of both nodes: meaningful when they agree (one host).
    #[serde(default)]
    pub dest_behind_ms: Option<f64>,
}

/// The destination's side of the commit, in milliseconds from the final
/// state read off the connection.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct DestTimings {
    /// Until the receiving thread took the final state: pages read before
    /// it that were still being applied.
    pub backlog_ms: f64,
    /// Decoding the execution state.
    pub decode_ms: f64,
    /// Installing it into the pre-instantiated cell (globals, OS layer,
    /// the rewind prepared).
    pub install_ms: f64,
    /// The commit point and registration (the gateway told to serve here).
    pub register_ms: f64,
    /// From the final state read to `Running` sent; the cell's thread
    /// starts the rewind at the same time.
    pub to_running_ms: f64,
    /// From the first page of the last round (after the last
    /// `RoundDone`; all pages in stop-and-copy) read off the connection to
    /// the final state read: how long the paused pages took to arrive here.
    #[serde(default)]
    pub last_pages_read_ms: f64,
    /// Time spent decoding and writing those pages into the memory.
    #[serde(default)]
    pub last_pages_apply_ms: f64,
    /// Wall-clock time (ms since the Unix epoch) the last `RoundDone` was
    /// read here (0: none).
    #[serde(default)]
    pub last_round_done_unix_ms: f64,
}

/// Post-copy counters reported by the destination.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PostCopyStats {
    /// Pages requested on demand (after a fault).
    pub demand_pages: u64,
    /// Page requests (each may carry a batch of neighbours).
    pub requests: u64,
    /// Pages pushed in the background.
    pub pushed_pages: u64,
    /// Milliseconds from resume until every page was present.
    pub complete_ms: f64,
}

/// `POST /v1/migrations/{id}/resolve` answer (asked of a destination by a
/// source whose connection broke during the commit).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Resolution {
    /// The cell runs on the destination: the source must drop its copy.
    Running,
    /// The destination did not and will never start it: the source resumes.
    Aborted,
}

/// Error body of every failed request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong, for a person.
    pub error: String,
}
