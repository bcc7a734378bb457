//! T1 on the real-program suite against stock `wasmtime` (issue 31): the
//! overhead a user sees who brings a program no one here wrote.
//!
//! Why it exists: T1 on our own workloads is measured against
//! `plain-wasmtime`, a baseline we built; a user compares with the
//! `wasmtime` command they already have. This runs each program of
//! `workloads/real/suite.toml` that has a bench size on stock
//! `wasmtime-cli` (the same major version as roam's engine, the module
//! compiled ahead with `wasmtime compile`) and on `roam run` of the
//! default preparation (compile cache warm), interleaved per repetition.
//! It reports the median CPU time of each and their ratio, the geomean and
//! the worst program, and what preparing and compiling cost. CPU time, not
//! wall time, because the machine this runs on is shared with builds. Both
//! outputs are checked against the manifest's reference on every run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use roam_testkit::real::{Program, Size, Suite};

use crate::paths::Paths;
use crate::proc::run_cpu;
use crate::report::{Report, Table};
use crate::stats::{geomean, median, percentile, us};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Repetitions (the median is reported).
    pub reps: usize,
    /// Programs by name (default: every one with a bench size).
    pub only: Option<Vec<String>>,
    /// The stock `wasmtime` executable.
    pub wasmtime: PathBuf,
    /// The repository (for the manifest and `target/workloads/real`).
    pub root: PathBuf,
    /// `roam prepare --capture` (`asyncify`, `eh` or `returns`).
    pub capture: String,
    /// Minimum T3 samples per program (0: no T3).
    pub t3_samples: usize,
    /// Wait between T3's checkpoint requests.
    pub t3_every: crate::t3::Interval,
    /// Where the report goes (passed on to the T3 child processes).
    pub out: PathBuf,
}

/// One timed run, its output checked: CPU seconds of the child.
fn run_timed(mut c: Command, program: &Program, size: &Size, what: &str) -> anyhow::Result<f64> {
    let (secs, stdout) = run_cpu(&mut c, what)?;
    program
        .check(size, &stdout)
        .map_err(|e| anyhow::anyhow!("{what}: wrong output: {e}"))?;
    Ok(secs)
}

/// Who runs the module: roam reads its own flags up to `--`, wasmtime
/// passes everything after the module to the program.
#[derive(Clone, Copy, PartialEq)]
enum Runner {
    Roam,
    Wasmtime,
}

/// A command with the program's stdin and preopened directory at `size`.
fn command(
    runner: Runner,
    exe: &Path,
    module: &Path,
    real: &Path,
    size: &Size,
    scratch: &Path,
) -> anyhow::Result<Command> {
    let mut c = Command::new(exe);
    c.args(match runner {
        Runner::Roam => &["run"][..],
        Runner::Wasmtime => &["run", "--allow-precompiled"],
    });
    if let Some(guest) = &size.dir {
        c.arg("--dir")
            .arg(format!("{}::{guest}", scratch.display()));
    }
    c.arg(module);
    if runner == Runner::Roam {
        c.arg("--");
    }
    c.args(&size.args);
    c.stdin(stdin(real, size)?);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    Ok(c)
}

/// The program's stdin at `size`: its input file under `real`, or nothing.
pub(crate) fn stdin(real: &Path, size: &Size) -> anyhow::Result<Stdio> {
    Ok(match &size.stdin {
        Some(f) => {
            let f = real.join(f);
            std::fs::File::open(&f)
                .with_context(|| format!("cannot open {}", f.display()))?
                .into()
        }
        None => Stdio::null(),
    })
}

/// Run the comparison and return its report.
pub fn run(paths: &Paths, opts: &Options) -> anyhow::Result<Report> {
    let roam = paths.tool("roam")?;
    let suite = Suite::load(&opts.root).map_err(|e| anyhow::anyhow!("{e}"))?;
    let real = opts.root.join("target/workloads/real");
    let dir = paths.scratch.join("real");
    std::fs::create_dir_all(&dir)?;
    let cache = dir.join("roam-cache");
    let version = Command::new(&opts.wasmtime)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", opts.wasmtime.display()))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();

    let mut table = Table::new(&[
        "program",
        "wasmtime CPU s",
        "roam CPU s",
        "roam ÷ wasmtime",
        "medians' ratio",
        "prepare s",
        "wasmtime compile s",
        "roam first run s",
        "module KiB",
        "prepared KiB",
        "T3 samples",
        "T3 p50 µs",
        "T3 p99 µs",
        "T3 max µs",
    ]);
    let exe = std::env::current_exe().context("cannot find roam-bench's own executable")?;
    let (mut ratios, mut medians, mut t3_all) = (Vec::new(), Vec::new(), Vec::new());
    for p in &suite.programs {
        let Some(bench) = &p.bench else { continue };
        if opts.only.as_ref().is_some_and(|o| !o.contains(&p.name)) {
            continue;
        }
        let module = p.module(&opts.root);
        if !module.exists() {
            bail!("{} is missing: run workloads/build.sh", module.display());
        }
        let scratch = paths.fresh_dir("real-data")?;

        let cwasm = dir.join(format!("{}.cwasm", p.name));
        let began = Instant::now();
        let o = Command::new(&opts.wasmtime)
            .arg("compile")
            .arg(&module)
            .arg("-o")
            .arg(&cwasm)
            .output()
            .context("cannot run wasmtime compile")?;
        if !o.status.success() {
            bail!(
                "wasmtime compile {}: {}",
                p.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let compile = began.elapsed().as_secs_f64();

        let prepared = dir.join(format!("{}.{}.wasm", p.name, opts.capture));
        let args = format!("--capture {}", opts.capture);
        let (prep, _) = crate::eh::prepare(&roam, &module, &prepared, &args)?;
        // The first run fills roam's compile cache (Cranelift, as wasmtime).
        let _ = std::fs::remove_dir_all(&cache);
        let began = Instant::now();
        let mut c = command(Runner::Roam, &roam, &prepared, &real, &p.test, &scratch)?;
        c.env("ROAM_CACHE_DIR", &cache);
        run_timed(c, p, &p.test, &format!("roam run {} (test size)", p.name))?;
        let first = began.elapsed().as_secs_f64();

        let (mut stock, mut ours) = (Vec::new(), Vec::new());
        for rep in 0..opts.reps {
            let c = command(
                Runner::Wasmtime,
                &opts.wasmtime,
                &cwasm,
                &real,
                bench,
                &scratch,
            )?;
            stock.push(run_timed(c, p, bench, &format!("wasmtime run {}", p.name))?);
            let mut c = command(Runner::Roam, &roam, &prepared, &real, bench, &scratch)?;
            c.env("ROAM_CACHE_DIR", &cache);
            ours.push(run_timed(c, p, bench, &format!("roam run {}", p.name))?);
            eprintln!(
                "real: {} rep {}: wasmtime {:.2} s, roam {:.2} s",
                p.name,
                rep + 1,
                stock[rep],
                ours[rep]
            );
        }
        // The fastest run of each is the one least disturbed by the rest
        // of the machine; the medians' ratio is shown beside it.
        let fastest = |xs: &[f64]| percentile(xs, 0.0).expect("at least one rep");
        let (s, r) = (fastest(&stock), fastest(&ours));
        let ratio = r / s.max(0.01);
        let of_medians = median(&ours).unwrap() / median(&stock).unwrap().max(0.01);
        ratios.push((p.name.clone(), ratio));
        medians.push(of_medians);
        let kib = |f: &Path| std::fs::metadata(f).map(|m| m.len() / 1024).unwrap_or(0);
        let mut row = vec![
            p.name.clone(),
            format!("{s:.2}"),
            format!("{r:.2}"),
            format!("{ratio:.2}×"),
            format!("{of_medians:.2}×"),
            format!("{prep:.1}"),
            format!("{compile:.1}"),
            format!("{first:.1}"),
            kib(&module).to_string(),
            kib(&prepared).to_string(),
        ];
        if opts.t3_samples > 0 {
            let t3 = crate::real_t3::measure(
                &exe,
                &opts.out,
                p,
                bench,
                &prepared,
                &real,
                &scratch,
                opts.t3_every,
                opts.t3_samples,
            )?;
            let xs: Vec<f64> = t3.response.iter().map(|d| us(*d)).collect();
            eprintln!(
                "real: {} T3: {} samples in {} runs, p99 {:.0} µs",
                p.name,
                xs.len(),
                t3.runs,
                percentile(&xs, 99.0).unwrap_or(f64::NAN)
            );
            let at = |q: f64| percentile(&xs, q).map_or("-".into(), |x| format!("{x:.0}"));
            row.extend([xs.len().to_string(), at(50.0), at(99.0), at(100.0)]);
            t3_all.extend(xs);
        } else {
            row.extend(["-".into(), "-".into(), "-".into(), "-".into()]);
        }
        table.push(row);
    }
    if ratios.is_empty() {
        bail!("no program of the suite was selected");
    }
    let g = geomean(&ratios.iter().map(|r| r.1).collect::<Vec<_>>()).unwrap();
    let worst = ratios
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("at least one");
    let notes = vec![
        format!(
            "geomean roam ÷ wasmtime over {} programs: **{g:.2}×** (target ≤ 1.25×); worst: {} at **{:.2}×** (target ≤ 1.5×); geomean of the medians' ratios: {:.2}×",
            ratios.len(),
            worst.0,
            worst.1,
            geomean(&medians).unwrap(),
        ),
        format!("baseline: `{version}`, each module compiled ahead with `wasmtime compile` and run with `wasmtime run --allow-precompiled`; roam runs the default preparation with `--capture {}`, its compile cache warm", opts.capture),
        "CPU time (user + system) of each process, the fastest of the repetitions (the run the rest of the machine disturbed least; the ratio of the medians is beside it), the two interleaved; both outputs are checked against the manifest on every run".into(),
        match percentile(&t3_all, 99.0) {
            Some(p99) => format!(
                "T3, all programs pooled: {} samples, p99 **{p99:.0} µs** (target ≤ 1 ms: {}); continue checkpoints requested every {} (jittered), each after the previous one was served, in the bench's own process with the program's input on stdin; every run's output checked against the manifest",
                t3_all.len(),
                if p99 <= 1000.0 { "met" } else { "NOT met" },
                opts.t3_every,
            ),
            None => "T3 not measured (`--t3-samples 0`)".into(),
        },
        "prepare s: `roam prepare` with default options but the capture (reused when newer than both its input and the `roam` binary, with the time recorded when it was made); roam first run: a run at test size with an empty compile cache, compile included".into(),
    ];
    Ok(Report {
        figure: None,
        name: "t1-real".into(),
        label: opts.capture.clone(),
        title: format!(
            "T1 on the real-program suite, against stock wasmtime (capture: {})",
            opts.capture
        ),
        setup: format!(
            "`roam-bench real --reps {} --capture {} --t3-samples {}`, bench sizes of workloads/real/suite.toml",
            opts.reps, opts.capture, opts.t3_samples
        ),
        table,
        notes,
    })
}
