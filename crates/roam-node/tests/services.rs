//! A service cell behind the gateway when its node is cut off from the
//! planner, and the cut heals: the planner restores the cell from its kept
//! checkpoint on another node while a client is still connected; the
//! gateway routes new clients there (a restore raises the route's
//! generation); the cut-off node's fence holds its copy and, once the link
//! heals, lets it go, and its stale route changes nothing. The data written
//! before the checkpoint is there, and only one copy of the cell runs. A
//! real planner (over the embedded store and over a real etcd), a real
//! gateway and real nodes, in this process.

mod common;

use std::time::Duration;

use common::*;
use roam_node::types::CellState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_cell_restored_after_a_partition_is_served_once_embedded() {
    restored_service(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_cell_restored_after_a_partition_is_served_once_etcd() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    restored_service(Some(format!("etcd://{}/roam-test", etcd.endpoint()))).await;
}

/// One RESP command on `s`; the reply's first line and, for a bulk
/// string, its value.
async fn cmd(s: &mut TcpStream, args: &[&str]) -> String {
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    let complete = |g: &[u8]| {
        let text = String::from_utf8_lossy(g);
        match text.strip_prefix('$') {
            // A bulk string: its length line, then the value and CRLF.
            Some(rest) => match rest.split_once("\r\n") {
                Some((len, value)) => match len.parse::<i64>() {
                    Ok(n) if n >= 0 => value.len() as i64 >= n + 2,
                    _ => true,
                },
                None => false,
            },
            None => text.ends_with("\r\n"),
        }
    };
    while !complete(&got) {
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0, "the connection closed before a reply to {args:?}");
        got.push(b[0]);
    }
    String::from_utf8_lossy(&got).trim_end().to_string()
}

/// A client through the gateway, at `addr`.
async fn client(addr: std::net::SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("the gateway accepts")
}

async fn restored_service(store: Option<String>) {
    let gw = roam_gateway::server::Gateway::bind(roam_gateway::server::GatewayConfig::new(
        "kv",
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .expect("the gateway binds");
    let (control, service) = (gw.control_addr(), gw.service_addr("kv").unwrap());
    tokio::spawn(gw.run(std::future::pending()));
    let p = Planner::start(store).await;
    // a reaches the planner through a link that can be cut.
    let link = Delay::start(p.addr).await;
    let setup = |planner: String| Setup {
        planner: Some(planner),
        gateway: Some(control.to_string()),
        ..Setup::default()
    };
    let a = TestNode::start("a", setup(format!("http://{}", link.addr))).await;
    let b = TestNode::start("b", setup(p.url.clone())).await;
    p.wait_alive(2).await;
    let placed = p.place("kvserver", &[], "a", Some("kv"), 1).await;
    let id = placed.id.clone();
    wait_for("the cell to run on a", LIMIT, || async {
        a.cell(&id).await.filter(|c| c.state == CellState::Running)
    })
    .await;
    let mut first = client(service).await;
    assert_eq!(cmd(&mut first, &["SET", "before", "1"]).await, "+OK");
    let written = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    wait_for("a kept checkpoint after the write", LIMIT, || async {
        let c = p.client.cell(&id).await.ok()?;
        c.kept.filter(|k| k.holder == "b" && k.taken_ms > written)
    })
    .await;

    // The cut: a hears nothing from the planner, and the planner nothing
    // from a; `first` stays connected to the gateway.
    link.cut(true);
    let rec = wait_for("the cell to be restored on b", LIMIT, || async {
        let c = p.client.cell(&id).await.ok()?;
        let restored = c.owner == "b" && c.generation > placed.generation;
        (restored && c.state != roam_cluster::CellState::Restoring).then_some(c)
    })
    .await;
    assert_eq!(rec.state, roam_cluster::CellState::Running, "{rec:?}");
    // New clients reach the restored copy, with what was written before
    // its checkpoint.
    let mut second = client(service).await;
    assert_eq!(cmd(&mut second, &["GET", "before"]).await, "$1\r\n1");
    assert_eq!(cmd(&mut second, &["SET", "after", "2"]).await, "+OK");
    drop(first);

    // The cut heals: a learns that the cell lives elsewhere and lets its
    // held copy go; its route, older, does not take the service back.
    link.cut(false);
    wait_for("a to let its copy go", LIMIT, || async {
        match a.cell(&id).await {
            None => Some(()),
            Some(c) if c.state != CellState::Running => Some(()),
            Some(_) => None,
        }
    })
    .await;
    for _ in 0..3 {
        let mut c = client(service).await;
        assert_eq!(cmd(&mut c, &["GET", "after"]).await, "$1\r\n2");
    }
    let on_b = b.cell(&id).await.expect("b runs the cell");
    assert_eq!(on_b.state, CellState::Running);
    let rec = p.client.cell(&id).await.unwrap();
    assert_eq!(rec.owner, "b", "{rec:?}");
}
