//! `roam-bench`: roam's benchmarks T1 (steady-state overhead), T2
//! (checkpoint capture/restore vs memory size) and T3 (migration response
//! time).
//!
//! Why it exists: roam makes quantitative promises; these programs measure
//! them, always next to a baseline measured in the same run on the same
//! machine, and report ratios, because a noisy two-core machine makes
//! absolute numbers from different runs incomparable. They are benchmarks,
//! not tests: they print a markdown table and write
//! `bench/results/<t>.{csv,md}`. See docs/benchmarks.md.

mod paths;
mod prepare;
mod proc;
mod quiet;
mod report;
mod stats;
mod t1;
mod t2;
mod t3;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use roam_runtime::{Runtime, RuntimeConfig};

#[derive(Parser, Debug)]
#[command(
    name = "roam-bench",
    about = "roam's benchmarks (see docs/benchmarks.md)"
)]
struct Cli {
    /// Where results are written.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Steady-state overhead: native, plain wasmtime, roam (3 policies), qemu.
    T1 {
        /// Size class: S, M or L.
        #[arg(long, default_value = "L")]
        size: String,
        /// Repetitions per variant (median reported).
        #[arg(long, default_value_t = 1)]
        reps: usize,
        /// Comma-separated workloads (default: all).
        #[arg(long)]
        only: Option<String>,
    },
    /// Checkpoint capture and restore time vs live memory.
    T2 {
        /// Comma-separated sizes in MiB.
        #[arg(long, default_value = "1,4,16,64,256,1024", value_delimiter = ',')]
        sizes: Vec<u32>,
        /// Continue checkpoints per size.
        #[arg(long, default_value_t = 5)]
        samples: usize,
    },
    /// Migration response time, p50/p99 per workload.
    T3 {
        /// Size class: S, M or L.
        #[arg(long, default_value = "M")]
        size: String,
        /// Minimum samples per workload.
        #[arg(long, default_value_t = 30)]
        samples: usize,
        /// Comma-separated workloads (default: all).
        #[arg(long)]
        only: Option<String>,
    },
}

fn runtime(paths: &paths::Paths) -> anyhow::Result<Runtime> {
    Ok(Runtime::new(RuntimeConfig {
        cache_dir: paths.scratch.join("roam-cache"),
        ..Default::default()
    })?)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let paths = paths::Paths::discover()?;
    let report = match cli.bench {
        Bench::T1 { size, reps, only } => {
            let only = only.as_deref().map(t1::parse_only).transpose()?;
            t1::run(
                &paths,
                &t1::Options {
                    size,
                    reps: reps.max(1),
                    only,
                },
            )?
        }
        Bench::T2 { sizes, samples } => {
            let rt = runtime(&paths)?;
            let mut rows = Vec::new();
            for mib in sizes {
                eprintln!("t2: {mib} MiB ...");
                let r = {
                    let _q = quiet::Quiet::new()?;
                    t2::measure(&rt, mib, samples)?
                };
                eprintln!(
                    "t2: {mib} MiB: captures {:?}, restores {:?}",
                    r.captures, r.restores
                );
                rows.push(r);
            }
            t2::report(&rows, samples)
        }
        Bench::T3 {
            size,
            samples,
            only,
        } => {
            let rt = runtime(&paths)?;
            let only = only.as_deref().map(t1::parse_only).transpose()?;
            let mut results = Vec::new();
            let mut failures = Vec::new();
            for name in t1::WORKLOADS {
                if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == name)) {
                    continue;
                }
                eprintln!("t3: {name} ...");
                match t3::measure(&rt, &paths, name, &size, samples) {
                    Ok(s) => {
                        eprintln!(
                            "t3: {name}: {} samples in {} runs",
                            s.response.len(),
                            s.runs
                        );
                        results.push((name.to_string(), s));
                    }
                    Err(e) => {
                        eprintln!("t3: {name} FAILED: {e:#}");
                        failures.push(format!("FAILED {name}: {e:#}"));
                    }
                }
            }
            eprintln!("t3: condvar baseline ...");
            let base = t3::condvar_baseline(100);
            let mut r = t3::report(&results, &base, &size);
            r.notes.extend(failures);
            r
        }
    };
    report.emit(&cli.out)?;
    Ok(())
}
