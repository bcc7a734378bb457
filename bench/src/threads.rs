//! Threaded programs: what running under roam costs, against a stock
//! wasmtime with wasi-threads, and how long a checkpoint-and-stop of all
//! threads takes, by thread count.
//!
//! Why it exists: issue "Tissues" asks for checkpoint time and downtime
//! against the thread count, and for the overhead of threaded programs,
//! next to MVVM's figures (a WAMR-based system that checkpoints the
//! OpenMP NAS benchmarks at 4 threads in 1.4–12 ms, where CRIU takes
//! 0.3–2.3 s). wasmtime dropped wasi-threads in release 47, so the baseline
//! is the last release that has it (`--wasmtime PATH`, 46.0.1 was used);
//! without one, the table leaves those columns empty.
//!
//! The stops are taken through the runtime library, so the times are the
//! runtime's own: from the request until every thread is parked, from
//! there until the snapshot is complete, its encoding, and a restore until
//! every thread is ready to rewind. The restored run finishes, and both
//! halves' output must be the native build's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_runtime::{CheckpointKind, Outcome, Runtime, ThreadedCell, Trigger};
use roam_snapshot::EncodeOptions;
use roam_wasi::WasiConfig;

use crate::paths::Paths;
use crate::proc::run_cpu;
use crate::report::{Report, Table};
use crate::stats::ms;

/// What to run.
pub struct Options {
    /// Programs of `workloads/threads`.
    pub programs: Vec<String>,
    /// Thread counts.
    pub counts: Vec<usize>,
    /// Repetitions of each uninterrupted run (the fastest counts).
    pub reps: usize,
    /// A wasmtime CLI with wasi-threads (46 or older).
    pub wasmtime: Option<PathBuf>,
}

fn expected(name: &str) -> anyhow::Result<Vec<u8>> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(format!("workloads/threads/expected/{name}-M.txt"));
    std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))
}

/// The fastest of `reps` runs: CPU seconds and wall seconds.
fn timed(
    mut make: impl FnMut() -> Command,
    want: &[u8],
    what: &str,
    reps: usize,
) -> anyhow::Result<(f64, f64)> {
    let (mut cpu, mut wall) = (f64::MAX, f64::MAX);
    for _ in 0..reps.max(1) {
        let mut cmd = make();
        cmd.stdin(Stdio::null()).stderr(Stdio::null());
        let t = Instant::now();
        let (secs, out) = run_cpu(&mut cmd, what)?;
        wall = wall.min(t.elapsed().as_secs_f64());
        cpu = cpu.min(secs);
        if out != want {
            bail!("{what}: its output differs from the native build's");
        }
    }
    Ok((cpu, wall))
}

/// One stop and restore, through the library.
struct Stop {
    held: usize,
    parked: Duration,
    capture: Duration,
    encode: Duration,
    restore: Duration,
    memory: u64,
    encoded: usize,
}

fn stop_once(
    rt: &Runtime,
    wasm: &Path,
    args: &[String],
    after: Duration,
    want: &[u8],
) -> anyhow::Result<Option<Stop>> {
    let module = rt.load_file(wasm)?;
    let cfg = WasiConfig {
        args: args.to_vec(),
        ..Default::default()
    };
    let mut cell = ThreadedCell::start(rt, module.clone(), cfg, Default::default())?;
    let first = cell.capture_output();
    let ctl = cell.controller();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        ctl.request(CheckpointKind::Stop, Trigger::Api);
    });
    let (snap, timing) = match cell.run(&mut |_, _| Ok(()))? {
        Outcome::Stopped(s, t) => (s, t),
        Outcome::Exited(_) => return Ok(None),
        Outcome::Paused(..) => bail!("a threaded program paused"),
    };
    let t = Instant::now();
    let bytes = snap.encode(&EncodeOptions::default())?;
    let encode = t.elapsed();
    let t = Instant::now();
    let mut back = ThreadedCell::restore(rt, module, &snap, Vec::new(), Default::default())?;
    let restore = t.elapsed();
    let second = back.capture_output();
    match back.run(&mut |_, _| Ok(()))? {
        Outcome::Exited(0) => {}
        other => bail!("the restored program ended with {other:?}"),
    }
    let mut whole = first.stdout();
    whole.extend_from_slice(&second.stdout());
    if whole != want {
        bail!("stopped after {after:?} and restored, its output differs from the native build's");
    }
    Ok(Some(Stop {
        held: 1 + snap.threads.len(),
        parked: timing.response,
        capture: timing.capture,
        encode,
        restore,
        memory: snap.memory.byte_len(),
        encoded: bytes.len(),
    }))
}

pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let roam = paths.tool("roam")?;
    let scratch = paths.fresh_dir("threads")?;
    let rt = Runtime::new(roam_runtime::RuntimeConfig {
        cache_dir: scratch.join("cache"),
        ..Default::default()
    })?;
    let mut table = Table::new(&[
        "program",
        "threads",
        "roam CPU s",
        "roam wall s",
        "wasmtime CPU s",
        "wasmtime wall s",
        "roam ÷ wasmtime CPU",
        "threads stopped",
        "all parked ms",
        "capture ms",
        "encode ms",
        "restore ms",
        "downtime ms",
        "memory MiB",
        "snapshot MiB",
    ]);
    let mut captures = Vec::new();
    let mut ratios = Vec::new();
    for name in &o.programs {
        let wasm = paths.wasm(&format!("threads/{name}"))?;
        let want = expected(name)?;
        let cwasm = match &o.wasmtime {
            Some(w) => {
                let out = scratch.join(format!("{name}.cwasm"));
                let st = Command::new(w)
                    .args(["compile", "-W", "threads=y,shared-memory=y", "-o"])
                    .arg(&out)
                    .arg(&wasm)
                    .status()
                    .with_context(|| format!("cannot run {}", w.display()))?;
                if !st.success() {
                    bail!("{} compile {name} failed", w.display());
                }
                Some((w.clone(), out))
            }
            None => None,
        };
        for &n in &o.counts {
            let args = [n.to_string(), "M".to_string()];
            let (cpu, wall) = timed(
                || {
                    let mut c = Command::new(&roam);
                    c.env("ROAM_CACHE_DIR", scratch.join("cache"))
                        .arg("run")
                        .arg(&wasm)
                        .arg("--")
                        .args(&args);
                    c
                },
                &want,
                &format!("roam run {name} {n}"),
                o.reps,
            )?;
            let base = match &cwasm {
                Some((w, c)) => Some(timed(
                    || {
                        let mut cmd = Command::new(w);
                        cmd.args([
                            "run",
                            "--allow-precompiled",
                            "-W",
                            "threads=y,shared-memory=y",
                        ])
                        .args(["-S", "threads=y"])
                        .arg(c)
                        .args(&args);
                        cmd
                    },
                    &want,
                    &format!("wasmtime {name} {n}"),
                    o.reps,
                )?),
                None => None,
            };
            // Stops at 10, 20 and 30 % of the run: the one that finds the
            // most threads running counts (a program's first and last
            // phases run on one thread).
            let argv: Vec<String> = std::iter::once(format!("{name}.wasm"))
                .chain(args.iter().cloned())
                .collect();
            let mut best: Option<Stop> = None;
            for share in [0.1, 0.2, 0.3] {
                let after = Duration::from_secs_f64(wall * share);
                if let Some(s) = stop_once(&rt, &wasm, &argv, after, &want)? {
                    if best.as_ref().is_none_or(|b| s.held > b.held) {
                        best = Some(s);
                    }
                }
            }
            let s = best.with_context(|| {
                format!("{name} with {n} threads always finished before its stop")
            })?;
            let f = |x: f64| format!("{x:.2}");
            let f1 = |d: Duration| format!("{:.1}", ms(d));
            let mib = |b: u64| format!("{:.1}", b as f64 / (1 << 20) as f64);
            if let Some((bcpu, _)) = base {
                ratios.push(cpu / bcpu);
            }
            captures.push((n, ms(s.parked + s.capture)));
            table.push(vec![
                name.clone(),
                n.to_string(),
                f(cpu),
                f(wall),
                base.map_or("-".into(), |b| f(b.0)),
                base.map_or("-".into(), |b| f(b.1)),
                base.map_or("-".into(), |b| format!("{:.2}×", cpu / b.0)),
                s.held.to_string(),
                f1(s.parked),
                f1(s.capture),
                f1(s.encode),
                f1(s.restore),
                f1(s.parked + s.capture + s.encode + s.restore),
                mib(s.memory),
                mib(s.encoded as u64),
            ]);
        }
    }
    let range = |xs: &[f64]| {
        let lo = xs.iter().copied().fold(f64::MAX, f64::min);
        let hi = xs.iter().copied().fold(0.0, f64::max);
        (lo, hi)
    };
    let mut notes = Vec::new();
    let at4: Vec<f64> = captures
        .iter()
        .filter(|(n, _)| *n == 4)
        .map(|(_, c)| *c)
        .collect();
    if !at4.is_empty() {
        let (lo, hi) = range(&at4);
        notes.push(format!(
            "checkpoint (every thread parked, then captured) at 4 threads: **{lo:.1}–{hi:.1} ms**; \
             MVVM reports 1.4–12 ms for the OpenMP NAS benchmarks at 4 threads, CRIU 0.3–2.3 s"
        ));
    }
    if !ratios.is_empty() {
        let (lo, hi) = range(&ratios);
        notes.push(format!(
            "CPU time against stock wasmtime with wasi-threads: {lo:.2}× to {hi:.2}×"
        ));
    } else {
        notes
            .push("no wasmtime with wasi-threads given (--wasmtime): its columns are empty".into());
    }
    notes.push(
        "downtime here is local: parked + capture + encode + restore, no transfer; of three \
         stops, at 10, 20 and 30 % of the uninterrupted run's wall time, the one that found the \
         most threads running is shown (each restored run is checked)"
            .into(),
    );
    Ok(Report {
        name: "threads".into(),
        label: "run".into(),
        title: "Threaded programs: overhead and checkpoint time by thread count".into(),
        setup: format!(
            "`roam-bench threads --reps {} --counts {}`, size M, {} wasmtime",
            o.reps,
            o.counts
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
            match &o.wasmtime {
                Some(w) => format!("`{}`", version(w)),
                None => "no".into(),
            }
        ),
        table,
        notes,
        figure: None,
    })
}

fn version(w: &Path) -> String {
    Command::new(w)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| w.display().to_string())
}
