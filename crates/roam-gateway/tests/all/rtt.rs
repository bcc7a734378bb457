//! The round trip a node measures on its link (protocol 3), and the
//! traffic it counts per service: what the planner's follow-the-client
//! policy decides by. One node reaches the gateway directly, the other
//! through a delay line of 25 ms each way; both must name the same
//! gateway, and the far one must measure at least the line's 50 ms.

use std::time::Duration;

use roam_gateway::link::GatewayLink;
use roam_link::{LinkConfig, LinkProxy, Rate};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::peer::{TestGateway, LONG};
use crate::program::Cell;

async fn measured(l: &GatewayLink) -> roam_gateway::link::Rtt {
    let t = tokio::time::Instant::now();
    loop {
        if let Some(r) = l.rtt().filter(|r| r.samples >= 3) {
            return r;
        }
        assert!(t.elapsed() < LONG, "no round trip measured on {l:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_measures_its_own_path_to_the_same_gateway() {
    let gw = TestGateway::start(|_| {}).await;
    let line = LinkProxy::start(
        "127.0.0.1:0".parse().unwrap(),
        gw.control,
        LinkConfig::symmetric(Rate::UNLIMITED, Duration::from_millis(25)),
    )
    .await
    .unwrap();
    let near = GatewayLink::connect(&gw.control.to_string(), None, "node-near").unwrap();
    let far = GatewayLink::connect(&line.local_addr().to_string(), None, "node-far").unwrap();
    assert!(near.wait_connected(LONG).await && far.wait_connected(LONG).await);
    let (n, f) = (measured(&near).await, measured(&far).await);
    // A lower bound only: the line delays each way by 25 ms at least,
    // however loaded the machine is.
    assert!(f.median >= Duration::from_millis(50), "far: {f:?}");
    assert!(f.min >= Duration::from_millis(50), "far: {f:?}");
    assert!(n.median < f.median, "near {n:?}, far {f:?}");
    // Two addresses, one gateway.
    assert_ne!(near.address(), far.address());
    let id = near.gateway_id().expect("the gateway named itself");
    assert!(id.starts_with("gw-"), "{id}");
    assert_eq!(far.gateway_id().as_deref(), Some(id.as_str()));
    line.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_service_counts_its_clients_and_their_traffic() {
    let gw = TestGateway::start(|_| {}).await;
    let a = GatewayLink::connect(&gw.control.to_string(), None, "node-a").unwrap();
    assert!(a.wait_connected(LONG).await);
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    let run = cell.start();
    let t = tokio::time::Instant::now();
    while gw.handle.route("kv").is_none() {
        assert!(t.elapsed() < LONG, "no route");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = a.served();
    assert_eq!(before.len(), 1);
    assert_eq!(
        (before[0].service.as_str(), before[0].cell.as_str()),
        ("kv", "c-1")
    );
    assert_eq!(before[0].traffic.bytes, 0);
    // One client sends 3 messages of 100 bytes and reads the echo.
    let mut s = TcpStream::connect(gw.service).await.unwrap();
    let mut got = vec![0u8; 100];
    for _ in 0..3 {
        s.write_all(&[7u8; 100]).await.unwrap();
        tokio::time::timeout(LONG, s.read_exact(&mut got))
            .await
            .expect("echo in time")
            .unwrap();
    }
    let now = a.served();
    assert_eq!(now[0].conns, 1);
    assert_eq!(now[0].traffic.bytes, 300);
    assert!(now[0].traffic.frames >= 3, "{:?}", now[0].traffic);
    // Unserved, the service and its counters are gone.
    a.unserve("kv", "c-1", 0).unwrap();
    assert!(a.served().is_empty());
    drop(s);
    run.pause().await;
}
