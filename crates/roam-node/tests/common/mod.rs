//! Nodes, a planner and faults, all in this process: what the migration
//! tests need to run the failure matrix without spawning `roam`.
//!
//! Each [`TestNode`] is a real [`Node`] on loopback ports, serving on the
//! test's tokio runtime, with its own state directory; they share one
//! compile cache. A [`Planner`] is a real planner over a real store (an
//! embedded redb, or an etcd the test starts). A [`Delay`] is a TCP proxy
//! that can hold back one direction of its connections, to stand for a
//! slow answer, or cut them, to stand for a partition.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use roam_node::types::{CellInfo, CellState, LaunchRequest, MigrateRequest, MigrationStatus};
use roam_node::{Client, Node, NodeConfig, NodeLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/roam-node")
        .to_path_buf()
}

/// A workload module built by `workloads/build.sh`.
pub fn workload(name: &str) -> Vec<u8> {
    let p = repo_root()
        .join("target/workloads")
        .join(format!("{name}.wasm"));
    std::fs::read(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run workloads/build.sh (or scripts/test.sh)",
            p.display()
        )
    })
}

/// `prog` followed by `args`: a program's argv.
pub fn argv(args: &[&str]) -> Vec<String> {
    std::iter::once("prog")
        .chain(args.iter().copied())
        .map(str::to_string)
        .collect()
}

/// One compile cache for every node of this test binary.
fn cache_dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"))
        .path()
}

/// A node serving in this process until dropped.
pub struct TestNode {
    pub name: String,
    pub client: Client,
    pub url: String,
    stop: Option<oneshot::Sender<()>>,
    _state: tempfile::TempDir,
}

/// How to set up a test node.
#[derive(Clone, Default)]
pub struct Setup {
    pub planner: Option<String>,
    pub limits: Option<NodeLimits>,
    pub planner_timeout: Option<Duration>,
    /// The gateway's control address.
    pub gateway: Option<String>,
    /// Mutual TLS: the node's identity, and the credentials the test's
    /// client (an operator) presents to it.
    pub tls: Option<(roam_auth::Identity, roam_node::ClientAuth)>,
    /// The power model the node declares.
    pub power: Option<roam_api::power::PowerModel>,
    /// Bytes offered as a memory server.
    pub memory_server: Option<u64>,
}

impl TestNode {
    pub async fn start(name: &str, setup: Setup) -> TestNode {
        let state = tempfile::tempdir().expect("a temp dir");
        let cfg = NodeConfig {
            name: name.to_string(),
            listen: "127.0.0.1:0".parse().unwrap(),
            migrate_listen: "127.0.0.1:0".parse().unwrap(),
            advertise_migrate: None,
            state_dir: state.path().to_path_buf(),
            cache_dir: cache_dir().to_path_buf(),
            capture: roam_prepare::Capture::default(),
            chunk_store_bytes: 64 << 20,
            memory_reserve: 0,
            tls: setup.tls.as_ref().map(|(id, _)| id.clone()),
            token: None,
            insecure: false,
            limits: setup.limits.unwrap_or_default(),
            // In-process nodes are dropped, not stopped: cgroups would
            // outlive them (see roam-cli's tests/all/cpu.rs for those).
            cpu_control: roam_node::cpu::CpuControl::Only(roam_node::cpu::Mechanism::Nice),
            gateway: setup.gateway,
            planner: setup.planner,
            planner_timeout: setup
                .planner_timeout
                .unwrap_or(roam_node::DEFAULT_PLANNER_TIMEOUT),
            advertise: None,
            power: setup.power,
            cores: None,
            memory_server: setup.memory_server,
        };
        let node = Node::bind(cfg).await.expect("the node binds");
        let url = node.control_url();
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(node.serve(async {
            let _ = rx.await;
        }));
        TestNode {
            name: name.to_string(),
            client: match &setup.tls {
                Some((_, auth)) => Client::with_auth(&url, auth).expect("a TLS client"),
                None => Client::new(&url),
            },
            url,
            stop: Some(tx),
            _state: state,
        }
    }

    /// Upload a workload; its hash.
    pub async fn upload(&self, name: &str) -> String {
        self.client
            .upload_module(workload(name))
            .await
            .expect("the module uploads")
            .hash
    }

    /// Launch `module` with `args` under `id`.
    pub async fn launch(&self, module: &str, id: &str, args: &[&str]) {
        self.launch_with(module, id, args, &[]).await
    }

    /// The host directory of a cell's first sandbox directory here.
    pub fn sandbox(&self, id: &str) -> PathBuf {
        self._state
            .path()
            .join("cells")
            .join(id)
            .join("dirs")
            .join("0")
    }

    /// Launch `module` with `args` and guest directories `dirs`.
    pub async fn launch_with(&self, module: &str, id: &str, args: &[&str], dirs: &[&str]) {
        let req = LaunchRequest {
            module: module.to_string(),
            args: argv(args),
            env: Vec::new(),
            dirs: dirs.iter().map(|d| d.to_string()).collect(),
            max_memory: Some(64 << 20),
            service: None,
            id: Some(id.to_string()),
            generation: None,
            cpu: Default::default(),
            far: None,
        };
        self.client.launch(&req).await.expect("the cell launches");
    }

    /// The cell's state here, if this node knows it.
    pub async fn cell(&self, id: &str) -> Option<CellInfo> {
        self.client.cell(id).await.ok()
    }

    /// Wait until the cell ended here; its output.
    pub async fn output(&self, id: &str, limit: Duration) -> (CellState, Vec<u8>) {
        let state = wait_for(
            &format!("cell {id} to end on {}", self.name),
            limit,
            || async {
                let c = self.cell(id).await?;
                (!matches!(c.state, CellState::Running | CellState::Migrating)).then_some(c.state)
            },
        )
        .await;
        let log = self.client.logs(id).await.expect("the cell's log");
        (state, log)
    }

    /// Start a migration of `id` to `to` and wait for its end.
    pub async fn migrate(&self, id: &str, to: &TestNode, mode: &str) -> MigrationStatus {
        let req = MigrateRequest {
            to: to.url.clone(),
            mode: mode.to_string(),
            transfer: Default::default(),
        };
        let m = self
            .client
            .migrate(id, &req)
            .await
            .expect("the migration starts")
            .migration;
        wait_for("the migration to end", Duration::from_secs(120), || async {
            let st = self.client.migration(&m).await.ok()?;
            st.done.then_some(st)
        })
        .await
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// Poll `f` every 50 ms until it gives a value; panic after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP proxy to `target` whose answers (target → client) can be held
/// back by a given time, and which can cut every connection, both ways.
pub struct Delay {
    pub addr: std::net::SocketAddr,
    delay_ms: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
}

/// Copy `from` to `to`, each read held back by `delay_ms` first, until
/// either end closes or `cut` is set.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Option<Arc<AtomicU64>>,
    cut: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            () = async {
                while !cut.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            } => break,
        };
        let ms = delay_ms.as_ref().map_or(0, |d| d.load(Ordering::SeqCst));
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

impl Delay {
    pub async fn start(target: std::net::SocketAddr) -> Delay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicBool::new(false));
        let (d, c) = (delay_ms.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                // Cut: a connection is closed as soon as it comes.
                if c.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, None, c.clone()));
                tokio::spawn(pipe(sr, cw, Some(d.clone()), c.clone()));
            }
        });
        Delay {
            addr,
            delay_ms,
            cut,
        }
    }

    /// Hold back every answer by `d` from now on.
    pub fn set(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    /// Cut every connection and refuse new ones (`true`), or heal (`false`).
    pub fn cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }
}

/// A planner serving in this process until dropped.
pub struct Planner {
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub client: roam_api::PlannerClient,
    stop: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Planner {
    /// A planner on `store` (`redb:PATH`, `etcd://...`), or on an
    /// embedded store of its own.
    pub async fn start(store: Option<String>) -> Planner {
        let dir = tempfile::tempdir().unwrap();
        let spec: roam_cluster::StoreSpec = store
            .unwrap_or_else(|| format!("redb:{}", dir.path().join("cluster.redb").display()))
            .parse()
            .expect("a store spec");
        let store = spec.open().await.expect("the store opens");
        let mut cfg = roam_planner::PlannerConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.checkpoint_interval_s = 0;
        let p = roam_planner::Planner::bind(cfg, store)
            .await
            .expect("the planner binds");
        let (url, addr) = (p.url(), p.local_addr());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(p.serve(async {
            let _ = rx.await;
        }));
        let client = roam_api::PlannerClient::with_auth(&url, &roam_api::ClientAuth::default())
            .expect("a planner client");
        Planner {
            url,
            addr,
            client,
            stop: Some(tx),
            _dir: dir,
        }
    }

    /// Upload workload `name` to the planner and have it placed on node
    /// `node` with `args` (after the program name), 64 MiB, kept
    /// checkpoints every `interval_s` seconds (0: none), behind `service`
    /// if given: the cell's record.
    pub async fn place(
        &self,
        name: &str,
        args: &[&str],
        node: &str,
        service: Option<&str>,
        interval_s: u64,
    ) -> roam_cluster::CellRecord {
        let uploaded = self
            .client
            .upload_module(workload(name))
            .await
            .expect("the planner takes the module");
        self.client
            .place(&roam_api::planner::PlaceRequest {
                module: uploaded.hash,
                args: argv(args),
                env: Vec::new(),
                dirs: Vec::new(),
                max_memory: Some(64 << 20),
                service: service.map(str::to_string),
                node: Some(node.to_string()),
                checkpoint_interval_s: Some(interval_s),
                far: None,
            })
            .await
            .expect("the planner places the cell")
    }

    /// Wait until `n` nodes are alive.
    pub async fn wait_alive(&self, n: usize) {
        wait_for("the nodes to register", Duration::from_secs(30), || async {
            let nodes = self.client.nodes().await.ok()?;
            (nodes.iter().filter(|x| x.alive).count() >= n).then_some(())
        })
        .await
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A restore of cell `id` (the `dirty` workload with `args`) from kept
/// checkpoint `snapshot` on `holder`, as its generation 2.
pub fn restore_request(
    id: &str,
    module: &str,
    args: &[&str],
    holder: &TestNode,
    snapshot: &str,
) -> roam_node::types::RestoreRequest {
    roam_node::types::RestoreRequest {
        id: id.into(),
        module: module.into(),
        args: argv(args),
        env: Vec::new(),
        dirs: Vec::new(),
        max_memory: Some(64 << 20),
        service: None,
        generation: 2,
        holder: holder.url.clone(),
        snapshot: snapshot.into(),
        cpu: Default::default(),
        far: None,
    }
}

/// Cell `id` on `node` ends well with the output of the uninterrupted run
/// `reference` on `ref_node`.
pub async fn assert_same_output(
    node: &TestNode,
    id: &str,
    ref_node: &TestNode,
    reference: &str,
    limit: Duration,
) {
    let (state, out) = node.output(id, limit).await;
    assert_eq!(state, CellState::Exited { code: 0 });
    let (_, expected) = ref_node.output(reference, limit).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&expected),
        "the restored cell's output differs from an uninterrupted run"
    );
}
