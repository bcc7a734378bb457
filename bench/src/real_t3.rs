//! T3 on the real-program suite: how long a real program takes to reach a
//! migration point once a checkpoint is asked for.
//!
//! Why it exists: our own workloads were written with loops that reach a
//! point often; a database engine or an interpreter may run long stretches
//! (a `memcpy`, a sort, a garbage collection) that the point policy has to
//! cover. T3 is measured in-process, as for our own suite (`t3.rs`), but
//! the programs read their input from stdin, which roam's WASI layer takes
//! from the host's fd 0. So each run is a child process of this bench
//! (`roam-bench t3-child`, hidden), with the program's input file on its
//! stdin and its output on a pipe. The parent checks that output against
//! the manifest, so a run whose checkpoints changed the result fails the
//! bench, and reads the samples back from a file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use roam_runtime::Runtime;
use roam_testkit::real::{Program, Size};
use roam_wasi::Preopen;

use crate::t3::{self, Interval, Samples};

/// At most this many runs of one program to collect its samples.
const MAX_RUNS: usize = 20;

/// `roam-bench t3-child`: run `module` once in this process with `args`,
/// requesting continue checkpoints every `every`, and write one line per
/// checkpoint to `to`: response and capture time in nanoseconds.
pub fn child(
    rt: &Runtime,
    module: &Path,
    args: &[String],
    dir: Option<(PathBuf, String)>,
    every: Interval,
    to: &Path,
) -> anyhow::Result<()> {
    let preopens = dir
        .map(|(host, guest)| vec![Preopen { host, guest }])
        .unwrap_or_default();
    let mut s = Samples::default();
    t3::one_run(rt, module, args, every, preopens, &mut s)?;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(to).with_context(|| format!("cannot create {}", to.display()))?,
    );
    for (r, c) in s.response.iter().zip(&s.capture) {
        writeln!(f, "{} {}", r.as_nanos(), c.as_nanos())?;
    }
    f.flush()?;
    Ok(())
}

/// Run `program` at `size` from its `prepared` module as child processes of
/// `exe` (this bench) until at least `min` checkpoints were served or
/// [`MAX_RUNS`] runs were made. Every run's output must match the manifest.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    exe: &Path,
    out: &Path,
    program: &Program,
    size: &Size,
    prepared: &Path,
    real: &Path,
    scratch: &Path,
    every: Interval,
    min: usize,
) -> anyhow::Result<Samples> {
    let mut s = Samples::default();
    let file = scratch.join("t3-samples.txt");
    while s.response.len() < min && s.runs < MAX_RUNS {
        let mut c = Command::new(exe);
        c.arg("--out")
            .arg(out)
            .arg("t3-child")
            .arg("--module")
            .arg(prepared)
            .arg("--samples-to")
            .arg(&file)
            .arg("--interval-ms")
            .arg(format!("{}-{}", every.lo_ms, every.hi_ms));
        if let Some(guest) = &size.dir {
            c.arg("--dir")
                .arg(format!("{}::{guest}", scratch.display()));
        }
        c.arg("--").args(&size.args);
        let o = c
            .stdin(crate::real::stdin(real, size)?)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot run {}", exe.display()))?;
        if !o.status.success() {
            bail!(
                "t3 of {} under checkpoints failed ({}): {}",
                program.name,
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        program.check(size, &o.stdout).map_err(|e| {
            anyhow::anyhow!(
                "t3 of {}: wrong output under checkpoints: {e}",
                program.name
            )
        })?;
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for line in text.lines() {
            let mut it = line.split(' ').map(str::parse::<u64>);
            match (it.next(), it.next()) {
                (Some(Ok(r)), Some(Ok(c))) => {
                    s.response.push(Duration::from_nanos(r));
                    s.capture.push(Duration::from_nanos(c));
                }
                _ => bail!("{}: bad sample line {line:?}", file.display()),
            }
        }
        s.runs += 1;
    }
    Ok(s)
}
