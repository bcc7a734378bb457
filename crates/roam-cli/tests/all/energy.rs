//! The planner's energy policies end to end: two `roam node` processes
//! that declare power models (a server where a unit of work costs 12 J, a
//! board where it costs 4 J), a planner under `energy-unbalanced`, and a
//! CPU-busy cell launched on the server by name. Nothing but the planner
//! moves it: it must go to the board, once, and finish with the output of
//! an uninterrupted run; a new cell must be placed on the board's free
//! core; and the nodes' estimates must reach `roam nodes`, the node's and
//! the planner's `/metrics`.

use super::common::*;

/// 8 MiB of state rewritten at 200 MiB/s for 20 s: a core kept busy.
const BUSY: [&str; 3] = ["8", "200", "20"];

fn powered(p: &Planner, name: &str, model: &str) -> Node {
    powered_with(p, name, model, &[])
}

#[test]
fn energy_unbalanced_moves_a_busy_cell_to_the_cheaper_node() {
    // A lease of 3 s: heartbeats every second.
    let p = Planner::start(None, &["--lease", "3", "--checkpoint-interval", "0"]);
    let out = p.roam(&["policy", "energy-unbalanced"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("* energy-unbalanced"),
        "{}",
        text(&out.stdout)
    );
    let nodes = vec![
        (
            "server".to_string(),
            powered(&p, "server", "idle=50,busy=12"),
        ),
        (
            "board".to_string(),
            powered(&p, "board", "idle=2,busy=1,speed=0.25"),
        ),
    ];
    wait_alive(&p, 2);
    let logs = || all_logs(&p, &nodes);
    let expected = std::thread::spawn(|| reference(&BUSY));
    let id = p.launch(&BUSY, &["--on", "server"]);

    let t = std::time::Instant::now();
    let moved = loop {
        let c = p.cell(&id);
        if c["owner"] == "board" && c["state"]["state"] == "running" {
            break c;
        }
        assert!(
            matches!(c["state"]["state"].as_str(), Some("running" | "migrating")),
            "the cell ended on the server before the planner moved it: {c}\n{}",
            logs()
        );
        assert!(
            t.elapsed() < SLOW,
            "the cell did not move to the board: {c}\n{}\n{}",
            p.get("/v1/nodes"),
            logs()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(moved["generation"], 2, "{moved}\n{}", logs());

    // Under energy-unbalanced a new cell goes to the cheapest free core:
    // the board has two cores and one cell.
    let small = p.launch(&SMALL, &[]);
    assert_eq!(p.cell(&small)["owner"], "board", "{}", logs());

    // The estimates, where people and Prometheus read them.
    let listed = text(&p.roam(&["nodes"]).stdout);
    assert!(listed.contains("POWER"), "{listed}");
    assert!(
        listed.contains("2 of 2 live nodes report power"),
        "{listed}"
    );
    let board = &nodes[1].1;
    let (_, m) = http_get(&board.addr, "/metrics").unwrap();
    let m = text(&m);
    // The samples themselves, not only their metadata.
    assert!(m.contains("\nroam_node_power_watts "), "{m}");
    assert!(m.contains("\nroam_node_energy_joules "), "{m}");
    let (_, m) = http_get(p.addr(), "/metrics").unwrap();
    let m = text(&m);
    assert!(
        m.contains("roam_planner_node_power_watts{node=\"server\"}"),
        "{m}"
    );
    // The move is counted once the planner has seen its migration end.
    wait_for("the move in the planner's metrics", SLOW, || {
        let (_, m) = http_get(p.addr(), "/metrics").ok()?;
        text(&m)
            .contains("reason=\"energy-unbalanced\"")
            .then_some(())
    });
    // The server's estimate counts its idle draw: at least 50 W for every
    // second it has been up.
    let server = p
        .get("/v1/nodes")
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "server")
        .unwrap()
        .clone();
    let power = &server["status"]["power"];
    assert!(power["watts"].as_f64().unwrap() >= 50.0, "{power}");
    assert!(power["joules"].as_f64().unwrap() >= 50.0, "{power}");

    // It stays on the board (the server is never cheaper) and finishes
    // with the uninterrupted run's output.
    let end = board.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", logs());
    assert_eq!(
        p.cell(&id)["generation"],
        2,
        "the cell moved again\n{}",
        logs()
    );
    let (st, log) = http_get(p.addr(), &format!("/v1/cells/{id}/logs")).unwrap();
    assert_eq!(st, 200, "{}", text(&log));
    assert_eq!(
        text(&log),
        text(&expected.join().unwrap()),
        "the moved cell's output differs from an uninterrupted run"
    );
}

/// `energy-balanced`: two busy cells launched on one node of one core;
/// the planner moves one of them to the other node by itself, and both
/// finish with the uninterrupted run's output.
#[test]
fn energy_balanced_evens_busy_cells_out() {
    let p = Planner::start(None, &["--lease", "3", "--checkpoint-interval", "0"]);
    let out = p.roam(&["policy", "energy-balanced"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let one = ["--cores", "1"];
    let nodes = vec![
        (
            "a".to_string(),
            powered_with(&p, "a", "idle=50,busy=12", &one),
        ),
        (
            "b".to_string(),
            powered_with(&p, "b", "idle=50,busy=12", &one),
        ),
    ];
    wait_alive(&p, 2);
    let expected = std::thread::spawn(|| reference(&BUSY));
    let ids = [
        p.launch(&BUSY, &["--on", "a"]),
        p.launch(&BUSY, &["--on", "a"]),
    ];
    wait_one_moved(&p, &nodes, &ids, "b");
    // Counted once the planner has seen the migration end.
    wait_for("the move in the planner's metrics", SLOW, || {
        let (_, m) = http_get(p.addr(), "/metrics").ok()?;
        text(&m)
            .contains("reason=\"energy-balanced\"")
            .then_some(())
    });
    // Neither moved twice: one stayed, one moved once.
    expect_exits(&p, &nodes, &ids, &text(&expected.join().unwrap()));
}
