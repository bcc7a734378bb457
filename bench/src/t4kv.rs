//! T4 with the KV cell: what a client sees while the server it talks to
//! migrates.
//!
//! Why it exists: the node-level T4 (`t4`) reports the migration's own
//! numbers; the promise to a client is stronger: no failed request, and a
//! pause it barely notices. Here the `kvserver` cell, loaded with a dataset
//! (256 MiB by default), serves behind `roam gateway` while redis-benchmark
//! runs back to back, a probe issues `INCR` continuously (the longest gap
//! between its replies is the client-visible downtime), and readers `GET`
//! and check random dataset keys (throughput before, during and after). The
//! cell is migrated between two nodes once per mode, alternating direction,
//! with the transfer shaped to the given bandwidth (`roam migrate
//! --bandwidth`). At the end every dataset key is read back and compared.

use std::time::Duration;

use crate::kv::load::{self, Load, LoadConfig};
use crate::kv::{self, num};
use crate::paths::Paths;
use crate::report::{Report, Table};

/// What to run.
pub struct Options {
    /// Dataset keys.
    pub keys: u64,
    /// Dataset value length, bytes.
    pub value_len: usize,
    /// Migration modes, in order (the cell alternates between the nodes).
    pub modes: Vec<String>,
    /// `roam migrate --bandwidth`.
    pub bandwidth: String,
    /// Seconds of load before each migration (and after the last).
    pub settle: f64,
    /// Reader threads.
    pub readers: usize,
    /// redis-benchmark arguments, run back to back during the whole load.
    pub bench: String,
}

struct Step {
    mode: String,
    t0: f64,
    t1: f64,
    summary: Result<serde_json::Value, String>,
}

/// A mode as given to `--modes`: `pre-copy/pipeline` is pre-copy with its
/// final round sent through the transfer pipeline (the ablation of the
/// direct final round); any other name is a `roam migrate --mode`.
fn mode_args(mode: &str) -> (&str, Vec<String>) {
    match mode.split_once('/') {
        Some((base, "pipeline")) => (base, vec!["--final-round".into(), "pipeline".into()]),
        _ => (mode, Vec::new()),
    }
}

/// Run the benchmark: the client's view, and the node's pause phase by
/// phase (`t4kv-pause`).
pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<(Report, Report)> {
    let roam = paths.tool("roam")?;
    let wasm = paths.wasm("kvserver")?;
    let dir = paths.fresh_dir("t4kv")?;
    let cache = paths.scratch.join("kv-cache");
    std::fs::create_dir_all(&cache)?;
    let (listen, control) = (kv::free_addr()?, kv::free_addr()?);
    let (na, nb) = (kv::free_addr()?, kv::free_addr()?);
    let _gw = kv::gateway(&roam, listen, "kv", control, &dir)?;
    let _a = kv::node(&roam, na, "a", control, &dir, &cache)?;
    let _b = kv::node(&roam, nb, "b", control, &dir, &cache)?;
    let cell = kv::launch_service(&roam, na, "kv", &wasm)?;
    eprintln!(
        "t4kv: cell {cell} on node a; loading {} keys x {} B ...",
        o.keys, o.value_len
    );
    let t = std::time::Instant::now();
    load::load_dataset(listen, o.keys, o.value_len)?;
    eprintln!("t4kv: loaded in {:.1} s", t.elapsed().as_secs_f64());
    let settle = Duration::from_secs_f64(o.settle);
    let load = Load::start(LoadConfig {
        addr: listen,
        readers: o.readers,
        keys: o.keys,
        value_len: o.value_len,
        bench_args: o.bench.split_whitespace().map(String::from).collect(),
    })?;
    let (mut from, mut to) = (na, nb);
    let mut steps = Vec::new();
    for mode in &o.modes {
        std::thread::sleep(settle);
        let t0 = load.timeline.now();
        eprintln!("t4kv: {mode} {from} -> {to} at {t0:.1} s ...");
        let (base, extra) = mode_args(mode);
        let summary = kv::migrate_with(&roam, &cell, from, to, base, Some(&o.bandwidth), &extra)
            .map_err(|e| format!("{e:#}"));
        let t1 = load.timeline.now();
        match &summary {
            Ok(s) => {
                eprintln!("t4kv: {mode}: {s}");
                std::mem::swap(&mut from, &mut to);
            }
            Err(e) => eprintln!("t4kv: {mode} FAILED: {e}"),
        }
        steps.push(Step {
            mode: mode.clone(),
            t0,
            t1,
            summary,
        });
    }
    std::thread::sleep(settle);
    let end = load.timeline.now();
    let (timeline, seen) = load.stop();
    eprintln!("t4kv: verifying the dataset ...");
    let bad = load::verify_dataset(listen, o.keys, o.value_len);

    let mut t = Table::new(&[
        "mode",
        "bandwidth",
        "total ms",
        "downtime ms (node)",
        "longest reply gap ms (probe)",
        "longest reply gap ms (readers)",
        "pause ≤ 50 ms",
        "req/s before",
        "req/s during",
        "req/s after",
        "error",
    ]);
    for (k, s) in steps.iter().enumerate() {
        let next = steps.get(k + 1).map_or(end, |n| n.t0);
        let before = (s.t0 - o.settle + 0.5).max(0.0);
        let gap = seen.longest_probe_gap(s.t0, s.t1 + 1.0);
        let (total, down) = match &s.summary {
            Ok(v) => (num(v, "total_ms"), num(v, "downtime_ms")),
            Err(_) => (f64::NAN, f64::NAN),
        };
        t.push(vec![
            s.mode.clone(),
            o.bandwidth.clone(),
            format!("{total:.0}"),
            format!("{down:.1}"),
            format!("{gap:.1}"),
            format!("{:.1}", seen.longest_reader_gap(s.t0, s.t1 + 1.0)),
            if gap <= 50.0 { "yes" } else { "no" }.into(),
            format!("{:.0}", timeline.rate(before, s.t0)),
            format!("{:.0}", timeline.rate(s.t0, s.t1)),
            format!("{:.0}", timeline.rate(s.t1, next)),
            s.summary.as_ref().err().cloned().unwrap_or_default(),
        ]);
    }
    let mut notes = vec![
        format!(
            "dataset: {} keys x {} B = {:.0} MiB of values; verified after the last migration: {}",
            o.keys,
            o.value_len,
            (o.keys * o.value_len as u64) as f64 / f64::from(1 << 20),
            match &bad {
                Ok(0) => "every key present with its value".to_string(),
                Ok(n) => format!("{n} keys MISSING OR WRONG"),
                Err(e) => format!("could not verify: {e:#}"),
            }
        ),
        format!(
            "failed requests (probe + readers): {}{}",
            seen.error_count,
            if seen.errors.is_empty() {
                String::new()
            } else {
                format!(": {:?}", seen.errors)
            }
        ),
        format!("probe INCRs answered in sequence: {}", seen.probe_ops),
    ];
    let fails = seen.bench_failures();
    let runs = seen.bench.len();
    notes.push(format!(
        "redis-benchmark `{}`: {runs} runs back to back, {} failed{}",
        o.bench,
        fails.len(),
        if fails.is_empty() {
            String::new()
        } else {
            format!(": {fails:?}")
        }
    ));
    notes.push(
        "req/s: checked GETs of the readers plus probe INCRs (redis-benchmark's requests are not counted); \
         before = the settle period before the migration, during = while `roam migrate` ran, \
         after = until the next migration or the end"
            .into(),
    );
    notes.push("target: pre-copy pause ≤ 50 ms as the client sees it, zero failed requests".into());
    let mut pause = crate::pause::table(&["mode", "longest reply gap ms (probe)"]);
    for s in &steps {
        if let Ok(v) = &s.summary {
            let gap = seen.longest_probe_gap(s.t0, s.t1 + 1.0);
            pause.push(crate::pause::row(
                vec![s.mode.clone(), format!("{gap:.1}")],
                v,
            ));
        }
    }
    let mut pause_notes = crate::pause::notes();
    pause_notes.push(
        "longest reply gap − downtime: the gateway's hold and serve and the first reply \
         reaching the client, beyond the node's pause"
            .into(),
    );
    let report = Report {
        figure: None,
        name: "t4kv".into(),
        label: String::new(),
        title: "T4 — the KV cell migrating under redis-benchmark load, as the client sees it".into(),
        setup: format!(
            "`roam-bench t4kv --keys {} --value-len {} --modes {} --bandwidth {} --settle {} --readers {} --bench '{}'`: \
             kvserver cell behind `roam gateway`, nodes a and b on loopback, migrated a→b→a… once per mode",
            o.keys,
            o.value_len,
            o.modes.join(","),
            o.bandwidth,
            o.settle,
            o.readers,
            o.bench
        ),
        table: t,
        notes,
    };
    let pause = Report {
        figure: None,
        name: "t4kv-pause".into(),
        label: String::new(),
        title: "T4 — the KV cell: where the pause goes".into(),
        setup: report.setup.clone(),
        table: pause,
        notes: pause_notes,
    };
    Ok((report, pause))
}
