//! T7, follow-the-user (H-Container, figures 16-17): a user moves between
//! two edges; the KV cell either stays where it is or follows.
//!
//! Why it exists: migration is worth its pause only if being close to the
//! user pays more. Two nodes each reach the gateway through a delay line
//! whose delay changes over time (user-space, see `kv::delay`): in even
//! phases node a is near and b far, in odd phases the reverse. Closed-loop
//! clients (readers that wait for each reply) issue GETs through the
//! gateway, so their throughput follows the round-trip time. Three
//! scenarios, each on fresh processes: the cell always on a, always on b,
//! and migrating (pre-copy) to the near node at each phase change. The
//! baseline is the better of the two static placements.
//!
//! A fourth scenario lets the planner decide: the nodes register with a
//! `roam planner` whose placement policy is `follow-the-client`, and
//! nothing else moves the cell. The planner sees each node's measured
//! round trip to the gateway in its heartbeats and moves the cell itself
//! (`roam-planner/src/follow.rs`). The benchmark only watches the cell's
//! owner, to report how long each phase took to be followed and whether
//! any move went the wrong way.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kv::delay::DelayProxy;
use crate::kv::load::{self, Load, LoadConfig};
use crate::kv::{self};
use crate::paths::Paths;
use crate::report::{Report, Table};

/// What to run.
pub struct Options {
    /// Number of phases.
    pub phases: usize,
    /// Seconds per phase.
    pub phase_secs: f64,
    /// One-way delay to the near node, ms.
    pub near_ms: f64,
    /// One-way delay to the far node, ms.
    pub far_ms: f64,
    /// Dataset keys (values of 1 KiB).
    pub keys: u64,
    /// Closed-loop reader clients.
    pub readers: usize,
    /// Migration mode when following.
    pub mode: String,
}

/// The scenario in which the planner's policy moves the cell.
const POLICY: &str = "follow-the-client policy";

struct Outcome {
    name: &'static str,
    rate: f64,
    migrations: usize,
    /// Policy only: moves that went to the node that was far then.
    wrong_moves: usize,
    /// Policy only: for each phase after the first, seconds from its start
    /// until the cell ran on its near node (`None`: not within the phase).
    reactions: Vec<Option<f64>>,
    /// Replies per second, second by second.
    per_second: Vec<f64>,
    /// When the cell changed node (seconds since the load started).
    moves_at: Vec<f64>,
    failed_migrations: Vec<String>,
    longest_gap: f64,
    errors: u64,
    first_errors: Vec<String>,
}

fn scenario(paths: &Paths, o: &Options, name: &'static str) -> anyhow::Result<Outcome> {
    let roam = paths.tool("roam")?;
    let wasm = paths.wasm("kvserver")?;
    let dir = paths.fresh_dir(&format!("t7-{}", name.replace(' ', "-")))?;
    let cache = paths.scratch.join("kv-cache");
    std::fs::create_dir_all(&cache)?;
    let (listen, control) = (kv::free_addr()?, kv::free_addr()?);
    let (na, nb) = (kv::free_addr()?, kv::free_addr()?);
    let near = Duration::from_secs_f64(o.near_ms / 1000.0);
    let far = Duration::from_secs_f64(o.far_ms / 1000.0);
    let _gw = kv::gateway(&roam, listen, "kv", control, &dir)?;
    let pa = DelayProxy::start(control, near)?;
    let pb = DelayProxy::start(control, far)?;
    let planner = if name == POLICY {
        Some(kv::planner(&roam, &dir, "follow-the-client")?)
    } else {
        None
    };
    let extra: Vec<String> = match &planner {
        Some((_, url)) => vec!["--planner".into(), url.clone()],
        None => Vec::new(),
    };
    let _a = kv::node_with(&roam, na, "a", pa.addr, &dir, &cache, &extra)?;
    let _b = kv::node_with(&roam, nb, "b", pb.addr, &dir, &cache, &extra)?;
    let home = if name == "always on b" { nb } else { na };
    let cell = match &planner {
        Some((_, url)) => launch_through(&roam, url, "a", &wasm)?,
        None => kv::launch_service(&roam, home, "kv", &wasm)?,
    };
    let len = 1024;
    load::load_dataset(listen, o.keys, len)?;
    let load = Load::start(LoadConfig {
        addr: listen,
        readers: o.readers,
        keys: o.keys,
        value_len: len,
        bench_args: Vec::new(),
    })?;
    let t0 = Instant::now();
    let watcher = planner
        .as_ref()
        .map(|(_, url)| OwnerWatch::start(url.clone(), cell.clone(), t0));
    let mut phase_starts = Vec::new();
    let mut scripted_at = Vec::new();
    let mut at = home;
    let mut migrations = 0;
    let mut failed = Vec::new();
    let phase = Duration::from_secs_f64(o.phase_secs);
    for p in 0..o.phases {
        let start = std::time::Instant::now();
        phase_starts.push(t0.elapsed().as_secs_f64());
        let a_near = p % 2 == 0;
        pa.set_delay(if a_near { near } else { far });
        pb.set_delay(if a_near { far } else { near });
        let near_node = if a_near { na } else { nb };
        if name == "follow the user" && at != near_node {
            eprintln!("t7: {name}: phase {p}: migrating to the near node ...");
            match kv::migrate(&roam, &cell, at, near_node, &o.mode, None) {
                Ok(_) => {
                    at = near_node;
                    migrations += 1;
                    scripted_at.push(t0.elapsed().as_secs_f64());
                }
                Err(e) => failed.push(format!("phase {p}: {e:#}")),
            }
        }
        if let Some(rest) = phase.checked_sub(start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    let end = load.timeline.now();
    let (timeline, seen) = load.stop();
    let (mut wrong_moves, mut reactions, mut moves_at) = (0, Vec::new(), scripted_at);
    let per_second = (0..end.floor() as usize)
        .map(|t| timeline.rate(t as f64, t as f64 + 1.0))
        .collect();
    if let Some(w) = watcher {
        let owners = w.stop()?;
        moves_at = owners.iter().skip(1).map(|x| x.0).collect();
        let near_in = |p: usize| if p.is_multiple_of(2) { "a" } else { "b" };
        let phase_of = |t: f64| phase_starts.iter().rposition(|s| *s <= t).unwrap_or(0);
        for pair in owners.windows(2) {
            migrations += 1;
            let (t, to) = (pair[1].0, &pair[1].1);
            if to != near_in(phase_of(t)) {
                wrong_moves += 1;
            }
        }
        for (p, &from) in phase_starts.iter().enumerate().skip(1) {
            let until = from + o.phase_secs;
            let owner_at = |t: f64| owners.iter().rev().find(|x| x.0 <= t).map(|x| x.1.as_str());
            reactions.push(if owner_at(from) == Some(near_in(p)) {
                Some(0.0)
            } else {
                owners
                    .iter()
                    .find(|x| x.0 > from && x.0 < until && x.1 == near_in(p))
                    .map(|x| x.0 - from)
            });
        }
    }
    Ok(Outcome {
        name,
        rate: timeline.rate(0.0, end),
        migrations,
        wrong_moves,
        reactions,
        per_second,
        moves_at,
        failed_migrations: failed,
        longest_gap: seen
            .longest_reader_gap(0.0, end)
            .max(seen.longest_probe_gap(0.0, end)),
        errors: seen.error_count,
        first_errors: seen.errors,
    })
}

/// Run the three scenarios.
pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let mut outs = Vec::new();
    let mut notes = Vec::new();
    for name in ["always on a", "always on b", "follow the user", POLICY] {
        eprintln!("t7: {name} ...");
        match scenario(paths, o, name) {
            Ok(out) => {
                eprintln!("t7: {name}: {:.0} req/s", out.rate);
                outs.push(out);
            }
            Err(e) => {
                eprintln!("t7: {name} FAILED: {e:#}");
                notes.push(format!("FAILED {name}: {e:#}"));
            }
        }
    }
    let best_static = outs
        .iter()
        .filter(|o| o.name.starts_with("always"))
        .map(|o| o.rate)
        .fold(f64::NAN, f64::max);
    let mut t = Table::new(&[
        "scenario",
        "req/s (average over all phases)",
        "÷ best never-migrating",
        "migrations",
        "moves to the far node",
        "followed after (s, per phase change)",
        "longest reply gap ms",
        "failed requests",
    ]);
    for out in &outs {
        let reactions: Vec<String> = out
            .reactions
            .iter()
            .map(|r| r.map_or("not followed".into(), |s| format!("{s:.1}")))
            .collect();
        t.push(vec![
            out.name.into(),
            format!("{:.0}", out.rate),
            format!("{:.2}", out.rate / best_static),
            out.migrations.to_string(),
            if out.name == POLICY {
                out.wrong_moves.to_string()
            } else {
                "-".into()
            },
            if reactions.is_empty() {
                "-".into()
            } else {
                reactions.join(", ")
            },
            format!("{:.1}", out.longest_gap),
            out.errors.to_string(),
        ]);
        for f in &out.failed_migrations {
            notes.push(format!("{}: migration FAILED: {f}", out.name));
        }
        if !out.first_errors.is_empty() {
            notes.push(format!(
                "{}: first failures: {:?}",
                out.name, out.first_errors
            ));
        }
    }
    notes.push(
        "target: follow the user ≥ 1.25 × the better never-migrating placement, with the \
         policy deciding, no failed request and no flapping (no move to the far node)"
            .into(),
    );
    notes.push(format!(
        "`{POLICY}`: a `roam planner` (lease 3 s, so heartbeats every second) with placement \
         policy follow-the-client; the benchmark never moves the cell, it polls the planner \
         for the cell's owner every 200 ms"
    ));
    let figure = Some(plot(&outs, o));
    Ok(Report {
        figure,
        name: "t7".into(),
        label: String::new(),
        title: "T7 — follow-the-user: KV throughput with the cell following the user's nearer node".into(),
        setup: format!(
            "`roam-bench t7 --phases {} --phase-secs {} --near-ms {} --far-ms {} --keys {} --readers {} --mode {}`: \
             kvserver cell behind `roam gateway`; each node's link to the gateway through a user-space delay line \
             (one-way {} ms near, {} ms far, swapped every phase); {} closed-loop GET clients and one INCR probe",
            o.phases, o.phase_secs, o.near_ms, o.far_ms, o.keys, o.readers, o.mode, o.near_ms, o.far_ms, o.readers
        ),
        table: t,
        notes,
    })
}

/// `roam launch --planner URL --on NODE --service kv`, once both nodes
/// have registered: the cell id.
fn launch_through(
    roam: &std::path::Path,
    url: &str,
    on: &str,
    wasm: &std::path::Path,
) -> anyhow::Result<String> {
    kv::wait_nodes(
        roam,
        url,
        2,
        Duration::from_secs(30),
        "the nodes did not register",
        |_| true,
    )?;
    let mut cmd = Command::new(roam);
    cmd.args(["launch", "--planner", url, "--on", on, "--service", "kv"])
        .arg(wasm);
    Ok(kv::run_bounded(&mut cmd, Duration::from_secs(300))?
        .trim()
        .to_string())
}

/// Polls the planner for a cell's owner, recording each change.
struct OwnerWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<(f64, String)>>>,
}

impl OwnerWatch {
    fn start(url: String, cell: String, t0: Instant) -> OwnerWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(5))
                    .build()?;
                let mut seen: Vec<(f64, String)> = Vec::new();
                while !s.load(Ordering::Relaxed) {
                    let r = http.get(format!("{url}/v1/cells/{cell}")).send().await;
                    if let Ok(r) = r {
                        if let Ok(v) = r.json::<serde_json::Value>().await {
                            let owner = v["owner"].as_str().unwrap_or_default().to_string();
                            if !owner.is_empty() && seen.last().is_none_or(|l| l.1 != owner) {
                                seen.push((t0.elapsed().as_secs_f64(), owner));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(seen)
            })
        });
        OwnerWatch { stop, thread }
    }

    fn stop(self) -> anyhow::Result<Vec<(f64, String)>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the owner watch panicked"))?
    }
}

/// Replies per second over time, one line per scenario, with the phase
/// changes as dashed lines and each scenario's moves as dots on its line:
/// H-Container's figure 17, as an SVG.
fn plot(outs: &[Outcome], o: &Options) -> String {
    use std::fmt::Write;
    const COLORS: [&str; 4] = ["#8a8a8a", "#c9a227", "#2a7ab0", "#d0452f"];
    let (w, h, left, bottom, top, right) = (900.0, 340.0, 60.0, 40.0, 20.0, 260.0);
    let secs = (o.phases as f64 * o.phase_secs).max(1.0);
    let peak = outs
        .iter()
        .flat_map(|x| x.per_second.iter().copied())
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.1;
    let x = |t: f64| left + (t / secs).min(1.0) * (w - left - right);
    let y = |v: f64| h - bottom - (v / peak).clamp(0.0, 1.0) * (h - bottom - top);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    // Axes, ticks every 10 s and at five levels of req/s.
    let _ = writeln!(
        s,
        "<path d=\"M{left} {top} V{} H{}\" stroke=\"black\" fill=\"none\"/>",
        h - bottom,
        w - right
    );
    let mut t = 0.0;
    while t <= secs {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{t:.0}</text>",
            x(t),
            h - bottom + 16.0
        );
        t += 10.0;
    }
    for i in 0..=4 {
        let v = peak / 1.1 * i as f64 / 4.0;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            left - 6.0,
            y(v) + 4.0
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">seconds (the near node swaps at each dashed line)</text>\n\
         <text x=\"14\" y=\"{:.1}\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">replies per second</text>",
        (left + w - right) / 2.0,
        h - 6.0,
        h / 2.0,
        h / 2.0
    );
    for p in 1..o.phases {
        let px = x(p as f64 * o.phase_secs);
        let _ = writeln!(
            s,
            "<line x1=\"{px:.1}\" y1=\"{top}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"#bbb\" stroke-dasharray=\"4 4\"/>",
            h - bottom
        );
    }
    for (i, out) in outs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = out
            .per_second
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(t, v)| format!("{:.1},{:.1}", x(t as f64 + 0.5), y(*v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{c}\" stroke-width=\"1.8\"/>",
            pts.join(" ")
        );
        for m in &out.moves_at {
            let v = out.per_second.get(*m as usize).copied().unwrap_or(0.0);
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{c}\"/>",
                x(*m),
                y(v)
            );
        }
        let ly = top + 16.0 + 20.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"3\"/>\n\
             <text x=\"{}\" y=\"{:.1}\">{} ({:.0}/s)</text>",
            w - right + 10.0,
            w - right + 30.0,
            w - right + 36.0,
            ly + 4.0,
            out.name,
            out.rate
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\">dots: the cell moved</text>\n</svg>",
        w - right + 10.0,
        top + 16.0 + 20.0 * outs.len() as f64
    );
    s
}
