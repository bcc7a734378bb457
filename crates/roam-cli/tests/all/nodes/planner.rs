//! The node side of the control plane: ownership transactions that keep a
//! cell from running twice when the migration link breaks after the final
//! state, and kept checkpoints that bring a cell back after its node is
//! killed, on the same ISA and across ISAs.
//!
//! The planner here is a **test stand-in**, not `roam planner`: an axum
//! server inside this file answering registration, heartbeats and the
//! ownership transaction (a compare-and-swap over a map), so that the
//! nodes' side is tested on its own. Kept checkpoints are driven through
//! the nodes' API, as the planner drives them.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use roam_link::Rate;

use super::*;

/// Test stand-in for the planner: the nodes registered, and every cell's
/// owner and generation.
#[derive(Default)]
struct StandInState {
    nodes: HashMap<String, Value>,
    cells: HashMap<String, (String, u64)>,
    /// Every ownership transaction asked: (cell, request, won).
    asked: Vec<(String, Value, bool)>,
    /// Registrations, in order (node names).
    registered: Vec<String>,
    /// Cells every heartbeat answer tells the node to stop.
    stop: Vec<String>,
}

type Shared = Arc<Mutex<StandInState>>;

/// A test stand-in for the planner (see the module docs), on a free
/// loopback port.
struct StandInPlanner {
    url: String,
    state: Shared,
    _rt: tokio::runtime::Runtime,
}

impl StandInPlanner {
    fn start() -> StandInPlanner {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let state = Shared::default();
        let app = Router::new()
            .route("/v1/nodes", post(register))
            .route("/v1/nodes/{name}/heartbeat", post(heartbeat))
            .route("/v1/cells/{id}/owner", post(owner))
            .with_state(state.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        rt.spawn(async move { axum::serve(listener, app).await });
        StandInPlanner {
            url,
            state,
            _rt: rt,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StandInState> {
        self.state.lock().unwrap()
    }

    /// The cell was placed on `owner` at `generation`.
    fn place(&self, id: &str, owner: &str, generation: u64) {
        self.lock()
            .cells
            .insert(id.to_string(), (owner.to_string(), generation));
    }
}

fn answer(s: &StandInState) -> Value {
    serde_json::json!({ "heartbeat_ms": 300, "lease_ms": 5000, "stop": s.stop })
}

async fn register(State(s): State<Shared>, Json(r): Json<Value>) -> Json<Value> {
    let name = r["name"].as_str().unwrap_or_default().to_string();
    let mut s = s.lock().unwrap();
    s.registered.push(name.clone());
    s.nodes.insert(name, r);
    Json(answer(&s))
}

async fn heartbeat(
    State(s): State<Shared>,
    Path(name): Path<String>,
    Json(r): Json<Value>,
) -> Result<Json<Value>, StatusCode> {
    let mut s = s.lock().unwrap();
    match s.nodes.get_mut(&name) {
        Some(node) => {
            node["status"] = r["status"].clone();
            Ok(Json(answer(&s)))
        }
        None => Err(StatusCode::GONE),
    }
}

async fn owner(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Json(r): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut s = s.lock().unwrap();
    let cur = s.cells.get(&id).cloned();
    let won = cur.as_ref().is_some_and(|(o, g)| {
        Some(o.as_str()) == r["from"].as_str() && Some(*g) == r["generation"].as_u64()
    });
    s.asked.push((id.clone(), r.clone(), won));
    match (won, cur) {
        (true, Some((_, g))) => {
            let to = r["to"].as_str().unwrap_or_default().to_string();
            s.cells.insert(id, (to.clone(), g + 1));
            (
                StatusCode::OK,
                Json(serde_json::json!({ "owner": to, "generation": g + 1 })),
            )
        }
        (_, cur) => (
            StatusCode::CONFLICT,
            Json(serde_json::json!({ "error": format!("the transaction lost: {cur:?}") })),
        ),
    }
}

/// `POST path` with raw bytes over HTTP/1.0: status and body.
fn http_post_bytes(addr: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, buf[end + 4..].to_vec())
}

fn post_ok(addr: &str, path: &str, body: &Value) -> Value {
    let (st, b) = http_post(addr, path, body).unwrap();
    assert_eq!(st, 200, "POST {path}: {}", text(&b));
    serde_json::from_slice(&b).unwrap()
}

/// Upload the workload to `node` and launch it there as a planner's cell
/// at `generation`; the cell id, once the program allocated its state.
fn launch_owned(node: &Node, args: &[&str], generation: u64) -> String {
    let module = std::fs::read(workload(WORKLOAD)).unwrap();
    let (st, b) = http_post_bytes(&node.addr, "/v1/modules", &module);
    assert_eq!(st, 200, "{}", text(&b));
    let hash = serde_json::from_slice::<Value>(&b).unwrap()["hash"]
        .as_str()
        .unwrap()
        .to_string();
    let mut argv = vec![WORKLOAD.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let body = serde_json::json!({ "module": hash, "args": argv, "generation": generation });
    let id = post_ok(&node.addr, "/v1/cells", &body)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let state_bytes = args[0].parse::<u64>().unwrap() << 20;
    wait_for("the cell to allocate its state", SLOW, || {
        let c = node.cell(&id).unwrap();
        assert_eq!(c["state"], "running", "{c}\n{}", node.log());
        (c["memory_bytes"].as_u64().unwrap() >= state_bytes).then_some(())
    });
    id
}

/// 32 MiB of state rewritten at 4 MiB/s for 20 s.
const LOAD: [&str; 3] = ["32", "4", "20"];
/// One-way delay of the migration link: `Running` takes this long to come
/// back, the window in which the test cuts.
const DELAY: Duration = Duration::from_millis(800);

/// The link between source and destination breaks after the destination
/// got the final state and started the cell, before `Running` reaches the
/// source; the source cannot reach the destination's control API either
/// (so it cannot ask it to resolve), but both reach the planner. Without
/// the ownership transaction the source would resume its copy; with it,
/// the destination took ownership before starting, the source's request
/// to take the cell back loses, and the cell runs exactly once.
#[test]
fn partition_after_final_runs_the_cell_exactly_once() {
    let expected = reference(&LOAD);
    let planner = StandInPlanner::start();
    let port = free_port();
    let link = Link::start(port, LinkConfig::symmetric(Rate::UNLIMITED, DELAY));
    let a = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            &planner.url,
            "--name",
            "src",
        ],
    );
    let b = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-migrate",
            &link.proxy().local_addr().to_string(),
            "--planner",
            &planner.url,
            "--name",
            "dst",
        ],
    );
    // The source reaches the destination's control API only through this
    // proxy, cut with the migration link.
    let b_port: u16 = b.addr.rsplit(':').next().unwrap().parse().unwrap();
    let control = Link::start(b_port, LinkConfig::transparent());
    wait_for("both nodes to register", SLOW, || {
        let s = planner.lock();
        (s.nodes.contains_key("src") && s.nodes.contains_key("dst")).then_some(())
    });
    assert_eq!(
        planner.lock().nodes["dst"]["migrate"],
        link.proxy().local_addr().to_string(),
        "the destination registers the advertised migration address"
    );
    let id = launch_owned(&a, &LOAD, 1);
    planner.place(&id, "src", 1);
    let to = control.proxy().local_addr().to_string();
    let body = serde_json::json!({ "to": to, "mode": "stop-and-copy" });
    let mid = post_ok(&a.addr, &format!("/v1/cells/{id}/migrate"), &body)["migration"]
        .as_str()
        .unwrap()
        .to_string();
    // The destination runs the cell: `Running` is on its way back.
    wait_for("the destination to start the cell", SLOW, || {
        (b.state(&id) == "running").then_some(())
    });
    link.proxy().handle().cut(AfterCut::Refuse);
    control.proxy().handle().cut(AfterCut::Refuse);
    let end = wait_for("the migration to end", SLOW, || {
        let st = a.get_json(&format!("/v1/migrations/{mid}")).unwrap();
        (st["done"] == true).then_some(st)
    });
    eprintln!("migration ended: {end}");
    let asked = planner.lock().asked.clone();
    eprintln!("ownership transactions: {asked:?}");
    assert!(
        asked
            .iter()
            .any(|(c, r, won)| c == &id && r["to"] == "dst" && *won),
        "the destination started the cell without taking ownership: {asked:?}\n{}",
        both_logs(&a, &b)
    );
    assert!(
        asked
            .iter()
            .any(|(c, r, won)| c == &id && r["from"] == "src" && r["to"] == "src" && !*won),
        "the source did not ask for the cell back, or won it: {asked:?}\n{}",
        both_logs(&a, &b)
    );
    assert_eq!(planner.lock().cells[&id], ("dst".to_string(), 2));
    assert_eq!(a.state(&id), "moved", "{}", both_logs(&a, &b));
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(
        text(&b.raw_logs(&id).unwrap()),
        text(&expected),
        "{}",
        both_logs(&a, &b)
    );
    assert!(
        a.raw_logs(&id)
            .is_none_or(|l| !text(&l).contains("checksum: ")),
        "the source ran the cell to the end too\n{}",
        both_logs(&a, &b)
    );
}

/// The planner declared the node dead (its lease expired: `410`) and
/// restored its cell elsewhere: the node registers again, and stops the
/// cell the planner names in `stop`, saying why.
#[test]
fn a_fenced_node_registers_again_and_stops_the_cells_it_lost() {
    let planner = StandInPlanner::start();
    let a = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            &planner.url,
            "--name",
            "fenced",
        ],
    );
    wait_for("the node to register", SLOW, || {
        planner.lock().nodes.contains_key("fenced").then_some(())
    });
    let id = launch_owned(&a, &LOAD, 1);
    let other = launch_owned(&a, &LOAD, 1);
    let beat = wait_for("a heartbeat naming both cells", SLOW, || {
        let s = planner.lock();
        let cells = s.nodes.get("fenced").map(|n| n["status"]["cells"].clone());
        drop(s);
        cells.filter(|c| c.as_array().is_some_and(|c| c.len() == 2))
    });
    eprintln!("registered status cells: {beat}");
    {
        // The lease expired: the planner forgot the node, and gave `id`
        // to another node.
        let mut s = planner.lock();
        s.nodes.remove("fenced");
        s.stop = vec![id.clone()];
    }
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", a.log());
    assert!(
        end["error"].as_str().unwrap_or("").contains("another node"),
        "{end}"
    );
    assert_eq!(
        planner.lock().registered,
        vec!["fenced".to_string(), "fenced".to_string()],
        "the node did not register again after 410\n{}",
        a.log()
    );
    assert_eq!(a.state(&other), "running", "a cell it still owns stopped");
    // Logged once per change of state, not per attempt.
    assert_eq!(a.log().matches("lease expired").count(), 1, "{}", a.log());
}

/// Keep two checkpoints of a running cell on `to`'s node, kill the owner
/// with SIGKILL, restore the cell on the holder from the newest one: it
/// finishes with the output of an uninterrupted run, and the second
/// checkpoint sent far fewer bytes than the first.
fn keep_kill_restore(to: Isa) {
    // 32 MiB rewritten at 2 MiB/s for 16 s: a second checkpoint a second
    // after the first finds about 2 MiB changed.
    let args = ["32", "2", "16"];
    let expected = reference(&args);
    let mut a = Node::start_with(
        Isa::X86_64,
        &["--migrate-listen", "127.0.0.1:0", "--name", "owner"],
    );
    let b = Node::start_with(to, &["--migrate-listen", "127.0.0.1:0", "--name", "holder"]);
    let id = launch_owned(&a, &args, 1);
    // Let it finish filling its state: from then on it rewrites 2 MiB/s.
    std::thread::sleep(Duration::from_secs(3));
    let keep = serde_json::json!({ "holder": b.addr, "holder_name": "holder" });
    let first = post_ok(&a.addr, &format!("/v1/cells/{id}/keep"), &keep);
    std::thread::sleep(Duration::from_secs(1));
    let second = post_ok(&a.addr, &format!("/v1/cells/{id}/keep"), &keep);
    eprintln!("first keep: {first}\nsecond keep: {second}");
    let (s1, s2) = (
        first["sent_bytes"].as_u64().unwrap(),
        second["sent_bytes"].as_u64().unwrap(),
    );
    assert!(
        s1 > 16 << 20,
        "the first keep sent only {s1} bytes: {first}"
    );
    assert!(
        s2 * 3 < s1,
        "the second keep sent {s2} bytes, the first {s1}: no dedup"
    );
    assert_ne!(first["snapshot"], second["snapshot"]);
    let metrics = {
        let (st, body) = http_get(&a.addr, "/metrics").unwrap();
        assert_eq!(st, 200);
        text(&body)
    };
    assert!(
        metrics.contains("roam_node_kept_checkpoints_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "roam_node_kept_checkpoint_sent_bytes_total {}",
            s1 + s2
        )),
        "{metrics}"
    );
    assert_eq!(
        a.state(&id),
        "running",
        "the cell stopped for its checkpoints"
    );
    a.kill9();
    // The holder needs the module (the planner uploads it first).
    let module = std::fs::read(workload(WORKLOAD)).unwrap();
    let (st, m) = http_post_bytes(&b.addr, "/v1/modules", &module);
    assert_eq!(st, 200, "{}", text(&m));
    let hash = serde_json::from_slice::<Value>(&m).unwrap()["hash"].clone();
    let mut argv = vec![WORKLOAD.to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let restore = serde_json::json!({
        "id": id, "module": hash, "args": argv, "generation": 2,
        "holder": b.addr, "snapshot": second["snapshot"],
    });
    // A snapshot the holder does not have is refused, and runs nothing.
    let mut wrong = restore.clone();
    wrong["snapshot"] = first["snapshot"].clone();
    let (st, body) = http_post(&b.addr, "/v1/cells/restore", &wrong).unwrap();
    assert_eq!(st, 400, "{}", text(&body));
    assert!(b.cell(&id).is_none(), "a refused restore left a cell");
    let restored = post_ok(&b.addr, "/v1/cells/restore", &restore);
    assert_eq!(restored["state"], "running", "{restored}");
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(
        text(&b.raw_logs(&id).unwrap()),
        text(&expected),
        "the restored cell's output differs from an uninterrupted run\n{}",
        b.log()
    );
}

#[test]
fn kept_checkpoint_survives_a_killed_owner() {
    keep_kill_restore(Isa::X86_64);
}

#[test]
fn kept_checkpoint_restores_across_isas() {
    keep_kill_restore(Isa::Aarch64);
}
