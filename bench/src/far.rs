//! Far memory's slowdown (`docs/far-memory.md`): each workload run with
//! 75 %, 50 % and 25 % of its working set resident, under each eviction
//! policy, against the same workload with all of its memory, side by side
//! in one run.
//!
//! Stores compared:
//! - `swap file`: `roam run --local-memory` paging to an unlinked file on
//!   this machine's disk (through the page cache);
//! - `linux zram`: the plain `roam run` in a memory cgroup limited to the
//!   same budget (plus roam's own resident memory), swapping to a zram
//!   device: what a board does without roam's far memory. Only as root,
//!   with `/dev/zram0` and the cgroup v1 memory controller; skipped (and
//!   said so) otherwise.
//!
//! The working set is the peak resident memory of a run with an unbounded
//! budget, as far memory counts it. Every run's checksum must equal the
//! run with all of its memory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::paths::Paths;
use crate::proc::checksum;
use crate::report::{Report, Table};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Workloads.
    pub workloads: Vec<String>,
    /// Their size.
    pub size: String,
    /// Shares of the working set kept resident, percent.
    pub shares: Vec<u32>,
    /// Runs per variant (median).
    pub reps: usize,
    /// Also Linux swap to zram, when possible here.
    pub zram: bool,
    /// Also a memory server on another node (`far_server.rs`).
    pub server: bool,
    /// Also a memory server through a link of each of these rates.
    pub links: Vec<String>,
}

/// A `roam run` of `name`, with `extra` flags first (and `wrap` around
/// it): its checksum and the far-memory summary, when there is one. The
/// caller times it.
fn roam_run(
    paths: &Paths,
    name: &str,
    size: &str,
    extra: &[String],
    wrap: Option<&[String]>,
) -> anyhow::Result<(String, String)> {
    let roam = paths.tool("roam")?;
    let mut cmd = match wrap {
        Some(w) => {
            let mut c = Command::new(&w[0]);
            c.args(&w[1..]).arg(&roam);
            c
        }
        None => Command::new(&roam),
    };
    cmd.arg("run")
        .args(extra)
        .arg(paths.wasm(name)?)
        .arg("--")
        .arg(size);
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot run roam on {name}"))?;
    if !out.status.success() {
        bail!(
            "roam run {name} {extra:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sum = checksum(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("{name} printed no checksum"))?;
    let err = String::from_utf8_lossy(&out.stderr);
    let summary = err
        .lines()
        .rev()
        .find(|l| l.starts_with("roam: local memory"))
        .unwrap_or_default()
        .to_string();
    Ok((sum, summary))
}

/// The median wall time of `reps` runs, each checked against `want`.
fn timed(
    reps: usize,
    want: &str,
    what: &str,
    mut f: impl FnMut() -> anyhow::Result<(String, String)>,
) -> anyhow::Result<(Duration, String)> {
    let mut times = Vec::new();
    let mut summary = String::new();
    for _ in 0..reps.max(1) {
        let began = Instant::now();
        let (sum, s) = f()?;
        times.push(began.elapsed());
        if sum != want {
            bail!("{what}: checksum {sum}, uninterrupted {want}");
        }
        summary = s;
    }
    times.sort();
    Ok((times[times.len() / 2], summary))
}

/// A number before `unit` in a far-memory summary (`12.5 MiB read back`).
fn figure(summary: &str, unit: &str) -> Option<f64> {
    summary
        .split(unit)
        .next()?
        .rsplit([' ', '('])
        .next()?
        .parse()
        .ok()
}

/// Runs `roam run` in a memory cgroup that swaps to zram; undone on drop.
struct Zram {
    cgroup: PathBuf,
}

impl Zram {
    /// Set up zram swap of `bytes` and an empty cgroup, or say why not.
    fn setup(bytes: u64) -> Result<Zram, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root".into());
        }
        let mem = Path::new("/sys/fs/cgroup/memory");
        if !mem.join("memory.limit_in_bytes").exists() {
            return Err("no cgroup v1 memory controller".into());
        }
        if !Path::new("/sys/block/zram0").exists() {
            return Err("no /dev/zram0".into());
        }
        let sh = |c: &str| {
            let ok = Command::new("sh").arg("-c").arg(c).status();
            match ok {
                Ok(s) if s.success() => Ok(()),
                _ => Err(format!("`{c}` failed")),
            }
        };
        let _ = sh("swapoff /dev/zram0 2>/dev/null; echo 1 > /sys/block/zram0/reset");
        sh(&format!("echo {bytes} > /sys/block/zram0/disksize"))?;
        sh("mkswap /dev/zram0 >/dev/null && swapon /dev/zram0")?;
        let cgroup = mem.join("roam-bench-far");
        let _ = std::fs::create_dir(&cgroup);
        Ok(Zram { cgroup })
    }

    /// The wrapper that runs a command in the cgroup at `limit` bytes.
    fn wrap(&self, limit: u64) -> Vec<String> {
        let g = self.cgroup.display();
        vec![
            "sh".into(),
            "-c".into(),
            format!(
                "echo {limit} > {g}/memory.limit_in_bytes && echo 60 > {g}/memory.swappiness \
                 && echo $$ > {g}/cgroup.procs && exec \"$@\""
            ),
            "sh".into(),
        ]
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("sh")
            .arg("-c")
            .arg("swapoff /dev/zram0; echo 1 > /sys/block/zram0/reset")
            .status();
    }
}

/// Run the benchmark.
pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let scratch = paths.fresh_dir("far")?;
    let swap = scratch.join("swap");
    std::fs::create_dir_all(&swap)?;
    let swap_flag = |local: u64, eviction: &str| -> Vec<String> {
        vec![
            "--local-memory".into(),
            format!("{}KiB", local / 1024),
            "--eviction".into(),
            eviction.into(),
            "--swap-dir".into(),
            swap.display().to_string(),
        ]
    };
    let mut zram = if o.zram {
        match Zram::setup(4 << 30) {
            Ok(z) => Some(z),
            Err(why) => {
                eprintln!("far: no Linux zram baseline: {why}");
                None
            }
        }
    } else {
        None
    };
    let mut table = Table::new(&[
        "workload",
        "working set (MiB)",
        "resident",
        "store",
        "eviction",
        "time (s)",
        "slowdown",
        "far faults",
        "MiB read back",
        "MiB written out",
    ]);
    let mut worst: Vec<(String, f64)> = Vec::new();
    // Linux zram runs that did not finish (the cgroup's OOM killer).
    let mut zram_failed: Vec<String> = Vec::new();
    // The memory servers: on loopback, and in two namespaces joined by a
    // link reshaped to each rate in turn (one pair: the namespaces are
    // the script's, one of each).
    let roam = paths.tool("roam")?;
    let nodes = scratch.join("nodes");
    let pair = match o.server {
        true => Some(crate::far_server::Pair::start(&roam, &nodes, None)?),
        false => None,
    };
    let linked = match o.links.first() {
        Some(rate) => Some(crate::far_server::Pair::start(
            &roam,
            &nodes.join("linked"),
            Some(rate),
        )?),
        None => None,
    };
    for name in &o.workloads {
        // Uninterrupted, with all of its memory: the reference.
        let (want, _) = roam_run(paths, name, &o.size, &[], None)?;
        let (base, _) = timed(o.reps, &want, name, || {
            roam_run(paths, name, &o.size, &[], None)
        })?;
        // The working set: the peak resident with an unbounded budget.
        let (_, s) = roam_run(paths, name, &o.size, &swap_flag(4 << 30, "clock"), None)?;
        let ws_mib = figure(&s, " MiB resident)").context("no peak in the summary")?;
        let ws = (ws_mib * 1048576.0) as u64;
        let full = |store: &str, t: Duration| {
            vec![
                name.clone(),
                format!("{ws_mib:.1}"),
                "100 %".into(),
                store.to_string(),
                "-".into(),
                format!("{:.2}", t.as_secs_f64()),
                "1.00".into(),
                "0".into(),
                "0".into(),
                "0".into(),
            ]
        };
        table.push(full("-", base));
        // Through the nodes, all of it on the board: the memory server's
        // rows are measured against this.
        let wasm = paths.wasm(name)?;
        let node_base = match &pair {
            Some(p) => {
                // Once untimed: the board compiles the module and caches it.
                p.run(&wasm, &o.size, None)?;
                let (t, _) = timed(o.reps, &want, name, || {
                    p.run(&wasm, &o.size, None)
                        .map(|(s, _, _)| (s, String::new()))
                })?;
                table.push(full("node, no server", t));
                Some(t)
            }
            None => None,
        };
        for &share in &o.shares {
            let local = (ws * u64::from(share) / 100).max(256 << 10) / 4096 * 4096;
            let mut row = |store: &str, eviction: &str, t: Duration, summary: &str| {
                let against = match store.starts_with("memory server") {
                    true => node_base.unwrap_or(base),
                    false => base,
                };
                let slow = t.as_secs_f64() / against.as_secs_f64();
                worst.push((format!("{name} {share} % {store} {eviction}"), slow));
                table.push(vec![
                    name.clone(),
                    format!("{ws_mib:.1}"),
                    format!("{share} %"),
                    store.to_string(),
                    eviction.to_string(),
                    format!("{:.2}", t.as_secs_f64()),
                    format!("{slow:.2}"),
                    figure(summary, " faults").map_or("-".into(), |f| format!("{f:.0}")),
                    figure(summary, " MiB read back").map_or("-".into(), |f| format!("{f:.1}")),
                    figure(summary, " MiB written out").map_or("-".into(), |f| format!("{f:.1}")),
                ]);
            };
            for eviction in ["clock", "random"] {
                let what = format!("{name} at {share} % ({eviction})");
                let (t, s) = timed(o.reps, &want, &what, || {
                    roam_run(paths, name, &o.size, &swap_flag(local, eviction), None)
                })?;
                row("swap file", eviction, t, &s);
                // Timed like the run without a server: launch, run, and
                // the log's fetch.
                let far = Some((local, eviction));
                if let Some(p) = &pair {
                    let (t, s) = timed(o.reps, &want, &what, || {
                        p.run(&wasm, &o.size, far).map(|(sum, _, s)| (sum, s))
                    })?;
                    row("memory server", eviction, t, &s);
                }
                if let Some(p) = &linked {
                    for rate in &o.links {
                        p.shape(rate)?;
                        let (t, s) = timed(o.reps, &want, &what, || {
                            p.run(&wasm, &o.size, far).map(|(sum, _, s)| (sum, s))
                        })?;
                        row(&format!("memory server, {rate}"), eviction, t, &s);
                    }
                }
            }
            if let Some(z) = zram.as_mut() {
                // roam's own memory (engine, code, buffers) is not the
                // program's: the cgroup gets it on top of the budget.
                let limit = local + (48 << 20);
                let wrap = z.wrap(limit);
                let what = format!("{name} at {share} % (zram)");
                match timed(o.reps, &want, &what, || {
                    roam_run(paths, name, &o.size, &[], Some(&wrap))
                }) {
                    Ok((t, _)) => row("linux zram", "kernel", t, ""),
                    // Killed in its cgroup: what a board without roam gets
                    // is a result too. Anything else (a wrong checksum)
                    // is not.
                    Err(e) if format!("{e:#}").contains("SIGKILL") => {
                        eprintln!("far: {what}: {e:#}");
                        zram_failed.push(format!("{name} at {share} %"));
                        table.push(vec![
                            name.clone(),
                            format!("{ws_mib:.1}"),
                            format!("{share} %"),
                            "linux zram".into(),
                            "kernel".into(),
                            "failed".into(),
                            "-".into(),
                            "-".into(),
                            "-".into(),
                            "-".into(),
                        ]);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    worst.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut notes = vec![format!(
        "Slowdown is the median time over {} run(s) against the same workload with all of its memory, in the same run; every run's checksum equals that run's.",
        o.reps
    )];
    if let Some((what, x)) = worst.first() {
        notes.push(format!("Worst: **{x:.2}×** ({what})."));
    }
    notes.push(
        "HEXO's Netswap (their Fig. 9–10): up to +40 % throughput over plain TCP swap; their boards page 512 pages per batch, as roam does."
            .into(),
    );
    if o.server {
        notes.push(
            "Memory-server rows: two `roam node` processes on this machine's loopback, the cell launched on one with its far pages on the other; each against the same launch with all of its memory (`node, no server`), both timed from the launch to the fetched log. Rows named with a rate run the two nodes in two network namespaces joined by a veth pair shaped by the kernel (`tc tbf`) at that rate each way, without added delay (no `netem` here); the others on loopback. Their faults and bytes are the node's counters at its last poll before the end."
                .into(),
        );
    }
    if !zram_failed.is_empty() {
        notes.push(format!(
            "Linux zram: the plain `roam run` did not finish in its memory cgroup (budget + 48 MiB) at {}; the kernel's OOM killer ended it (its reason is on stderr and in `dmesg`).",
            zram_failed.join(", ")
        ));
    }
    if o.zram && zram.is_none() {
        notes.push("No Linux zram baseline on this machine (see stderr).".into());
    }
    drop(zram);
    Ok(Report {
        name: "far".into(),
        label: o.size.clone(),
        title: "Far memory: slowdown with part of the working set resident".into(),
        setup: format!(
            "`roam-bench far --only {} --size {} --shares {} --reps {}{}{}{}`",
            o.workloads.join(","),
            o.size,
            o.shares
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            o.reps,
            if o.zram { " --zram" } else { "" },
            if o.server && o.links.is_empty() {
                " --server"
            } else {
                ""
            },
            if o.links.is_empty() {
                String::new()
            } else {
                format!(" --links {}", o.links.join(","))
            },
        ),
        table,
        notes,
        figure: None,
    })
}
