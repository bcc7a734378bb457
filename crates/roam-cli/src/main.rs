//! `roam`: prepare, run, checkpoint, restore and inspect migratable
//! WebAssembly programs.
//!
//! Exit status: the program's own exit status; 0 after a checkpoint-and-stop;
//! 2 for a usage error; 125 when roam itself fails; 134 when the program
//! traps; 143 when SIGTERM killed a program that reached no migration point
//! in time (no checkpoint was taken).

mod args;
mod auth_args;
mod cert;
mod cluster_cmd;
mod etcd_args;
mod follow;
mod gateway_cmd;
mod human;
mod inspect;
mod listen;
mod maintenance_cmd;
mod node_args;
mod node_cmd;
mod planner_cmd;
mod prepare;
mod run;
mod threads;
mod up;

use anyhow::{Context, Result};
use args::Command;
use clap::Parser;

/// roam exits with this when it fails itself (not the program).
const EXIT_ROAM_ERROR: i32 = 125;
/// roam exits with this when the program traps.
const EXIT_TRAP: i32 = 134;

fn main() {
    let cli = args::Cli::parse();
    // A command that only prints (`roam cells | head`) ends quietly when
    // its reader goes away, as other Unix tools do, instead of failing on
    // the broken pipe. Not the long-lived ones: a node, gateway or planner
    // must outlive a closed pipe, and `roam run` must still checkpoint.
    if !matches!(
        cli.command,
        Command::Node(_)
            | Command::Gateway(_)
            | Command::Planner(_)
            | Command::Run(_)
            | Command::Restore(_)
            | Command::Up(_)
    ) {
        // SAFETY: no other thread exists yet, and SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROAM_LOG").unwrap_or_else(|_| {
        let daemon = matches!(
            cli.command,
            Command::Node(_) | Command::Gateway(_) | Command::Planner(_)
        );
        tracing_subscriber::EnvFilter::new(if cli.verbose {
            "debug"
        } else if daemon {
            "info"
        } else {
            "warn"
        })
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    // Programs run on a thread with room for deep wasm recursion
    // (RuntimeConfig::max_wasm_stack) plus the host.
    let worker = std::thread::Builder::new()
        .name("roam".into())
        .stack_size(roam_runtime::RUN_THREAD_STACK)
        .spawn(move || dispatch(cli.command));
    let code = match worker {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("roam panicked; this is a bug"))),
        Err(e) => Err(anyhow::anyhow!("cannot start the worker thread: {e}")),
    };
    let code = code.unwrap_or_else(|e| {
        eprintln!("roam: error: {e:#}");
        if e.downcast_ref::<roam_runtime::RunError>()
            .is_some_and(|r| matches!(r, roam_runtime::RunError::Trap(_)))
        {
            EXIT_TRAP
        } else {
            EXIT_ROAM_ERROR
        }
    });
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

/// Run `command`. A client command that names a node (`--node`, or
/// `--from` for `migrate`) talks to that node's API (`node_cmd`); without
/// one it goes through the planner (`cluster_cmd`).
fn dispatch(command: Command) -> Result<i32> {
    match command {
        Command::Prepare(a) => prepare::main(a),
        Command::Run(a) => run::run(a),
        Command::Restore(a) => run::restore(a),
        Command::Inspect(a) => inspect::main(a),
        Command::Cert(a) => cert::main(a),
        Command::Up(a) => up::up(a),
        Command::Node(a) => node_cmd::node(a),
        Command::Gateway(a) => gateway_cmd::gateway(a),
        Command::Planner(a) => planner_cmd::planner(a),
        Command::Launch(a) => by_node(a.node.clone(), a, node_cmd::launch, cluster_cmd::launch),
        Command::Cells(a) => by_node(a.node.clone(), a, node_cmd::cells, cluster_cmd::cells),
        Command::Migrate(a) => by_node(a.from.clone(), a, node_cmd::migrate, cluster_cmd::migrate),
        Command::Logs(a) => by_node(a.node.clone(), a, node_cmd::logs, cluster_cmd::logs),
        Command::Kill(a) => by_node(a.node.clone(), a, node_cmd::kill, cluster_cmd::kill),
        Command::Nodes(a) => cluster_cmd::nodes(a),
        Command::Drain(a) => cluster_cmd::drain(a),
        Command::Undrain(a) => cluster_cmd::undrain(a),
        Command::Maintenance(a) => maintenance_cmd::maintenance(a),
        Command::Policy(a) => cluster_cmd::policy(a),
        Command::Slowdowns(a) => cluster_cmd::slowdowns(a),
    }
}

/// `on_node(node, a)` when a node is named, else `on_planner(a)`.
fn by_node<A>(
    node: Option<String>,
    a: A,
    on_node: fn(&str, A) -> Result<i32>,
    on_planner: fn(A) -> Result<i32>,
) -> Result<i32> {
    match node {
        Some(node) => on_node(&node, a),
        None => on_planner(a),
    }
}

/// The async runtime of the daemons and of the clients of their APIs.
fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
