//! `offload-by-slowdown` end to end: a planner under the policy, a server
//! and a slower node (declared speeds 1 and 0.25), one core each. Two
//! CPU-busy cells launched without a node both start on the server (it is
//! one over while a slower core is free); nothing but the planner moves
//! one of them to the slower node. Both finish with the output of an
//! uninterrupted run, and the planner has learned the program's CPU time
//! from both runs, the one split across the nodes included: `roam
//! slowdowns` and `GET /v1/slowdowns` show it.

use super::common::*;

/// 8 MiB of state rewritten at 200 MiB/s for 20 s: a core kept busy.
const BUSY: [&str; 3] = ["8", "200", "20"];

/// A node of one core with declared speed `speed`.
fn node(p: &Planner, name: &str, speed: &str) -> Node {
    let model = format!("idle=10,busy=5,speed={speed}");
    powered_with(p, name, &model, &["--cores", "1"])
}

#[test]
fn offload_by_slowdown_moves_one_of_two_cells_off_a_full_server_and_learns() {
    let p = Planner::start(None, &["--lease", "3", "--checkpoint-interval", "0"]);
    let out = p.roam(&["policy", "offload-by-slowdown"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let nodes = vec![
        ("server".to_string(), node(&p, "server", "1")),
        ("board".to_string(), node(&p, "board", "0.25")),
    ];
    wait_alive(&p, 2);
    let logs = || all_logs(&p, &nodes);
    let out = p.roam(&["slowdowns"]);
    assert!(
        text(&out.stdout).contains("nothing learned yet"),
        "{}",
        text(&out.stdout)
    );
    let expected = std::thread::spawn(|| reference(&BUSY));
    let ids = [p.launch(&BUSY, &[]), p.launch(&BUSY, &[])];
    for id in &ids {
        assert_eq!(p.cell(id)["owner"], "server", "{}", logs());
    }
    wait_one_moved(&p, &nodes, &ids, "board");
    // The decision says why, with the prediction behind it: nothing is
    // learned yet, so the declared speeds (1 ÷ 0.25).
    wait_for("the offload among the planner's decisions", SLOW, || {
        let (_, d) = http_get(p.addr(), "/v1/dashboard/decisions").ok()?;
        let d = text(&d);
        (d.contains("offload:") && d.contains("4.0× slower there (declared speeds)")).then_some(())
    });
    // The moved cell may come back: when the server's other cell ends
    // first (a loaded machine), the server has a free core and runs it 4×
    // faster, so the policy brings it back. That is the policy at work too.
    expect_exits_moved(&p, &nodes, &ids, &text(&expected.join().unwrap()), 2);
    let came_back = ids.iter().any(|id| p.cell(id)["generation"] == 3);
    // Both runs ended on x86-64: two whole observations of its time, the
    // moved one's two stints added up.
    let learned = wait_for("both runs learned", SLOW, || {
        // Reading a cell settles its end; the table follows.
        for id in &ids {
            p.cell(id);
        }
        let t = p.get("/v1/slowdowns");
        let prog = t["programs"].as_object()?.values().next()?.clone();
        (prog["isas"]["x86_64"]["runs"].as_f64()? >= 2.0).then_some(prog)
    });
    assert_eq!(
        learned["isas"]["x86_64"]["runs"].as_f64(),
        Some(2.0),
        "{learned}"
    );
    // Each run's CPU time is what its nodes report for it, summed over
    // the nodes it ran on (the source keeps the moved cell's figure); the
    // estimate after two runs is their mean.
    let run_ms = |id: &str| -> u64 {
        nodes
            .iter()
            .filter_map(|(_, n)| {
                let (st, body) = http_get(&n.addr, &format!("/v1/cells/{id}")).ok()?;
                let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                (st == 200).then(|| v["cpu_ms"].as_u64().expect("cpu_ms reported"))
            })
            .sum()
    };
    let (a, b) = (run_ms(&ids[0]), run_ms(&ids[1]));
    assert!(a > 0 && b > 0, "{a} {b}");
    let ms = learned["isas"]["x86_64"]["cpu_ms"].as_f64().unwrap();
    if came_back {
        // The server's record of a cell that came back holds only its last
        // stint there, so the nodes' figures no longer add up to the run;
        // the planner read each stint as it ended.
        assert!(ms >= (a.min(b)) as f64 / 2.0, "{learned}\n{}", logs());
    } else {
        assert_eq!(ms, (a + b) as f64 / 2.0, "{learned}\n{}", logs());
    }
    let out = text(&p.roam(&["slowdowns"]).stdout);
    assert!(out.contains("dirty") && out.contains("x86_64"), "{out}");
    assert!(out.contains("(2.0 runs)"), "{out}");
}
