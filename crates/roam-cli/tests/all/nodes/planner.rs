//! The node side of the control plane: ownership transactions that keep a
//! cell from running twice when the migration link breaks after the final
//! state, and kept checkpoints that bring a cell back after its node is
//! killed, on the same ISA and across ISAs.
//!
//! The partition tests run a real `roam planner` (embedded store); the
//! kept-checkpoint tests drive the nodes' API directly, as the planner
//! does, to test the nodes' side on its own.

use roam_link::Rate;

use super::*;

/// `POST path` with raw bytes over HTTP/1.0: status and body.
pub(super) fn http_post_bytes(addr: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
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

pub(super) fn post_ok(addr: &str, path: &str, body: &Value) -> Value {
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
    wait_allocated(node, &id, args);
    id
}

/// Wait until the cell on `node` has allocated its state (it is mid-run).
fn wait_allocated(node: &Node, id: &str, args: &[&str]) {
    let state_bytes = args[0].parse::<u64>().unwrap() << 20;
    wait_for("the cell to allocate its state", SLOW, || {
        let c = node.cell(id).unwrap();
        assert_eq!(c["state"], "running", "{c}\n{}", node.log());
        (c["memory_bytes"].as_u64().unwrap() >= state_bytes).then_some(())
    });
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
    partition(Cut::AfterStart);
}

/// The same partition, struck as soon as the source sent the final state:
/// it is still in the link's delay when the link breaks, so the
/// destination may never get it. Whichever node wins ownership runs the
/// cell, exactly once.
#[test]
fn partition_at_the_final_state_runs_the_cell_exactly_once() {
    partition(Cut::AtFinal);
}

/// When the partition strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// As soon as the source is committing (the final state sent).
    AtFinal,
    /// Once the destination runs the cell (`Running` on its way back).
    AfterStart,
}

fn partition(when: Cut) {
    let expected = reference(&LOAD);
    let planner = Planner::start(None, &["--checkpoint-interval", "0"]);
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
    let nodes = wait_for("both nodes to register", SLOW, || {
        let nodes = planner.get("/v1/nodes");
        (nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["alive"] == true)
            .count()
            == 2)
            .then_some(nodes)
    });
    let dst = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "dst");
    assert_eq!(
        dst.unwrap()["migrate"],
        link.proxy().local_addr().to_string(),
        "the destination registers the advertised migration address"
    );
    let id = planner.launch(&LOAD, &["--on", "src", "--checkpoint-interval", "0"]);
    let generation = planner.cell(&id)["generation"].as_u64().unwrap();
    wait_allocated(&a, &id, &LOAD);
    let to = control.proxy().local_addr().to_string();
    let body = serde_json::json!({ "to": to, "mode": "stop-and-copy" });
    let mid = post_ok(&a.addr, &format!("/v1/cells/{id}/migrate"), &body)["migration"]
        .as_str()
        .unwrap()
        .to_string();
    if when == Cut::AfterStart {
        // The destination runs the cell: `Running` is on its way back.
        wait_for("the destination to start the cell", SLOW, || {
            (b.state(&id) == "running").then_some(())
        });
    } else {
        wait_for("the source to send the final state", SLOW, || {
            let st = a.get_json(&format!("/v1/migrations/{mid}")).unwrap();
            assert!(st["done"] != true, "the migration ended early: {st}");
            (st["phase"] == "committing").then_some(())
        });
    }
    link.proxy().handle().cut(AfterCut::Refuse);
    control.proxy().handle().cut(AfterCut::Refuse);
    let end = wait_for("the migration to end", SLOW, || {
        let st = a.get_json(&format!("/v1/migrations/{mid}")).unwrap();
        (st["done"] == true).then_some(st)
    });
    eprintln!("migration ended: {end}");
    assert!(
        a.log().contains("asking the planner for the cell back"),
        "the source did not ask the planner for the cell back\n{}",
        both_logs(&a, &b)
    );
    let rec = planner.cell(&id);
    let owner = rec["owner"].as_str().unwrap().to_string();
    assert_eq!(
        rec["generation"].as_u64().unwrap(),
        generation + 1,
        "one transaction won, exactly: {rec}\n{}",
        planner.log()
    );
    if when == Cut::AfterStart {
        assert_eq!(owner, "dst", "{rec}\n{}", both_logs(&a, &b));
    }
    // The owner ran it to the end, with the uninterrupted run's output;
    // the other node neither runs it nor ran it to the end.
    let (home, other) = if owner == "dst" { (&b, &a) } else { (&a, &b) };
    let end = home.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(
        text(&home.raw_logs(&id).unwrap()),
        text(&expected),
        "{}",
        both_logs(&a, &b)
    );
    assert!(
        !matches!(
            other.state(&id).as_str(),
            "running" | "migrating" | "exited"
        ),
        "the cell is also on the node that does not own it: {}\n{}",
        other.state(&id),
        both_logs(&a, &b)
    );
    assert!(
        other
            .raw_logs(&id)
            .is_none_or(|l| !text(&l).contains("checksum: ")),
        "the node that does not own the cell ran it to the end too\n{}",
        both_logs(&a, &b)
    );
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
    // No planner committed either checkpoint, so the holder still has the
    // first beside the second (a failed record would still name it).
    let (st, body) = http_get(
        &b.addr,
        &format!(
            "/v1/kept/{id}?snapshot={}",
            first["snapshot"].as_str().unwrap()
        ),
    )
    .unwrap();
    assert_eq!(
        st,
        200,
        "the first kept checkpoint is gone: {}",
        text(&body)
    );
    // A snapshot the holder never kept is refused, and runs nothing.
    let mut wrong = restore.clone();
    wrong["snapshot"] = serde_json::json!("0".repeat(64));
    let (st, body) = http_post(&b.addr, "/v1/cells/restore", &wrong).unwrap();
    assert_eq!(st, 404, "{}", text(&body));
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
