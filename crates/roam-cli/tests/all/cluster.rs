//! The control plane end to end: `roam planner` over the embedded store
//! and over a real etcd, real `roam node` processes registered with it
//! (one aarch64 under qemu-user), and the cluster commands.
//!
//! What must hold: a cell launched through the planner runs once, moves by
//! node name, leaves a drained node, and comes back from its kept
//! checkpoint when its node is killed, on another ISA if need be, finishing
//! with the output of an uninterrupted run; a planner leader killed is
//! replaced while the cells keep running; the embedded store survives a
//! planner restart. "Runs once" is checked on every live node: exactly one
//! of them reports the cell running or ended there.
//!
//! The tests drive the planner two ways: the `roam` commands, as an
//! operator would, and the planner's raw HTTP API (module upload, launch,
//! migrate, drain and kill, placement refusals and metrics), which the
//! commands would hide.

use std::time::Instant;

use serde_json::Value;

use super::common::*;

/// The story's workload: 8 MiB of state rewritten at 1 MiB/s for 60 s,
/// long enough for two moves, two drains and a kept checkpoint before the
/// kill, with the aarch64 node under qemu and other tests on the same cores.
const STORY: [&str; 3] = ["8", "1", "60"];

/// The whole story on the embedded store. See [`story`].
#[test]
fn embedded_cluster_launches_moves_drains_and_survives_a_killed_node() {
    story(None);
}

/// The whole story on a real etcd. See [`story`].
#[test]
fn etcd_cluster_launches_moves_drains_and_survives_a_killed_node() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    story(Some(&format!("etcd://{}", etcd.endpoint())));
}

/// Three nodes, one of them aarch64 under qemu: launch, move by name to
/// the aarch64 node, drain it, put it back in service, drain the idle
/// x86-64 node so that the cell's checkpoints are kept on the aarch64 node,
/// kill the node the cell runs on: the cell is restored on the aarch64
/// node from the checkpoint kept there and finishes with the uninterrupted
/// output, run exactly once.
fn story(store: Option<&str>) {
    let p = Planner::start(store, &["--checkpoint-interval", "1", "--lease", "5"]);
    let mut nodes = vec![
        ("a".to_string(), node(Isa::X86_64, &p, "a")),
        ("b".to_string(), node(Isa::X86_64, &p, "b")),
        ("arm".to_string(), node(Isa::Aarch64, &p, "arm")),
    ];
    wait_alive(&p, 3);
    // The uninterrupted run, meanwhile.
    let expected = std::thread::spawn(|| reference(&STORY));
    // Placed on a, so that the move below goes somewhere else. (The policy
    // alone may well pick the aarch64 node.)
    let id = p.launch(&STORY, &["--on", "a"]);

    // Moved by name.
    let ok = |out: std::process::Output, what: &str, nodes: &[(String, Node)]| {
        assert!(
            out.status.success(),
            "roam {what}: {}\n{}",
            text(&out.stderr),
            all_logs(&p, nodes)
        );
        text(&out.stdout)
    };
    ok(
        p.roam(&["migrate", &id, "--to", "arm", "--mode", "pre-copy"]),
        "migrate",
        &nodes,
    );
    assert_eq!(p.cell(&id)["owner"], "arm");

    // Drained, and back in service.
    ok(p.roam(&["drain", "arm"]), "drain", &nodes);
    let c = p.cell(&id);
    assert_ne!(c["owner"], "arm", "{c}");
    let on = c["owner"].as_str().unwrap().to_string();
    ok(p.roam(&["undrain", "arm"]), "undrain", &nodes);
    // The idle x86-64 node is drained: checkpoints can only go to arm.
    let idle = if on == "a" { "b" } else { "a" };
    let out = ok(p.roam(&["drain", idle]), "drain", &nodes);
    assert!(out.contains("is drained"), "{out}");

    // Killed.
    let c = wait_for_or(
        "a checkpoint kept on arm",
        SLOW,
        || all_logs(&p, &nodes),
        || {
            let c = p.cell(&id);
            (c["kept"]["holder"] == "arm").then_some(c)
        },
    );
    let gen = c["generation"].as_u64().unwrap();
    assert_eq!(c["owner"], on.as_str(), "{c}");
    owner_node(&c, &mut nodes).kill9();
    let c = wait_restored(&p, &id, gen, &on);
    assert_eq!(c["owner"], "arm", "restored on the holder: {c}");

    let live: Vec<&Node> = nodes
        .iter()
        .filter(|(n, _)| *n != on)
        .map(|(_, n)| n)
        .collect();
    let arm = &nodes.iter().find(|(n, _)| n == "arm").unwrap().1;
    let end = arm.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", p.log());
    assert_eq!(
        holders(&id, &live),
        vec![arm.addr.clone()],
        "the cell runs on more than one node"
    );
    let out = p.roam(&["logs", &id]);
    let expected = expected.join().unwrap();
    assert_eq!(text(&out.stdout), text(&expected), "{}", p.log());
    // The planner learned the exit from the heartbeats.
    wait_for("the planner to record the exit", SLOW, || {
        let list = p.get("/v1/cells");
        let c = list
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id.as_str())?;
        (c["state"]["state"] == "exited").then_some(())
    });
}

/// A node cut off from the planner past its lease (frozen with SIGSTOP)
/// is declared dead and its cell restored on another node from its kept
/// checkpoint. When it comes back, the planner's answer to its heartbeat
/// makes it stop its own copy: the cell runs to the end exactly once.
#[test]
fn a_node_cut_off_past_its_lease_stops_its_copy_when_it_returns() {
    let p = Planner::start(None, &["--checkpoint-interval", "1", "--lease", "5"]);
    let a = node(Isa::X86_64, &p, "a");
    let b = node(Isa::X86_64, &p, "b");
    wait_alive(&p, 2);
    let id = p.launch(&SMALL_LONG, &["--on", "a"]);
    let c = wait_kept(&p, &id);
    let gen = c["generation"].as_u64().unwrap();
    signal(a.pid(), libc::SIGSTOP);
    let restored = std::panic::catch_unwind(|| wait_restored(&p, &id, gen, "a"));
    signal(a.pid(), libc::SIGCONT);
    let c = restored.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_eq!(c["owner"], "b", "{c}");
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", a.log());
    assert!(
        end["error"].as_str().unwrap_or("").contains("another node"),
        "{end}"
    );
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(holders(&id, &[&a, &b]), vec![b.addr.clone()]);
    let out = p.roam(&["logs", &id]);
    assert_eq!(
        text(&out.stdout),
        text(&reference(&SMALL_LONG)),
        "{}",
        p.log()
    );
}

/// A node whose link to the planner is cut (the node itself keeps
/// running) pauses its cells before the planner can declare it dead, so its
/// copy does not run next to the one restored elsewhere: the link stays cut
/// until the restored copy has finished, long enough for an unfenced copy
/// to finish too. When the link comes back, the node stops its held copy.
#[test]
fn a_node_cut_off_from_the_planner_holds_its_cells_until_it_hears_back() {
    let p = Planner::start(None, &["--checkpoint-interval", "1", "--lease", "5"]);
    let port: u16 = p.url.rsplit(':').next().unwrap().parse().unwrap();
    let link = Link::start(port, roam_link::LinkConfig::transparent());
    let via = format!("http://{}", link.proxy().local_addr());
    let a = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            &via,
            "--name",
            "a",
        ],
    );
    let b = node(Isa::X86_64, &p, "b");
    wait_alive(&p, 2);
    let id = p.launch(&SMALL_LONG, &["--on", "a"]);
    let c = wait_kept(&p, &id);
    let gen = c["generation"].as_u64().unwrap();
    link.proxy().handle().cut(roam_link::AfterCut::Refuse);
    wait_for("node a to hold its cells", SLOW, || {
        a.log()
            .contains("pausing this node's planner cells")
            .then_some(())
    });
    let c = wait_restored(&p, &id, gen, "a");
    assert_eq!(c["owner"], "b", "{c}");
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    // Without the fence, a's copy, started earlier, would have ended by now.
    assert_eq!(a.cell(&id).unwrap()["state"], "running", "{}", a.log());
    link.proxy().handle().restore();
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", a.log());
    assert!(
        end["error"].as_str().unwrap_or("").contains("another node"),
        "{end}"
    );
    let out = p.roam(&["logs", &id]);
    assert_eq!(
        text(&out.stdout),
        text(&reference(&SMALL_LONG)),
        "{}",
        p.log()
    );
}

/// The embedded store survives a planner restart: nodes and cells are
/// still known, and the nodes keep heartbeating to the new process.
#[test]
fn embedded_store_survives_a_planner_restart() {
    let mut p = Planner::start(None, &["--checkpoint-interval", "0"]);
    let _a = node(Isa::X86_64, &p, "a");
    wait_alive(&p, 1);
    let id = p.launch(&SMALL_LONG, &[]);
    let before = p.cell(&id);
    p.restart();
    assert_eq!(p.cell(&id)["owner"], before["owner"]);
    assert_eq!(p.cell(&id)["module"], before["module"]);
    wait_alive(&p, 1);
}

/// Several planners on one etcd: the leader is killed while cells run; the
/// other takes over and, when a node is then killed, restores its cell.
#[test]
fn etcd_leader_killed_then_a_node_killed() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    let store = format!("etcd://{}", etcd.endpoint());
    let opts = ["--checkpoint-interval", "1", "--lease", "5"];
    let mut leader = Planner::start(Some(&store), &opts);
    wait_for("the first planner to lead", SLOW, || {
        leader.leads().then_some(())
    });
    let other = Planner::start(Some(&store), &opts);
    let both = format!("{},{}", leader.url, other.url);
    let mut nodes = vec![
        // The leader first: the nodes fail over when it dies.
        ("a".to_string(), node_of(Isa::X86_64, &both, "a")),
        ("b".to_string(), node_of(Isa::X86_64, &both, "b")),
    ];
    wait_alive(&other, 2);
    let id = other.launch(&SMALL_LONG, &[]);
    leader.kill9();
    wait_for("the other planner to lead", SLOW, || {
        other.leads().then_some(())
    });
    // The cell kept running through the change of leader, and checkpoints
    // are kept again by the new one.
    let c = wait_kept(&other, &id);
    assert_eq!(c["state"]["state"], "running", "{c}");
    let gen = c["generation"].as_u64().unwrap();
    let dead = c["owner"].as_str().unwrap().to_string();
    owner_node(&c, &mut nodes).kill9();
    let c = wait_restored(&other, &id, gen, &dead);
    let live: Vec<&Node> = nodes
        .iter()
        .filter(|(n, _)| *n != dead)
        .map(|(_, n)| n)
        .collect();
    let end = live[0].wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", other.log());
    assert!(
        live[0].log().contains("now talking to this planner"),
        "the node did not fail over to the other planner\n{}",
        live[0].log()
    );
    let out = other.roam(&["logs", &id]);
    assert_eq!(text(&out.stdout), text(&reference(&SMALL_LONG)), "{c}");
}

// ---- through the planner's HTTP API --------------------------------------

/// A planner on `store` (`None`: the embedded store in its directory), with
/// the given lease and checkpoint interval (seconds).
fn planner_on(store: Option<String>, lease: &str, checkpoint_interval: &str) -> Planner {
    let p = Planner::start(
        store.as_deref(),
        &[
            "--checkpoint-interval",
            checkpoint_interval,
            "--lease",
            lease,
        ],
    );
    // The startup line names the store it opened.
    let log = p.log();
    assert!(
        store.is_none_or(|spec| log.contains(&format!(" store {spec}"))),
        "{log}"
    );
    p
}

#[test]
fn launch_migrate_drain_and_kill_through_the_planner() {
    launch_migrate_drain_and_kill(planner_on(None, "5", "0"));
}

/// The same on the etcd store: a real etcd, started and stopped here.
#[test]
fn launch_migrate_drain_and_kill_on_etcd() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    let store = format!("etcd://{}", etcd.endpoint());
    launch_migrate_drain_and_kill(planner_on(Some(store), "5", "0"));
    drop(etcd);
}

fn launch_migrate_drain_and_kill(p: Planner) {
    let a = registered_node(&p, "edge-a");
    let b = registered_node(&p, "edge-b");
    let (st, nodes) = p.api_get("/v1/nodes");
    assert_eq!(st, 200);
    let names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["edge-a", "edge-b"]);
    assert!(nodes.as_array().unwrap().iter().all(|n| n["alive"] == true));

    let module = std::fs::read(workload(WORKLOAD)).unwrap();
    let hash = p.upload(&module);
    assert_eq!(hash, blake3::hash(&module).to_hex().as_str());

    // A launch the policy cannot place says why for each node.
    let (st, v) = p.api_post(
        "/v1/cells",
        serde_json::json!({"module": hash, "args": ["dirty"], "node": "edge-z"}),
    );
    assert_eq!(st, 503, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("edge-a: not the node asked for") && msg.contains("edge-b: not the node"),
        "{msg}"
    );

    // Launch on edge-a by name, migrate to edge-b by name.
    let mut args = vec!["dirty"];
    args.extend(SMALL);
    let (st, cell) = p.api_post(
        "/v1/cells",
        serde_json::json!({"module": hash, "args": args, "node": "edge-a"}),
    );
    assert_eq!(st, 200, "{cell}\n{}\n{}", p.log(), a.log());
    let id = cell["id"].as_str().unwrap().to_string();
    assert_eq!(cell["owner"], "edge-a");
    assert_eq!(cell["state"]["state"], "running");
    assert_eq!(cell["generation"], 1);
    wait_for("the cell to allocate its state on edge-a", SLOW, || {
        let c = a.cell(&id)?;
        (c["memory_bytes"].as_u64()? >= 8 << 20).then_some(())
    });
    let (st, m) = p.api_post(
        &format!("/v1/cells/{id}/migrate"),
        serde_json::json!({"to": "edge-b", "mode": "pre-copy"}),
    );
    assert_eq!(st, 200, "{m}\n{}", p.log());
    assert_eq!(m["to"], "edge-b");
    let moved = p.wait_cell(&id, "the planner to record the move", |c| {
        c["owner"] == "edge-b" && c["state"]["state"] == "running"
    });
    assert_eq!(moved["generation"], 2, "{moved}");
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(end["code"], 0, "{end}");
    let (st, log) = http_get(p.addr(), &format!("/v1/cells/{id}/logs")).unwrap();
    assert_eq!(st, 200, "{}", text(&log));
    assert_eq!(
        text(&log),
        text(&reference(&SMALL)),
        "the migrated cell's output differs from an uninterrupted run"
    );

    // The planner learns of the exit from the owner.
    p.wait_cell(&id, "the planner to see the exit", |c| {
        c["state"]["state"] == "exited"
    });

    // Drain edge-a: its long-running cell moves to edge-b; then kill it.
    let (st, cell) = p.api_post(
        "/v1/cells",
        serde_json::json!({"module": hash, "args": ["dirty", "8", "4", "600"],
            "node": "edge-a"}),
    );
    assert_eq!(st, 200, "{cell}\n{}", p.log());
    let id2 = cell["id"].as_str().unwrap().to_string();
    wait_for("the second cell to allocate its state", SLOW, || {
        let c = a.cell(&id2)?;
        (c["memory_bytes"].as_u64()? >= 8 << 20).then_some(())
    });
    let (st, d) = p.api_post("/v1/nodes/edge-a/drain", Value::Null);
    assert_eq!(st, 200, "{d}\n{}", p.log());
    assert_eq!(d["moves"][0]["cell"], id2.as_str(), "{d}");
    assert_eq!(d["moves"][0]["to"], "edge-b", "{d}");
    p.wait_cell(&id2, "the drained cell to run on edge-b", |c| {
        c["owner"] == "edge-b" && c["state"]["state"] == "running"
    });
    assert_eq!(b.state(&id2), "running");
    // A draining node takes no new cells.
    let (st, v) = p.api_post(
        "/v1/cells",
        serde_json::json!({"module": hash, "args": ["dirty"], "node": "edge-a"}),
    );
    assert_eq!(st, 503, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("edge-a: draining"),
        "{v}"
    );

    let (st, k) = p.api_post(&format!("/v1/cells/{id2}/kill"), Value::Null);
    assert_eq!(st, 200, "{k}\n{}", p.log());
    assert_eq!(k["state"]["state"], "killed");
    assert_eq!(b.state(&id2), "killed");

    let (st, metrics) = http_get(p.addr(), "/metrics").unwrap();
    assert_eq!(st, 200);
    let metrics = text(&metrics);
    assert!(
        metrics.contains("roam_planner_placements_total{policy=\"manual\",result=\"placed\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("roam_planner_cells{state=\"killed\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_killed_node_loses_no_cell() {
    let p = planner_on(None, "5", "1");
    let mut a = registered_node(&p, "edge-a");
    let b = registered_node(&p, "edge-b");
    let module = std::fs::read(workload(WORKLOAD)).unwrap();
    let hash = p.upload(&module);
    let mut args = vec!["dirty"];
    args.extend(SMALL);
    let (st, cell) = p.api_post(
        "/v1/cells",
        serde_json::json!({"module": hash, "args": args, "node": "edge-a",
            "checkpoint_interval_s": 1}),
    );
    assert_eq!(st, 200, "{cell}\n{}\n{}", p.log(), a.log());
    let id = cell["id"].as_str().unwrap().to_string();
    // A checkpoint kept on edge-b, taken while the cell runs on edge-a.
    let kept = p.wait_cell(&id, "a kept checkpoint", |c| {
        c["kept"]["holder"] == "edge-b"
    });
    assert_eq!(kept["owner"], "edge-a", "{kept}");
    let killed = Instant::now();
    a.kill9();
    let back = p.wait_cell(&id, "the cell restored on edge-b", |c| {
        c["owner"] == "edge-b" && c["state"]["state"] == "running"
    });
    // Reported, not asserted: the lease (2 s) plus detection and restore.
    eprintln!(
        "the cell ran again on edge-b {:.1} s after edge-a was killed (lease 5 s)",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(back["generation"], 2, "{back}\n{}", p.log());
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}\n{}", b.log(), p.log());
    assert_eq!(end["code"], 0, "{end}");
    let log = b.raw_logs(&id).unwrap();
    assert_eq!(
        text(&log),
        text(&reference(&SMALL)),
        "the restored cell's output differs from an uninterrupted run"
    );
}
