//! The node and cluster commands: a daemon, and thin clients of its API.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use roam_node::roam_auth::{Identity, TlsFiles, Token};
use roam_node::types::{LaunchRequest, MigrateRequest, MigrationStatus, TransferOptions};
use roam_node::{Client, ClientAuth, Node, NodeConfig};

use crate::node_args::*;

/// The credentials the command was given.
pub(crate) fn auth(a: &AuthArgs) -> Result<ClientAuth> {
    let tls = match &a.tls_ca {
        Some(ca) => Some(roam_node::roam_auth::ClientTls::load(
            ca,
            a.tls_cert.as_deref(),
            a.tls_key.as_deref(),
        )?),
        None if a.tls_cert.is_some() => {
            bail!("--tls-cert needs --tls-ca (or ROAM_TLS_CA): the CA to check the node against")
        }
        None => None,
    };
    let token = match (&a.token_file, std::env::var("ROAM_TOKEN")) {
        (Some(f), _) => Some(Token::load(f)?),
        (None, Ok(t)) => Some(Token::new(&t, "in $ROAM_TOKEN")?),
        (None, Err(_)) => None,
    };
    Ok(ClientAuth { tls, token })
}

/// A client of `addr` with the credentials the command was given.
fn client(addr: &str, a: &AuthArgs) -> Result<Client> {
    Ok(Client::with_auth(addr, &auth(a)?)?)
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
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
    let tls = match (a.tls_ca, a.tls_cert, a.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(Identity::load(&TlsFiles { ca, cert, key })?),
        _ => None,
    };
    let token = a.token_file.as_deref().map(Token::load).transpose()?;
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
        insecure: a.insecure,
        limits: roam_node::NodeLimits {
            max_cells: a.max_cells,
            max_total_memory: a.max_total_memory,
            cell_memory: a.cell_memory,
            max_cell_memory: a.max_cell_memory,
            max_module_bytes: a.max_module_size,
            max_files_bytes: a.max_files_size,
            max_file_entries: a.max_file_entries,
            log_bytes: a.log_size,
        },
        gateway: a.gateway,
        planner: a.planner,
        planner_timeout: std::time::Duration::from_secs(a.planner_timeout),
        advertise: a.advertise,
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

/// What `roam launch` sends, from its arguments: the module's bytes, the
/// program's arguments (its name first), its environment.
pub(crate) type LaunchParts = (Vec<u8>, Vec<String>, Vec<(String, String)>);

pub(crate) fn launch_parts(a: &LaunchArgs) -> Result<LaunchParts> {
    let bytes =
        std::fs::read(&a.module).with_context(|| format!("cannot read {}", a.module.display()))?;
    let env = a
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {kv}: expected KEY=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let program = a
        .module
        .file_stem()
        .map_or_else(|| "program".into(), |s| s.to_string_lossy().into_owned());
    let mut args = vec![program];
    args.extend(a.args.iter().cloned());
    Ok((bytes, args, env))
}

/// `roam launch`.
pub fn launch(a: LaunchArgs) -> Result<i32> {
    let Some(node) = a.node.clone() else {
        return crate::cluster_cmd::launch(a);
    };
    let (bytes, args, env) = launch_parts(&a)?;
    runtime()?.block_on(async move {
        let c = client(&node, &a.auth)?;
        // Ask the node first: a refused credential then reads as the
        // node's answer, not as a broken pipe halfway through the upload.
        c.node().await?;
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
            })
            .await?;
        println!("{}", r.id);
        Ok(0)
    })
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// `roam cells`.
pub fn cells(a: CellsArgs) -> Result<i32> {
    let Some(node) = a.node.clone() else {
        return crate::cluster_cmd::cells(a);
    };
    runtime()?.block_on(async move {
        let cells = client(&node, &a.auth)?.cells().await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
            return Ok(0);
        }
        println!(
            "{:<16} {:<10} {:<24} {:>12} {:>10} {:>5}  SERVICE",
            "CELL", "STATE", "PROGRAM", "MEMORY", "UPTIME", "HOPS"
        );
        for c in cells {
            let state = serde_json::to_value(&c.state)?;
            let mut st = state["state"].as_str().unwrap_or("?").to_string();
            if let Some(code) = state.get("code") {
                st = format!("{st}({code})");
            }
            println!(
                "{:<16} {:<10} {:<24} {:>12} {:>9.1}s {:>5}  {}",
                c.id,
                st,
                c.program,
                mib(c.memory_bytes),
                c.uptime_ms as f64 / 1000.0,
                c.hops,
                c.service.as_deref().unwrap_or("-")
            );
        }
        Ok(0)
    })
}

/// `roam migrate`.
pub fn migrate(a: MigrateArgs) -> Result<i32> {
    let Some(from) = a.from.clone() else {
        return crate::cluster_cmd::migrate(a);
    };
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
        let src = client(&from, &a.auth)?;
        let mid = src.migrate(&a.cell, &req).await?.migration;
        let status = follow(&src, &mid, a.json).await?;
        if let Some(e) = status.error {
            bail!("migration of {} failed: {e}", a.cell);
        }
        if !a.json {
            if let Some(s) = &status.summary {
                print_summary(&a.cell, &from, &to, s);
            }
        }
        Ok(0)
    })
}

/// Follow migration `mid` on its source `src` to its end, with a progress
/// bar (none with `json`, which prints the final status instead).
pub(crate) async fn follow(src: &Client, mid: &str, json: bool) -> Result<MigrationStatus> {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {msg:32} {bar:30} {bytes}/{total_bytes} wire {prefix}",
        )
        .expect("a valid template"),
    );
    let mut last = (std::time::Instant::now(), 0u64);
    let status: MigrationStatus = loop {
        let s = src.migration(mid).await?;
        if s.done {
            break s;
        }
        let now = std::time::Instant::now();
        let dt = now.duration_since(last.0).as_secs_f64();
        if dt >= 0.5 {
            let rate = (s.wire_bytes.saturating_sub(last.1)) as f64 * 8.0 / dt / 1e6;
            bar.set_prefix(format!("{} ({rate:.1} Mbit/s)", mib(s.wire_bytes)));
            last = (now, s.wire_bytes);
        }
        bar.set_length(s.memory_bytes.max(1));
        bar.set_position((s.pages_in * 4096).min(s.memory_bytes.max(1)));
        bar.set_message(s.phase.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    }
    Ok(status)
}

pub(crate) fn print_summary(
    cell: &str,
    from: &str,
    to: &str,
    s: &roam_node::types::MigrationSummary,
) {
    println!(
        "migrated {cell} {from} → {to} ({} → {}), {}",
        s.from_isa, s.to_isa, s.mode
    );
    println!("  total time     {:>10.1} ms", s.total_ms);
    println!(
        "  downtime       {:>10.1} ms  (pages while paused {:.1} ms, commit {:.1} ms)",
        s.downtime_ms, s.paused_pages_ms, s.commit_ms
    );
    if let Some(b) = &s.pause {
        print_breakdown(b);
    }
    println!("  rounds         {:>10}", s.rounds);
    if let Some(t) = &s.tracking {
        println!("  dirty tracking {t:>10}");
    }
    println!("  memory         {:>13}", mib(s.memory_bytes));
    println!("  modified state {:>13}", mib(s.modified_bytes));
    println!(
        "  on the wire    {:>13}  ({:.3} × modified state)",
        mib(s.wire_bytes),
        s.wire_bytes as f64 / s.modified_bytes.max(1) as f64
    );
    if let Some(p) = &s.post_copy {
        println!(
            "  post-copy      {} pages on demand in {} requests, {} pushed, complete after {:.1} ms",
            p.demand_pages, p.requests, p.pushed_pages, p.complete_ms
        );
    }
    if s.pipeline.is_object() {
        let n = |k: &str| s.pipeline[k].as_u64().unwrap_or(0);
        let ms = |k: &str| n(k) as f64 / 1e6;
        println!(
            "  pipeline       {} pages: {} zero, {} unchanged, {} as deltas, {} compressed; {} in → {} out",
            n("pages_in"),
            n("zero_pages"),
            n("unchanged_pages"),
            n("delta_pages"),
            n("compressed_pages"),
            mib(n("bytes_in")),
            mib(n("bytes_out")),
        );
        println!(
            "                 hashing {:.1} ms, dedup {:.1} ms, compression {:.1} ms",
            ms("hash_nanos"),
            ms("dedup_nanos"),
            ms("compress_nanos")
        );
    }
}

/// The downtime phase by phase, indented under it.
fn print_breakdown(b: &roam_node::types::PauseBreakdown) {
    let row = |what: &str, v: f64| println!("    {what:<34} {v:>8.1} ms");
    println!(
        "    (pause requested → migration point {:.1} ms, while the cell ran)",
        b.request_to_point_ms
    );
    row("capture and handoff", b.to_driver_ms);
    row("last dirty pages collected", b.collect_ms);
    row(
        &format!(
            "{} paused pages encoded ({})",
            b.final_pages, b.final_encoding
        ),
        b.encode_ms,
    );
    row("… and on the wire", b.wire_ms);
    row("files and log", b.files_log_ms);
    row("execution state encoded", b.state_encode_ms);
    row(
        &format!("commit ({} B of state)", b.state_bytes),
        b.commit_ms,
    );
    if b.paused_wire_floor_ms > 0.0 {
        println!(
            "    ({} B on the wire while paused: {:.1} ms at the shaped bandwidth)",
            b.paused_wire_bytes, b.paused_wire_floor_ms
        );
    }
    if let Some(behind) = b.dest_behind_ms {
        row("  destination behind at the pause", behind);
    }
    if let Some(d) = &b.destination {
        row("  destination: last pages arriving", d.last_pages_read_ms);
        row("  destination: … of which applying", d.last_pages_apply_ms);
        row("  destination: pages still applying", d.backlog_ms);
        row("  destination: state decoded", d.decode_ms);
        row("  destination: state installed", d.install_ms);
        row("  destination: commit point, serve", d.register_ms);
        row("  destination: final state → running", d.to_running_ms);
    }
}

/// `roam logs`.
pub fn logs(a: LogsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let Some(node) = &a.node else {
            return crate::cluster_cmd::logs(&a).await;
        };
        let out = client(node, &a.auth)?.logs(&a.cell).await?;
        use std::io::Write;
        std::io::stdout().write_all(&out)?;
        Ok(0)
    })
}

/// `roam kill`.
pub fn kill(a: KillArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let Some(node) = &a.node else {
            return crate::cluster_cmd::kill(&a).await;
        };
        let c = client(node, &a.auth)?.kill(&a.cell).await?;
        println!("{} killed", c.id);
        Ok(0)
    })
}
