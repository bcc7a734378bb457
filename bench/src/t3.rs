//! T3: migration response time — from a checkpoint request to the moment
//! the program reaches a migration point and starts unwinding.
//!
//! Why it exists: a migration cannot start before the program yields, so the
//! response time bounds how fast a scheduler can move work (target: p99 ≤
//! 1 ms). The baseline, measured in the same run, is how fast one host
//! thread can wake another through a condvar: the floor for any mechanism
//! that asks a running thread to do something.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_runtime::{
    Cell, CellOptions, CheckpointKind, CheckpointTiming, Outcome, Runtime, Trigger,
};
use roam_snapshot::Snapshot;
use roam_wasi::{Preopen, WasiConfig};

use crate::paths::Paths;
use crate::report::{Report, Table};
use crate::stats::{percentile, us};

/// A tiny xorshift generator for jitter (no need for a crate).
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock.
    pub fn new() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Jitter(t | 1)
    }

    /// A duration uniformly in `[lo, hi)` milliseconds.
    pub fn between_ms(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(lo * 1000 + self.0 % ((hi - lo) * 1000))
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Self::new()
    }
}

/// How long the driver waits between checkpoint requests, in
/// milliseconds: uniformly in `[lo, hi)`. The default, 20–50 ms, is a busy
/// scheduler's pace; a short interval samples many more points of one run,
/// which finds rare long stretches without a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// Shortest wait.
    pub lo_ms: u64,
    /// Longest wait (exclusive).
    pub hi_ms: u64,
}

impl Default for Interval {
    fn default() -> Self {
        Interval {
            lo_ms: 20,
            hi_ms: 50,
        }
    }
}

impl std::str::FromStr for Interval {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("{s:?} is not LO-HI in whole milliseconds, with 0 <= LO < HI <= 60000");
        let (lo, hi) = s.split_once('-').ok_or_else(bad)?;
        let lo: u64 = lo.trim().parse().map_err(|_| bad())?;
        let hi: u64 = hi.trim().parse().map_err(|_| bad())?;
        if lo >= hi || hi > 60_000 {
            return Err(bad());
        }
        Ok(Interval {
            lo_ms: lo,
            hi_ms: hi,
        })
    }
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}–{} ms", self.lo_ms, self.hi_ms)
    }
}

/// Samples of one workload.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// Response times.
    pub response: Vec<Duration>,
    /// Capture times, for context.
    pub capture: Vec<Duration>,
    /// How many times the workload ran to collect them.
    pub runs: usize,
}

/// Run one cell to exit while another thread requests Continue checkpoints
/// every `every` (20–50 ms by default), each after the previous one was
/// served.
pub fn one_run(
    rt: &Runtime,
    wasm: &Path,
    args: &[String],
    every: Interval,
    preopens: Vec<Preopen>,
    out: &mut Samples,
) -> anyhow::Result<()> {
    let module = rt.load_file(wasm)?;
    let name = wasm
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let cfg = WasiConfig {
        args: std::iter::once(name).chain(args.iter().cloned()).collect(),
        env: vec![],
        preopens,
        ..Default::default()
    };
    let mut cell = Cell::start(rt, module, cfg, CellOptions::default())?;
    let ctl = cell.controller();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<()>();
    let stop2 = stop.clone();
    let driver = std::thread::spawn(move || {
        let mut j = Jitter::new();
        'outer: while !stop2.load(Ordering::Relaxed) {
            std::thread::sleep(j.between_ms(every.lo_ms, every.hi_ms));
            ctl.request(CheckpointKind::Continue, Trigger::Api);
            loop {
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(()) => break,
                    Err(RecvTimeoutError::Timeout) if !stop2.load(Ordering::Relaxed) => {}
                    Err(_) => break 'outer,
                }
            }
        }
    });
    let mut sink = |_s: &Snapshot, t: CheckpointTiming| {
        out.response.push(t.response);
        out.capture.push(t.capture);
        let _ = tx.send(());
        Ok(())
    };
    let outcome = cell.run(&mut sink);
    stop.store(true, Ordering::Relaxed);
    driver
        .join()
        .map_err(|_| anyhow::anyhow!("driver thread panicked"))?;
    out.runs += 1;
    match outcome.context("the workload failed under checkpointing")? {
        Outcome::Exited(0) => Ok(()),
        Outcome::Exited(c) => bail!("{} exited with status {c}", wasm.display()),
        Outcome::Stopped(..) | Outcome::Paused(..) => bail!("unexpected stop"),
    }
}

/// Collect at least `min` samples of a workload, running it up to 20 times.
pub fn measure(
    rt: &Runtime,
    paths: &Paths,
    name: &str,
    size: &str,
    every: Interval,
    min: usize,
) -> anyhow::Result<Samples> {
    measure_file(rt, paths, name, &paths.wasm(name)?, size, every, min)
}

/// [`measure`] on a given module file of workload `name` (prepared or not).
pub fn measure_file(
    rt: &Runtime,
    paths: &Paths,
    name: &str,
    wasm: &Path,
    size: &str,
    every: Interval,
    min: usize,
) -> anyhow::Result<Samples> {
    let mut s = Samples::default();
    while s.response.len() < min && s.runs < 20 {
        let data = if name == "filework" {
            Some(paths.fresh_dir("data-t3")?)
        } else {
            None
        };
        let preopens = data
            .map(|d| {
                vec![Preopen {
                    host: d,
                    guest: "/data".into(),
                }]
            })
            .unwrap_or_default();
        let _quiet = crate::quiet::Quiet::new()?;
        one_run(rt, wasm, &[size.into()], every, preopens, &mut s)?;
    }
    Ok(s)
}

/// Baseline: request-to-wake latency of a condvar, `n` samples at the same
/// jittered intervals.
pub fn condvar_baseline(n: usize) -> Vec<Duration> {
    let pair = Arc::new((Mutex::new(None::<Instant>), Condvar::new()));
    let p2 = pair.clone();
    let waiter = std::thread::spawn(move || {
        let (m, cv) = &*p2;
        let mut out = Vec::with_capacity(n);
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while out.len() < n {
            match g.take() {
                Some(at) => out.push(at.elapsed()),
                None => g = cv.wait(g).unwrap_or_else(|e| e.into_inner()),
            }
        }
        out
    });
    let mut j = Jitter::new();
    for _ in 0..n {
        std::thread::sleep(j.between_ms(20, 50));
        let (m, cv) = &*pair;
        *m.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        cv.notify_one();
    }
    waiter.join().unwrap_or_default()
}

fn row(t: &mut Table, name: &str, runs: String, xs: &[Duration], capture: &[Duration]) {
    let v: Vec<f64> = xs.iter().map(|d| us(*d)).collect();
    let f = |p: f64| percentile(&v, p).map_or("-".into(), |x| format!("{x:.1}"));
    let cap: Vec<f64> = capture.iter().map(|d| us(*d) / 1e3).collect();
    let p99_ok = percentile(&v, 99.0).map_or("-", |x| if x <= 1000.0 { "yes" } else { "no" });
    t.push(vec![
        name.into(),
        v.len().to_string(),
        runs,
        f(50.0),
        f(99.0),
        f(100.0),
        crate::stats::median(&cap).map_or("-".into(), |x| format!("{x:.2}")),
        p99_ok.into(),
    ]);
}

/// Build the report.
pub fn report(
    results: &[(String, Samples)],
    baseline: &[Duration],
    size: &str,
    every: Interval,
) -> Report {
    let mut t = Table::new(&[
        "workload",
        "samples",
        "runs",
        "response p50 µs",
        "response p99 µs",
        "response max µs",
        "capture p50 ms",
        "p99 ≤ 1 ms",
    ]);
    for (name, s) in results {
        row(&mut t, name, s.runs.to_string(), &s.response, &s.capture);
    }
    row(&mut t, "baseline: condvar wake", "-".into(), baseline, &[]);
    let all: Vec<f64> = results
        .iter()
        .flat_map(|(_, s)| s.response.iter().map(|d| us(*d)))
        .collect();
    let p99 = percentile(&all, 99.0);
    let notes = vec![
        format!(
            "all workloads pooled: {} samples, p50 {} µs, p99 {} µs; target p99 ≤ 1 ms: {}",
            all.len(),
            percentile(&all, 50.0).map_or("-".into(), |x| format!("{x:.1}")),
            p99.map_or("-".into(), |x| format!("{x:.1}")),
            if p99.is_some_and(|x| x <= 1000.0) { "met" } else { "NOT met" }
        ),
        format!("response: CheckpointTiming.response (request → migration point reached, unwind begins) of continue checkpoints requested every {every} (jittered), each after the previous was served; workloads rerun until ≥ the minimum sample count (max 20 runs)"),
        "baseline: time from setting a flag and notify_one on a condvar to the waiting thread observing it".into(),
    ];
    Report {
        figure: None,
        name: "t3".into(),
        label: size.to_string(),
        title: "T3: migration response time".into(),
        setup: if every == Interval::default() {
            format!("`roam-bench t3 --size {size}`")
        } else {
            format!(
                "`roam-bench t3 --size {size} --interval-ms {}-{}`",
                every.lo_ms, every.hi_ms
            )
        },
        table: t,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let mut j = Jitter::new();
        for _ in 0..1000 {
            let d = j.between_ms(20, 50);
            assert!(
                d >= Duration::from_millis(20) && d < Duration::from_millis(50),
                "{d:?}"
            );
        }
    }

    #[test]
    fn condvar_baseline_collects_each_wake() {
        let b = condvar_baseline(3);
        assert_eq!(b.len(), 3);
        assert!(b.iter().all(|d| *d < Duration::from_secs(1)));
    }

    #[test]
    fn report_flags_p99_against_the_target() {
        let fast = Samples {
            response: vec![Duration::from_micros(100); 10],
            capture: vec![Duration::from_millis(2); 10],
            runs: 1,
        };
        let slow = Samples {
            response: vec![Duration::from_millis(5); 10],
            ..fast.clone()
        };
        let r = report(
            &[("a".into(), fast), ("b".into(), slow)],
            &[Duration::from_micros(30)],
            "S",
            Interval::default(),
        );
        assert_eq!(r.table.rows[0][4], "100.0");
        assert_eq!(r.table.rows[0][7], "yes");
        assert_eq!(r.table.rows[1][7], "no");
        assert_eq!(r.table.rows[2][0], "baseline: condvar wake");
        assert!(r.notes[0].ends_with("NOT met"));
    }
}
