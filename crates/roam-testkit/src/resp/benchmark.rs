//! Running Debian's `redis-benchmark` (package `redis-tools`) and reading
//! its results.
//!
//! Why it exists: redis-benchmark is the client nobody here wrote, so the
//! tests and benchmarks run it unmodified. It has two habits a harness must
//! guard against: it waits forever when it cannot connect, and it reports an
//! error reply or a lost connection on stderr and exits. So every run here
//! has a time bound (the child is killed past it), the output is read in
//! `--csv` form, and stderr is kept and classified.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// One test's line of `redis-benchmark --csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchTest {
    /// Test name as redis-benchmark prints it (`SET`, `PING_INLINE`, …).
    pub name: String,
    /// Requests per second.
    pub rps: f64,
    /// Average latency, ms.
    pub avg_ms: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 95th percentile latency, ms.
    pub p95_ms: f64,
    /// 99th percentile latency, ms.
    pub p99_ms: f64,
    /// Worst latency, ms.
    pub max_ms: f64,
}

/// What one redis-benchmark run produced.
#[derive(Debug, Clone)]
pub struct BenchRun {
    /// One entry per test that finished, in output order.
    pub tests: Vec<BenchTest>,
    /// stderr lines that report a failure (`Error: ...`, `Unexpected error
    /// reply`, `Could not connect`, `Could not fetch server CONFIG`, ...).
    pub errors: Vec<String>,
    /// How it exited.
    pub status: ExitStatus,
    /// Spawn to exit.
    pub elapsed: Duration,
}

impl BenchRun {
    /// Exit status 0 and no error line.
    pub fn ok(&self) -> bool {
        self.status.success() && self.errors.is_empty()
    }

    /// The test named `name` (case-insensitive).
    pub fn test(&self, name: &str) -> Option<&BenchTest> {
        self.tests
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
    }
}

/// Running redis-benchmark failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The program could not be started.
    #[error("cannot start {program}: {source}; install it: apt-get install redis-tools (or run scripts/setup.sh)")]
    Spawn {
        /// The program that was run.
        program: String,
        /// Why it did not start.
        #[source]
        source: std::io::Error,
    },
    /// It ran past the time bound and was killed.
    #[error("redis-benchmark did not finish within {bound:?} and was killed; its stderr ends with: {stderr_tail}")]
    TimedOut {
        /// The bound.
        bound: Duration,
        /// The last lines of its stderr.
        stderr_tail: String,
    },
    /// Waiting for it failed.
    #[error("waiting for redis-benchmark failed: {0}")]
    Wait(#[source] std::io::Error),
}

/// Program name of the benchmark (override with `REDIS_BENCHMARK`).
pub fn program() -> String {
    std::env::var("REDIS_BENCHMARK").unwrap_or_else(|_| "redis-benchmark".into())
}

/// Runs `redis-benchmark ARGS --csv` and parses its output. `--csv` is
/// added unless present. Killed after `bound`.
pub fn redis_benchmark(args: &[&str], bound: Duration) -> Result<BenchRun, BenchError> {
    let program = program();
    let mut cmd = Command::new(&program);
    cmd.args(args);
    if !args.contains(&"--csv") {
        cmd.arg("--csv");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|source| BenchError::Spawn {
        program: program.clone(),
        source,
    })?;
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("stdout is piped");
    let mut err = child.stderr.take().expect("stderr is piped");
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().map_err(BenchError::Wait)? {
            break s;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
            return Err(BenchError::TimedOut {
                bound,
                stderr_tail: tail(&stderr, 5),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out_t.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_t.join().unwrap_or_default()).into_owned();
    Ok(BenchRun {
        tests: parse_csv(&stdout),
        errors: error_lines(&stderr),
        status,
        elapsed,
    })
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// The test lines of `redis-benchmark --csv` output (the header and
/// anything unparsable are skipped).
pub fn parse_csv(stdout: &str) -> Vec<BenchTest> {
    stdout
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line
                .split(',')
                .map(|f| f.trim().trim_matches('"'))
                .collect();
            if f.len() < 8 {
                return None;
            }
            let n = |i: usize| f[i].parse::<f64>().ok();
            Some(BenchTest {
                name: f[0].to_string(),
                rps: n(1)?,
                avg_ms: n(2)?,
                p50_ms: n(4)?,
                p95_ms: n(5)?,
                p99_ms: n(6)?,
                max_ms: n(7)?,
            })
        })
        .collect()
}

/// stderr lines that say something failed. redis-benchmark's harmless
/// notices (the `-e` deprecation warning) are not errors.
pub fn error_lines(stderr: &str) -> Vec<String> {
    stderr
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("-e option has no effect"))
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error") || l.contains("could not") || l.contains("unexpected")
        })
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_csv_output() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\
                   \"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"SET\",\"42553.19\",\"0.140\",\"0.032\",\"0.151\",\"0.215\",\"0.255\",\"3.471\"\n\
                   \"PING_INLINE\",\"46511.62\",\"0.135\",\"0.040\",\"0.143\",\"0.199\",\"0.255\",\"0.895\"\n";
        let t = parse_csv(out);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "SET");
        assert_eq!(t[0].rps, 42553.19);
        assert_eq!(t[0].p99_ms, 0.255);
        assert_eq!(t[1].max_ms, 0.895);
    }

    #[test]
    fn classifies_stderr() {
        let e = error_lines(
            "WARNING: -e option has no effect. We now immediately exit on error to avoid false results.\n\
             Error: Connection reset by peer\r\nUnexpected error reply, exiting...\n",
        );
        assert_eq!(
            e,
            [
                "Error: Connection reset by peer",
                "Unexpected error reply, exiting..."
            ]
        );
        assert!(error_lines("").is_empty());
    }

    #[test]
    fn a_missing_program_is_a_spawn_error_naming_the_package() {
        std::env::set_var("REDIS_BENCHMARK", "/nonexistent/redis-benchmark");
        let e = redis_benchmark(&["-n", "1"], Duration::from_secs(5)).unwrap_err();
        std::env::remove_var("REDIS_BENCHMARK");
        assert!(e.to_string().contains("redis-tools"), "{e}");
    }
}
