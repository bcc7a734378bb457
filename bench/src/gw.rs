//! Gateway overhead: redis-benchmark straight to the KV cell against
//! through `roam gateway`, with the native server as the baseline.
//!
//! Why it exists: behind a gateway every byte takes two more hops (client
//! -> gateway -> node -> cell) and the gateway keeps it until the cell has
//! consumed it. This measures what that costs a client: throughput and p99
//! latency per redis-benchmark test, for the same `kvserver` natively (gcc),
//! as a cell under `roam run --listen` (roam's sockets, no gateway), and as a
//! cell on a node behind `roam gateway`. All three run in the same process
//! tree at the same time and the repetitions are interleaved, so drift on
//! the shared machine hits each variant alike; medians are reported.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use roam_testkit::resp::benchmark::{redis_benchmark, BenchRun};

use crate::kv::{self, Proc};
use crate::paths::Paths;
use crate::report::{Report, Table};
use crate::stats::median;

/// What to run.
pub struct Options {
    /// redis-benchmark -c.
    pub clients: u32,
    /// redis-benchmark -n.
    pub requests: u64,
    /// redis-benchmark -P.
    pub pipeline: u32,
    /// redis-benchmark -t.
    pub tests: String,
    /// Interleaved repetitions per variant.
    pub reps: usize,
}

const VARIANTS: [&str; 3] = ["native", "roam run --listen", "roam gateway"];

/// Running servers, one per variant (None: it could not start, with why).
struct Servers {
    addrs: Vec<Result<std::net::SocketAddr, String>>,
    _procs: Vec<Proc>,
}

fn start(paths: &Paths, dir: &std::path::Path) -> anyhow::Result<Servers> {
    let roam = paths.tool("roam")?;
    let wasm = paths.wasm("kvserver")?;
    let cache = paths.scratch.join("kv-cache");
    std::fs::create_dir_all(&cache)?;
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    let native = paths
        .native(std::env::consts::ARCH, "kvserver")
        .context("no native kvserver: run workloads/build.sh kvserver");
    addrs.push(
        (|| {
            let addr = kv::free_addr()?;
            procs.push(kv::native_server(&native?, addr, dir)?);
            Ok::<_, anyhow::Error>(addr)
        })()
        .map_err(|e| format!("{e:#}")),
    );
    addrs.push(
        (|| {
            let addr = kv::free_addr()?;
            procs.push(kv::run_listen(&roam, &wasm, addr, dir, &cache)?);
            Ok::<_, anyhow::Error>(addr)
        })()
        .map_err(|e| format!("{e:#}")),
    );
    addrs.push(
        (|| {
            let (listen, control, node) = (kv::free_addr()?, kv::free_addr()?, kv::free_addr()?);
            procs.push(kv::gateway(&roam, listen, "kv", control, dir)?);
            procs.push(kv::node(&roam, node, "a", control, dir, &cache)?);
            kv::launch_service(&roam, node, "kv", &wasm)?;
            // The gateway accepts before the cell serves: wait for a real reply.
            let start = std::time::Instant::now();
            loop {
                let ok = roam_testkit::resp::Client::connect(listen, Duration::from_secs(10))
                    .and_then(|mut c| c.cmd_str(&["PING"]))
                    .is_ok_and(|r| r == roam_testkit::resp::Reply::Simple("PONG".into()));
                if ok {
                    break;
                }
                anyhow::ensure!(
                    start.elapsed() < Duration::from_secs(120),
                    "the cell behind the gateway did not answer PING within 120 s"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok::<_, anyhow::Error>(listen)
        })()
        .map_err(|e| format!("{e:#}")),
    );
    Ok(Servers {
        addrs,
        _procs: procs,
    })
}

/// Run the benchmark.
pub fn run(paths: &Paths, opts: &Options) -> anyhow::Result<Report> {
    let dir = paths.fresh_dir("gw")?;
    let servers = start(paths, &dir)?;
    let mut notes = Vec::new();
    for (v, a) in VARIANTS.iter().zip(&servers.addrs) {
        if let Err(e) = a {
            eprintln!("gw: {v} could not start: {e}");
            notes.push(format!("FAILED {v}: {e}"));
        }
    }
    // (variant, test) -> (rps samples, p99 samples)
    let mut samples: BTreeMap<(usize, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for rep in 0..opts.reps {
        for (v, addr) in servers.addrs.iter().enumerate() {
            let Ok(addr) = addr else { continue };
            let port = addr.port().to_string();
            let (c, n, p) = (
                opts.clients.to_string(),
                opts.requests.to_string(),
                opts.pipeline.to_string(),
            );
            let args = [
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-c",
                &c,
                "-n",
                &n,
                "-P",
                &p,
                "-t",
                &opts.tests,
            ];
            eprintln!("gw: rep {} {} ...", rep + 1, VARIANTS[v]);
            let run: BenchRun = redis_benchmark(&args, Duration::from_secs(900))?;
            if !run.ok() {
                notes.push(format!(
                    "{} rep {}: redis-benchmark failed ({}): {:?}",
                    VARIANTS[v],
                    rep + 1,
                    run.status,
                    run.errors
                ));
            }
            for t in &run.tests {
                if !order.contains(&t.name) {
                    order.push(t.name.clone());
                }
                let e = samples.entry((v, t.name.clone())).or_default();
                e.0.push(t.rps);
                e.1.push(t.p99_ms);
            }
        }
    }
    let get = |v: usize, test: &str| -> (f64, f64) {
        samples
            .get(&(v, test.to_string()))
            .map(|(r, p)| (median(r).unwrap_or(f64::NAN), median(p).unwrap_or(f64::NAN)))
            .unwrap_or((f64::NAN, f64::NAN))
    };
    let mut t = Table::new(&[
        "test",
        "native req/s",
        "run --listen req/s",
        "gateway req/s",
        "gateway ÷ run --listen",
        "run --listen ÷ native",
        "native p99 ms",
        "run --listen p99 ms",
        "gateway p99 ms",
        "gateway p99 − run --listen p99 ms",
    ]);
    for test in &order {
        let (n, d, g) = (get(0, test), get(1, test), get(2, test));
        t.push(vec![
            test.clone(),
            format!("{:.0}", n.0),
            format!("{:.0}", d.0),
            format!("{:.0}", g.0),
            format!("{:.2}", g.0 / d.0),
            format!("{:.2}", d.0 / n.0),
            format!("{:.3}", n.1),
            format!("{:.3}", d.1),
            format!("{:.3}", g.1),
            format!("{:.3}", g.1 - d.1),
        ]);
    }
    notes
        .push("medians over the interleaved repetitions; p99 as redis-benchmark reports it".into());
    Ok(Report {
        name: "gw".into(),
        label: String::new(),
        title:
            "Gateway overhead — redis-benchmark through roam gateway against straight to the cell"
                .into(),
        setup: format!(
            "`roam-bench gw --clients {} --requests {} --pipeline {} --tests {} --reps {}`: \
             kvserver native (gcc -O2), as a cell under `roam run --listen`, and as a cell on a \
             `roam node --gateway` behind `roam gateway` (all on loopback, running at once)",
            opts.clients, opts.requests, opts.pipeline, opts.tests, opts.reps
        ),
        table: t,
        notes,
    })
}
