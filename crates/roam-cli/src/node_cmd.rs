//! `roam node`, the daemon, and the client commands that name one node
//! (`launch`, `cells`, `logs`, `kill` with `--node`; `migrate` with
//! `--from`): thin clients of its control API. Without a node they go
//! through the planner (`cluster_cmd`); `main` chooses.

use anyhow::{bail, Context, Result};
use roam_node::types::{LaunchRequest, MigrateRequest, TransferOptions};
use roam_node::{Client, Node, NodeConfig};

use crate::auth_args::ClientAuthArgs;
use crate::follow::{follow, print_summary};
use crate::human::bytes;
use crate::node_args::{CellsArgs, KillArgs, LaunchArgs, LogsArgs, MigrateArgs, NodeArgs};
use crate::runtime;

/// A client of the node at `addr` with the credentials the command was
/// given.
fn client(addr: &str, a: &ClientAuthArgs) -> Result<Client> {
    Ok(Client::with_auth(addr, &a.load()?)?)
}

/// `roam node`.
pub fn node(a: NodeArgs) -> Result<i32> {
    let name = a
        .name
        .unwrap_or_else(|| format!("{}-{}", roam_runtime::host_isa(), a.listen.port()));
    let migrate_listen = a.migrate_listen.unwrap_or_else(|| {
        let mut m = a.listen;
        m.set_port(a.listen.port().wrapping_add(1000));
        m
    });
    let state_dir = a
        .state_dir
        .or_else(|| std::env::var_os("ROAM_STATE_DIR").map(Into::into))
        .unwrap_or_else(|| {
            let home =
                std::env::var_os("HOME").map_or_else(|| ".".into(), std::path::PathBuf::from);
            home.join(".local/state/roam").join(&name)
        });
    let cache_dir = a
        .cache_dir
        .unwrap_or_else(roam_runtime::cache::Cache::default_dir);
    // Cells have no terminal: their stdin is empty, their output is logged.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = rustix::stdio::dup2_stdin(&null);
    }
    let tls = a.auth.tls.identity()?;
    let token = a.auth.token()?;
    let cfg = NodeConfig {
        name,
        listen: a.listen,
        migrate_listen,
        advertise_migrate: a.advertise_migrate,
        state_dir,
        cache_dir,
        capture: match a.capture {
            Some(c) => c,
            None => roam_prepare::Capture::from_env()
                .with_context(|| roam_prepare::ENV_CAPTURE.to_string())?,
        },
        chunk_store_bytes: a.chunk_store_mib << 20,
        memory_reserve: a.memory_reserve_mib << 20,
        tls,
        token,
        insecure: a.auth.tls.insecure,
        limits: roam_node::NodeLimits {
            max_cells: a.max_cells,
            max_total_memory: a.max_total_memory,
            cell_memory: a.cell_memory,
            max_cell_memory: a.max_cell_memory,
            max_module_bytes: a.max_module_size,
            max_files_bytes: a.max_files_size,
            max_file_entries: a.max_file_entries,
            log_bytes: a.log_size,
            cell_cpu_weight: a.cell_cpu_weight,
            cell_cpu_max_millicores: a.cell_cpu_max,
        },
        cpu_control: a.cell_cpu_control,
        gateway: a.gateway,
        planner: a.planner,
        planner_timeout: std::time::Duration::from_secs(a.planner_timeout),
        advertise: a.advertise,
        power: a.power,
        cores: a.cores.map(usize::from),
        memory_server: a.memory_server,
    };
    runtime()?.block_on(async move {
        let node = Node::bind(cfg).await?;
        eprintln!(
            "roam node listening: control {} migrate {}",
            node.control_url(),
            node.migrate_addr()
        );
        node.serve(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        Ok(0)
    })
}

/// `roam launch --node ADDR`.
pub fn launch(node: &str, a: LaunchArgs) -> Result<i32> {
    if a.local_memory.is_some() && a.memory_server.is_none() {
        anyhow::bail!(
            "--local-memory with --node needs --memory-server, the control address of a node \
             started with --memory-server (through the planner, it picks one)"
        );
    }
    let (bytes, args, env) = a.parts()?;
    runtime()?.block_on(async move {
        let c = client(node, &a.auth)?;
        // Ask the node first, with a call only those who may launch may
        // make (listing cells): a refused credential then reads as the
        // node's answer, not as a broken pipe halfway through the upload.
        // (`GET /v1/node` is open to other nodes, so it did not: with a
        // node certificate, a cold module cache made the upload lose that
        // race.)
        c.cells().await?;
        let m = c.upload_module(bytes).await?;
        let r = c
            .launch(&LaunchRequest {
                module: m.hash,
                args,
                env,
                dirs: a.dirs.clone(),
                max_memory: a.max_memory,
                service: a.service.clone(),
                id: None,
                generation: None,
                cpu: roam_node::types::CpuRequest {
                    weight: a.cpu_weight,
                    max_millicores: a.cpu_max,
                },
                far: a.far(),
            })
            .await?;
        println!("{}", r.id);
        Ok(0)
    })
}

/// `roam cells --node ADDR`.
pub fn cells(node: &str, a: CellsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let cells = client(node, &a.auth)?.cells().await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
            return Ok(0);
        }
        println!(
            "{:<16} {:<10} {:<24} {:>12} {:>10} {:>5} {:>7}  {:<18} SERVICE",
            "CELL", "STATE", "PROGRAM", "MEMORY", "UPTIME", "HOPS", "THREADS", "CPU"
        );
        for c in cells {
            let state = serde_json::to_value(&c.state)?;
            let mut st = state["state"].as_str().unwrap_or("?").to_string();
            if let Some(code) = state.get("code") {
                st = format!("{st}({code})");
            }
            println!(
                "{:<16} {:<10} {:<24} {:>12} {:>9.1}s {:>5} {:>7}  {:<18} {}",
                c.id,
                st,
                c.program,
                memory_column(&c),
                c.uptime_ms as f64 / 1000.0,
                c.hops,
                c.threads.map_or_else(|| "-".to_string(), |n| n.to_string()),
                cpu_column(c.cpu.as_ref()),
                c.service.as_deref().unwrap_or("-")
            );
        }
        Ok(0)
    })
}

/// A cell's memory in `roam cells`; a far-memory cell's with the share
/// resident on its node (`256.0 MiB, 25% here`).
fn memory_column(c: &roam_node::types::CellInfo) -> String {
    match &c.far {
        Some(f) if c.memory_bytes > 0 => format!(
            "{}, {:.0}% here",
            bytes(c.memory_bytes),
            100.0 * f.resident_bytes as f64 / c.memory_bytes as f64
        ),
        _ => bytes(c.memory_bytes),
    }
}

/// A running cell's CPU limits in `roam cells`: mechanism, weight and cap
/// in cores (`cgroup-v1:200/0.50`; a cap `nice` cannot enforce ends in
/// `!`).
fn cpu_column(c: Option<&roam_node::types::CellCpu>) -> String {
    let Some(c) = c else {
        return "-".into();
    };
    let cap = c.max_millicores.map_or_else(String::new, |m| {
        let bang = if c.max_enforced { "" } else { "!" };
        format!("/{:.2}{bang}", f64::from(m) / 1000.0)
    });
    format!("{}:{}{cap}", c.mechanism, c.weight)
}

/// `roam migrate --from ADDR --to ADDR`.
pub fn migrate(from: &str, a: MigrateArgs) -> Result<i32> {
    let Some(to) = a.to.clone() else {
        bail!("--from needs --to: the destination node's host:port");
    };
    let req = MigrateRequest {
        to: to.clone(),
        mode: a.mode.clone(),
        transfer: TransferOptions {
            codec: Some(a.codec.clone()),
            delta: Some(!a.no_delta),
            bandwidth: a.bandwidth.clone(),
            randomize: a.randomize,
            max_remaining_bytes: Some(a.max_remaining_mb * 1_000_000),
            max_round_ms: Some(a.max_round_ms),
            max_downtime_ms: Some(a.max_downtime_ms),
            max_rounds: Some(a.max_rounds),
            tracking: Some(a.tracking.clone()),
            final_round: Some(a.final_round.clone()),
        },
    };
    runtime()?.block_on(async move {
        let src = client(from, &a.auth)?;
        let mid = src.migrate(&a.cell, &req).await?.migration;
        let status = follow(&src, &mid, a.json).await?;
        if let Some(e) = status.error {
            bail!("migration of {} failed: {e}", a.cell);
        }
        if !a.json {
            if let Some(s) = &status.summary {
                print_summary(&a.cell, from, &to, s);
            }
        }
        Ok(0)
    })
}

/// `roam logs --node ADDR`.
pub fn logs(node: &str, a: LogsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let out = client(node, &a.auth)?.logs(&a.cell).await?;
        use std::io::Write;
        std::io::stdout().write_all(&out)?;
        Ok(0)
    })
}

/// `roam kill --node ADDR`.
pub fn kill(node: &str, a: KillArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let c = client(node, &a.auth)?.kill(&a.cell).await?;
        println!("{} killed", c.id);
        Ok(0)
    })
}
