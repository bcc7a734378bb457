//! Network services behind `roam gateway`, end to end: the KV cell
//! (`workloads/c/kvserver.c`) serves `redis-benchmark` and a writer of a
//! known key set through the gateway while it moves between an x86-64 node
//! and an aarch64 node under qemu-user, in every mode, and while moves fail.
//! The threaded KV server (`workloads/threads/kv`, a thread per client)
//! does the same in the modes a threaded program moves in.
//!
//! What must hold: no client sees an error or a reset (redis-benchmark 7
//! exits at the first one; the writer checks every reply and reads keys
//! back), a client that connects while the cell is paused is served after
//! the move, and at the end `DBSIZE` and the server's `ROAM.DIGEST` equal
//! what the test computes from what the clients wrote (the INCR counter
//! included: no request was lost or applied twice).

use std::path::Path;
use std::process::Stdio;

use super::*;

mod follow;
mod load;

use load::{bench_keys, connect, digest, key, BenchLoop, Benched, Writer, Written};
use roam_testkit::resp::Reply;

/// redis-benchmark is there, or the test is skipped (fails under CI).
fn have_redis_tools() -> bool {
    if roam_testkit::have("redis-benchmark") {
        return true;
    }
    roam_testkit::missing(&roam_testkit::REDIS_TOOLS, "redis-benchmark does not run");
    false
}

/// A node on free ports that reports to `gw`.
fn service_node(isa: Isa, gw: &Gateway, extra: &[&str]) -> Node {
    let mut args = vec!["--gateway", &gw.control];
    if !extra.contains(&"--migrate-listen") {
        args.extend(["--migrate-listen", "127.0.0.1:0"]);
    }
    args.extend(extra);
    Node::start_with(isa, &args)
}

/// `roam launch --service kv kvserver.wasm` on `node`; the cell id, once
/// the gateway routes a client to it.
fn launch_kv(node: &Node, gw: &Gateway) -> String {
    launch_service(node, gw, &workload("kvserver"))
}

/// [`launch_kv`] of another KV server `module`.
fn launch_service(node: &Node, gw: &Gateway, module: &Path) -> String {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &node.addr, "--service", SERVICE])
        .arg(module);
    let out = run_bounded(cmd, SLOW);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}\n{}",
        text(&out.stderr),
        node.log(),
        gw.log()
    );
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(node.cell(&id).unwrap()["service"], SERVICE);
    let (mut c, _) = connect(gw.port).unwrap();
    let pong = c.cmd(&[b"PING"]);
    assert!(
        matches!(&pong, Ok(Reply::Simple(s)) if s == "PONG"),
        "PING through the gateway: {pong:?}\n{}\n{}",
        node.log(),
        gw.log()
    );
    id
}

/// The cell holds exactly what the clients wrote: `DBSIZE`, and
/// `ROAM.DIGEST` against the digest computed here.
fn check_data(gw: &Gateway, w: &Written, len: usize, b: &Benched, logs: &dyn Fn() -> String) {
    let (mut c, _) = connect(gw.port).unwrap();
    let set_value = match c.cmd(&[b"GET", b"key:__rand_int__"]).unwrap() {
        Reply::Bulk(Some(v)) if v.len() == 3 => v,
        Reply::Bulk(None) if b.runs == 0 => Vec::new(),
        other => panic!("redis-benchmark's SET key holds {other:?}\n{}", logs()),
    };
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
        (0..w.count).map(|i| (key(i), w.value_of(i, len))).collect();
    pairs.extend(bench_keys(b, &set_value));
    let want = digest(pairs.iter().map(|(k, v)| (&k[..], &v[..])));
    let size = c.cmd(&[b"DBSIZE"]).unwrap();
    assert_eq!(
        size,
        Reply::Int(pairs.len() as i64),
        "DBSIZE after {} writer keys and {} benchmark runs\n{}",
        w.count,
        b.runs,
        logs()
    );
    let got = match c.cmd(&[b"ROAM.DIGEST"]).unwrap() {
        Reply::Bulk(Some(v)) => text(&v),
        Reply::Simple(s) => s,
        other => panic!("ROAM.DIGEST answered {other:?}"),
    };
    assert_eq!(got, want, "the server's digest differs\n{}", logs());
    // The counter alone: every INCR applied exactly once.
    if b.runs > 0 {
        let n = c.cmd(&[b"GET", b"counter:__rand_int__"]).unwrap();
        assert_eq!(n, Reply::Bulk(Some(b.incrs.to_string().into_bytes())));
    }
}

/// No client saw an error; the load actually ran.
fn check_clients(w: &Written, b: &Benched, logs: &dyn Fn() -> String) {
    assert!(
        w.errors.is_empty() && b.errors.is_empty(),
        "clients saw errors:\n{}\n{}\n{}",
        w.errors.join("\n"),
        b.errors.join("\n"),
        logs()
    );
    assert!(b.runs > 0, "no redis-benchmark run finished");
    eprintln!(
        "{} keys, {} SETs by the writer; {} redis-benchmark runs: {}",
        w.count,
        w.sets,
        b.runs,
        b.rates.join(" | ")
    );
}

/// A client that connects once the gateway logs a new hold of the service,
/// and PINGs: its local port, and the reply. The gateway's log, not the
/// source's: the source logs its pause before its hold reaches the
/// gateway, so a client started on the source's word can arrive first.
fn connect_during_hold(gw: &Gateway) -> std::thread::JoinHandle<(u16, Result<Reply, String>)> {
    let (log, port) = (gw.log.clone(), gw.port);
    let held = gw.count("service held");
    std::thread::spawn(move || {
        let start = Instant::now();
        let holds = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("service held")
                .count()
        };
        while holds() <= held {
            assert!(start.elapsed() < SLOW, "the gateway never held the service");
            std::thread::sleep(Duration::from_millis(20));
        }
        match connect(port) {
            Ok((mut c, local)) => (local, c.cmd(&[b"PING"]).map_err(|e| e.to_string())),
            Err(e) => (0, Err(e)),
        }
    })
}

/// The log of a node, readable from another thread.
fn log_reader(n: &Node) -> impl Fn() -> String + Send + 'static {
    let path = n.log.clone();
    move || std::fs::read_to_string(&path).unwrap_or_default()
}

/// Wait until the writer has written `more` keys past what it had:
/// clients are served again.
fn wait_progress(w: &Writer, more: u64, logs: &dyn Fn() -> String) {
    let from = w.written();
    let start = Instant::now();
    while w.written() < from + more {
        assert!(
            start.elapsed() < SLOW,
            "the writer made no progress after the move\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// x86-64 → aarch64 → x86-64 with pre-copy, then stop-and-copy to aarch64
/// (a client connects during its pause) and post-copy back to x86-64,
/// all under redis-benchmark and the writer.
#[test]
fn kv_cell_moves_across_isas_in_every_mode_under_load() {
    moves_under_load(
        &workload("kvserver"),
        ["pre-copy", "pre-copy", "stop-and-copy", "post-copy"],
    );
}

/// The threaded KV server, a thread per client: the same moves, but
/// stop-and-copy back instead of post-copy, which threaded programs do not
/// offer (`docs/migration.md`).
#[test]
fn threaded_kv_cell_moves_across_isas_under_load() {
    moves_under_load(
        &workload("threads/threads-kv"),
        ["pre-copy", "pre-copy", "stop-and-copy", "stop-and-copy"],
    );
}

/// The KV server `module` launched on an x86-64 node, then moved to an
/// aarch64 node and back twice in these `modes`, under redis-benchmark and
/// the writer; a client connects during the pause of the first
/// stop-and-copy.
fn moves_under_load(module: &Path, modes: [&str; 4]) {
    if !have_redis_tools() {
        return;
    }
    const LEN: usize = 200;
    const KEYS: u64 = 20_000;
    let gw = Gateway::start();
    let a = service_node(Isa::X86_64, &gw, &[]);
    let b = service_node(Isa::Aarch64, &gw, &[]);
    let logs = || format!("{}\n{}", both_logs(&a, &b), gw.log());
    let id = launch_service(&a, &gw, module);
    let writer = Writer::start(gw.port, LEN, KEYS, 0);
    let bench = BenchLoop::start(gw.port);
    wait_for("the load to run", SLOW, || {
        (writer.written() >= 1000 && bench.runs() >= 1).then_some(())
    });
    let moves = [
        (&a, &b, modes[0]),
        (&b, &a, modes[1]),
        (&a, &b, modes[2]),
        (&b, &a, modes[3]),
    ];
    let mut held_during = false;
    for (hop, (from, to, mode)) in moves.into_iter().enumerate() {
        if mode == "stop-and-copy" {
            // Every value changes since the destination last had the cell,
            // so the pause carries all of them: seconds at 8 Mbit/s.
            wait_progress(&writer, KEYS, &logs);
        }
        let during = (mode == "stop-and-copy" && !held_during).then(|| connect_during_hold(&gw));
        held_during |= during.is_some();
        // Stop-and-copy at 8 Mbit/s: a pause of seconds, so the client
        // above connects while the cell is paused.
        // Pre-copy: the writer dirties faster than the cell under qemu
        // sends, so the rounds are capped to keep the test short.
        let extra: &[&str] = match mode {
            "stop-and-copy" => &["--bandwidth", "8mbit"],
            "pre-copy" => &["--max-rounds", "4"],
            _ => &[],
        };
        let (out, status) = migrate(&id, from, to, mode, extra);
        assert!(
            out.status.success(),
            "move {} ({mode}) failed: {}\n{}",
            hop + 1,
            text(&out.stderr),
            logs()
        );
        assert_eq!(status["summary"]["to_isa"], to.isa.name(), "{status}");
        eprintln!(
            "move {}: {mode} {} -> {}, downtime {} ms, total {} ms",
            hop + 1,
            from.isa.name(),
            to.isa.name(),
            status["summary"]["downtime_ms"],
            status["summary"]["total_ms"]
        );
        if let Some(t) = during {
            let (local, reply) = t.join().unwrap();
            gw.assert_arrived_while_held(local);
            assert_eq!(
                reply,
                Ok(Reply::Simple("PONG".into())),
                "a client that connected during the pause\n{}",
                logs()
            );
        }
        let cell = to.cell(&id).unwrap();
        assert_eq!(cell["state"], "running", "{cell}\n{}", logs());
        assert_eq!(cell["hops"], hop + 1, "{cell}");
        wait_progress(&writer, 200, &logs);
    }
    let (w, bn) = (writer.finish(), bench.finish());
    check_clients(&w, &bn, &logs);
    check_data(&gw, &w, LEN, &bn, &logs);
    // Each move held the clients, and the last Serve is generation 4.
    assert_eq!(gw.count("service held"), 4, "{}", gw.log());
    assert_eq!(gw.count("generation=4 conns="), 1, "{}", gw.log());
    // The gateway's metrics saw the clients, their bytes and both nodes.
    let accepted = gw.metric(r#"roam_gateway_clients_accepted_total{service="kv"}"#);
    assert!(accepted.is_some_and(|n| n >= 2.0), "{accepted:?}");
    for dir in ["to_cell", "to_client"] {
        let bytes = gw.metric(&format!(
            r#"roam_gateway_client_bytes_total{{service="kv",direction="{dir}"}}"#
        ));
        assert!(bytes.is_some_and(|n| n > 100_000.0), "{dir}: {bytes:?}");
    }
    assert_eq!(gw.metric_lines("roam_gateway_node_rtt_seconds{"), 2);
    assert_eq!(
        gw.metric_lines(r#"roam_gateway_service_node{service="kv""#),
        1
    );
}

/// A move whose link is cut mid-transfer, and one whose destination is
/// killed mid-transfer: both fail, the cell keeps serving from the source,
/// a client that connected during the failed pause is served, and no client
/// sees an error.
#[test]
fn failed_moves_leave_the_clients_served_by_the_source() {
    if !have_redis_tools() {
        return;
    }
    // 8000 values of 1 KiB that do not compress: 8 MiB of data take
    // seconds at 20 Mbit/s.
    const LEN: usize = 1024;
    let gw = Gateway::start();
    let port = free_port();
    let link = Link::start(port, LinkConfig::transparent());
    let a = service_node(Isa::X86_64, &gw, &[]);
    let b = service_node(
        Isa::X86_64,
        &gw,
        &[
            "--migrate-listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-migrate",
            &link.proxy().local_addr().to_string(),
        ],
    );
    let mut c = service_node(Isa::X86_64, &gw, &[]);
    let c_log = log_reader(&c);
    let logs = || format!("{}\n{}\n{}", both_logs(&a, &b), c_log(), gw.log());
    let id = launch_kv(&a, &gw);
    let writer = Writer::start(gw.port, LEN, 8000, 8000);
    let bench = BenchLoop::start(gw.port);
    wait_for("8000 keys", SLOW, || {
        (writer.written() >= 8000).then_some(())
    });
    let slow = ["--bandwidth", "20mbit", "--codec", "none"];

    // The link to b is cut once 2 MiB went through.
    let handle = link.proxy().handle();
    let cutter = std::thread::spawn(move || {
        let start = Instant::now();
        while handle.bytes_forwarded(Direction::ClientToServer) < 2 << 20 {
            if start.elapsed() > Duration::from_secs(60) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        handle.cut(AfterCut::Refuse);
        true
    });
    let during = connect_during_hold(&gw);
    let (out, _) = migrate(&id, &a, &b, "stop-and-copy", &slow);
    assert!(cutter.join().unwrap(), "the transfer never reached 2 MiB");
    assert_failed(&out, "", &a, &b);
    let (local, reply) = during.join().unwrap();
    assert_eq!(reply, Ok(Reply::Simple("PONG".into())), "{}", logs());
    gw.assert_arrived_while_held(local);
    wait_progress(&writer, 200, &logs);

    // c is killed once the cell paused for it and pages flow.
    let paused = a.log().matches("phase=paused").count();
    let a_log = log_reader(&a);
    let c_addr = c.addr.clone();
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["migrate", &id, "--from", &a.addr, "--to", &c_addr])
        .args(["--mode", "stop-and-copy", "--json"])
        .args(slow);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    wait_for("the cell to pause for c", SLOW, || {
        (a_log().matches("phase=paused").count() > paused).then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    c.kill9();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the move to a killed node succeeded");
    assert!(
        text(&out.stderr).contains("keeps running"),
        "{}",
        text(&out.stderr)
    );
    wait_progress(&writer, 200, &logs);

    let (w, bn) = (writer.finish(), bench.finish());
    check_clients(&w, &bn, &logs);
    let cell = a.cell(&id).unwrap();
    assert_eq!(cell["state"], "running", "{cell}\n{}", logs());
    assert_eq!(cell["hops"], 0, "{cell}");
    check_data(&gw, &w, LEN, &bn, &logs);
    // Held twice, served by the source three times (launch, and after each
    // failure), never by another generation; a kill ends the service.
    assert_eq!(gw.count("service held"), 2, "{}", gw.log());
    assert_eq!(gw.count("generation=0 conns="), 3, "{}", gw.log());
    assert_eq!(gw.count("service served"), 3, "{}", gw.log());
    let (st, body) = http_post(&a.addr, &format!("/v1/cells/{id}/kill"), &Value::Null).unwrap();
    assert_eq!(st, 200, "{}", text(&body));
    wait_for("the gateway to hear the cell ended", SLOW, || {
        (gw.count("service unserved") == 1).then_some(())
    });
}

/// A service cell needs a node with a gateway, and a valid service name.
#[test]
fn a_service_cell_is_refused_without_a_gateway_or_with_a_bad_name() {
    let plain = Node::start(Isa::X86_64);
    let launch = |node: &Node, name: &str| {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &node.addr, "--service", name])
            .arg(workload("kvserver"));
        run_bounded(cmd, SLOW)
    };
    let out = launch(&plain, SERVICE);
    assert!(!out.status.success(), "launched without a gateway");
    assert!(
        text(&out.stderr).contains("--gateway"),
        "{}",
        text(&out.stderr)
    );
    let gw = Gateway::start();
    let node = service_node(Isa::X86_64, &gw, &[]);
    let out = launch(&node, "kv/../x");
    assert!(!out.status.success(), "launched with a bad service name");
    assert!(
        text(&out.stderr).contains("service name"),
        "{}",
        text(&out.stderr)
    );
    assert!(node.cells().is_empty(), "{:?}", node.cells());
}
