//! Running a program as a child process and timing it.
//!
//! Why it exists: T1 compares separate executables (native, qemu, plain
//! wasmtime, `roam run`), and every one must be timed the same way —
//! wall-clock from spawn to exit — and must print the same checksum. The
//! benchmarks written on a machine shared with builds (`eh`, `real`) time
//! CPU instead ([`run_cpu`]).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// One timed run.
#[derive(Debug, Clone)]
pub struct Timed {
    /// Spawn to exit.
    pub wall: Duration,
    /// The value of the last `checksum: <hex>` line of stdout, if any.
    pub checksum: Option<String>,
}

/// The last `checksum: X` line's X.
pub fn checksum(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("checksum:"))
        .map(|v| v.trim().to_string())
}

/// Run `cmd` to completion, capturing stdout; fail unless it exits 0.
pub fn run_timed(cmd: &mut Command) -> anyhow::Result<Timed> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
    let wall = started.elapsed();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(5).collect();
        let prog = std::path::Path::new(cmd.get_program());
        bail!(
            "{} failed ({}): {}",
            prog.file_name().unwrap_or_default().to_string_lossy(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok(Timed {
        wall,
        checksum: checksum(&String::from_utf8_lossy(&out.stdout)),
    })
}

/// User plus system CPU seconds of this process's waited-for children
/// (`/proc/self/stat`, clock ticks of 10 ms): on a loaded machine, wall
/// time measures the other load as much as the program.
fn children_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name: state is field 3, cutime 16 and cstime 17.
    let ticks: f64 = fields.get(13)?.parse::<f64>().ok()? + fields.get(14)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Run `cmd` (its stdin as the caller set it) to completion, capturing
/// stdout; fail, naming it `what`, unless it exits 0. Returns the CPU
/// seconds it used and its stdout.
pub fn run_cpu(cmd: &mut Command, what: &str) -> anyhow::Result<(f64, Vec<u8>)> {
    let before = children_cpu().context("cannot read /proc/self/stat")?;
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {what}"))?;
    let secs = children_cpu().context("cannot read /proc/self/stat")? - before;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(4).collect();
        bail!("{what} ({}): {}", out.status, tail.join(" / "));
    }
    Ok((secs, out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_takes_the_last_line() {
        assert_eq!(
            checksum("x\nchecksum: 1\nchecksum: abcd\n"),
            Some("abcd".into())
        );
        assert_eq!(checksum("no sum here\n"), None);
    }

    #[test]
    fn times_a_child_and_reads_its_checksum() {
        let t = run_timed(Command::new("sh").args(["-c", "sleep 0.05; echo 'checksum: 00ff'"]))
            .unwrap();
        assert_eq!(t.checksum.as_deref(), Some("00ff"));
        assert!(t.wall >= Duration::from_millis(50));
    }

    #[test]
    fn a_failing_child_is_an_error_with_its_stderr() {
        let e = run_timed(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        assert!(run_timed(&mut Command::new("/nonexistent/program")).is_err());
    }
}
