//! Real TCP clients through the gateway to an in-process cell behind the
//! real link and `NetHub`: streams compared byte for byte across moves,
//! failed moves, lost links and full buffers.

use std::sync::atomic::Ordering;
use std::time::Duration;

use roam_gateway::link::GatewayLink;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::peer::{TestGateway, LONG};
use crate::program::Cell;

/// The deterministic stream client `seed` sends.
fn stream(seed: u64, len: usize) -> Vec<u8> {
    roam_testkit::pseudo_random(len, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Send `len` bytes in `chunk`-byte writes with a pause between them, shut
/// the write side, read everything back; the echo must be the stream with
/// every byte plus one, complete and in order.
async fn client(addr: std::net::SocketAddr, seed: u64, len: usize, chunk: usize, pause: Duration) {
    let s = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let data = stream(seed, len);
    let expect: Vec<u8> = data.iter().map(|b| b.wrapping_add(1)).collect();
    let writer = tokio::spawn(async move {
        for c in data.chunks(chunk) {
            wr.write_all(c).await.expect("client write (reset?)");
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        wr.shutdown().await.unwrap();
    });
    let mut got = Vec::with_capacity(len);
    tokio::time::timeout(LONG * 3, rd.read_to_end(&mut got))
        .await
        .expect("the echo did not finish in time")
        .expect("client read (reset?)");
    writer.await.unwrap();
    assert_eq!(got.len(), expect.len(), "client {seed}: length");
    if let Some(i) = (0..len).find(|&i| got[i] != expect[i]) {
        panic!("client {seed}: first wrong byte at offset {i}");
    }
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = tokio::time::Instant::now();
    while !f() {
        assert!(t.elapsed() < LONG, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn link(gw: &TestGateway, node: &str) -> GatewayLink {
    let l = GatewayLink::connect(&gw.control.to_string(), None, node).unwrap();
    assert!(l.wait_connected(LONG).await, "{node} connects");
    l
}

async fn served(gw: &TestGateway, node: &str, generation: u64) {
    wait_until("the route", || {
        gw.handle
            .route("kv")
            .is_some_and(|r| r.0 == node && r.2 == generation && !r.3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_flow_both_ways_in_order() {
    let gw = TestGateway::start(|_| {}).await;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    served(&gw, "node-a", 0).await;
    let errors = cell.errors.clone();
    let run = cell.start();
    let clients: Vec<_> = (0..4)
        .map(|i| tokio::spawn(client(gw.service, i, 1 << 20, 64 << 10, Duration::ZERO)))
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let cell = run.pause().await;
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert_eq!(cell.echoed.load(Ordering::Relaxed), 4 << 20);
    wait_until("the gateway forgets closed clients", || {
        gw.handle.stats().clients == 0
    })
    .await;
}

/// The report (`GET /metrics` of `roam gateway --metrics`): the route,
/// every byte both ways, a round trip to a connected client and to the
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_clients_bytes_and_round_trips() {
    let gw = TestGateway::start(|_| {}).await;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    served(&gw, "node-a", 0).await;
    let run = cell.start();
    for i in 0..2 {
        client(gw.service, i, 100_000, 10_000, Duration::ZERO).await;
    }
    // One client that stays: its round trip is known once it was written to.
    let mut c = TcpStream::connect(gw.service).await.unwrap();
    c.write_all(&[1, 2, 3]).await.unwrap();
    let mut echo = [0u8; 3];
    c.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, [2, 3, 4]);
    wait_until("the report", || {
        let r = gw.handle.report();
        let kv = &r.services[0];
        kv.clients.len() == 1
            && kv.clients[0].rtt.is_some()
            && kv.traffic.to_client == 200_003
            && r.links.iter().any(|l| l.rtt.is_some())
    })
    .await;
    let r = gw.handle.report();
    let kv = &r.services[0];
    assert_eq!(kv.name, "kv");
    assert_eq!(kv.node.as_deref(), Some("node-a"));
    assert_eq!(kv.traffic.accepted, 3);
    assert_eq!(kv.traffic.to_cell, 200_003);
    assert_eq!(kv.clients[0].peer, c.local_addr().unwrap().to_string());
    let rtt = kv.clients[0].rtt.unwrap();
    assert!(rtt < Duration::from_secs(1), "{rtt:?}");
    assert_eq!(r.links.len(), 1);
    assert_eq!(r.links[0].node, "node-a");
    let text = gw.handle.metrics_text();
    assert!(
        text.contains(
            "roam_gateway_client_bytes_total{service=\"kv\",direction=\"to_cell\"} 200003"
        ),
        "{text}"
    );
    assert!(
        text.contains("roam_gateway_client_rtt_seconds{service=\"kv\",client=\"127.0.0.1\"}"),
        "{text}"
    );
    assert!(
        text.contains("roam_gateway_node_rtt_seconds{node=\"node-a\"}"),
        "{text}"
    );
    drop(c);
    run.pause().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_mid_stream_loses_duplicates_and_reorders_nothing() {
    let gw = TestGateway::start(|_| {}).await;
    let (a, b) = (link(&gw, "node-a").await, link(&gw, "node-b").await);
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    served(&gw, "node-a", 0).await;
    let (echoed, errors) = (cell.echoed.clone(), cell.errors.clone());
    let run = cell.start();
    let len = 2 << 20;
    let clients: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(client(
                gw.service,
                10 + i,
                len,
                16 << 10,
                Duration::from_millis(1),
            ))
        })
        .collect();
    wait_until("traffic before the move", || {
        echoed.load(Ordering::Relaxed) > 512 << 10
    })
    .await;
    // The source holds the service and pauses the cell; the snapshot
    // travels; the destination restores it and serves at generation 1.
    a.hold("kv", "c-1", 0).unwrap();
    let cell = run.pause().await;
    let moved_at = echoed.load(Ordering::Relaxed);
    // A client that arrives during the move waits, then is served.
    let late = tokio::spawn(client(gw.service, 99, 100 << 10, 8 << 10, Duration::ZERO));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cell = cell.migrate();
    b.serve("kv", "c-1", 1, cell.hub()).unwrap();
    // The source's late Unserve of generation 0 must not undo the move.
    a.unserve("kv", "c-1", 0).unwrap();
    served(&gw, "node-b", 1).await;
    let run = cell.start();
    for c in clients {
        c.await.unwrap();
    }
    late.await.unwrap();
    let cell = run.pause().await;
    assert!(moved_at < 3 * len as u64, "the move happened mid-stream");
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert_eq!(
        cell.echoed.load(Ordering::Relaxed),
        3 * len as u64 + (100 << 10)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_move_changes_nothing_for_clients() {
    let gw = TestGateway::start(|_| {}).await;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    a.serve("kv", "c-1", 2, cell.hub()).unwrap();
    served(&gw, "node-a", 2).await;
    let (echoed, errors) = (cell.echoed.clone(), cell.errors.clone());
    let run = cell.start();
    let len = 1 << 20;
    let clients: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(client(
                gw.service,
                20 + i,
                len,
                16 << 10,
                Duration::from_millis(1),
            ))
        })
        .collect();
    wait_until("traffic", || echoed.load(Ordering::Relaxed) > 256 << 10).await;
    a.hold("kv", "c-1", 2).unwrap();
    let cell = run.pause().await;
    // The snapshot is taken and sent, the destination fails: discarded.
    drop(cell.ctx.save().unwrap().encode());
    let late = tokio::spawn(client(gw.service, 98, 50 << 10, 8 << 10, Duration::ZERO));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The source resumes and serves again at the same generation.
    a.serve("kv", "c-1", 2, cell.hub()).unwrap();
    served(&gw, "node-a", 2).await;
    let run = cell.start();
    for c in clients {
        c.await.unwrap();
    }
    late.await.unwrap();
    let cell = run.pause().await;
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert_eq!(
        cell.echoed.load(Ordering::Relaxed),
        2 * len as u64 + (50 << 10)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_link_holds_clients_until_the_node_serves_again() {
    let gw = TestGateway::start(|_| {}).await;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    let (echoed, errors) = (cell.echoed.clone(), cell.errors.clone());
    let run = cell.start();
    let len = 1 << 20;
    let c = tokio::spawn(client(
        gw.service,
        30,
        len,
        16 << 10,
        Duration::from_millis(1),
    ));
    wait_until("traffic", || echoed.load(Ordering::Relaxed) > 128 << 10).await;
    drop(a);
    wait_until("the link is gone", || gw.handle.stats().links == 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cell = run.pause().await;
    let a = link(&gw, "node-a").await;
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    let run = cell.start();
    c.await.unwrap();
    run.pause().await;
    assert_eq!(errors.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_far_more_than_the_buffers_is_slowed_not_dropped() {
    let (conn_buffer, total_buffer) = (64 << 10, 160 << 10);
    let gw = TestGateway::start(|c| {
        c.conn_buffer = conn_buffer;
        c.total_buffer = total_buffer;
    })
    .await;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    cell.reading.store(false, Ordering::Relaxed);
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    served(&gw, "node-a", 0).await;
    let reading = cell.reading.clone();
    let run = cell.start();
    let len = 8 << 20;
    let clients: Vec<_> = (0..4)
        .map(|i| tokio::spawn(client(gw.service, 40 + i, len, 64 << 10, Duration::ZERO)))
        .collect();
    // The program reads nothing: the gateway fills its buffers to the
    // total cap and stops reading; memory stays bounded.
    let mut peak = 0;
    for _ in 0..100 {
        let s = gw.handle.stats();
        peak = peak.max(s.buffered_up);
        assert!(s.buffered_up <= total_buffer, "{s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(peak, total_buffer, "the gateway buffered up to its cap");
    assert_eq!(gw.handle.stats().clients, 4);
    reading.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let cell = run.pause().await;
    assert_eq!(cell.errors.load(Ordering::Relaxed), 0);
    assert_eq!(cell.echoed.load(Ordering::Relaxed), 4 * len as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_gateway_dies_clients_lose_connections_and_the_cell_keeps_its_state() {
    let gw = TestGateway::start(|_| {}).await;
    let control = gw.control;
    let a = link(&gw, "node-a").await;
    let cell = Cell::new();
    let hub = cell.hub();
    a.serve("kv", "c-1", 0, hub.clone()).unwrap();
    served(&gw, "node-a", 0).await;
    let errors = cell.errors.clone();
    let run = cell.start();
    let mut c = TcpStream::connect(gw.service).await.unwrap();
    c.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    tokio::time::timeout(LONG, c.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"ifmmp");
    gw.kill().await;
    // The client loses its connection.
    let mut rest = Vec::new();
    let r = tokio::time::timeout(LONG, c.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(r.is_err() || rest.is_empty(), "{r:?} {rest:?}");
    // The cell keeps the connection's state until a gateway says otherwise.
    assert_eq!(hub.state().conns.len(), 1);
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    // A new gateway on the same control address: the link reconnects and
    // serves again; the new gateway does not know the old connection, so
    // the program sees it reset; new clients are served.
    let gw = TestGateway::start(|cfg| cfg.control = control).await;
    wait_until("the program sees the reset", || {
        errors.load(Ordering::Relaxed) == 1
    })
    .await;
    client(gw.service, 50, 64 << 10, 8 << 10, Duration::ZERO).await;
    run.pause().await;
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_writes_more_than_a_window_then_closes_is_heard_to_the_end() {
    use roam_wasi::net::program;
    let gw = TestGateway::start(|_| {}).await;
    let a = link(&gw, "node-a").await;
    let mut cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    served(&gw, "node-a", 0).await;
    let mut c = TcpStream::connect(gw.service).await.unwrap();
    let conn = loop {
        if let Some(id) = program::accept(&mut cell.ctx, 0).unwrap() {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    // One megabyte (four windows), then close the fd at once, as a server
    // that answers and hangs up does.
    let reply = stream(60, 1 << 20);
    let mut at = 0;
    while at < reply.len() {
        let n = program::send(&cell.ctx, conn, &reply[at..]).unwrap();
        at += n;
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    program::close(&mut cell.ctx, conn);
    let mut got = Vec::new();
    tokio::time::timeout(LONG, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), reply.len());
    assert!(got == reply, "the reply arrived changed");
}
