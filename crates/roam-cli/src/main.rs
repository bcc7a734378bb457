//! `roam`: prepare, run, checkpoint, restore and inspect migratable
//! WebAssembly programs.
//!
//! Exit status: the program's own exit status; 0 after a checkpoint-and-stop;
//! 2 for a usage error; 125 when roam itself fails; 134 when the program
//! traps; 143 when SIGTERM killed a program that reached no migration point
//! in time (no checkpoint was taken).

mod args;
mod cert;
mod cluster_cmd;
mod etcd_args;
mod gateway_cmd;
mod inspect;
mod listen;
mod node_args;
mod node_cmd;
mod planner_cmd;
mod prepare;
mod run;
mod up;

use clap::Parser;

/// roam exits with this when it fails itself (not the program).
const EXIT_ROAM_ERROR: i32 = 125;
/// roam exits with this when the program traps.
const EXIT_TRAP: i32 = 134;

fn main() {
    let cli = args::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("ROAM_LOG").unwrap_or_else(|_| {
        let daemon = matches!(
            cli.command,
            args::Command::Node(_) | args::Command::Gateway(_) | args::Command::Planner(_)
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
        .spawn(move || match cli.command {
            args::Command::Prepare(a) => prepare::main(a),
            args::Command::Run(a) => run::run(a),
            args::Command::Restore(a) => run::restore(a),
            args::Command::Inspect(a) => inspect::main(a),
            args::Command::Node(a) => node_cmd::node(a),
            args::Command::Launch(a) => node_cmd::launch(a),
            args::Command::Cells(a) => node_cmd::cells(a),
            args::Command::Migrate(a) => node_cmd::migrate(a),
            args::Command::Logs(a) => node_cmd::logs(a),
            args::Command::Kill(a) => node_cmd::kill(a),
            args::Command::Cert(a) => cert::main(a),
            args::Command::Gateway(a) => gateway_cmd::gateway(a),
            args::Command::Up(a) => up::up(a),
            args::Command::Nodes(a) => cluster_cmd::nodes(a),
            args::Command::Drain(a) => cluster_cmd::drain(a),
            args::Command::Undrain(a) => cluster_cmd::undrain(a),
            args::Command::Planner(a) => planner_cmd::planner(a),
        });
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
