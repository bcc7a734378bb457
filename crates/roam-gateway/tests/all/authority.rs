//! `roam gateway --planner`: a `Serve` changes a service's route only when
//! the planner (here a fake authority) names that node, cell and
//! generation. A rogue node is refused and gets no client byte; the
//! assigned node is accepted; a planner that cannot answer keeps the route.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roam_gateway::proto::{Hello, ToGateway, ToNode, MIN_WINDOW, PROTOCOL_VERSION};
use roam_gateway::server::{Assignment, AuthorityError, AuthorityFuture, ServeAuthority};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::peer::{RawNode, TestGateway, LONG};

/// What the planner says, settable by the test; counts the questions.
#[derive(Debug, Default)]
struct Fake {
    answer: Mutex<Option<Vec<Assignment>>>,
    asked: AtomicUsize,
}

impl Fake {
    fn says(&self, node: &str, generation: u64) {
        *self.answer.lock().unwrap() = Some(vec![Assignment {
            cell: "c-1".into(),
            node: node.into(),
            generation,
        }]);
    }

    fn is_down(&self) {
        *self.answer.lock().unwrap() = None;
    }
}

impl ServeAuthority for Fake {
    fn assignments<'a>(&'a self, service: &'a str) -> AuthorityFuture<'a> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let answer = match (service, self.answer.lock().unwrap().clone()) {
            (_, None) => Err(AuthorityError::Unreachable("connection refused".into())),
            ("kv", Some(list)) => Ok(list),
            (_, Some(_)) => Ok(vec![]),
        };
        Box::pin(async move { answer })
    }
}

async fn start(fake: &Arc<Fake>) -> TestGateway {
    let authority: Arc<dyn ServeAuthority> = fake.clone();
    TestGateway::start(|c| c.authority = Some(authority)).await
}

async fn node(gw: &TestGateway, name: &str) -> RawNode {
    let mut n = RawNode::connect(gw.control).await;
    n.send(&ToGateway::Hello(Hello {
        version: PROTOCOL_VERSION,
        node: name.into(),
        window: MIN_WINDOW,
    }))
    .await;
    assert!(matches!(n.recv().await, Some(ToNode::Welcome { .. })));
    n
}

fn serve(generation: u64) -> ToGateway {
    ToGateway::Serve {
        service: "kv".into(),
        cell: "c-1".into(),
        generation,
        conns: vec![],
    }
}

async fn routed_to(gw: &TestGateway, node: &str, generation: u64) {
    let started = std::time::Instant::now();
    loop {
        let r = gw.handle.route("kv");
        if r.as_ref().map(|r| (r.0.as_str(), r.2)) == Some((node, generation)) {
            return;
        }
        assert!(
            started.elapsed() < LONG,
            "kv is not routed to {node} at {generation}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A client's bytes arrive at `n`: its `Open`, then the bytes.
async fn gets_client_bytes(n: &mut RawNode, want: &[u8]) {
    let mut got = Vec::new();
    while got.len() < want.len() {
        match n.recv().await {
            Some(ToNode::Data { bytes, .. }) => got.extend_from_slice(&bytes),
            Some(ToNode::Open { .. } | ToNode::Delivered { .. }) => {}
            other => panic!("expected the client's bytes, got {other:?}"),
        }
    }
    assert_eq!(got, want);
}

/// `n` gets nothing within a while (no `Open`, no `Data`).
async fn gets_nothing(n: &mut RawNode) {
    match n.recv_within(Duration::from_millis(400)).await {
        Err(()) => {}
        Ok(m) => panic!("expected nothing, got {m:?}"),
    }
}

#[tokio::test]
async fn a_rogue_nodes_serve_at_a_higher_generation_is_refused() {
    let fake = Arc::new(Fake::default());
    fake.says("node-a", 3);
    let gw = start(&fake).await;
    let mut a = node(&gw, "node-a").await;
    a.send(&serve(3)).await;
    routed_to(&gw, "node-a", 3).await;
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    client.write_all(b"GET k").await.unwrap();
    gets_client_bytes(&mut a, b"GET k").await;

    // A node the planner does not name, at a later generation: refused,
    // answered as stale with the planner's generation.
    let mut rogue = node(&gw, "rogue").await;
    rogue.send(&serve(9)).await;
    match rogue.recv().await {
        Some(ToNode::Stale {
            service,
            cell,
            generation,
            current,
        }) => {
            assert_eq!((service.as_str(), cell.as_str()), ("kv", "c-1"));
            assert_eq!((generation, current), (9, 3));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    // The owner at a generation the planner does not name: refused too.
    let mut a2 = node(&gw, "node-a").await;
    a2.send(&serve(4)).await;
    assert!(matches!(a2.recv().await, Some(ToNode::Stale { .. })));
    routed_to(&gw, "node-a", 3).await;
    assert!(!gw.handle.route("kv").unwrap().3, "held");

    // Clients stay with the real node: old and new ones.
    client.write_all(b"SET k v").await.unwrap();
    gets_client_bytes(&mut a, b"SET k v").await;
    let mut late = TcpStream::connect(gw.service).await.unwrap();
    late.write_all(b"PING").await.unwrap();
    gets_client_bytes(&mut a, b"PING").await;
    gets_nothing(&mut rogue).await;
    assert_eq!(gw.handle.stats().links, 3, "the refused links stay");
}

#[tokio::test]
async fn the_assigned_node_is_accepted_and_each_new_generation_asked() {
    let fake = Arc::new(Fake::default());
    fake.says("node-a", 3);
    let gw = start(&fake).await;
    let mut a = node(&gw, "node-a").await;
    a.send(&serve(3)).await;
    routed_to(&gw, "node-a", 3).await;
    let asked = fake.asked.load(Ordering::SeqCst);
    assert_eq!(asked, 1);

    // The cell moves to node-b at generation 4: the planner says so first
    // (the destination took ownership before it started the cell).
    fake.says("node-b", 4);
    let mut b = node(&gw, "node-b").await;
    b.send(&serve(4)).await;
    routed_to(&gw, "node-b", 4).await;
    assert_eq!(
        fake.asked.load(Ordering::SeqCst),
        2,
        "a new generation is asked, whatever the cache holds"
    );
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    client.write_all(b"GET k").await.unwrap();
    gets_client_bytes(&mut b, b"GET k").await;
    gets_nothing(&mut a).await;

    // node-a, now stale, cannot take it back (no question needed).
    a.send(&serve(3)).await;
    assert!(matches!(a.recv().await, Some(ToNode::Stale { .. })));
    assert_eq!(fake.asked.load(Ordering::SeqCst), 2);
    routed_to(&gw, "node-b", 4).await;
}

#[tokio::test]
async fn a_planner_that_cannot_answer_keeps_the_route() {
    let fake = Arc::new(Fake::default());
    fake.says("node-a", 3);
    let gw = start(&fake).await;
    let mut a = node(&gw, "node-a").await;
    a.send(&serve(3)).await;
    routed_to(&gw, "node-a", 3).await;
    let mut client = TcpStream::connect(gw.service).await.unwrap();
    client.write_all(b"one").await.unwrap();
    gets_client_bytes(&mut a, b"one").await;

    // The planner goes away. A Serve that would change the route (even one
    // it would accept) is refused and its link closed: fail closed.
    fake.is_down();
    let mut b = node(&gw, "node-b").await;
    b.send(&serve(4)).await;
    let reason = loop {
        match b.recv().await {
            Some(ToNode::Refused { reason }) => break reason,
            Some(_) => continue,
            None => panic!("closed without Refused"),
        }
    };
    assert!(
        reason.contains("cannot check") && reason.contains("connection refused"),
        "{reason}"
    );
    assert!(
        b.recv().await.is_none(),
        "the link stays open after Refused"
    );
    routed_to(&gw, "node-a", 3).await;
    client.write_all(b"two").await.unwrap();
    gets_client_bytes(&mut a, b"two").await;

    // The owner's link drops and comes back while the planner is still
    // away: the same route is not a change, and it is taken again.
    drop(a);
    let mut a = node(&gw, "node-a").await;
    a.send(&ToGateway::Serve {
        service: "kv".into(),
        cell: "c-1".into(),
        generation: 3,
        conns: vec![],
    })
    .await;
    routed_to(&gw, "node-a", 3).await;
    let asked = fake.asked.load(Ordering::SeqCst);
    client.write_all(b"three").await.unwrap();
    // The cell lost the connection (it was not listed), so the gateway
    // closes it; a new client reaches node-a.
    let mut again = TcpStream::connect(gw.service).await.unwrap();
    again.write_all(b"four").await.unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"four") {
        match a.recv().await {
            Some(ToNode::Data { bytes, .. }) => got.extend_from_slice(&bytes),
            Some(_) => {}
            None => panic!("node-a's link closed"),
        }
    }
    assert_eq!(asked, 2, "re-attaching asked the planner");

    // The planner is back and names node-b: its Serve is accepted.
    fake.says("node-b", 4);
    let mut b = node(&gw, "node-b").await;
    b.send(&serve(4)).await;
    routed_to(&gw, "node-b", 4).await;
}
