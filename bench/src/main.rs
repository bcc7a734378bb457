//! `roam-bench`: roam's benchmarks T1 (steady-state overhead, on roam's
//! workloads and on the real-program suite), T2 (checkpoint capture/restore
//! vs memory size), T3 (migration response time), T4 (live migration
//! between two nodes), T5 (the page transfer pipeline against bandwidth),
//! T7 (follow-the-user), energy against static placement, the gateway's overhead, the memory kept
//! checkpoints cost and the control plane at scale; the targets are defined in docs/targets.md.
//!
//! Why it exists: roam makes quantitative promises; these programs measure
//! them, always next to a baseline measured in the same run on the same
//! machine, and report ratios, because a noisy two-core machine makes
//! absolute numbers from different runs incomparable. They are benchmarks,
//! not tests: they print a markdown table and write
//! `bench/results/<benchmark>/<YYYY-MM-DD>-<label>.{csv,md}`, then
//! regenerate the index `bench/results/README.md` (`roam-bench index`
//! regenerates it alone). See docs/benchmarks.md.
//!
//! The Redis-protocol benchmarks (`gw`, `t4kv`, `t7`) run the `kvserver`
//! cell as a network service and measure what its clients see.

mod eh;
mod energy;
mod far;
mod far_server;
mod gw;
mod hexo;
mod index;
mod kept;
mod kv;
mod paths;
mod pause;
mod prepare;
mod proc;
mod quiet;
mod real;
mod real_t3;
mod report;
mod scale;
mod stats;
mod t1;
mod t13;
mod t2;
mod t3;
mod t4;
mod t4kv;
mod t5;
mod t7;
mod threads;

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
    /// Added to the label of the result's file name,
    /// `<out>/<benchmark>/<YYYY-MM-DD>-<label>.{csv,md}` (the label is
    /// already the size, capture or backends where a benchmark has them).
    #[arg(long, global = true)]
    label: Option<String>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand, Debug)]
enum Bench {
    /// Regenerate the index of results, `<out>/README.md`: per benchmark,
    /// its latest files and their headlines.
    Index,
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
    /// T1 and T3 together per variant (policies, or any `roam prepare` flags and runtime settings).
    T13 {
        /// Size class for T1: S, M or L.
        #[arg(long, default_value = "L")]
        size: String,
        /// Repetitions per variant (median reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Size class for T3.
        #[arg(long, default_value = "M")]
        t3_size: String,
        /// Minimum T3 samples per workload and variant (0 skips T3). The
        /// p99 of fewer than a few hundred is nearly their maximum.
        #[arg(long, default_value_t = 300)]
        t3_samples: usize,
        /// Comma-separated workloads (default: all).
        #[arg(long)]
        only: Option<String>,
        /// `NAME=ARGS`: `roam prepare` flags and `VAR=value` settings of one
        /// variant; repeatable, the first is the reference (default: the
        /// default preparation and every policy).
        #[arg(long = "variant")]
        variants: Vec<String>,
    },
    /// Capture by exceptions (`roam prepare --capture eh`, and its ablation
    /// `eh-points`) against the default preparation and the unprepared
    /// module, all on plain wasmtime.
    Eh {
        /// Size class of the suite's workloads: S, M or L.
        #[arg(long, default_value = "M")]
        size: String,
        /// Repetitions (median reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Comma-separated workloads of the suite (default: all; `none`: none).
        #[arg(long)]
        only: Option<String>,
        /// `NAME=PATH ARG...`: a program from outside the suite, run with
        /// these arguments (`--dir=HOST::GUEST` preopens); repeatable.
        #[arg(long = "extra")]
        extra: Vec<String>,
        /// Repetitions for `--extra` programs.
        #[arg(long, default_value_t = 1)]
        extra_reps: usize,
    },
    /// T1 on the real-program suite (workloads/real/suite.toml) against
    /// stock wasmtime-cli; writes bench/results/t1-real/<date>-<capture>.{csv,md}.
    Real {
        /// Repetitions (median reported).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Comma-separated programs of the suite (default: every one with a
        /// bench size).
        #[arg(long, value_delimiter = ',')]
        only: Option<Vec<String>>,
        /// The stock `wasmtime` command (wasmtime-cli 48).
        #[arg(long, default_value = "wasmtime")]
        wasmtime: PathBuf,
        /// How roam captures the stack: `returns` (roam's default), `eh`
        /// or `asyncify`.
        #[arg(long, default_value = "returns")]
        capture: String,
        /// Minimum T3 samples per program (0 skips T3).
        #[arg(long, default_value_t = 200)]
        t3_samples: usize,
        /// T3's wait between checkpoint requests, `LO-HI` milliseconds.
        #[arg(long, default_value = "20-50")]
        t3_interval_ms: t3::Interval,
    },
    /// One T3 run of a real program, in a process of its own so that the
    /// program's input can be its stdin (used by `real`).
    #[command(hide = true)]
    T3Child {
        /// The prepared module.
        #[arg(long)]
        module: PathBuf,
        /// Where to write the samples.
        #[arg(long)]
        samples_to: PathBuf,
        /// Wait between checkpoint requests.
        #[arg(long)]
        interval_ms: t3::Interval,
        /// A writable directory for the program: HOST::GUEST.
        #[arg(long)]
        dir: Option<String>,
        /// The program's arguments.
        #[arg(last = true)]
        args: Vec<String>,
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
        /// Wait between requests, `LO-HI` milliseconds (jittered). A short
        /// wait, with many samples, finds rare long stretches without a point.
        #[arg(long, default_value = "20-50")]
        interval_ms: t3::Interval,
        /// Comma-separated workloads (default: all).
        #[arg(long)]
        only: Option<String>,
    },
    /// Live migration between two local nodes: modes and bandwidths.
    T4 {
        /// Arguments of the `dirty` workload: MiB of state, MiB/s dirtied, seconds.
        #[arg(long, default_value = "256,20,300", value_delimiter = ',')]
        dirty: Vec<String>,
        /// Seconds the cell runs before the migration starts.
        #[arg(long, default_value_t = 3.0)]
        settle: f64,
        /// Repetitions of every case, interleaved.
        #[arg(long, default_value_t = 1)]
        reps: usize,
        /// Only these cases, `NAME@BANDWIDTH` separated by `;` (default:
        /// all; an unknown name lists them).
        #[arg(long, value_delimiter = ';')]
        cases: Vec<String>,
    },
    /// Transfer pipeline vs bandwidth: static modes against adaptive.
    T5 {
        /// Size class of the workloads.
        #[arg(long, default_value = "S")]
        size: String,
        /// Comma-separated workloads whose memory is pushed.
        #[arg(long, default_value = "kmeans,pca,is", value_delimiter = ',')]
        workloads: Vec<String>,
        /// Milliseconds each workload runs before it is stopped.
        #[arg(long, default_value_t = 1000)]
        after_ms: u64,
        /// Cap on modified MiB pushed per image.
        #[arg(long, default_value_t = 8)]
        cap_mib: u64,
        /// Comma-separated bandwidths in Mbit/s.
        #[arg(long, default_value = "5,10,25,100,1000", value_delimiter = ',')]
        mbit: Vec<u64>,
    },
    /// Gateway overhead: redis-benchmark through roam gateway vs straight to the cell vs native.
    Gw {
        /// redis-benchmark -c.
        #[arg(long, default_value_t = 50)]
        clients: u32,
        /// redis-benchmark -n.
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
        /// redis-benchmark -P.
        #[arg(long, default_value_t = 1)]
        pipeline: u32,
        /// redis-benchmark -t.
        #[arg(long, default_value = "set,get,incr,ping")]
        tests: String,
        /// Interleaved repetitions.
        #[arg(long, default_value_t = 3)]
        reps: usize,
    },
    /// The owner's and the holder's memory while checkpoints of a cell are
    /// kept, with another `roam` binary side by side.
    Kept {
        /// The `dirty` workload's state, MiB.
        #[arg(long, default_value_t = 512)]
        mib: u64,
        /// Its dirtying rate, MiB/s.
        #[arg(long, default_value_t = 2)]
        rate: u64,
        /// Checkpoints kept per binary.
        #[arg(long, default_value_t = 8)]
        keeps: usize,
        /// Another `roam` binary, measured first in the same run.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// T4 with the KV cell: client-visible downtime and throughput while it migrates.
    T4kv {
        /// Dataset keys (262144 x 1024 B = 256 MiB).
        #[arg(long, default_value_t = 262_144)]
        keys: u64,
        /// Dataset value length in bytes.
        #[arg(long, default_value_t = 1024)]
        value_len: usize,
        /// Modes, in order; the cell alternates between the two nodes.
        #[arg(
            long,
            default_value = "pre-copy,stop-and-copy,post-copy",
            value_delimiter = ','
        )]
        modes: Vec<String>,
        /// Migration bandwidth (`roam migrate --bandwidth`).
        #[arg(long, default_value = "1gbit")]
        bandwidth: String,
        /// Seconds of load before each migration and after the last.
        #[arg(long, default_value_t = 5.0)]
        settle: f64,
        /// Reader threads.
        #[arg(long, default_value_t = 2)]
        readers: usize,
        /// redis-benchmark arguments, run back to back.
        #[arg(long, default_value = "-c 16 -n 20000 -r 100000 -t set,get,incr,ping")]
        bench: String,
    },
    /// T7 follow-the-user: two nodes, the client's delay to each changing over time.
    T7 {
        /// Phases (the near node alternates).
        #[arg(long, default_value_t = 4)]
        phases: usize,
        /// Seconds per phase.
        #[arg(long, default_value_t = 10.0)]
        phase_secs: f64,
        /// One-way delay to the near node, ms.
        #[arg(long, default_value_t = 2.0)]
        near_ms: f64,
        /// One-way delay to the far node, ms.
        #[arg(long, default_value_t = 25.0)]
        far_ms: f64,
        /// Dataset keys of 1 KiB.
        #[arg(long, default_value_t = 16_384)]
        keys: u64,
        /// Closed-loop reader clients.
        #[arg(long, default_value_t = 4)]
        readers: usize,
        /// Migration mode when following.
        #[arg(long, default_value = "pre-copy")]
        mode: String,
    },
    /// Energy (Popcorn): waves of jobs on static clusters and under the
    /// energy policies, an x86-64 server and an aarch64 board under qemu.
    Energy {
        /// Waves of arrivals.
        #[arg(long, default_value_t = 3)]
        waves: usize,
        /// Jobs per wave.
        #[arg(long, default_value_t = 2)]
        per_wave: usize,
        /// Seconds between waves.
        #[arg(long, default_value_t = 30.0)]
        gap_secs: f64,
        /// The job's workload.
        #[arg(long, default_value = "kmeans")]
        job: String,
        /// The job's size.
        #[arg(long, default_value = "M")]
        size: String,
        /// The server's power model (speed 1 is the reference).
        #[arg(long, default_value = "idle=50,busy=12")]
        server: String,
        /// The board's idle draw, watts.
        #[arg(long, default_value_t = 2.0)]
        board_idle: f64,
        /// The board's draw per busy core, watts (its speed is calibrated).
        #[arg(long, default_value_t = 0.5)]
        board_busy: f64,
    },
    /// HEXO's consolidation: jobs done in a window on an x86-64 server
    /// alone, with an aarch64 board under least-loaded, and under
    /// offload-by-slowdown; and the learned slowdowns' error.
    Hexo {
        /// The kinds of job, `workload:size`, comma-separated, taken in turn.
        #[arg(long, default_value = "ep:M,kmeans:M,is:M,cg:M,matmul:M")]
        jobs: String,
        /// Seconds each scenario runs.
        #[arg(long, default_value_t = 300.0)]
        window: f64,
    },
    /// Threaded programs: CPU against a wasmtime with wasi-threads, and a
    /// checkpoint-and-stop of every thread, by thread count.
    Threads {
        /// Programs of workloads/threads, comma-separated.
        #[arg(
            long,
            default_value = "threads-sum,threads-rayon,threads-omp,threads-pthreads,threads-zstd"
        )]
        only: String,
        /// Thread counts, comma-separated.
        #[arg(long, default_value = "1,2,4,8")]
        counts: String,
        /// Repetitions of each uninterrupted run (the fastest counts).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// A wasmtime CLI that still has wasi-threads (release 46 or
        /// older), for the baseline columns.
        #[arg(long, env = "ROAM_BENCH_WASMTIME_THREADS")]
        wasmtime: Option<PathBuf>,
    },
    /// Far memory: slowdown with 75/50/25 % of the working set resident,
    /// per eviction policy, against all of it; and Linux swap to zram.
    Far {
        /// Comma-separated workloads.
        #[arg(long, default_value = "is,kv,kmeans")]
        only: String,
        /// Their size.
        #[arg(long, default_value = "M")]
        size: String,
        /// Shares of the working set resident, percent, comma-separated.
        #[arg(long, default_value = "75,50,25")]
        shares: String,
        /// Runs per variant (median).
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Also Linux swap to zram in a memory cgroup (root only).
        #[arg(long)]
        zram: bool,
        /// Also page to a memory server: a second `roam node` on loopback.
        #[arg(long)]
        server: bool,
        /// Also page to a memory server through a link of each of these
        /// rates (`tc` units, comma-separated, e.g. `1gbit,100mbit`); implies
        /// `--server`.
        #[arg(long, value_delimiter = ',')]
        links: Vec<String>,
    },
    /// Control-plane scale: one planner, a simulated fleet of nodes and cells.
    Scale {
        /// Simulated nodes.
        #[arg(long, default_value_t = 1000)]
        nodes: usize,
        /// Cells placed.
        #[arg(long, default_value_t = 10_000)]
        cells: usize,
        /// Stores to measure: redb, etcd (comma-separated).
        #[arg(long, default_value = "redb,etcd", value_delimiter = ',')]
        backends: Vec<String>,
        /// Seconds of steady heartbeats measured.
        #[arg(long, default_value_t = 20)]
        settle: u64,
        /// Nodes killed in the failure phase.
        #[arg(long, default_value_t = 10)]
        victims: usize,
        /// The planner's node lease, seconds.
        #[arg(long, default_value_t = 10)]
        lease: u64,
        /// Placements in flight at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
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
    let label = cli.label.as_deref();
    let emit = |mut r: report::Report| -> anyhow::Result<()> {
        r.label = report::join_label(&r.label, label);
        r.emit(&cli.out)?;
        Ok(())
    };
    let report = match cli.bench {
        Bench::Index => {
            index::write(&cli.out)?;
            eprintln!("wrote {}", cli.out.join("README.md").display());
            return Ok(());
        }
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
        Bench::T13 {
            size,
            reps,
            t3_size,
            t3_samples,
            only,
            variants,
        } => {
            let only = only.as_deref().map(t1::parse_only).transpose()?;
            let variants = if variants.is_empty() {
                t13::default_variants()
            } else {
                variants
                    .iter()
                    .map(|v| t13::VariantSpec::parse(v))
                    .collect::<anyhow::Result<_>>()?
            };
            t13::run(
                &paths,
                &t13::Options {
                    size,
                    reps: reps.max(1),
                    t3_size,
                    t3_samples,
                    only,
                    variants,
                },
            )?
        }
        Bench::Eh {
            size,
            reps,
            only,
            extra,
            extra_reps,
        } => {
            let only = match only.as_deref() {
                Some("none") => Some(Vec::new()),
                o => o.map(t1::parse_only).transpose()?,
            };
            let extra = extra
                .iter()
                .map(|e| eh::Extra::parse(e))
                .collect::<anyhow::Result<_>>()?;
            eh::run(
                &paths,
                &eh::Options {
                    size,
                    reps: reps.max(1),
                    only,
                    extra,
                    extra_reps: extra_reps.max(1),
                },
            )?
        }
        Bench::Real {
            reps,
            only,
            wasmtime,
            capture,
            t3_samples,
            t3_interval_ms,
        } => real::run(
            &paths,
            &real::Options {
                reps: reps.max(1),
                only,
                wasmtime,
                capture,
                root: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")),
                t3_samples,
                t3_every: t3_interval_ms,
                out: cli.out.clone(),
            },
        )?,
        Bench::T3Child {
            module,
            samples_to,
            interval_ms,
            dir,
            args,
        } => {
            let dir = dir
                .map(|d| match d.split_once("::") {
                    Some((host, guest)) => Ok((PathBuf::from(host), guest.to_string())),
                    None => Err(anyhow::anyhow!("--dir {d:?}: give HOST::GUEST")),
                })
                .transpose()?;
            let rt = runtime(&paths)?;
            real_t3::child(&rt, &module, &args, dir, interval_ms, &samples_to)?;
            return Ok(());
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
            interval_ms,
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
                match t3::measure(&rt, &paths, name, &size, interval_ms, samples) {
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
            let mut r = t3::report(&results, &base, &size, interval_ms);
            r.notes.extend(failures);
            r
        }
        Bench::T4 {
            dirty,
            settle,
            reps,
            cases,
        } => {
            let picked = t4::select(t4::default_cases(), &cases)?;
            let out = t4::run(
                &paths,
                &dirty,
                std::time::Duration::from_secs_f64(settle),
                &picked,
                reps,
            )?;
            let only = if cases.is_empty() {
                String::new()
            } else {
                format!(" --cases '{}'", cases.join(";"))
            };
            let setup = format!(
                "`roam-bench t4 --dirty {} --settle {settle} --reps {reps}{only}`: `dirty {}` \
                 on node a, `roam migrate --json` to node b after {settle} s, fresh nodes per \
                 case, cases interleaved",
                dirty.join(","),
                dirty.join(" "),
            );
            emit(t4::pause_report(&out, setup.clone()))?;
            t4::report(&out, setup)
        }
        Bench::T5 {
            size,
            workloads,
            after_ms,
            cap_mib,
            mbit,
        } => {
            let rt = runtime(&paths)?;
            let cap = cap_mib << 20;
            let mut images = Vec::new();
            let mut notes = Vec::new();
            for name in &workloads {
                eprintln!("t5: capturing {name} ...");
                match t5::workload_image(
                    &rt,
                    &paths,
                    name,
                    &size,
                    std::time::Duration::from_millis(after_ms),
                    cap,
                ) {
                    Ok(img) => images.push(img),
                    Err(e) => {
                        eprintln!("t5: {name} FAILED: {e:#}");
                        notes.push(format!("FAILED {name}: {e:#}"));
                    }
                }
            }
            images.push(t5::synthetic_image(cap));
            for img in &images {
                notes.push(format!(
                    "{}: memory {:.1} MiB, {} pages pushed, modified {:.2} MiB pushed of {:.2} MiB",
                    img.name,
                    img.memory.len() as f64 / f64::from(1 << 20),
                    img.pages.len(),
                    img.modified as f64 / f64::from(1 << 20),
                    img.modified_uncapped as f64 / f64::from(1 << 20),
                ));
            }
            let mut rows = Vec::new();
            for img in &images {
                for &m in &mbit {
                    rows.push(t5::measure(img, m)?);
                }
            }
            let setup = format!(
                "`roam-bench t5 --size {size} --workloads {} --after-ms {after_ms} --cap-mib {cap_mib} --mbit {}`",
                workloads.join(","),
                mbit.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            );
            t5::report(&rows, setup, notes)
        }
        Bench::Gw {
            clients,
            requests,
            pipeline,
            tests,
            reps,
        } => gw::run(
            &paths,
            &gw::Options {
                clients,
                requests,
                pipeline,
                tests,
                reps: reps.max(1),
            },
        )?,
        Bench::Kept {
            mib,
            rate,
            keeps,
            baseline,
        } => kept::run(
            &paths,
            &kept::Options {
                mib,
                rate,
                keeps: keeps.max(1),
                baseline,
            },
        )?,
        Bench::T4kv {
            keys,
            value_len,
            modes,
            bandwidth,
            settle,
            readers,
            bench,
        } => {
            let (r, pause) = t4kv::run(
                &paths,
                &t4kv::Options {
                    keys,
                    value_len,
                    modes,
                    bandwidth,
                    settle,
                    readers,
                    bench,
                },
            )?;
            emit(pause)?;
            r
        }
        Bench::Energy {
            waves,
            per_wave,
            gap_secs,
            job,
            size,
            server,
            board_idle,
            board_busy,
        } => energy::run(
            &paths,
            &energy::Options {
                waves,
                per_wave,
                gap_secs,
                job,
                size,
                server,
                board_idle,
                board_busy,
            },
        )?,
        Bench::Hexo { jobs, window } => {
            let jobs = jobs
                .split(',')
                .map(|j| {
                    j.split_once(':')
                        .map(|(w, s)| (w.trim().to_string(), s.trim().to_string()))
                        .ok_or_else(|| anyhow::anyhow!("--jobs: `workload:size`, got {j:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let (main, model) = hexo::run(
                &paths,
                &hexo::Options {
                    jobs,
                    window_secs: window,
                },
            )?;
            emit(model)?;
            main
        }
        Bench::Threads {
            only,
            counts,
            reps,
            wasmtime,
        } => threads::run(
            &paths,
            &threads::Options {
                programs: only.split(',').map(|s| s.trim().to_string()).collect(),
                counts: counts
                    .split(',')
                    .map(|c| c.trim().parse())
                    .collect::<Result<Vec<usize>, _>>()
                    .map_err(|e| anyhow::anyhow!("--counts: {e}"))?,
                reps,
                wasmtime,
            },
        )?,
        Bench::Far {
            only,
            size,
            shares,
            reps,
            zram,
            server,
            links,
        } => far::run(
            &paths,
            &far::Options {
                workloads: only.split(',').map(str::to_string).collect(),
                size,
                shares: shares
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e| anyhow::anyhow!("--shares: percentages, comma-separated: {e}"))?,
                reps,
                zram,
                server: server || !links.is_empty(),
                links,
            },
        )?,
        Bench::Scale {
            nodes,
            cells,
            backends,
            settle,
            victims,
            lease,
            concurrency,
        } => scale::run(
            &paths,
            &scale::Options {
                nodes,
                cells,
                backends,
                settle,
                victims,
                lease,
                concurrency,
            },
        )?,
        Bench::T7 {
            phases,
            phase_secs,
            near_ms,
            far_ms,
            keys,
            readers,
            mode,
        } => t7::run(
            &paths,
            &t7::Options {
                phases,
                phase_secs,
                near_ms,
                far_ms,
                keys,
                readers,
                mode,
            },
        )?,
    };
    emit(report)
}
