//! Hostile or broken nodes get `Refused` with the precise reason and lose
//! their link; clients that wait too long get the documented error.

use std::time::Duration;

use roam_gateway::proto::{
    Hello, ToGateway, ToNode, MIN_PROTOCOL_VERSION, MIN_WINDOW, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::peer::{RawNode, TestGateway, LONG};

fn hello(window: u64) -> ToGateway {
    ToGateway::Hello(Hello {
        version: PROTOCOL_VERSION,
        node: "node-a".into(),
        window,
    })
}

/// `Serve` of cell `c-1`, generation 0, no connections yet.
fn serve(service: &str) -> ToGateway {
    ToGateway::Serve {
        service: service.into(),
        cell: "c-1".into(),
        generation: 0,
        conns: vec![],
    }
}

async fn welcomed(gw: &TestGateway, window: u64) -> RawNode {
    let mut n = RawNode::connect(gw.control).await;
    n.send(&hello(window)).await;
    match n.recv().await {
        Some(ToNode::Welcome { version, window: w }) => {
            assert_eq!(version, PROTOCOL_VERSION);
            assert_eq!(w, window.min(roam_gateway::server::DEFAULT_WINDOW));
        }
        other => panic!("expected Welcome, got {other:?}"),
    }
    n
}

async fn refused(n: &mut RawNode) -> String {
    loop {
        match n.recv().await {
            Some(ToNode::Refused { reason }) => {
                assert!(
                    n.recv().await.is_none(),
                    "the link stays open after Refused"
                );
                return reason;
            }
            Some(_) => continue,
            None => panic!("the link closed without Refused"),
        }
    }
}

#[tokio::test]
async fn oversized_frame_is_refused_before_allocating() {
    let gw = TestGateway::start(|_| {}).await;
    let mut n = welcomed(&gw, 256 << 10).await;
    let mut frame = vec![0u8; 12];
    frame[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    n.send_raw(&frame).await;
    let r = refused(&mut n).await;
    assert!(
        r.contains("frame of 4294967295 bytes exceeds the 1048576-byte limit"),
        "{r}"
    );
    assert_eq!(gw.handle.stats().links, 0);
}

#[tokio::test]
async fn bad_service_name_is_refused() {
    let gw = TestGateway::start(|_| {}).await;
    let mut n = welcomed(&gw, 256 << 10).await;
    n.send(&serve("../kv")).await;
    let r = refused(&mut n).await;
    assert!(
        r.contains("Serve message: service name \"../kv\" is invalid: it must start with a letter or digit"),
        "{r}"
    );
    assert!(gw.handle.route("kv").is_none());
}

#[tokio::test]
async fn old_version_and_bad_node_name_are_refused_at_hello() {
    let gw = TestGateway::start(|_| {}).await;
    let mut n = RawNode::connect(gw.control).await;
    n.send(&ToGateway::Hello(Hello {
        version: 0,
        node: "node-a".into(),
        window: 256 << 10,
    }))
    .await;
    let r = refused(&mut n).await;
    let want =
        format!("protocol version 0, this gateway {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}");
    assert!(r.contains(&want), "{r}");
    let mut n = RawNode::connect(gw.control).await;
    n.send(&ToGateway::Hello(Hello {
        version: 1,
        node: "a/b".into(),
        window: 256 << 10,
    }))
    .await;
    let r = refused(&mut n).await;
    assert!(r.contains("node name \"a/b\" is invalid"), "{r}");
}

#[tokio::test]
async fn data_beyond_the_window_is_refused_and_the_client_kept() {
    let gw = TestGateway::start(|_| {}).await;
    let mut n = welcomed(&gw, MIN_WINDOW).await;
    n.send(&serve("kv")).await;
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    let conn = match n.recv().await {
        Some(ToNode::Open { service, conn, .. }) => {
            assert_eq!(service, "kv");
            conn
        }
        other => panic!("expected Open, got {other:?}"),
    };
    n.send(&ToGateway::Data {
        conn,
        offset: 0,
        bytes: vec![b'x'; MIN_WINDOW as usize + 1],
    })
    .await;
    let r = refused(&mut n).await;
    assert!(
        r.contains(&format!(
            "connection {conn}: Data up to offset 4097 exceeds the window, which ends at 4096"
        )),
        "{r}"
    );
    // Nothing of the refused data reached the client, and it is still
    // connected (held until a node serves again).
    assert_eq!(gw.handle.stats().clients, 1);
    client.write_all(b"still here").await.unwrap();
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), client.read(&mut b))
            .await
            .is_err(),
        "the client got bytes or a close"
    );
}

#[tokio::test]
async fn a_client_without_a_cell_gets_the_resp_error_after_the_wait() {
    let gw = TestGateway::start(|c| {
        c.services[0].resp = true;
        c.wait_timeout = Duration::from_millis(300);
    })
    .await;
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    client.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(LONG, client.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR roam gateway: service kv has no running cell (waited 0.3 s); retry later\r\n"
    );
    assert_eq!(gw.handle.stats().clients, 0);
}

#[tokio::test]
async fn a_client_of_a_plain_service_is_closed_after_the_wait() {
    let gw = TestGateway::start(|c| c.wait_timeout = Duration::from_millis(200)).await;
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(LONG, client.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got.is_empty());
}

/// A node that serves a service and then reads nothing: clients that come,
/// send and reset leave their frames queued to it. The gateway closes the
/// link once the queue passes its bound, instead of growing for ever.
#[tokio::test]
async fn a_node_that_never_reads_loses_its_link_at_the_bound() {
    const BACKLOG: usize = 256 << 10;
    let gw = TestGateway::start(|c| {
        c.total_buffer = 64 << 10;
        c.conn_buffer = 16 << 10;
        c.link_backlog = BACKLOG;
    })
    .await;
    let mut n = welcomed(&gw, 16 << 10).await;
    n.send(&serve("kv")).await;
    tokio::time::timeout(LONG, async {
        while gw.handle.route("kv").is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the service routed to the node");
    // The node's socket buffers take a few MiB before the gateway's queue
    // grows at all; 8 KiB per client (half its buffer, so the gateway goes
    // on reading it and sees the reset), 8,000 clients is 64 MiB at most.
    let mut clients = 0;
    while gw.handle.stats().links == 1 {
        assert!(
            clients < 8_000,
            "the link is still up after {clients} clients sent {} MiB it never read",
            (clients * (8 << 10)) >> 20
        );
        let mut c = TcpStream::connect(gw.service).await.unwrap();
        c.write_all(&[b'x'; 8 << 10]).await.unwrap();
        // Wait until the gateway has taken the bytes, then reset: the
        // connection is forgotten, its frames stay queued.
        tokio::time::sleep(Duration::from_millis(1)).await;
        #[allow(deprecated)] // A reset is the point; the socket has nothing left to send.
        c.set_linger(Some(Duration::ZERO)).unwrap();
        drop(c);
        clients += 1;
    }
    // Its service is held, as for any lost link, for a node to serve again.
    assert!(gw.handle.route("kv").is_none());
}

/// A node whose `Serve` is older than the service's route is told so
/// (protocol 2), and still loses nothing: the route stays.
#[tokio::test]
async fn a_stale_serve_is_answered_and_changes_nothing() {
    let gw = TestGateway::start(|_| {}).await;
    let mut current = RawNode::connect(gw.control).await;
    current
        .send(&ToGateway::Hello(Hello {
            version: PROTOCOL_VERSION,
            node: "node-b".into(),
            window: MIN_WINDOW,
        }))
        .await;
    assert!(matches!(current.recv().await, Some(ToNode::Welcome { .. })));
    current
        .send(&ToGateway::Serve {
            service: "kv".into(),
            cell: "c-1".into(),
            generation: 5,
            conns: vec![],
        })
        .await;
    let mut old = welcomed(&gw, MIN_WINDOW).await;
    // Wait until the gateway routes to node-b, then serve from node-a at 3.
    let started = std::time::Instant::now();
    while gw.handle.route("kv").map(|r| r.2) != Some(5) {
        assert!(started.elapsed() < LONG, "node-b's Serve was not followed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    old.send(&ToGateway::Serve {
        service: "kv".into(),
        cell: "c-1".into(),
        generation: 3,
        conns: vec![],
    })
    .await;
    match tokio::time::timeout(LONG, old.recv()).await {
        Ok(Some(ToNode::Stale {
            service,
            cell,
            generation,
            current,
        })) => {
            assert_eq!((service.as_str(), cell.as_str()), ("kv", "c-1"));
            assert_eq!((generation, current), (3, 5));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    let r = gw.handle.route("kv").expect("a route");
    assert_eq!(
        (r.0.as_str(), r.2),
        ("node-b", 5),
        "the stale Serve took the route"
    );
}
