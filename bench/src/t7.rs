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

use std::time::Duration;

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

struct Outcome {
    name: &'static str,
    rate: f64,
    migrations: usize,
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
    let _a = kv::node(&roam, na, "a", pa.addr, &dir, &cache)?;
    let _b = kv::node(&roam, nb, "b", pb.addr, &dir, &cache)?;
    let home = if name == "always on b" { nb } else { na };
    let cell = kv::launch_service(&roam, home, "kv", &wasm)?;
    let len = 1024;
    load::load_dataset(listen, o.keys, len)?;
    let load = Load::start(LoadConfig {
        addr: listen,
        readers: o.readers,
        keys: o.keys,
        value_len: len,
        bench_args: Vec::new(),
    })?;
    let mut at = home;
    let mut migrations = 0;
    let mut failed = Vec::new();
    let phase = Duration::from_secs_f64(o.phase_secs);
    for p in 0..o.phases {
        let start = std::time::Instant::now();
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
    Ok(Outcome {
        name,
        rate: timeline.rate(0.0, end),
        migrations,
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
    for name in ["always on a", "always on b", "follow the user"] {
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
        .filter(|o| o.name != "follow the user")
        .map(|o| o.rate)
        .fold(f64::NAN, f64::max);
    let mut t = Table::new(&[
        "scenario",
        "req/s (average over all phases)",
        "÷ best never-migrating",
        "migrations",
        "longest reply gap ms",
        "failed requests",
    ]);
    for out in &outs {
        t.push(vec![
            out.name.into(),
            format!("{:.0}", out.rate),
            format!("{:.2}", out.rate / best_static),
            out.migrations.to_string(),
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
    notes.push("target: follow the user ≥ 1.25 × the better never-migrating placement".into());
    Ok(Report {
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
