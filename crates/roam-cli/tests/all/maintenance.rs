//! A declared maintenance end to end: a planner and two real `roam node`
//! processes; `roam maintenance` declares a window on the node that runs a
//! cell. Before the window begins the planner must have moved the cell
//! away with a live migration (not restored it afterwards), and after the
//! window the node must be back in service; the cell finishes with the
//! output of an uninterrupted run.

use std::time::{Duration, Instant};

use super::common::*;

#[test]
fn a_declared_maintenance_moves_the_cells_before_it_begins() {
    let p = Planner::start(None, &["--lease", "3", "--checkpoint-interval", "0"]);
    let nodes = vec![
        ("edge-a".to_string(), node(Isa::X86_64, &p, "edge-a")),
        ("edge-b".to_string(), node(Isa::X86_64, &p, "edge-b")),
    ];
    wait_alive(&p, 2);
    let logs = || all_logs(&p, &nodes);
    let expected = std::thread::spawn(|| reference(&SMALL_LONG));
    let id = p.launch(&SMALL_LONG, &["--on", "edge-a"]);
    wait_for("the cell to allocate its state", SLOW, || {
        let c = nodes[0].1.cell(&id)?;
        (c["memory_bytes"].as_u64()? >= 8 << 20).then_some(())
    });

    // Work on edge-a in 12 s, for 3 s; the planner starts 10 s before
    // (room for a loaded machine: the move itself takes about a second).
    let declared = Instant::now();
    let out = p.roam(&[
        "maintenance",
        "edge-a",
        "--in",
        "12s",
        "--for",
        "3s",
        "--lead",
        "10s",
    ]);
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), logs());
    let said = text(&out.stdout);
    assert!(
        said.starts_with("edge-a: maintenance from ") && said.contains("drains from"),
        "{said}"
    );
    let listed = text(&p.roam(&["nodes"]).stdout);
    assert!(listed.contains("edge-a: maintenance from"), "{listed}");

    // Moved by a live migration, before the window.
    let moved = p.wait_cell(&id, "the cell to leave edge-a", |c| {
        c["owner"] == "edge-b" && c["state"]["state"] == "running"
    });
    assert!(
        declared.elapsed() < Duration::from_secs(12),
        "the cell left edge-a {:?} after the declaration, after its window began\n{}",
        declared.elapsed(),
        logs()
    );
    assert_eq!(moved["generation"], 2, "{moved}");
    let nodes_now = p.get("/v1/nodes");
    let a = nodes_now
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "edge-a")
        .unwrap();
    assert_eq!(a["state"], "draining", "{a}");
    assert_eq!(a["maintenance"]["drained"], true, "{a}");

    // After the window: back in service, the window gone.
    wait_for("edge-a back in service", SLOW, || {
        let nodes = p.get("/v1/nodes");
        let a = nodes
            .as_array()?
            .iter()
            .find(|n| n["name"] == "edge-a")?
            .clone();
        (a["state"] == "ready" && a["maintenance"].is_null()).then_some(())
    });
    assert!(declared.elapsed() >= Duration::from_secs(15));
    wait_for("the move in the planner's metrics", SLOW, || {
        let (_, m) = http_get(p.addr(), "/metrics").ok()?;
        text(&m).contains("reason=\"maintenance\"").then_some(())
    });

    let end = nodes[1].1.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", logs());
    let (st, log) = http_get(p.addr(), &format!("/v1/cells/{id}/logs")).unwrap();
    assert_eq!(st, 200, "{}", text(&log));
    assert_eq!(
        text(&log),
        text(&expected.join().unwrap()),
        "the moved cell's output differs from an uninterrupted run"
    );
}
