//! A simulated fleet: many lightweight nodes in one process, each with the
//! node API under its own path (`http://HOST:PORT/n/NAME/v1/...`), each
//! registering and heartbeating with the planner like `roam node
//! --planner` does.
//!
//! Why simulated: a thousand real nodes would need a thousand machines. The
//! planner cannot tell the difference: it sees registrations, heartbeats
//! and node API answers of the right shape, and drives the nodes through
//! the same client it uses for real ones. The cells do not run; what is
//! measured is the planner and its store.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use roam_api::planner::{HeartbeatRequest, HeartbeatResponse, NodeStatus, RegisterRequest};
use roam_api::sysinfo::Machine;
use roam_api::types::{CellInfo, CellState, LaunchResponse, ModuleInfo, NodeInfo};
use serde_json::{json, Value};

/// One simulated node.
pub struct SimNode {
    pub name: String,
    cells: Mutex<BTreeSet<String>>,
    /// Cleared to make the node "die": it stops heartbeating and answering.
    pub alive: AtomicBool,
}

/// The fleet, shared by the node API server and the heartbeat tasks.
pub struct Fleet {
    pub nodes: HashMap<String, Arc<SimNode>>,
    /// Heartbeat round trips, microseconds.
    pub beats: Mutex<Vec<u64>>,
    /// Heartbeats answered 410 (lease expired) and other failures.
    pub expired: AtomicU64,
    pub failed: AtomicU64,
    seq: AtomicU64,
}

impl Fleet {
    pub fn new(n: usize) -> Arc<Fleet> {
        let nodes = (0..n)
            .map(|i| {
                let name = format!("sim-{i:05}");
                let node = SimNode {
                    name: name.clone(),
                    cells: Mutex::new(BTreeSet::new()),
                    alive: AtomicBool::new(true),
                };
                (name, Arc::new(node))
            })
            .collect();
        Arc::new(Fleet {
            nodes,
            beats: Mutex::new(Vec::new()),
            expired: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            seq: AtomicU64::new(0),
        })
    }

    fn node(&self, name: &str) -> Result<&Arc<SimNode>, StatusCode> {
        match self.nodes.get(name) {
            Some(n) if n.alive.load(Ordering::Relaxed) => Ok(n),
            // A dead node does not answer: the closest an in-process
            // server gets is an error status.
            Some(_) => Err(StatusCode::SERVICE_UNAVAILABLE),
            None => Err(StatusCode::NOT_FOUND),
        }
    }
}

fn machine() -> Machine {
    Machine {
        cores: 4,
        memory_total: 8 << 30,
        memory_available: 6 << 30,
        load1: 0.5,
    }
}

fn info(id: &str, state: CellState) -> CellInfo {
    CellInfo {
        id: id.to_string(),
        state,
        program: "sim".into(),
        module: String::new(),
        memory_bytes: 1 << 20,
        max_memory: 64 << 20,
        log_dropped_bytes: 0,
        uptime_ms: 0,
        hops: 0,
        service: None,
        cpu: None,
        far: None,
        memory_lost: false,
        cpu_ms: None,
        threads: None,
    }
}

type Fl = State<Arc<Fleet>>;

async fn node_info(State(f): Fl, Path(n): Path<String>) -> Result<Json<NodeInfo>, StatusCode> {
    let node = f.node(&n)?;
    Ok(Json(NodeInfo {
        name: node.name.clone(),
        isa: "x86_64".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        migrate_addr: "127.0.0.1:1".into(),
        userfaultfd: false,
        cells_running: node.cells.lock().unwrap().len(),
        machine: machine(),
        cpu: None,
    }))
}

async fn upload(
    State(f): Fl,
    Path(n): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<ModuleInfo>, StatusCode> {
    f.node(&n)?;
    Ok(Json(ModuleInfo {
        hash: blake3::hash(&body).to_hex().to_string(),
        bytes: body.len() as u64,
    }))
}

/// `POST /v1/cells` and `POST /v1/cells/restore`: take the id the planner
/// gives, or make one.
async fn start_cell(
    State(f): Fl,
    Path(n): Path<String>,
    Json(req): Json<Value>,
) -> Result<Json<LaunchResponse>, StatusCode> {
    let node = f.node(&n)?;
    let id = match req.get("id").and_then(Value::as_str) {
        Some(id) => id.to_string(),
        None => format!("c-sim{:08x}", f.seq.fetch_add(1, Ordering::Relaxed)),
    };
    node.cells.lock().unwrap().insert(id.clone());
    Ok(Json(LaunchResponse { id }))
}

async fn restore(
    State(f): Fl,
    Path(n): Path<String>,
    Json(req): Json<Value>,
) -> Result<Json<CellInfo>, StatusCode> {
    let node = f.node(&n)?;
    let id = req
        .get("id")
        .and_then(Value::as_str)
        .ok_or(StatusCode::BAD_REQUEST)?
        .to_string();
    node.cells.lock().unwrap().insert(id.clone());
    Ok(Json(info(&id, CellState::Running)))
}

async fn cells(State(f): Fl, Path(n): Path<String>) -> Result<Json<Vec<CellInfo>>, StatusCode> {
    let node = f.node(&n)?;
    let ids = node.cells.lock().unwrap().clone();
    Ok(Json(
        ids.iter().map(|id| info(id, CellState::Running)).collect(),
    ))
}

async fn cell(
    State(f): Fl,
    Path((n, id)): Path<(String, String)>,
) -> Result<Json<CellInfo>, StatusCode> {
    let node = f.node(&n)?;
    if !node.cells.lock().unwrap().contains(&id) {
        return Err(StatusCode::NOT_FOUND);
    }
    Ok(Json(info(&id, CellState::Running)))
}

async fn kill(
    State(f): Fl,
    Path((n, id)): Path<(String, String)>,
) -> Result<Json<CellInfo>, StatusCode> {
    let node = f.node(&n)?;
    node.cells.lock().unwrap().remove(&id);
    Ok(Json(info(&id, CellState::Killed)))
}

/// A kept checkpoint "sent" to the holder: a made-up snapshot of 1 MiB.
async fn keep(
    State(f): Fl,
    Path((n, id)): Path<(String, String)>,
) -> Result<Json<Value>, StatusCode> {
    f.node(&n)?;
    Ok(Json(json!({
        "snapshot": blake3::hash(id.as_bytes()).to_hex().to_string(),
        "bytes": 1u64 << 20,
        "sent_bytes": 1u64 << 20,
        "taken_ms": 1,
    })))
}

/// The node API of every simulated node.
pub fn router(fleet: Arc<Fleet>) -> Router {
    Router::new()
        .route("/n/{n}/v1/node", get(node_info))
        .route("/n/{n}/v1/modules", post(upload))
        .route("/n/{n}/v1/cells", post(start_cell).get(cells))
        .route("/n/{n}/v1/cells/restore", post(restore))
        .route("/n/{n}/v1/cells/{id}", get(cell))
        .route("/n/{n}/v1/cells/{id}/kill", post(kill))
        .route("/n/{n}/v1/cells/{id}/keep", post(keep))
        .with_state(fleet)
}

/// Register `node` with the planner at `planner` (a base URL); the
/// heartbeat period it asks for.
pub async fn register(
    http: &reqwest::Client,
    planner: &str,
    api_base: &str,
    node: &SimNode,
) -> anyhow::Result<Duration> {
    let req = RegisterRequest {
        name: node.name.clone(),
        isa: "x86_64".into(),
        api: format!("{api_base}/n/{}", node.name),
        migrate: "127.0.0.1:1".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        status: status(node),
    };
    let r = http
        .post(format!("{planner}/v1/nodes"))
        .json(&req)
        .send()
        .await?;
    if !r.status().is_success() {
        anyhow::bail!(
            "registering {} answered {}: {}",
            node.name,
            r.status(),
            r.text().await.unwrap_or_default()
        );
    }
    let a: HeartbeatResponse = r.json().await?;
    Ok(Duration::from_millis(a.heartbeat_ms.max(100)))
}

fn status(node: &SimNode) -> NodeStatus {
    NodeStatus {
        machine: machine(),
        cells: node.cells.lock().unwrap().iter().cloned().collect(),
        gateway: None,
        usage: vec![],
        power: None,
        memory_server: None,
    }
}

/// Heartbeat `node` every `period` until it is made to die or `stop` is
/// set; round trips go to the fleet's record.
pub async fn heartbeat_loop(
    fleet: Arc<Fleet>,
    http: reqwest::Client,
    planner: String,
    api_base: String,
    node: Arc<SimNode>,
    mut period: Duration,
    stop: Arc<AtomicBool>,
) {
    // Spread the fleet over the period, as independent machines would be.
    let offset = node.name[4..].parse::<u64>().unwrap_or(0) % 997;
    tokio::time::sleep(period.mul_f64(offset as f64 / 997.0)).await;
    while !stop.load(Ordering::Relaxed) && node.alive.load(Ordering::Relaxed) {
        let next = Instant::now() + period;
        let t = Instant::now();
        let r = http
            .post(format!("{planner}/v1/nodes/{}/heartbeat", node.name))
            .json(&HeartbeatRequest {
                status: status(&node),
            })
            .send()
            .await;
        match r {
            Ok(r) if r.status() == StatusCode::GONE => {
                fleet.expired.fetch_add(1, Ordering::Relaxed);
                if let Ok(p) = register(&http, &planner, &api_base, &node).await {
                    period = p;
                }
            }
            Ok(r) if r.status().is_success() => {
                let us = t.elapsed().as_micros() as u64;
                fleet.beats.lock().unwrap().push(us);
                if let Ok(a) = r.json::<HeartbeatResponse>().await {
                    let mut cells = node.cells.lock().unwrap();
                    for id in &a.stop {
                        cells.remove(id);
                    }
                }
            }
            _ => {
                fleet.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep_until(next.into()).await;
    }
}
