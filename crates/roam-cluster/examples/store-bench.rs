//! The cluster store's own benchmark: what one planner can ask of each
//! backend, side by side in one run (the embedded redb store is the
//! baseline etcd is compared with), on a fleet-sized state.
//!
//! ```text
//! cargo run --release -p roam-cluster --example store-bench -- [NODES] [CELLS] [CONCURRENCY]
//! ```
//!
//! Defaults: 1,000 nodes, 10,000 cells, 64 calls in flight. etcd is Debian's
//! `etcd`, started on free loopback ports in a temporary directory (its data
//! on the same disk as the redb file). Prints a markdown table and writes
//! `bench/results/store/<date>-run.{csv,md}` (run `roam-bench index`
//! afterwards to list it in `bench/results/README.md`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_cluster::{
    CellRecord, CellState, ClusterStore, EtcdStore, NodeRecord, NodeState, NodeStatus, RedbStore,
};

struct Row {
    what: String,
    redb: String,
    etcd: String,
}

fn node(name: String) -> NodeRecord {
    NodeRecord {
        name,
        isa: "x86_64".into(),
        api: "10.0.0.1:7700".into(),
        migrate: "10.0.0.1:7701".into(),
        version: "0.1.0".into(),
        status: NodeStatus::default(),
        state: NodeState::Ready,
        alive: false,
        registered_ms: 0,
        heartbeat_ms: 0,
        maintenance: None,
    }
}

fn cell(id: String, owner: String) -> CellRecord {
    CellRecord {
        id,
        module: "ab".repeat(32),
        args: vec!["prog".into(), "--size".into(), "L".into()],
        env: vec![],
        dirs: vec!["/data".into()],
        max_memory: Some(256 << 20),
        service: None,
        owner,
        generation: 1,
        state: CellState::Running,
        checkpoint_interval_s: 30,
        kept: None,
        created_ms: 1_700_000_000_000,
        handoff: None,
        far: None,
    }
}

/// Latencies of `n` calls of `op(i)`, `concurrency` in flight, and the
/// wall time of all of them.
async fn load<F, Fut>(n: usize, concurrency: usize, op: F) -> (Vec<Duration>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.min(n).max(1) {
        let (op, next) = (op.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return lat;
                }
                let t = Instant::now();
                op(i).await;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("a benchmark worker panicked"));
    }
    (all, start.elapsed())
}

fn pct(lat: &mut [Duration], p: f64) -> Duration {
    lat.sort();
    let rank = ((p / 100.0) * lat.len() as f64).ceil() as usize;
    lat[rank.clamp(1, lat.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn rate(n: usize, wall: Duration) -> String {
    format!("{:.0}/s", n as f64 / wall.as_secs_f64())
}

/// Every measurement over one store, as (what, value) pairs.
async fn measure<S: ClusterStore>(
    s: Arc<S>,
    nodes: usize,
    cells: usize,
    conc: usize,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut record = |what: String, value: String| {
        eprintln!("  {what}: {value}");
        out.push((what, value));
    };

    let st = s.clone();
    let (_, wall) = load(nodes, conc, move |i| {
        let s = st.clone();
        async move {
            s.register_node(node(format!("n-{i:05}")), Duration::from_secs(3600))
                .await
                .expect("register");
        }
    })
    .await;
    record(format!("register {nodes} nodes"), rate(nodes, wall));

    let beats = nodes * 5;
    let st = s.clone();
    let (mut lat, wall) = load(beats, conc, move |i| {
        let s = st.clone();
        async move {
            let status = NodeStatus {
                cells: vec![format!("c-{i}")],
                ..NodeStatus::default()
            };
            s.heartbeat(&format!("n-{:05}", i % nodes), status)
                .await
                .expect("heartbeat");
        }
    })
    .await;
    record("heartbeats".into(), rate(beats, wall));
    record("heartbeat p50".into(), ms(pct(&mut lat, 50.0)));
    record("heartbeat p99".into(), ms(pct(&mut lat, 99.0)));

    let st = s.clone();
    let (_, wall) = load(cells, conc, move |i| {
        let s = st.clone();
        async move {
            s.create_cell(cell(format!("c-{i:06}"), format!("n-{:05}", i % nodes)))
                .await
                .expect("create");
        }
    })
    .await;
    record(format!("create {cells} cells"), rate(cells, wall));

    // An ownership change: read the cell, compare-and-swap a new owner.
    let moves = cells / 2;
    let st = s.clone();
    let (mut lat, wall) = load(moves, conc, move |i| {
        let s = st.clone();
        async move {
            let id = format!("c-{:06}", i * 2 % cells);
            let mut c = s.cell(&id).await.expect("read").expect("exists");
            c.value.owner = format!("n-{:05}", (i + 1) % nodes);
            c.value.generation += 1;
            s.update_cell(c.revision, c.value).await.expect("swap");
        }
    })
    .await;
    record("ownership changes (read + CAS)".into(), rate(moves, wall));
    record("ownership change p50".into(), ms(pct(&mut lat, 50.0)));
    record("ownership change p99".into(), ms(pct(&mut lat, 99.0)));

    let mut lists = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(s.cells().await.expect("cells").len(), cells);
        lists.push(t.elapsed());
    }
    record(
        format!("list {cells} cells (median of 5)"),
        ms(pct(&mut lists, 50.0)),
    );
    let mut lists = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        assert_eq!(s.nodes().await.expect("nodes").len(), nodes);
        lists.push(t.elapsed());
    }
    record(
        format!("list {nodes} nodes (median of 5)"),
        ms(pct(&mut lists, 50.0)),
    );

    let module: Vec<u8> = (0..16u32 << 20).map(|i| (i ^ (i >> 9)) as u8).collect();
    let hash = blake3::hash(&module).to_hex().to_string();
    let t = Instant::now();
    s.put_module(&hash, &module).await.expect("put module");
    record("store a 16 MiB module".into(), ms(t.elapsed()));
    let t = Instant::now();
    let back = s.module(&hash).await.expect("get module").expect("stored");
    record("read a 16 MiB module".into(), ms(t.elapsed()));
    assert!(back == module, "the module came back different");
    out
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("arguments: NODES CELLS CONCURRENCY (numbers)")
        })
        .collect();
    let nodes = args.first().copied().unwrap_or(1000);
    let cells = args.get(1).copied().unwrap_or(10_000);
    let conc = args.get(2).copied().unwrap_or(64);

    let dir = tempfile::tempdir().expect("a temporary directory");
    eprintln!("redb:");
    let redb = Arc::new(RedbStore::open(dir.path().join("cluster.redb")).expect("open redb"));
    let redb_rows = measure(redb, nodes, cells, conc).await;

    let etcd =
        roam_testkit::etcd::Etcd::start().expect("etcd starts (apt-get install etcd-server)");
    eprintln!("etcd:");
    let store = Arc::new(
        EtcdStore::connect(&[etcd.endpoint()], "/bench/")
            .await
            .expect("connect to etcd"),
    );
    let etcd_rows = measure(store, nodes, cells, conc).await;

    let rows: Vec<Row> = redb_rows
        .into_iter()
        .zip(etcd_rows)
        .map(|((what, redb), (_, etcd))| Row { what, redb, etcd })
        .collect();
    let mut md = String::from("# Cluster store: redb and etcd under one planner's load\n\n");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("unknown");
    let _ = writeln!(
        md,
        "- machine: {cores} cores, load average {load} at the end (other work shares them)\n- date: {date}"
    );
    let _ = writeln!(
        md,
        "- setup: `cargo run --release -p roam-cluster --example store-bench -- {nodes} {cells} {conc}`: \
         {nodes} nodes, {cells} cells, {conc} calls in flight from one process; \
         etcd 1 member on loopback, data on the same disk as the redb file\n"
    );
    md.push_str("| operation | redb | etcd |\n| --- | --- | --- |\n");
    let mut csv = String::from("operation,redb,etcd\n");
    for r in &rows {
        let _ = writeln!(md, "| {} | {} | {} |", r.what, r.redb, r.etcd);
        let _ = writeln!(csv, "\"{}\",{},{}", r.what, r.redb, r.etcd);
    }
    println!("{md}");
    let results =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results/store");
    std::fs::create_dir_all(&results).expect("bench/results/store");
    let name = format!("{}-run", today());
    std::fs::write(results.join(format!("{name}.md")), md).expect("write the .md");
    std::fs::write(results.join(format!("{name}.csv")), csv).expect("write the .csv");
    eprintln!("wrote bench/results/store/{name}.{{csv,md}}");
}

/// Today's date (UTC), `YYYY-MM-DD`, from `date(1)`.
fn today() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .expect("date(1) runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
