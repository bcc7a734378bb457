//! Gateway overhead: redis-benchmark straight to the KV cell against
//! through `roam gateway`, with the native server as the baseline.
//!
//! Why it exists: behind a gateway every byte takes two more hops (client
//! -> gateway -> node -> cell) and the gateway keeps it until the cell has
//! consumed it. This measures what that costs a client: throughput and p99
//! latency per redis-benchmark test, for the same `kvserver` natively (gcc),
//! as a cell under `roam run --listen` (roam's sockets, no gateway), and as a
//! cell on a node behind `roam gateway`. All three run in the same process
//! tree at the same time and the repetitions are interleaved (one
//! redis-benchmark run per test and variant, in turn), so drift on the
//! shared machine hits each variant alike; medians are reported.
//!
//! The CPU each variant's processes use is reported too, per request: user
//! plus system time from `/proc/PID/stat` before and after each run. On a
//! machine whose cores are all busy (the clients, the server, the gateway
//! and the node share them), throughput follows CPU per request, so this
//! says where a difference comes from: the gateway process, or the node
//! and its cell.

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

/// What one variant measured for one test, one entry per repetition.
#[derive(Default)]
struct Samples {
    rps: Vec<f64>,
    p99: Vec<f64>,
    /// CPU µs per request of all the variant's processes.
    cpu_us: Vec<f64>,
    /// CPU µs per request of its first process (the gateway, for the
    /// gateway variant).
    first_cpu_us: Vec<f64>,
}

/// Running servers, one per variant (None: it could not start, with why).
struct Servers {
    addrs: Vec<Result<std::net::SocketAddr, String>>,
    /// Per variant, the processes that serve it: the server (native,
    /// `roam run`), or the gateway then the node (which runs the cell).
    pids: Vec<Vec<u32>>,
    _procs: Vec<Proc>,
}

/// User plus system CPU seconds of process `pid` and all its threads so
/// far (`/proc/PID/stat`, clock ticks of 10 ms).
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command name: state is field 3, utime 14 and stime 15.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn start(paths: &Paths, dir: &std::path::Path) -> anyhow::Result<Servers> {
    let roam = paths.tool("roam")?;
    let wasm = paths.wasm("kvserver")?;
    let cache = paths.scratch.join("kv-cache");
    std::fs::create_dir_all(&cache)?;
    let mut procs: Vec<Proc> = Vec::new();
    let mut addrs = Vec::new();
    let mut pids = Vec::new();
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
    pids.push(procs.iter().map(Proc::id).collect::<Vec<_>>());
    let before = procs.len();
    addrs.push(
        (|| {
            let addr = kv::free_addr()?;
            procs.push(kv::run_listen(&roam, &wasm, addr, dir, &cache)?);
            Ok::<_, anyhow::Error>(addr)
        })()
        .map_err(|e| format!("{e:#}")),
    );
    pids.push(procs[before..].iter().map(Proc::id).collect());
    let before = procs.len();
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
    pids.push(procs[before..].iter().map(Proc::id).collect());
    Ok(Servers {
        addrs,
        pids,
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
    // (variant, test) -> samples
    let mut samples: BTreeMap<(usize, String), Samples> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let tests: Vec<&str> = opts.tests.split(',').map(str::trim).collect();
    for rep in 0..opts.reps {
        for &test in &tests {
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
                    test,
                ];
                eprintln!("gw: rep {} {test} {} ...", rep + 1, VARIANTS[v]);
                let pids = &servers.pids[v];
                let cpu0: Vec<Option<f64>> = pids.iter().map(|&p| cpu_secs(p)).collect();
                let run: BenchRun = redis_benchmark(&args, Duration::from_secs(900))?;
                let cpu1: Vec<Option<f64>> = pids.iter().map(|&p| cpu_secs(p)).collect();
                if !run.ok() {
                    notes.push(format!(
                        "{} rep {} {test}: redis-benchmark failed ({}): {:?}",
                        VARIANTS[v],
                        rep + 1,
                        run.status,
                        run.errors
                    ));
                }
                // CPU per request of each process over the whole run (`ping`
                // is two tests in one run: they share its figure).
                let reqs = opts.requests as f64 * run.tests.len().max(1) as f64;
                let per_req: Vec<f64> = cpu0
                    .iter()
                    .zip(&cpu1)
                    .map(|(a, b)| match (a, b) {
                        (Some(a), Some(b)) => (b - a) / reqs * 1e6,
                        _ => f64::NAN,
                    })
                    .collect();
                for t in &run.tests {
                    if !order.contains(&t.name) {
                        order.push(t.name.clone());
                    }
                    let e = samples.entry((v, t.name.clone())).or_default();
                    e.rps.push(t.rps);
                    e.p99.push(t.p99_ms);
                    e.cpu_us.push(per_req.iter().sum());
                    e.first_cpu_us
                        .push(per_req.first().copied().unwrap_or(f64::NAN));
                }
            }
        }
    }
    let get = |v: usize, test: &str| -> [f64; 4] {
        let m = |x: &[f64]| median(x).unwrap_or(f64::NAN);
        samples
            .get(&(v, test.to_string()))
            .map(|s| [m(&s.rps), m(&s.p99), m(&s.cpu_us), m(&s.first_cpu_us)])
            .unwrap_or([f64::NAN; 4])
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
        "native CPU µs/req",
        "run --listen CPU µs/req",
        "gateway path CPU µs/req",
        "of it gateway µs/req",
    ]);
    for test in &order {
        let (n, d, g) = (get(0, test), get(1, test), get(2, test));
        t.push(vec![
            test.clone(),
            format!("{:.0}", n[0]),
            format!("{:.0}", d[0]),
            format!("{:.0}", g[0]),
            format!("{:.2}", g[0] / d[0]),
            format!("{:.2}", d[0] / n[0]),
            format!("{:.3}", n[1]),
            format!("{:.3}", d[1]),
            format!("{:.3}", g[1]),
            format!("{:.3}", g[1] - d[1]),
            format!("{:.1}", n[2]),
            format!("{:.1}", d[2]),
            format!("{:.1}", g[2]),
            format!("{:.1}", g[3]),
        ]);
    }
    if let (Some(r), Some(p)) = (
        median(
            &order
                .iter()
                .map(|t| get(2, t)[0] / get(1, t)[0])
                .collect::<Vec<_>>(),
        ),
        median(
            &order
                .iter()
                .map(|t| get(2, t)[1] - get(1, t)[1])
                .collect::<Vec<_>>(),
        ),
    ) {
        let met = r >= 0.9 && p <= 0.1;
        notes.push(format!(
            "**gateway ÷ run --listen: {r:.2}× throughput, p99 {:+.0} µs** (median over the \
             tests); target (T8) ≥ 0.90× and ≤ +100 µs: {}",
            p * 1000.0,
            if met { "met" } else { "not met" }
        ));
    }
    notes.push(
        "CPU µs/req: user plus system time of the variant's processes during its run, \
         divided by the requests (10 ms ticks): the server (native, `roam run` with its \
         sockets), or the gateway plus the node that runs the cell; redis-benchmark's own \
         CPU is not counted"
            .into(),
    );
    notes.push(
        "medians over the interleaved repetitions (one redis-benchmark run per test and \
         variant); p99 as redis-benchmark reports it"
            .into(),
    );
    Ok(Report {
        figure: None,
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
