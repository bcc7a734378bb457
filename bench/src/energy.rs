//! Popcorn's energy comparison with roam's planner deciding: the same
//! waves of CPU-bound jobs on two static clusters and under the two energy
//! policies, with the energy each node estimates from its declared power
//! model and its measured CPU time (`docs/control-plane.md`, "Energy").
//!
//! - `static x86-64`: two x86-64 servers, `least-loaded`: the cluster
//!   without boards (Popcorn's static baseline of two x86 machines).
//! - `static server + board`: one server and an aarch64 board (roam's
//!   aarch64 build under qemu-user), `least-loaded`.
//! - `energy-balanced`, `energy-unbalanced`: the server and the board
//!   under each policy; the unbalanced one also moves busy cells.
//!
//! Each node offers one core (`--cores 1`), so the two nodes of a cluster
//! use the machine's two cores. The board's speed in its model is
//! calibrated here: the job's CPU time on x86-64 over its CPU time under
//! qemu-user, so the model says what this emulated board really does per
//! core-second. Every job's output is checked against a run of its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kv::{self, Proc};
use crate::paths::Paths;
use crate::report::{Report, Table};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Waves of arrivals.
    pub waves: usize,
    /// Jobs per wave.
    pub per_wave: usize,
    /// Seconds between waves.
    pub gap_secs: f64,
    /// The job: a workload and its size.
    pub job: String,
    /// Its size argument.
    pub size: String,
    /// The server's model, `idle=W,busy=W` (speed 1: the reference).
    pub server: String,
    /// The board's idle and busy watts; its speed is calibrated.
    pub board_idle: f64,
    /// See `board_idle`.
    pub board_busy: f64,
}

/// One node of a scenario.
struct NodeSpec {
    name: &'static str,
    aarch64: bool,
}

const SERVERS: &[NodeSpec] = &[
    NodeSpec {
        name: "server-a",
        aarch64: false,
    },
    NodeSpec {
        name: "server-b",
        aarch64: false,
    },
];
const MIXED: &[NodeSpec] = &[
    NodeSpec {
        name: "server-a",
        aarch64: false,
    },
    NodeSpec {
        name: "board",
        aarch64: true,
    },
];

/// What one scenario measured.
struct Outcome {
    makespan_s: f64,
    /// Joules per node, in the scenario's node order.
    joules: Vec<f64>,
    moves: u64,
    on_board: usize,
}

pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let roam = paths.tool("roam")?;
    let arm = paths.cross_roam("aarch64-unknown-linux-gnu")?;
    let dir = paths.fresh_dir("energy")?;
    // Prepared once: no node prepares it, under emulation or not.
    let module = dir.join(format!("{}.roam.wasm", o.job));
    kv::run_bounded(
        Command::new(&roam)
            .arg("prepare")
            .arg(paths.wasm(&o.job)?)
            .arg("-o")
            .arg(&module),
        Duration::from_secs(300),
    )?;
    let caches = [dir.join("cache-x86_64"), dir.join("cache-aarch64")];
    let (x86_s, arm_s, reference) = calibrate(&roam, &arm, &module, &o.size, &caches)?;
    let reference = String::from_utf8_lossy(&reference).into_owned();
    let speed = (x86_s / arm_s).clamp(0.001, 1000.0);
    let board = format!(
        "idle={},busy={},speed={speed:.4}",
        o.board_idle, o.board_busy
    );
    eprintln!(
        "energy: {} {} takes {x86_s:.2} s of CPU on x86-64 and {arm_s:.2} s under qemu-aarch64: \
         the board's speed is {speed:.4}",
        o.job, o.size
    );
    let scenarios: [(&str, &str, &[NodeSpec]); 4] = [
        ("static x86-64", "least-loaded", SERVERS),
        ("static server + board", "least-loaded", MIXED),
        ("energy-balanced", "energy-balanced", MIXED),
        ("energy-unbalanced", "energy-unbalanced", MIXED),
    ];
    let mut table = Table::new(&[
        "scenario",
        "policy",
        "makespan s",
        "energy J",
        "per node J",
        "EDP kJ·s",
        "energy ÷ static x86-64",
        "EDP ÷ static x86-64",
        "jobs on the board",
        "moves",
    ]);
    let mut base: Option<(f64, f64)> = None;
    let mut rows = Vec::new();
    for (label, policy, specs) in scenarios {
        eprintln!("energy: {label}");
        let r = scenario(
            &roam, &arm, &dir, &caches, &module, o, policy, specs, &board, &reference,
        )
        .with_context(|| format!("scenario {label}"))?;
        let e: f64 = r.joules.iter().sum();
        let edp = e * r.makespan_s;
        let (be, bedp) = *base.get_or_insert((e, edp));
        let split: Vec<String> = specs
            .iter()
            .zip(&r.joules)
            .map(|(s, j)| format!("{} {j:.0}", s.name))
            .collect();
        table.push(vec![
            label.into(),
            policy.into(),
            format!("{:.1}", r.makespan_s),
            format!("{e:.0}"),
            split.join(", "),
            format!("{:.1}", edp / 1000.0),
            format!("{:.3}", e / be),
            format!("{:.3}", edp / bedp),
            r.on_board.to_string(),
            r.moves.to_string(),
        ]);
        rows.push((label, e / be, edp / bedp, r.makespan_s));
    }
    let best = rows
        .iter()
        .skip(1)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("three scenarios with a board");
    let mut notes = vec![format!(
        "lowest energy with a board: **{}** at **{:.2}×** the energy of two static x86-64 \
         servers (EDP {:.2}×, makespan {:.0} s)",
        best.0, best.1, best.2, best.3
    )];
    notes.push(format!(
        "energy is the power models applied to measured CPU time, not a meter: each node \
         estimates `idle · uptime + busy · CPU seconds` of its own process (docs/control-plane.md, \
         \"Energy\"), read from its `/metrics` at the first arrival and when the last job ended; \
         server `{}`, board `{board}` (speed calibrated: {} {} takes {x86_s:.2} s of CPU on \
         x86-64, {arm_s:.2} s under qemu-aarch64)",
        o.server, o.job, o.size
    ));
    notes.push(
        "the board is roam's aarch64 build under qemu-user, so its slowness is the emulator's \
         (a real board is a few times slower than a server core, not tens); each node offers \
         one core, so two nodes use the machine's two cores; every job's output matched a \
         run of its own"
            .into(),
    );
    Ok(Report {
        name: "energy".into(),
        label: String::new(),
        title: "Energy: static placement against the energy policies (Popcorn)".into(),
        setup: format!(
            "`roam-bench energy`: {} waves of {} `{} {}` jobs, {} s apart, launched through a \
             `roam planner` (lease 3 s) that places them by the scenario's policy",
            o.waves, o.per_wave, o.job, o.size, o.gap_secs
        ),
        table,
        notes,
        figure: None,
    })
}

/// The job's CPU seconds on x86-64 and under qemu-aarch64 (each the second
/// of two runs, so that both compile caches are warm), and its output.
pub(crate) fn calibrate(
    roam: &Path,
    arm: &Path,
    module: &Path,
    size: &str,
    caches: &[PathBuf; 2],
) -> anyhow::Result<(f64, f64, Vec<u8>)> {
    let run = |native: bool| -> anyhow::Result<(f64, Vec<u8>)> {
        let mut last = None;
        for _ in 0..2 {
            let mut cmd = if native {
                Command::new(roam)
            } else {
                let mut c = Command::new("qemu-aarch64");
                c.args(["-L", "/usr/aarch64-linux-gnu"]).arg(arm);
                c
            };
            cmd.env("ROAM_CACHE_DIR", &caches[usize::from(!native)])
                .arg("run")
                .arg(module)
                .arg("--")
                .arg(size);
            last = Some(crate::proc::run_cpu(&mut cmd, "the calibration run")?);
        }
        Ok(last.expect("two runs"))
    };
    let (x86, out) = run(true)?;
    let (a64, out_arm) = run(false)?;
    if out != out_arm {
        bail!("the job's output differs between x86-64 and aarch64");
    }
    Ok((x86, a64, out))
}

#[allow(clippy::too_many_arguments)]
fn scenario(
    roam: &Path,
    arm: &Path,
    dir: &Path,
    caches: &[PathBuf; 2],
    module: &Path,
    o: &Options,
    policy: &str,
    specs: &[NodeSpec],
    board: &str,
    reference: &str,
) -> anyhow::Result<Outcome> {
    let run = dir.join(policy.replace(' ', "-")).join(specs[1].name);
    std::fs::create_dir_all(&run)?;
    let (_planner, url) = kv::planner(roam, &run, policy)?;
    let mut nodes: Vec<(Proc, SocketAddr)> = Vec::new();
    for s in specs {
        let model = if s.aarch64 { board } else { &o.server };
        let node = kv::ClusterNode {
            name: s.name,
            aarch64: s.aarch64,
            power: model,
            pin: None,
        };
        let cache = &caches[usize::from(s.aarch64)];
        nodes.push(kv::cluster_node(roam, arm, &url, &run, cache, &node)?);
    }
    kv::wait_nodes(
        roam,
        &url,
        specs.len(),
        Duration::from_secs(120),
        "the nodes did not register with their power models",
        |x| !x["status"]["power"].is_null(),
    )?;
    let energy = |nodes: &[(Proc, SocketAddr)]| -> anyhow::Result<Vec<f64>> {
        nodes.iter().map(|(_, a)| joules(*a)).collect()
    };
    let start = energy(&nodes)?;
    let t0 = Instant::now();
    let mut ids = Vec::new();
    for wave in 0..o.waves {
        let at = Duration::from_secs_f64(o.gap_secs * wave as f64);
        std::thread::sleep(at.saturating_sub(t0.elapsed()));
        for _ in 0..o.per_wave {
            let mut cmd = Command::new(roam);
            cmd.args(["launch", "--planner", &url])
                .arg(module)
                .arg("--")
                .arg(&o.size);
            ids.push(
                kv::run_bounded(&mut cmd, Duration::from_secs(120))?
                    .trim()
                    .to_string(),
            );
        }
    }
    let cells = loop {
        let out = kv::run_bounded(
            Command::new(roam).args(["cells", "--planner", &url, "--json"]),
            Duration::from_secs(30),
        )?;
        let cells: serde_json::Value = serde_json::from_str(&out)?;
        let ours: Vec<&serde_json::Value> = cells
            .as_array()
            .context("cells")?
            .iter()
            .filter(|c| ids.iter().any(|id| c["id"] == id.as_str()))
            .collect();
        let state = |c: &serde_json::Value| c["state"]["state"].as_str().unwrap_or("").to_string();
        if let Some(bad) = ours
            .iter()
            .find(|c| matches!(state(c).as_str(), "failed" | "killed" | "lost"))
        {
            bail!("a job did not finish: {bad}");
        }
        if ours.len() == ids.len() && ours.iter().all(|c| state(c) == "exited") {
            break ours.into_iter().cloned().collect::<Vec<_>>();
        }
        if t0.elapsed() > Duration::from_secs(3600) {
            bail!("the jobs did not finish within an hour");
        }
        for (p, _) in &mut nodes {
            p.check_alive()?;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let makespan_s = t0.elapsed().as_secs_f64();
    let end = energy(&nodes)?;
    for id in &ids {
        let log = kv::run_bounded(
            Command::new(roam).args(["logs", id, "--planner", &url]),
            Duration::from_secs(60),
        )?;
        if log != reference {
            bail!("job {id}'s output differs from the calibration run's:\n{log}");
        }
    }
    Ok(Outcome {
        makespan_s,
        joules: end.iter().zip(&start).map(|(e, s)| e - s).collect(),
        moves: cells
            .iter()
            .map(|c| c["generation"].as_u64().unwrap_or(1).saturating_sub(1))
            .sum(),
        on_board: cells.iter().filter(|c| c["owner"] == "board").count(),
    })
}

/// `roam_node_energy_joules` from a node's `/metrics`.
fn joules(node: SocketAddr) -> anyhow::Result<f64> {
    let mut s = TcpStream::connect_timeout(&node, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {node}\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    body.lines()
        .find_map(|l| l.strip_prefix("roam_node_energy_joules "))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no roam_node_energy_joules in {node}'s metrics"))
}
