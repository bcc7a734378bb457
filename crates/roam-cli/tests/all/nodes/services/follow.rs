//! The planner's follow-the-client policy, end to end: a planner, a real
//! gateway, and two nodes that reach the gateway through delay lines, one
//! near (1 ms each way) and one far (30 ms). The KV cell starts on the far
//! node under a writer and redis-benchmark; nothing but the planner moves
//! it. It must move to the near node, once, and stay there, and no client
//! may see an error or lose a write.

use roam_link::{LinkConfig, Rate};

use super::*;

fn delay_line(gw: &Gateway, one_way_ms: u64) -> Link {
    let port: u16 = gw.control.rsplit_once(':').unwrap().1.parse().unwrap();
    Link::start(
        port,
        LinkConfig::symmetric(Rate::UNLIMITED, Duration::from_millis(one_way_ms)),
    )
}

fn planned_node(p: &Planner, name: &str, line: &Link) -> Node {
    let gateway = line.proxy().local_addr().to_string();
    planner_node(p, name, &["--gateway", &gateway])
}

#[test]
fn the_planner_moves_a_service_cell_to_its_clients_and_keeps_it_there() {
    if !have_redis_tools() {
        return;
    }
    const LEN: usize = 100;
    const KEYS: u64 = 5_000;
    let gw = Gateway::start();
    // A lease of 3 s: heartbeats every second.
    let p = Planner::start(None, &["--lease", "3", "--checkpoint-interval", "0"]);
    let out = p.roam(&["policy", "follow-the-client"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("* follow-the-client"),
        "{}",
        text(&out.stdout)
    );
    let (far_line, near_line) = (delay_line(&gw, 30), delay_line(&gw, 1));
    let far = planned_node(&p, "far", &far_line);
    let near = planned_node(&p, "near", &near_line);
    let logs = || format!("{}\n{}\n{}", both_logs(&far, &near), gw.log(), p.log());
    wait_alive(&p, 2);
    let w = workload("kvserver");
    let out = p.roam(&[
        "launch",
        "--on",
        "far",
        "--service",
        SERVICE,
        w.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        logs()
    );
    let id = text(&out.stdout).trim().to_string();
    let writer = Writer::start(gw.port, LEN, KEYS, 0);
    let bench = BenchLoop::start(gw.port);
    // Both nodes report their round trip, and `roam nodes` shows it.
    wait_for("both round trips", SLOW, || {
        let nodes = p.get("/v1/nodes");
        let rtt = |n: &str| {
            nodes.as_array()?.iter().find(|x| x["name"] == n)?["status"]["gateway"]["rtt_us"]
                .as_u64()
        };
        Some((rtt("far")?, rtt("near")?))
    });
    let listed = text(&p.roam(&["nodes"]).stdout);
    assert!(
        listed.contains("GATEWAY RTT") && listed.contains(" ms"),
        "{listed}"
    );
    let t = std::time::Instant::now();
    let moved = loop {
        let c = p.cell(&id);
        if c["owner"] == "near" && c["state"]["state"] == "running" {
            break c;
        }
        assert!(
            t.elapsed() < SLOW,
            "the cell did not move to the near node: {c}\n{}\n{}",
            p.get("/v1/nodes"),
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(moved["generation"], 2, "{moved}\n{}", logs());
    let nodes = p.get("/v1/nodes");
    let rtt_of = |n: &str| -> u64 {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == n)
            .unwrap()["status"]["gateway"]["rtt_us"]
            .as_u64()
            .unwrap()
    };
    // The new owner reports what the cell uses: CPU time and memory.
    let usage = wait_for("the cell's usage on the near node", SLOW, || {
        let nodes = p.get("/v1/nodes");
        let near = nodes
            .as_array()?
            .iter()
            .find(|x| x["name"] == "near")?
            .clone();
        let u = near["status"]["usage"]
            .as_array()?
            .iter()
            .find(|u| u["cell"] == id.as_str())?
            .clone();
        (u["cpu_ms"].as_u64()? > 0).then_some(u)
    });
    assert!(
        usage["memory_bytes"].as_u64().unwrap() >= 1 << 16,
        "{usage}"
    );
    let (_, m) = http_get(&near.addr, "/metrics").unwrap();
    let m = text(&m);
    assert!(
        m.contains(&format!("roam_node_cell_cpu_seconds{{cell=\"{id}\"}}")),
        "{m}"
    );
    assert!(
        m.contains("roam_node_gateway_rtt_seconds{gateway=\"gw-"),
        "{m}"
    );
    // The far line alone delays a round trip by 60 ms.
    assert!(rtt_of("far") >= 60_000, "far: {} µs", rtt_of("far"));
    assert!(rtt_of("near") < rtt_of("far"), "{nodes}");
    // No flapping: the cell stays for 8 s more of load.
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        let c = p.cell(&id);
        assert_eq!(c["owner"], "near", "the cell moved again: {c}\n{}", logs());
        std::thread::sleep(Duration::from_millis(250));
    }
    wait_progress(&writer, 200, &logs);
    let (w, bn) = (writer.finish(), bench.finish());
    check_clients(&w, &bn, &logs);
    check_data(&gw, &w, LEN, &bn, &logs);
    // The planner says why it moved the cell, in its metrics.
    let (_, metrics) = http_get(p.addr(), "/metrics").unwrap();
    assert!(
        text(&metrics).contains("reason=\"follow-the-client\""),
        "{}",
        text(&metrics)
    );
    drop((far_line, near_line));
}
