//! Control-plane scale: one real `roam planner` against a simulated fleet of
//! many nodes and cells, on the embedded store and on etcd.
//!
//! Why it exists: the planner is the one place every node heartbeats to and
//! every placement goes through, so its cost grows with the fleet. This
//! measures what a fleet of the spec's size asks of it: the heartbeat load
//! it sustains (round trip p50/p99, its CPU), placement latency p50/p99,
//! and how long it takes to see a node die and restore the dead node's
//! cells elsewhere. The nodes are simulated (see [`sim`]); the planner, its
//! store and etcd are the real programs.

mod sim;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::future::join_all;
use roam_api::planner::{CellRecord, CellState, NodeRecord, PlaceRequest};

use crate::kv::{free_addr, wait_listening, Proc};
use crate::paths::Paths;
use crate::report::{Report, Table};
use crate::stats::percentile;

/// What to run.
pub struct Options {
    /// Simulated nodes.
    pub nodes: usize,
    /// Cells placed.
    pub cells: usize,
    /// `redb`, `etcd`, or both.
    pub backends: Vec<String>,
    /// Seconds of steady heartbeats measured.
    pub settle: u64,
    /// Nodes killed in the failure phase.
    pub victims: usize,
    /// The planner's node lease, seconds.
    pub lease: u64,
    /// Placements in flight at once.
    pub concurrency: usize,
}

/// One backend's figures.
struct Row {
    backend: String,
    register_s: f64,
    beats_per_s: f64,
    beat_p50_ms: f64,
    beat_p99_ms: f64,
    beat_failed: u64,
    planner_cpu: f64,
    place_p50_ms: f64,
    place_p99_ms: f64,
    places_per_s: f64,
    victim_cells: usize,
    detect_s: f64,
    restore_s: f64,
}

pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for b in &o.backends {
        eprintln!("scale: {b}, {} nodes, {} cells", o.nodes, o.cells);
        let row = rt.block_on(one(paths, o, b))?;
        rows.push(row);
    }
    let mut t = Table::new(&[
        "store",
        "nodes",
        "cells",
        "register all (s)",
        "heartbeats/s",
        "heartbeat p50 (ms)",
        "heartbeat p99 (ms)",
        "heartbeats failed",
        "planner CPU (% of a core)",
        "placement p50 (ms)",
        "placement p99 (ms)",
        "placements/s",
        "cells on dead nodes",
        "dead seen after (s)",
        "all restored after (s)",
    ]);
    for r in &rows {
        t.push(vec![
            r.backend.clone(),
            o.nodes.to_string(),
            o.cells.to_string(),
            format!("{:.1}", r.register_s),
            format!("{:.0}", r.beats_per_s),
            format!("{:.2}", r.beat_p50_ms),
            format!("{:.2}", r.beat_p99_ms),
            r.beat_failed.to_string(),
            format!("{:.0}", r.planner_cpu),
            format!("{:.2}", r.place_p50_ms),
            format!("{:.2}", r.place_p99_ms),
            format!("{:.0}", r.places_per_s),
            r.victim_cells.to_string(),
            format!("{:.1}", r.detect_s),
            format!("{:.1}", r.restore_s),
        ]);
    }
    Ok(Report {
        figure: None,
        // One file per store set, so that runs of one store do not
        // overwrite another's.
        name: "scale".into(),
        label: o.backends.join("-"),
        title: "Control-plane scale: one planner, a simulated fleet".into(),
        setup: format!(
            "roam-bench scale --nodes {} --cells {} --backends {} --settle {} --victims {} --lease {} --concurrency {}",
            o.nodes,
            o.cells,
            o.backends.join(","),
            o.settle,
            o.victims,
            o.lease,
            o.concurrency
        ),
        table: t,
        notes: vec![
            "Nodes are simulated in the benchmark's process (node API answers of the right shape; cells do not run); the planner, its store and etcd are the real programs, on the same 2 shared cores as the simulated fleet.".into(),
            format!("A node is dead when its lease ({} s) runs out without a heartbeat: \"dead seen after\" counts from its last heartbeat and so includes the lease; \"all restored\" counts from the same moment until every one of its cells is owned by a live node and running.", o.lease),
        ],
    })
}

/// The planner's CPU time so far, seconds (utime + stime of /proc/PID/stat).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

async fn one(paths: &Paths, o: &Options, backend: &str) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir_in({
        std::fs::create_dir_all(&paths.scratch)?;
        &paths.scratch
    })?;
    let mut _etcd = None;
    let store = match backend {
        "redb" => format!("redb:{}", dir.path().join("cluster.redb").display()),
        "etcd" => {
            let e = roam_testkit::etcd::Etcd::start().context("cannot start etcd")?;
            let url = format!("etcd://{}", e.endpoint());
            _etcd = Some(e);
            url
        }
        other => bail!("unknown store {other:?}: redb or etcd"),
    };
    let addr = free_addr()?;
    let mut cmd = std::process::Command::new(paths.tool("roam")?);
    cmd.args(["planner", "--listen", &addr.to_string(), "--store", &store])
        .args(["--lease", &o.lease.to_string()])
        .args(["--checkpoint-interval", "0"])
        .env("ROAM_LOG", "warn");
    let mut planner = Proc::spawn(cmd, &dir.path().join("planner.log"), "planner")?;
    wait_listening(addr, &mut planner, Duration::from_secs(60))?;
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .timeout(Duration::from_secs(30))
        .build()?;

    // The fleet's node API.
    let fleet = sim::Fleet::new(o.nodes);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let api = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(std::future::IntoFuture::into_future(axum::serve(
        listener,
        sim::router(fleet.clone()),
    )));

    // Register every node, 64 at a time.
    let t = Instant::now();
    let names: Vec<String> = fleet.nodes.keys().cloned().collect();
    let mut period = Duration::from_secs(1);
    for chunk in names.chunks(64) {
        let regs = chunk
            .iter()
            .map(|n| sim::register(&http, &base, &api, &fleet.nodes[n]));
        for r in join_all(regs).await {
            period = r?;
        }
    }
    let register_s = t.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    for n in fleet.nodes.values() {
        tokio::spawn(sim::heartbeat_loop(
            fleet.clone(),
            http.clone(),
            base.clone(),
            api.clone(),
            n.clone(),
            period,
            stop.clone(),
        ));
    }

    // Steady heartbeats.
    tokio::time::sleep(period * 2).await;
    fleet.beats.lock().unwrap().clear();
    let (cpu0, t0) = (cpu_seconds(planner.id()), Instant::now());
    tokio::time::sleep(Duration::from_secs(o.settle)).await;
    let window = t0.elapsed().as_secs_f64();
    let planner_cpu = 100.0 * (cpu_seconds(planner.id()) - cpu0) / window;
    let beats: Vec<f64> = std::mem::take(&mut *fleet.beats.lock().unwrap())
        .into_iter()
        .map(|us| us as f64 / 1000.0)
        .collect();
    let beats_per_s = beats.len() as f64 / window;

    // Placements.
    let wasm = std::fs::read(paths.wasm("ep")?)?;
    let m: serde_json::Value = http
        .post(format!("{base}/v1/modules"))
        .body(wasm)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let module = m["hash"].as_str().context("no module hash")?.to_string();
    let mut lat = Vec::with_capacity(o.cells);
    let mut placed: Vec<CellRecord> = Vec::with_capacity(o.cells);
    let t = Instant::now();
    let mut left = o.cells;
    while left > 0 {
        let n = left.min(o.concurrency);
        left -= n;
        let reqs = (0..n).map(|_| place(&http, &base, &module));
        for r in join_all(reqs).await {
            let (cell, ms) = r?;
            lat.push(ms);
            placed.push(cell);
        }
    }
    let places_per_s = o.cells as f64 / t.elapsed().as_secs_f64();

    // Kill the victims, after keeping a checkpoint of each of their cells.
    let victims: Vec<String> = names.iter().take(o.victims).cloned().collect();
    // Only cells still running on a victim: under load a node of the fleet
    // can miss its lease before the kill (counted as heartbeats failed).
    let mut doomed: Vec<&CellRecord> = Vec::new();
    // Why a cell placed on a victim is not counted: for the log.
    let mut gone: BTreeMap<String, usize> = BTreeMap::new();
    for c in placed.iter().filter(|c| victims.contains(&c.owner)) {
        let now: CellRecord = http
            .get(format!("{base}/v1/cells/{}", c.id))
            .send()
            .await?
            .json()
            .await?;
        if now.state == CellState::Running && now.owner == c.owner {
            doomed.push(c);
        } else if now.owner != c.owner {
            *gone.entry(format!("moved to {}", now.owner)).or_default() += 1;
        } else {
            *gone.entry(format!("{:?}", now.state)).or_default() += 1;
        }
    }
    eprintln!(
        "scale: {} cells were placed on the {} victims; {} still run there{}",
        doomed.len() + gone.values().sum::<usize>(),
        victims.len(),
        doomed.len(),
        if gone.is_empty() {
            String::new()
        } else {
            format!(" (the others: {gone:?})")
        }
    );
    for chunk in doomed.chunks(o.concurrency) {
        let keeps = chunk.iter().map(|c| keep(&http, &base, &c.id));
        for r in join_all(keeps).await {
            r?;
        }
    }
    let killed = Instant::now();
    for v in &victims {
        fleet.nodes[v].alive.store(false, Ordering::Relaxed);
    }
    let limit = Duration::from_secs(120 + o.lease * 4);
    let detect_s = loop {
        let nodes: Vec<NodeRecord> = http
            .get(format!("{base}/v1/nodes"))
            .send()
            .await?
            .json()
            .await?;
        let dead = nodes
            .iter()
            .filter(|n| victims.contains(&n.name) && !n.alive)
            .count();
        if dead == victims.len() {
            break killed.elapsed().as_secs_f64();
        }
        if killed.elapsed() > limit {
            bail!("only {dead} of {} dead nodes were seen dead", victims.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut pending: Vec<&str> = doomed.iter().map(|c| c.id.as_str()).collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for id in pending {
            let c: CellRecord = http
                .get(format!("{base}/v1/cells/{id}"))
                .send()
                .await?
                .json()
                .await?;
            if victims.contains(&c.owner) || c.state != CellState::Running {
                if matches!(c.state, CellState::Lost { .. } | CellState::Failed { .. }) {
                    bail!("cell {id} was not restored: {:?}", c.state);
                }
                still.push(id);
            }
        }
        pending = still;
        if killed.elapsed() > limit {
            bail!("{} cells of dead nodes were never restored", pending.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let restore_s = killed.elapsed().as_secs_f64();

    stop.store(true, Ordering::Relaxed);
    server.abort();
    planner.check_alive()?;
    Ok(Row {
        backend: backend.to_string(),
        register_s,
        beats_per_s,
        beat_p50_ms: percentile(&beats, 50.0).unwrap_or(f64::NAN),
        beat_p99_ms: percentile(&beats, 99.0).unwrap_or(f64::NAN),
        beat_failed: fleet.failed.load(Ordering::Relaxed) + fleet.expired.load(Ordering::Relaxed),
        planner_cpu,
        place_p50_ms: percentile(&lat, 50.0).unwrap_or(f64::NAN),
        place_p99_ms: percentile(&lat, 99.0).unwrap_or(f64::NAN),
        places_per_s,
        victim_cells: doomed.len(),
        detect_s,
        restore_s,
    })
}

/// Keep a checkpoint of cell `id` now. A `409` (the cell is still being
/// started, or a checkpoint of it is under way) is tried again for up to
/// 30 s.
async fn keep(http: &reqwest::Client, base: &str, id: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let r = http
            .post(format!("{base}/v1/cells/{id}/checkpoint"))
            .send()
            .await?;
        let status = r.status();
        if status.is_success() {
            return Ok(());
        }
        let body = r.text().await.unwrap_or_default();
        if status != reqwest::StatusCode::CONFLICT || start.elapsed() > Duration::from_secs(30) {
            bail!("keeping a checkpoint of {id} answered {status}: {body}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Place one cell; its record and the round trip in milliseconds.
async fn place(
    http: &reqwest::Client,
    base: &str,
    module: &str,
) -> anyhow::Result<(CellRecord, f64)> {
    let t = Instant::now();
    let r = http
        .post(format!("{base}/v1/cells"))
        .json(&PlaceRequest {
            module: module.to_string(),
            args: vec!["sim".into()],
            checkpoint_interval_s: Some(0),
            ..PlaceRequest::default()
        })
        .send()
        .await?;
    if !r.status().is_success() {
        bail!(
            "placement answered {}: {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    let cell: CellRecord = r.json().await?;
    Ok((cell, t.elapsed().as_secs_f64() * 1000.0))
}
