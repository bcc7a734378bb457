//! The contract over a real etcd (started by the test, on free loopback
//! ports), and what only etcd does: leases that end with the process that
//! kept them, and an etcd that dies under its clients.

use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_cluster::{ClusterStore, EtcdStore, NodeStatus, StoreError};
use roam_testkit::etcd::Etcd;

use crate::contract::{cell, eventually, node, Fixture, PATIENCE};

async fn connect(etcd: &Etcd) -> EtcdStore {
    EtcdStore::connect(&[etcd.url()], "/roam-test/")
        .await
        .unwrap()
}

async fn fixture() -> Option<Fixture<EtcdStore>> {
    let etcd = Etcd::start_or_skip()?;
    let a = Arc::new(connect(&etcd).await);
    let b = Arc::new(connect(&etcd).await);
    Some(Fixture {
        a,
        b,
        _guard: Box::new(etcd),
    })
}

contract_tests!(fixture);

/// Two stores on two prefixes of one etcd do not see each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_keep_clusters_apart() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let one = EtcdStore::connect(&[etcd.endpoint()], "/one")
        .await
        .unwrap();
    let two = EtcdStore::connect(&[etcd.endpoint()], "/one-more/")
        .await
        .unwrap();
    assert_eq!(one.prefix(), "/one/");
    one.create_cell(cell("c-1", "edge-a")).await.unwrap();
    one.register_node(node("edge-a"), Duration::from_secs(60))
        .await
        .unwrap();
    assert!(two.cells().await.unwrap().is_empty());
    assert!(two.nodes().await.unwrap().is_empty());
    assert_eq!(one.cells().await.unwrap().len(), 1);
}

/// A listing longer than one page comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_listings_are_read_page_by_page() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let s = connect(&etcd).await;
    let mut want = Vec::new();
    for i in 0..1_234 {
        let id = format!("c-{i:05}");
        s.create_cell(cell(&id, "edge-a")).await.unwrap();
        want.push(id);
    }
    let mut got: Vec<String> = s
        .cells()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.value.id)
        .collect();
    got.sort();
    assert_eq!(got, want);
}

/// A damaged record is `Corrupt`, naming its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_corrupt_not_a_panic() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let s = connect(&etcd).await;
    let mut raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    raw.put("/roam-test/cells/bad", "{\"v\":1,\"record\":[]}", None)
        .await
        .unwrap();
    raw.put("/roam-test/nodes/bad", "\u{0}\u{1}", None)
        .await
        .unwrap();
    match s.cell("bad").await {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "/roam-test/cells/bad"),
        other => panic!("a damaged cell: {other:?}"),
    }
    assert!(matches!(s.nodes().await, Err(StoreError::Corrupt { .. })));
    // A manifest claiming more than a module may have is refused before
    // anything is allocated.
    let hash = "ab".repeat(32);
    raw.put(
        format!("/roam-test/manifests/{hash}"),
        "{\"v\":1,\"record\":{\"bytes\":18446744073709551615,\"chunks\":1}}",
        None,
    )
    .await
    .unwrap();
    assert!(matches!(
        s.module(&hash).await,
        Err(StoreError::Corrupt { .. })
    ));
}

/// A module changed in etcd behind the store's back (another client of the
/// same etcd) is `Corrupt` on read, never handed to a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_module_is_corrupt_on_read() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let s = connect(&etcd).await;
    let module = b"\0asm\x01\0\0\0 the module as uploaded".to_vec();
    let hash = blake3::hash(&module).to_hex().to_string();
    s.put_module(&hash, &module).await.unwrap();
    assert_eq!(s.module(&hash).await.unwrap(), Some(module.clone()));
    let mut raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    // Same length, so only the hash can tell.
    let mut changed = module.clone();
    changed[9] ^= 0x20;
    raw.put(format!("/roam-test/modules/{hash}/0"), changed, None)
        .await
        .unwrap();
    match s.module(&hash).await {
        Err(StoreError::Corrupt { key, message }) => {
            assert_eq!(key, format!("/roam-test/manifests/{hash}"));
            assert!(message.contains("hash to"), "{message}");
        }
        other => panic!("a changed module: {other:?}"),
    }
}

/// Killing etcd surfaces as `Backend` errors naming the endpoint, within a
/// bound, for every kind of call, and the leader learns it lost the lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_etcd_is_an_error_not_a_hang() {
    let Some(mut etcd) = Etcd::start_or_skip() else {
        return;
    };
    let s = connect(&etcd).await;
    s.register_node(node("edge-a"), Duration::from_secs(60))
        .await
        .unwrap();
    let rev = s.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let mut lead = s.lead("planner-1").await.unwrap();
    assert!(lead.held());
    let endpoint = etcd.endpoint();
    etcd.kill();

    let started = Instant::now();
    let results: Vec<(&str, Result<(), StoreError>)> = vec![
        ("nodes", s.nodes().await.map(|_| ())),
        (
            "heartbeat",
            s.heartbeat("edge-a", NodeStatus::default()).await,
        ),
        ("cell", s.cell("c-1").await.map(|_| ())),
        ("cells", s.cells().await.map(|_| ())),
        (
            "update_cell",
            s.update_cell(rev, cell("c-1", "edge-b")).await.map(|_| ()),
        ),
        ("modules", s.modules().await.map(|_| ())),
    ];
    for (what, result) in results {
        match result {
            Err(StoreError::Backend { backend, message }) => {
                assert_eq!(backend, "etcd");
                assert!(message.contains(&endpoint), "{what}: {message}");
            }
            other => panic!("{what} with etcd dead: {other:?}"),
        }
    }
    assert!(
        started.elapsed() < PATIENCE,
        "calls to a dead etcd took {:?}",
        started.elapsed()
    );
    tokio::time::timeout(PATIENCE, lead.lost())
        .await
        .expect("the leader learns it lost the lead when etcd dies");
    assert!(!lead.held());
    // Connecting to a dead etcd fails too, within the bound.
    match EtcdStore::connect(std::slice::from_ref(&endpoint), "/roam-test/").await {
        Err(StoreError::Backend { message, .. }) => assert!(message.contains(&endpoint)),
        other => panic!("connect to a dead etcd: {other:?}"),
    }
}

/// A leader that stops renewing its lease (its planner died, or was cut
/// off) loses the lead to a waiting planner once the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_ends_is_replaced() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let a = connect(&etcd).await;
    let b = Arc::new(connect(&etcd).await);
    let mut first = a.lead("planner-1").await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lead("planner-2").await }
    });
    // Revoke the leader's lease behind its back, as etcd does when the
    // lease runs out.
    let raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    let leader = raw
        .election_client()
        .leader("/roam-test/leader")
        .await
        .unwrap();
    let kv = leader.kv().expect("someone leads");
    assert_eq!(kv.value(), b"planner-1");
    raw.lease_client().revoke(kv.lease()).await.unwrap();

    tokio::time::timeout(PATIENCE, first.lost())
        .await
        .expect("the first leader learns its lease is gone");
    let second = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiting planner leads")
        .unwrap()
        .unwrap();
    assert!(second.held());
    eventually("etcd naming planner-2 the leader", || {
        let raw = raw.clone();
        async move {
            raw.election_client()
                .leader("/roam-test/leader")
                .await
                .ok()
                .and_then(|l| l.kv().map(|kv| kv.value() == b"planner-2"))
                .unwrap_or(false)
        }
    })
    .await;
}

/// A node's liveness is its lease: when the lease is revoked (as when it
/// runs out), the node is dead and its heartbeat is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dies_with_its_lease() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let s = connect(&etcd).await;
    s.register_node(node("edge-a"), Duration::from_secs(600))
        .await
        .unwrap();
    let mut raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    let alive = raw.get("/roam-test/alive/edge-a", None).await.unwrap();
    let lease = alive.kvs()[0].lease();
    assert_ne!(lease, 0, "the alive key is attached to a lease");
    // A heartbeat renews that lease: wait until its remaining TTL has
    // dropped (etcd reports whole seconds), then it goes back up.
    let remaining = |raw: &etcd_client::Client| {
        let mut leases = raw.lease_client();
        async move { leases.time_to_live(lease, None).await.unwrap().ttl() }
    };
    eventually("the lease of edge-a counting down", || async {
        remaining(&raw).await <= 597
    })
    .await;
    let before = remaining(&raw).await;
    s.heartbeat("edge-a", NodeStatus::default()).await.unwrap();
    let after = remaining(&raw).await;
    assert!(
        after > before,
        "the heartbeat did not renew: {before} s then {after} s"
    );
    raw.lease_client().revoke(lease).await.unwrap();
    let listed = s.nodes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].alive);
    assert!(matches!(
        s.heartbeat("edge-a", NodeStatus::default()).await,
        Err(StoreError::Expired(_))
    ));
    // Registering again gives it a new lease.
    s.register_node(node("edge-a"), Duration::from_secs(600))
        .await
        .unwrap();
    assert!(s.nodes().await.unwrap()[0].alive);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_spec_connects_under_its_prefix() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    let spec: roam_cluster::StoreSpec = format!("etcd://{}/spec-test", etcd.endpoint())
        .parse()
        .unwrap();
    let store = spec.open().await.unwrap();
    assert_eq!(store.backend(), "etcd");
    store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let raw = etcd_client::Client::connect([etcd.url()], None)
        .await
        .unwrap();
    let got = raw
        .kv_client()
        .get("/spec-test/cells/c-1", None)
        .await
        .unwrap();
    assert_eq!(got.kvs().len(), 1);
}
