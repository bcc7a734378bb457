//! HEXO's consolidation with roam's planner deciding: an endless queue of
//! jobs of different kinds on an x86-64 server alone, on the server and
//! an aarch64 board under `least-loaded`, and under `offload-by-slowdown`.
//! The measure is HEXO's: jobs completed in a fixed window.
//!
//! - `server alone`: one node, one core, one job at a time.
//! - `server + board, least-loaded`: two nodes, two jobs at a time; a job
//!   goes to whichever node has the free core.
//! - `server + board, offload-by-slowdown`: the same, but a new job starts
//!   on the server and the leader sends the job that loses least to the
//!   board, as learned from the runs it has seen end: the planner starts
//!   with nothing learned (no offline profiling).
//!
//! Each node offers one core (`--cores 1`) and is pinned to one of the
//! machine's two cores (`taskset`), so that a second cell on the server
//! shares its core instead of taking the board's. The board is roam's aarch64 build under qemu-user
//! and declares speed 0.1. Before the scenarios, every kind of job is run
//! alone on each ISA: its true slowdown, which the learned one is compared
//! with (the model's error). Every job's output is checked.

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
    /// The kinds of job, `workload:size`, taken in turn.
    pub jobs: Vec<(String, String)>,
    /// Seconds each scenario runs.
    pub window_secs: f64,
}

/// One kind of job, prepared and measured alone.
struct Kind {
    name: String,
    module: PathBuf,
    /// BLAKE3 of the module: the planner's name for it.
    hash: String,
    size: String,
    x86_s: f64,
    arm_s: f64,
    output: Vec<u8>,
}

/// One scenario's outcome.
struct Outcome {
    done: usize,
    on_board: usize,
    moves: u64,
    /// Completed jobs per kind.
    per_kind: Vec<usize>,
}

/// Run the benchmark: the scenarios' table, and the model's accuracy.
pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<(Report, Report)> {
    let roam = paths.tool("roam")?;
    let arm = paths.cross_roam("aarch64-unknown-linux-gnu")?;
    let dir = paths.fresh_dir("hexo")?;
    let caches = [dir.join("cache-x86_64"), dir.join("cache-aarch64")];
    let mut kinds = Vec::new();
    for (w, size) in &o.jobs {
        let module = dir.join(format!("{w}.roam.wasm"));
        kv::run_bounded(
            Command::new(&roam)
                .arg("prepare")
                .arg(paths.wasm(w)?)
                .arg("-o")
                .arg(&module),
            Duration::from_secs(300),
        )?;
        let hash = blake3::hash(&std::fs::read(&module)?).to_hex().to_string();
        let (x86_s, arm_s, output) = crate::energy::calibrate(&roam, &arm, &module, size, &caches)
            .with_context(|| format!("calibrating {w} {size}"))?;
        eprintln!(
            "hexo: {w} {size}: {x86_s:.2} s of CPU on x86-64, {arm_s:.2} s under qemu-aarch64 \
             ({:.1}× slower)",
            arm_s / x86_s
        );
        kinds.push(Kind {
            name: w.clone(),
            module,
            hash,
            size: size.clone(),
            x86_s,
            arm_s,
            output,
        });
    }
    let scenarios: [(&str, &str, bool); 3] = [
        ("server alone", "least-loaded", false),
        ("server + board", "least-loaded", true),
        ("server + board", "offload-by-slowdown", true),
    ];
    let mut table = Table::new(&[
        "setup",
        "policy",
        "jobs done",
        "× server alone",
        "per kind",
        "done on the board",
        "moves",
    ]);
    let mut base = None;
    let mut learned = None;
    let mut done = Vec::new();
    for (setup, policy, board) in scenarios {
        eprintln!("hexo: {setup}, {policy}");
        let (r, table_seen) = scenario(&roam, &arm, &dir, &caches, &kinds, o, policy, board)
            .with_context(|| format!("scenario {setup}, {policy}"))?;
        let b = *base.get_or_insert(r.done.max(1));
        let per_kind: Vec<String> = kinds
            .iter()
            .zip(&r.per_kind)
            .map(|(k, n)| format!("{} {n}", k.name))
            .collect();
        table.push(vec![
            setup.into(),
            policy.into(),
            r.done.to_string(),
            format!("{:.2}", r.done as f64 / b as f64),
            per_kind.join(", "),
            r.on_board.to_string(),
            r.moves.to_string(),
        ]);
        done.push(r.done);
        if policy == "offload-by-slowdown" {
            learned = Some(table_seen);
        }
    }
    let gain = |i: usize| (done[i] as f64 / done[1].max(1) as f64 - 1.0) * 100.0;
    let notes = vec![
        format!(
            "**offload-by-slowdown completes {:+.0} % jobs against least-loaded** on the same \
             server and board ({} against {}; the server alone: {})",
            gain(2),
            done[2],
            done[1],
            done[0]
        ),
        "the board is roam's aarch64 build under qemu-user on the machine's second core: its \
         slowdowns are the emulator's (several times to tens of times), where HEXO's boards \
         were 3× to 30× slower than its server; each node offers one core and is pinned to \
         one (`taskset`)"
            .into(),
        "jobs are counted when they exit within the window, each checked against a run of its \
         own; a job still running at the end counts nothing"
            .into(),
    ];
    let main = Report {
        name: "hexo".into(),
        label: String::new(),
        title: "HEXO consolidation: jobs done in a window, with the planner offloading by \
                slowdown"
            .into(),
        setup: format!(
            "`roam-bench hexo`: jobs {} in turn, {} s per scenario; a closed queue (a new job \
             as soon as one ends) of one job per core",
            o.jobs
                .iter()
                .map(|(w, s)| format!("{w} {s}"))
                .collect::<Vec<_>>()
                .join(", "),
            o.window_secs
        ),
        table,
        notes,
        figure: None,
    };
    Ok((main, accuracy(&kinds, learned.as_ref(), o)))
}

/// The learned slowdowns against the true ones.
fn accuracy(kinds: &[Kind], learned: Option<&serde_json::Value>, o: &Options) -> Report {
    let mut table = Table::new(&[
        "job",
        "x86-64 CPU s",
        "aarch64 CPU s",
        "true slowdown",
        "learned slowdown",
        "error",
        "runs learned from (x86-64 / aarch64)",
    ]);
    let mut errors = Vec::new();
    for k in kinds {
        let truth = k.arm_s / k.x86_s;
        let p = learned.map(|t| &t["programs"][&k.hash]);
        let time = |isa: &str| p.and_then(|p| p["isas"][isa]["cpu_ms"].as_f64());
        let runs = |isa: &str| {
            p.and_then(|p| p["isas"][isa]["runs"].as_f64())
                .map_or("-".into(), |r| format!("{r:.1}"))
        };
        let (guess, err) = match (time("x86_64"), time("aarch64")) {
            (Some(a), Some(b)) if a > 0.0 => {
                let g = b / a;
                let e = (g - truth) / truth;
                errors.push(e.abs());
                (format!("{g:.1}×"), format!("{:+.0} %", e * 100.0))
            }
            _ => ("not learned".into(), "-".into()),
        };
        table.push(vec![
            format!("{} {}", k.name, k.size),
            format!("{:.2}", k.x86_s),
            format!("{:.2}", k.arm_s),
            format!("{truth:.1}×"),
            guess,
            err,
            format!("{} / {}", runs("x86_64"), runs("aarch64")),
        ]);
    }
    let mean = if errors.is_empty() {
        "no program was learned on both ISAs".to_string()
    } else {
        format!(
            "**mean absolute error of the learned slowdown: {:.0} %** over {} of {} jobs",
            errors.iter().sum::<f64>() / errors.len() as f64 * 100.0,
            errors.len(),
            kinds.len()
        )
    };
    Report {
        name: "hexo-model".into(),
        label: String::new(),
        title: "HEXO: the slowdown the planner learned against the true one".into(),
        setup: format!(
            "`roam-bench hexo`: the planner's table (`GET /v1/slowdowns`) at the end of the \
             offload-by-slowdown scenario ({} s), against each job run alone on each ISA",
            o.window_secs
        ),
        table,
        notes: vec![
            mean,
            "true: CPU seconds of `roam run` under qemu-aarch64 over x86-64 (the second of two \
             runs each, caches warm). Learned: from the runs the planner saw end, a run split \
             between the nodes apportioned by the x86-64 time (`docs/control-plane.md`, \
             \"Offload by slowdown\"); HEXO's regression on hardware counters reached r = 0.95, \
             and this machine has no counters to read"
                .into(),
        ],
        figure: None,
    }
}

/// One scenario: the outcome, and the planner's learned table at the end.
#[allow(clippy::too_many_arguments)]
fn scenario(
    roam: &Path,
    arm: &Path,
    dir: &Path,
    caches: &[PathBuf; 2],
    kinds: &[Kind],
    o: &Options,
    policy: &str,
    with_board: bool,
) -> anyhow::Result<(Outcome, serde_json::Value)> {
    let run = dir.join(format!(
        "{policy}-{}",
        if with_board { "board" } else { "alone" }
    ));
    std::fs::create_dir_all(&run)?;
    let (_planner, url) = kv::planner(roam, &run, policy)?;
    let specs: &[(&str, bool)] = if with_board {
        &[("server", false), ("board", true)]
    } else {
        &[("server", false)]
    };
    let mut nodes: Vec<Proc> = Vec::new();
    for (name, aarch64) in specs {
        // Each node on a core of its own: `--cores 1` is what the planner
        // counts, the pinning what the machine enforces.
        let node = kv::ClusterNode {
            name,
            aarch64: *aarch64,
            power: if *aarch64 {
                "idle=2,busy=1,speed=0.1"
            } else {
                "idle=50,busy=12"
            },
            pin: Some(if *aarch64 { "1" } else { "0" }),
        };
        let cache = &caches[usize::from(*aarch64)];
        nodes.push(kv::cluster_node(roam, arm, &url, &run, cache, &node)?.0);
    }
    kv::wait_nodes(
        roam,
        &url,
        specs.len(),
        Duration::from_secs(120),
        "the nodes did not register",
        |_| true,
    )?;
    let slots = specs.len();
    let launch = |k: &Kind| -> anyhow::Result<String> {
        let mut cmd = Command::new(roam);
        cmd.args(["launch", "--planner", &url])
            .arg(&k.module)
            .arg("--")
            .arg(&k.size);
        Ok(kv::run_bounded(&mut cmd, Duration::from_secs(120))?
            .trim()
            .to_string())
    };
    let mut next = 0usize;
    // Cell id → its kind.
    let mut running: Vec<(String, usize)> = Vec::new();
    let mut per_kind = vec![0usize; kinds.len()];
    let (mut done, mut on_board, mut moves) = (0usize, 0usize, 0u64);
    let t0 = Instant::now();
    let window = Duration::from_secs_f64(o.window_secs);
    while t0.elapsed() < window {
        while running.len() < slots {
            let k = next % kinds.len();
            next += 1;
            running.push((launch(&kinds[k])?, k));
        }
        std::thread::sleep(Duration::from_millis(100));
        let out = kv::run_bounded(
            Command::new(roam).args(["cells", "--planner", &url, "--json"]),
            Duration::from_secs(30),
        )?;
        let cells: serde_json::Value = serde_json::from_str(&out)?;
        let cells = cells.as_array().context("cells")?;
        let mut still = Vec::new();
        for (id, k) in running {
            let c = cells
                .iter()
                .find(|c| c["id"] == id.as_str())
                .with_context(|| format!("cell {id} is not listed"))?;
            match c["state"]["state"].as_str().unwrap_or("") {
                "exited" => {
                    let log = kv::run_bounded(
                        Command::new(roam).args(["logs", &id, "--planner", &url]),
                        Duration::from_secs(60),
                    )?;
                    if log.as_bytes() != kinds[k].output.as_slice() {
                        bail!(
                            "job {id} ({}) printed another output:\n{log}",
                            kinds[k].name
                        );
                    }
                    done += 1;
                    per_kind[k] += 1;
                    on_board += usize::from(c["owner"] == "board");
                    moves += c["generation"].as_u64().unwrap_or(1).saturating_sub(1);
                }
                "failed" | "killed" | "lost" => bail!("job {id} did not finish: {c}"),
                _ => still.push((id, k)),
            }
        }
        running = still;
        for p in &mut nodes {
            p.check_alive()?;
        }
    }
    let out = kv::run_bounded(
        Command::new(roam).args(["slowdowns", "--json", "--planner", &url]),
        Duration::from_secs(30),
    )?;
    let learned = serde_json::from_str(&out).context("roam slowdowns --json")?;
    Ok((
        Outcome {
            done,
            on_board,
            moves,
            per_kind,
        },
        learned,
    ))
}
