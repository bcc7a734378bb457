//! Command-line arguments. The names and flags here are a contract that
//! scripts and later tooling rely on: add, never rename.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Move running WebAssembly programs between machines of different CPU
/// architectures.
#[derive(Parser, Debug)]
#[command(name = "roam", version, about, propagate_version = true)]
pub struct Cli {
    /// Log what roam does (or set ROAM_LOG=debug|info|...).
    #[arg(short, long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Instrument a module for migration (once; the output runs anywhere).
    Prepare(PrepareArgs),
    /// Run a module; checkpoint on SIGUSR1 (continue) or SIGTERM (stop).
    Run(RunArgs),
    /// Resume a snapshot on this machine, whatever ISA it was taken on.
    Restore(RestoreArgs),
    /// Describe a snapshot.
    Inspect(InspectArgs),
    /// Run a node daemon: cells, control API, migrations.
    Node(crate::node_args::NodeArgs),
    /// Launch a program on a node; prints the cell id.
    Launch(crate::node_args::LaunchArgs),
    /// List the cells of a node, or of the whole cluster (through the planner).
    Cells(crate::node_args::CellsArgs),
    /// Move a running cell to another node.
    Migrate(crate::node_args::MigrateArgs),
    /// Print a cell's output, wherever it runs now.
    Logs(crate::node_args::LogsArgs),
    /// Stop a cell and drop it.
    Kill(crate::node_args::KillArgs),
    /// Make the cluster CA, node and client certificates (mutual TLS).
    Cert(crate::cert::CertArgs),
    /// Run a gateway: clients connect to it and stay connected while the
    /// service's cell moves between nodes.
    Gateway(crate::gateway_cmd::GatewayArgs),
    /// Start a planner and local nodes on this machine, ready to use.
    Up(crate::up::UpArgs),
    /// List the cluster's nodes (through the planner).
    Nodes(crate::node_args::NodesArgs),
    /// Move every cell off a node before maintenance.
    Drain(crate::node_args::DrainArgs),
    /// Let a drained node take cells again, after its maintenance.
    Undrain(crate::node_args::UndrainArgs),
    /// Show the cluster's placement policies, or set the one in force
    Policy(crate::node_args::PolicyArgs),
    /// Show how much slower each program runs on each ISA, as the planner
    /// learned it from the runs it saw end (offload-by-slowdown)
    Slowdowns(crate::node_args::SlowdownsArgs),
    /// Declare when a node goes down for work: the planner moves its cells
    /// away beforehand and puts it back in service afterwards
    Maintenance(crate::maintenance_cmd::MaintenanceArgs),
    /// Run a planner: the one place that knows every node and cell, places
    /// cells, keeps their checkpoints on other nodes, restores a dead
    /// node's cells.
    Planner(crate::planner_cmd::PlannerArgs),
}

/// Where migration points go.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Points {
    /// Every loop header and the entry of every non-leaf function (default).
    Loops,
    /// Like loops, but leaf loops nested in another loop get no point:
    /// faster, and a checkpoint waits for the running inner loop.
    Outer,
    /// The entry of every non-leaf function.
    Functions,
    /// Only the program's own calls to `roam.migration_point`.
    Manual,
}

impl From<Points> for roam_prepare::PointPolicy {
    fn from(p: Points) -> Self {
        match p {
            Points::Loops => roam_prepare::PointPolicy::Loops,
            Points::Outer => roam_prepare::PointPolicy::Outer,
            Points::Functions => roam_prepare::PointPolicy::Functions,
            Points::Manual => roam_prepare::PointPolicy::Manual,
        }
    }
}

/// `roam prepare`.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// The module to instrument.
    pub input: PathBuf,
    /// Where to write the prepared module.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Migration-point policy.
    #[arg(long, value_enum, default_value_t = Points::Loops)]
    pub points: Points,
    /// The wasm-opt to use (default: $ROAM_WASM_OPT, then wasm-opt on PATH).
    #[arg(long)]
    pub wasm_opt: Option<PathBuf>,
    /// Functions Asyncify instruments: `reachable` (those that can reach an
    /// unwinding import, indirect calls resolved by signature) or `all`
    /// (Asyncify's own analysis) [default: all].
    #[arg(long, value_name = "SCOPE", help_heading = "Ablation and tuning")]
    pub asyncify_scope: Option<roam_prepare::AsyncifyScope>,
    /// Function entries that get a migration point: `cycles` (functions on a
    /// call-graph cycle) or `all` (every function that calls)
    /// [default: cycles].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub entry_points: Option<roam_prepare::EntryPoints>,
    /// How loop points are placed: `rerun` (as `hoisted`, and an inner loop
    /// at the top of its outer loop's body that only computes leaves to the
    /// outer loop's point, which runs that iteration again), `hoisted` (a
    /// loop that makes no call that may unwind checks the flag at its
    /// back-edges and calls the point from outside itself, so Asyncify
    /// leaves its body alone), `versioned` (such a loop runs as a fast copy
    /// that hands over to a slow copy with an inline point when the flag is
    /// up) or `inline` (a call at the top of every loop body)
    /// [default: rerun].
    #[arg(long, value_name = "HOW", help_heading = "Ablation and tuning")]
    pub loop_points: Option<roam_prepare::LoopPoints>,
    /// What a migration point's call does with the function's values:
    /// `spilled` (every local is copied to a scratch global around the call,
    /// so no value is live across it) or `plain` (the call as Asyncify
    /// leaves it) [default: spilled].
    #[arg(long, value_name = "FORM", help_heading = "Ablation and tuning")]
    pub point_calls: Option<roam_prepare::PointCalls>,
    /// Loops of functions with many locals move into functions of their
    /// own, which the register allocator handles far better than the large
    /// function once Asyncify has instrumented it: `on` or `off`
    /// [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub outline_loops: Option<roam_prepare::Outline>,
    /// Pure functions (they write nothing but their own locals) that reach a
    /// point run without Asyncify: at a point they give up, and the point in
    /// their caller runs the call again: `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub rerun_calls: Option<roam_prepare::RerunCalls>,
    /// Indirect calls whose every possible callee (by table and type)
    /// reaches no point and no blocking import go through a helper Asyncify
    /// is told cannot unwind: `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub quiet_indirect: Option<roam_prepare::QuietIndirect>,
    /// Short innermost loops that call nothing and move into a function of
    /// their own run their body twice per trip and check the flag once, at
    /// every other back-edge: `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub unroll_checks: Option<roam_prepare::UnrollChecks>,
    /// Loops that make a call that may unwind check the flag at their
    /// back-edges and call their point from outside themselves, as loops
    /// that call nothing do, instead of at the top of their body: `on` or
    /// `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub hoist_calls: Option<roam_prepare::HoistCalls>,
    /// Loops that count to a bound they never change, and call nothing,
    /// test their trip count on entry: a run short enough to end within a
    /// budget of instructions takes a copy without point or check: `on` or
    /// `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub counted_loops: Option<roam_prepare::CountedLoops>,
    /// A counted loop that holds only counted innermost loops, and calls
    /// nothing, runs as a copy without point or check when the whole nest
    /// is short (needs `--counted-loops on`): `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub counted_nests: Option<roam_prepare::CountedNests>,
    /// A `memory.fill` or `memory.copy` longer than 64 KiB runs in chunks
    /// with a migration point between them: `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub bulk_chunks: Option<roam_prepare::BulkChunks>,
    /// A loop moved into a function of its own takes only the locals it
    /// may read before it sets them, and gives back only those of its
    /// writes that are read after it: `on` or `off` (every local it uses
    /// in, every local it writes out) [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub trim_outlined: Option<roam_prepare::TrimOutlined>,
    /// After the last optimiser run, a float `gt`/`ge` of two locals that
    /// a `select` takes is turned round into `lt`/`le`, the form Cranelift
    /// makes a single minimum or maximum instruction of: `on` or `off`
    /// [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub turn_compares: Option<roam_prepare::TurnCompares>,
    /// A function that calls one that never returns and may unwind (an
    /// error path that prints and exits) returns first, and its caller
    /// makes the call, so the hot function's error checks are not call
    /// sites Asyncify must instrument: `on` or `off` [default: on].
    #[arg(long, value_name = "WHICH", help_heading = "Ablation and tuning")]
    pub lift_exits: Option<roam_prepare::LiftExits>,
    /// wasm-opt optimisation level after Asyncify: O0, O1, O2, O3, O4 or Os
    /// [default: O2].
    #[arg(long, value_name = "LEVEL", help_heading = "Ablation and tuning")]
    pub opt: Option<roam_prepare::OptLevel>,
    /// How the stack is captured: `eh`, which throws a Wasm exception at a
    /// point, stores each frame's live locals in handlers and rebuilds the
    /// stack in rewind copies of the functions; `returns`, the same but
    /// frames leave by returning, with a check of the state after each
    /// call that may reach a point (needs no exception support); `asyncify`, Binaryen's
    /// Asyncify (the fallback, several times slower on call-heavy
    /// programs); `eh-points`, an ablation with its points alone, which
    /// nothing can run [default: $ROAM_CAPTURE or returns].
    #[arg(long, value_name = "HOW")]
    pub capture: Option<roam_prepare::Capture>,
}

/// Options shared by `run` and `restore`.
#[derive(Args, Debug)]
pub struct CellArgs {
    /// Give the program a host directory: HOST::GUEST (repeatable).
    #[arg(long = "dir", value_name = "HOST::GUEST")]
    pub dirs: Vec<String>,
    /// Serve real TCP clients on ADDR (repeatable): the program finds each
    /// listening socket as an fd after the --dir directories. On restore,
    /// give one per listener of the snapshot, in the same order; restored
    /// connections are reported to the program as reset.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Where checkpoints are written.
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// Checkpoint-and-stop after this many seconds of running.
    #[arg(long, value_name = "SECS")]
    pub checkpoint_after: Option<f64>,
    /// Checkpoint-and-continue every SECS seconds.
    #[arg(long, value_name = "SECS")]
    pub checkpoint_every: Option<f64>,
    /// Checkpoint-and-stop at the Nth migration point reached (deterministic;
    /// slows the program, since every point then calls the host).
    #[arg(long, value_name = "N")]
    pub checkpoint_at_point: Option<u64>,
    /// Checkpoint-and-continue at every Nth migration point reached
    /// (deterministic; a stress test of unwind and rewind).
    #[arg(long, value_name = "N")]
    pub checkpoint_every_points: Option<u64>,
    /// Checkpoint-and-stop the next time the program blocks (sleeps or waits
    /// for input): migrate an idle program.
    #[arg(long)]
    pub checkpoint_on_block: bool,
    /// Carry the files of the --dir directories in the snapshot.
    #[arg(long)]
    pub with_files: bool,
    /// Embed the prepared module in the snapshot.
    #[arg(long)]
    pub embed_module: bool,
    /// zstd level for snapshots (1-19).
    #[arg(long, default_value_t = 3)]
    pub level: i32,
    /// The program's memory limit (e.g. 64MiB): growing past it fails
    /// (malloc returns NULL); a snapshot over it is refused [default: 4GiB,
    /// all a wasm32 program can address].
    #[arg(long, value_name = "SIZE", value_parser = crate::node_args::size)]
    pub max_memory: Option<u64>,
    /// Cache directory (default $ROAM_CACHE_DIR or ~/.cache/roam).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// `roam run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub cell: CellArgs,
    /// Environment variable for the program: KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Migration-point policy, when the module is prepared on the fly.
    #[arg(long, value_enum, default_value_t = Points::Loops)]
    pub points: Points,
    /// Keep at most SIZE of the program's memory resident (at least
    /// 256KiB) and page the rest to an unlinked swap file in --swap-dir
    /// (roam's own local swap; a node pages to a memory server instead,
    /// `roam launch --local-memory`).
    #[arg(long, value_name = "SIZE", value_parser = crate::node_args::size)]
    pub local_memory: Option<u64>,
    /// Where --local-memory's swap file lives [default: the system's
    /// temporary directory].
    #[arg(long, value_name = "DIR", requires = "local_memory")]
    pub swap_dir: Option<PathBuf>,
    /// Which page leaves when --local-memory is full.
    #[arg(long, value_name = "POLICY", value_parser = ["clock", "random"], requires = "local_memory")]
    pub eviction: Option<String>,
    /// The module (prepared or not).
    pub module: PathBuf,
    /// Arguments for the program.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// `roam restore`.
#[derive(Args, Debug)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub cell: CellArgs,
    /// The prepared module, when the snapshot does not embed it and the cache
    /// does not have it.
    #[arg(long)]
    pub module: Option<PathBuf>,
    /// Read every page of the snapshot before the program resumes. By
    /// default a format 2.0 snapshot resumes at once and its pages are read
    /// as the program touches them and in the background (needs
    /// userfaultfd; without it, everything is read first anyway).
    #[arg(long)]
    pub eager: bool,
    /// The snapshot to resume.
    pub snapshot_file: PathBuf,
}

/// `roam inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The snapshot.
    pub snapshot: PathBuf,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own checks of every subcommand: no flag declared twice, every
    /// `requires` naming a flag that exists.
    #[test]
    fn every_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
