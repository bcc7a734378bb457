//! T4: live migration between two nodes on one host.
//!
//! Why it exists: the node-level numbers — total time, downtime, bytes on
//! the wire — are what an operator sees. T4 starts two `roam node`
//! processes on loopback, launches the synthetic `dirty` workload (a fixed
//! amount of state rewritten at a fixed rate) on the first, and migrates it
//! to the second with `roam migrate --json` in each mode and at each
//! bandwidth (shaped in process by a token bucket). The baseline, computed
//! for the same run, is a naive copy: the cell's whole linear memory sent at
//! that bandwidth.
//!
//! Each case gets fresh nodes, so no cell from an earlier case competes for
//! the CPU, and the nodes are killed afterwards.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_transfer::Mode;

use crate::paths::Paths;
use crate::report::{Report, Table};

/// One migration to measure.
#[derive(Debug, Clone)]
pub struct Case {
    /// The row's name: the mode, and what differs from the defaults.
    pub name: String,
    /// `stop-and-copy`, `pre-copy` or `post-copy`.
    pub mode: String,
    /// More `roam migrate` arguments (an ablation of one technique).
    pub extra: Vec<String>,
    /// `roam migrate --bandwidth` value.
    pub bandwidth: String,
    /// The same in bits per second.
    pub bits_per_sec: u64,
}

/// The default cases: every mode at 1 Gbit/s, pre-copy at 100 Mbit/s, and
/// pre-copy with its final round through the pipeline (as before the
/// direct final round) for the side-by-side comparison.
pub fn default_cases() -> Vec<Case> {
    let c = |name: &str, mode: &str, extra: &[&str], bw: &str, bps: u64| Case {
        name: name.into(),
        mode: mode.into(),
        extra: extra.iter().map(|s| s.to_string()).collect(),
        bandwidth: bw.into(),
        bits_per_sec: bps,
    };
    let g = 1_000_000_000;
    vec![
        c("pre-copy", "pre-copy", &[], "1gbit", g),
        c(
            "pre-copy, final round via pipeline",
            "pre-copy",
            &["--final-round", "pipeline"],
            "1gbit",
            g,
        ),
        c("stop-and-copy", "stop-and-copy", &[], "1gbit", g),
        c("post-copy", "post-copy", &[], "1gbit", g),
        c("pre-copy", "pre-copy", &[], "100mbit", 100_000_000),
    ]
}

/// The cases of `all` whose name is in `only` (all when `only` is empty).
pub fn select(all: Vec<Case>, only: &[String]) -> anyhow::Result<Vec<Case>> {
    if only.is_empty() {
        return Ok(all);
    }
    let names: Vec<String> = all
        .iter()
        .map(|c| format!("{}@{}", c.name, c.bandwidth))
        .collect();
    let picked: Vec<Case> = all
        .into_iter()
        .zip(&names)
        .filter(|(_, n)| only.iter().any(|o| o == *n))
        .map(|(c, _)| c)
        .collect();
    if picked.len() != only.len() {
        bail!(
            "--cases names unknown cases; the cases are: {}",
            names.join("; ")
        );
    }
    Ok(picked)
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case.
    pub case: Case,
    /// Repetition, from 1.
    pub rep: usize,
    /// The `summary` object of the final status, or why there is none.
    pub summary: Result<serde_json::Value, String>,
}

/// A node process, killed on drop.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_node(
    roam: &Path,
    port: u16,
    name: &str,
    dir: &Path,
    cache: &Path,
) -> anyhow::Result<Node> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(roam)
        .arg("node")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--name")
        .arg(name)
        .arg("--state-dir")
        .arg(dir.join(name))
        .arg("--cache-dir")
        .arg(cache)
        .arg("--memory-reserve-mib")
        .arg("0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start roam node")?;
    Ok(Node(child))
}

/// Run `cmd` with a deadline; returns stdout on success.
fn run_bounded(cmd: &mut Command, limit: Duration) -> anyhow::Result<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                // `roam migrate --json` prints the failed status: keep its error.
                let status: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
                if let Some(e) = status.as_ref().and_then(|v| v.get("error")?.as_str()) {
                    let round = status.as_ref().and_then(|v| v.get("round")?.as_u64());
                    bail!("{e} (round {})", round.unwrap_or(0));
                }
                bail!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Launch on `a` (retrying while the node starts), wait `settle`, migrate.
#[allow(clippy::too_many_arguments)]
fn one_case(
    roam: &Path,
    wasm: &Path,
    args: &[String],
    a: &str,
    b: &str,
    settle: Duration,
    case: &Case,
) -> anyhow::Result<serde_json::Value> {
    let start = Instant::now();
    let cell = loop {
        let r = run_bounded(
            Command::new(roam)
                .arg("launch")
                .arg("--node")
                .arg(a)
                .arg(wasm)
                .arg("--")
                .args(args),
            Duration::from_secs(30),
        );
        match r {
            Ok(out) => break out.trim().to_string(),
            Err(e) if start.elapsed() > Duration::from_secs(15) => {
                return Err(e.context("launch failed"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    };
    std::thread::sleep(settle);
    let out = run_bounded(
        Command::new(roam)
            .args([
                "migrate",
                &cell,
                "--from",
                a,
                "--to",
                b,
                "--mode",
                &case.mode,
                "--bandwidth",
                &case.bandwidth,
                "--json",
            ])
            .args(&case.extra),
        Duration::from_secs(120),
    )
    .context("migrate failed")?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("not JSON: {out}"))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("migration failed: {e}");
    }
    v.get("summary")
        .filter(|s| !s.is_null())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no summary in {out}"))
}

/// Run every case on fresh nodes, `reps` times, the cases interleaved (so
/// a busy spell of the machine does not fall on one case only).
pub fn run(
    paths: &Paths,
    args: &[String],
    settle: Duration,
    cases: &[Case],
    reps: usize,
) -> anyhow::Result<Vec<Outcome>> {
    let roam = paths.tool("roam")?;
    let wasm: PathBuf = paths.wasm("dirty")?;
    let cache = paths.scratch.join("t4-cache");
    std::fs::create_dir_all(&cache)?;
    let mut out = Vec::new();
    let runs = (1..=reps.max(1)).flat_map(|rep| cases.iter().enumerate().map(move |c| (rep, c)));
    for (rep, (k, case)) in runs {
        let dir = paths.fresh_dir(&format!("t4-{k}"))?;
        let pa = 17810 + 10 * k as u16;
        let pb = pa + 1;
        eprintln!("t4: {} at {} (rep {rep}) ...", case.name, case.bandwidth);
        let summary = (|| {
            let _na = start_node(&roam, pa, "a", &dir, &cache)?;
            let _nb = start_node(&roam, pb, "b", &dir, &cache)?;
            one_case(
                &roam,
                &wasm,
                args,
                &format!("127.0.0.1:{pa}"),
                &format!("127.0.0.1:{pb}"),
                settle,
                case,
            )
        })()
        .map_err(|e| format!("{e:#}"));
        match &summary {
            Ok(s) => eprintln!("t4: {} at {}: {s}", case.name, case.bandwidth),
            Err(e) => eprintln!("t4: {} at {} FAILED: {e}", case.name, case.bandwidth),
        }
        out.push(Outcome {
            case: case.clone(),
            rep,
            summary,
        });
    }
    Ok(out)
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(f64::NAN)
}

/// Build the report.
pub fn report(outcomes: &[Outcome], setup: String) -> Report {
    let mut t = Table::new(&[
        "case",
        "rep",
        "bandwidth",
        "total ms",
        "downtime ms",
        "rounds",
        "memory MiB",
        "modified MiB",
        "wire MiB",
        "wire ÷ modified",
        "naive copy ms (memory ÷ bw)",
        "total ÷ naive",
        "modified ÷ bw ms",
        "total ÷ (modified ÷ bw)",
        "downtime ≤ 50 ms",
        "post-copy complete ms",
        "pipeline end mode",
        "error",
    ]);
    let mib = |b: f64| format!("{:.1}", b / f64::from(1 << 20));
    for o in outcomes {
        let c = &o.case;
        match &o.summary {
            Ok(s) => {
                let total = f(s, "total_ms");
                let down = f(s, "downtime_ms");
                let mem = f(s, "memory_bytes");
                let modified = f(s, "modified_bytes");
                let wire = f(s, "wire_bytes");
                let bps = c.bits_per_sec as f64;
                let naive = mem * 8.0 / bps * 1000.0;
                let reduced = modified * 8.0 / bps * 1000.0;
                t.push(vec![
                    c.name.clone(),
                    o.rep.to_string(),
                    c.bandwidth.clone(),
                    format!("{total:.0}"),
                    format!("{down:.1}"),
                    s.get("rounds").map(|r| r.to_string()).unwrap_or_default(),
                    mib(mem),
                    mib(modified),
                    mib(wire),
                    format!("{:.3}", wire / modified),
                    format!("{naive:.0}"),
                    format!("{:.2}", total / naive),
                    format!("{reduced:.0}"),
                    format!("{:.2}", total / reduced),
                    if down <= 50.0 { "yes" } else { "no" }.into(),
                    s.pointer("/post_copy/complete_ms")
                        .and_then(serde_json::Value::as_f64)
                        .map(|c| format!("{c:.0}"))
                        .unwrap_or_else(|| "-".into()),
                    s.pointer("/pipeline/mode")
                        .and_then(|m| serde_json::from_value::<Mode>(m.clone()).ok())
                        .map_or_else(|| "-".into(), |m| m.to_string()),
                    String::new(),
                ]);
            }
            Err(e) => {
                let mut row = vec![c.name.clone(), o.rep.to_string(), c.bandwidth.clone()];
                row.resize(17, String::new());
                row.push(e.clone());
                t.push(row);
            }
        }
    }
    Report {
        figure: None,
        name: "t4".into(),
        label: String::new(),
        title: "T4 — live migration between two nodes".into(),
        setup,
        table: t,
        notes: vec![
            "naive copy: the cell's whole linear memory at the shaped bandwidth, no pipeline".into(),
            "modified ÷ bw: the modified state (pages neither zero nor initial) at the shaped bandwidth".into(),
            "targets: downtime ≤ 50 ms; total ≤ 1.3 × reduced state ÷ bandwidth".into(),
        ],
    }
}

/// The pause of every successful case, phase by phase (`t4-pause`).
pub fn pause_report(outcomes: &[Outcome], setup: String) -> Report {
    let mut t = crate::pause::table(&["case", "rep", "bandwidth"]);
    for o in outcomes {
        if let Ok(s) = &o.summary {
            let labels = vec![
                o.case.name.clone(),
                o.rep.to_string(),
                o.case.bandwidth.clone(),
            ];
            t.push(crate::pause::row(labels, s));
        }
    }
    Report {
        figure: None,
        name: "t4-pause".into(),
        label: String::new(),
        title: "T4 — where the pause goes".into(),
        setup,
        table: t,
        notes: crate::pause::notes(),
    }
}
