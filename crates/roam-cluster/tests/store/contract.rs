//! The contract every `ClusterStore` keeps, written once and run over each
//! backend by [`contract_tests!`]. Each check compares what the store
//! returns with what was written (the reference is the test's own copy).

use roam_testkit::pseudo_random;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_cluster::{
    CellRecord, CellState, ClusterStore, Kept, NodeRecord, NodeState, NodeStatus, StoreError,
    MAX_MODULE_BYTES,
};

/// The longest any bounded wait of these tests lasts before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Two handles on one cluster state: for etcd two clients (two planners);
/// for redb the same store twice (one process has the file). `_guard`
/// keeps the backend (a temp dir, an etcd process) alive.
pub struct Fixture<S> {
    pub a: Arc<S>,
    pub b: Arc<S>,
    pub _guard: Box<dyn std::any::Any + Send>,
}

pub fn node(name: &str) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        isa: "x86_64".into(),
        api: "127.0.0.1:7700".into(),
        migrate: "127.0.0.1:7701".into(),
        version: "0.1.0".into(),
        status: NodeStatus::default(),
        state: NodeState::Ready,
        alive: false,
        registered_ms: 1_700_000_000_000,
        heartbeat_ms: 0,
        maintenance: None,
    }
}

pub fn cell(id: &str, owner: &str) -> CellRecord {
    CellRecord {
        id: id.into(),
        module: "ab".repeat(32),
        args: vec!["prog".into(), "--n".into(), "7".into()],
        env: vec![("K".into(), "V".into())],
        dirs: vec!["/data".into()],
        max_memory: Some(64 << 20),
        service: None,
        owner: owner.into(),
        generation: 1,
        state: CellState::Running,
        checkpoint_interval_s: 30,
        kept: None,
        created_ms: 1_700_000_000_000,
        handoff: None,
        far: None,
    }
}

/// Poll `f` until it is true; fail after [`PATIENCE`] saying `what`.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < PATIENCE,
            "{what} did not happen within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn find<S: ClusterStore>(s: &S, name: &str) -> Option<NodeRecord> {
    s.nodes()
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.name == name)
}

/// Register, heartbeat, expiry, re-registration, state, removal.
pub async fn nodes_live_expire_and_come_back<S: ClusterStore>(s: &S) {
    // A node that keeps heartbeating within a long lease stays alive and
    // its status is what it last reported.
    s.register_node(node("steady"), Duration::from_secs(120))
        .await
        .unwrap();
    let mut status = NodeStatus {
        cells: vec!["c-1".into(), "c-2".into()],
        ..Default::default()
    };
    status.machine.cores = 8;
    s.heartbeat("steady", status.clone()).await.unwrap();
    let got = find(s, "steady").await.expect("steady is listed");
    assert!(got.alive, "{got:?}");
    assert_eq!(got.status, status);
    assert_eq!(got.isa, "x86_64");
    assert_eq!(got.registered_ms, 1_700_000_000_000);
    assert!(got.heartbeat_ms > 0);

    // A node with a short lease and no heartbeat dies, and then its
    // heartbeat is refused until it registers again.
    s.register_node(node("brief"), Duration::from_secs(1))
        .await
        .unwrap();
    eventually("the lease of `brief` running out", || async {
        !find(s, "brief").await.expect("brief stays listed").alive
    })
    .await;
    match s.heartbeat("brief", NodeStatus::default()).await {
        Err(StoreError::Expired(name)) => assert_eq!(name, "brief"),
        other => panic!("heartbeat after expiry: {other:?}"),
    }
    assert!(
        find(s, "steady").await.unwrap().alive,
        "steady is unaffected"
    );
    s.register_node(node("brief"), Duration::from_secs(120))
        .await
        .unwrap();
    assert!(find(s, "brief").await.unwrap().alive);
    s.heartbeat("brief", NodeStatus::default()).await.unwrap();

    // Unknown and malformed names.
    assert!(matches!(
        s.heartbeat("nobody", NodeStatus::default()).await,
        Err(StoreError::Expired(_))
    ));
    assert!(matches!(
        s.set_node_state("nobody", NodeState::Draining).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.register_node(node("../etc"), Duration::from_secs(5))
            .await,
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.heartbeat("a/b", NodeStatus::default()).await,
        Err(StoreError::Invalid(_))
    ));

    // Administrative state survives heartbeats.
    s.set_node_state("steady", NodeState::Draining)
        .await
        .unwrap();
    s.heartbeat("steady", status.clone()).await.unwrap();
    assert_eq!(find(s, "steady").await.unwrap().state, NodeState::Draining);
    // So does a maintenance window, until it is cleared.
    let window = roam_cluster::Maintenance {
        start_ms: 1_800_000_000_000,
        end_ms: 1_800_003_600_000,
        lead_ms: 60_000,
        drained: true,
    };
    assert!(s
        .swap_node_maintenance("steady", None, Some(window), None)
        .await
        .unwrap());
    s.heartbeat("steady", status.clone()).await.unwrap();
    assert_eq!(find(s, "steady").await.unwrap().maintenance, Some(window));
    // Only over the window the caller read, with the state in the same change.
    assert!(!s
        .swap_node_maintenance("steady", None, None, Some(NodeState::Ready))
        .await
        .unwrap());
    let kept = find(s, "steady").await.unwrap();
    assert_eq!(
        (kept.maintenance, kept.state),
        (Some(window), NodeState::Draining)
    );
    // Registering again keeps both.
    s.register_node(node("steady"), Duration::from_secs(5))
        .await
        .unwrap();
    let kept = find(s, "steady").await.unwrap();
    assert_eq!(
        (kept.maintenance, kept.state),
        (Some(window), NodeState::Draining)
    );
    assert!(s
        .swap_node_maintenance("steady", Some(window), None, Some(NodeState::Ready))
        .await
        .unwrap());
    let kept = find(s, "steady").await.unwrap();
    assert_eq!((kept.maintenance, kept.state), (None, NodeState::Ready));
    assert!(matches!(
        s.swap_node_maintenance("nobody", None, None, None).await,
        Err(StoreError::NotFound(_))
    ));

    // Removal.
    s.remove_node("brief").await.unwrap();
    assert!(find(s, "brief").await.is_none());
    assert!(matches!(
        s.remove_node("brief").await,
        Err(StoreError::NotFound(_))
    ));
    let names: Vec<String> = s
        .nodes()
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["steady".to_string()]);
}

/// Two planners share the nodes: what one writes, the other's heartbeats
/// neither undo nor trip over (a heartbeat after the other planner changed
/// the node's state, or registered it again with a new lease).
pub async fn two_planners_share_the_nodes<S: ClusterStore>(a: Arc<S>, b: Arc<S>) {
    a.register_node(node("edge-a"), Duration::from_secs(120))
        .await
        .unwrap();
    a.heartbeat("edge-a", NodeStatus::default()).await.unwrap();
    b.set_node_state("edge-a", NodeState::Draining)
        .await
        .unwrap();
    let status = NodeStatus {
        cells: vec!["c-9".into()],
        ..Default::default()
    };
    a.heartbeat("edge-a", status.clone()).await.unwrap();
    let got = find(&*b, "edge-a").await.unwrap();
    assert_eq!(
        got.state,
        NodeState::Draining,
        "a heartbeat undid a state change"
    );
    assert_eq!(got.status, status);

    let mut again = node("edge-a");
    again.api = "127.0.0.1:7800".into();
    b.register_node(again, Duration::from_secs(120))
        .await
        .unwrap();
    a.heartbeat("edge-a", NodeStatus::default()).await.unwrap();
    let got = find(&*a, "edge-a").await.unwrap();
    assert!(got.alive);
    assert_eq!(
        got.api, "127.0.0.1:7800",
        "a heartbeat undid a registration"
    );

    b.remove_node("edge-a").await.unwrap();
    assert!(matches!(
        a.heartbeat("edge-a", NodeStatus::default()).await,
        Err(StoreError::Expired(_))
    ));
    assert!(find(&*a, "edge-a").await.is_none());
}

/// Create, read, compare-and-swap, delete; revisions never repeat.
pub async fn cells_compare_and_swap<S: ClusterStore>(s: &S) {
    let mut c = cell("c-1", "edge-a");
    let r1 = s.create_cell(c.clone()).await.unwrap();
    assert!(r1 > 0);
    assert!(matches!(
        s.create_cell(cell("c-1", "edge-b")).await,
        Err(StoreError::Exists(_))
    ));
    let got = s.cell("c-1").await.unwrap().expect("c-1 exists");
    assert_eq!((got.value.clone(), got.revision), (c.clone(), r1));

    c.owner = "edge-b".into();
    c.generation = 2;
    c.kept = Some(Kept {
        holder: "edge-c".into(),
        snapshot: "cd".repeat(32),
        bytes: 123_456,
        taken_ms: 1_700_000_001_000,
        generation: 1,
    });
    let r2 = s.update_cell(r1, c.clone()).await.unwrap();
    assert_ne!(r2, r1);
    match s.update_cell(r1, cell("c-1", "edge-x")).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (r1, r2)),
        other => panic!("a stale update: {other:?}"),
    }
    let got = s.cell("c-1").await.unwrap().unwrap();
    assert_eq!((got.value, got.revision), (c.clone(), r2));

    let other = cell("c-2", "edge-a");
    let r_other = s.create_cell(other.clone()).await.unwrap();
    let mut all = s.cells().await.unwrap();
    all.sort_by(|x, y| x.value.id.cmp(&y.value.id));
    assert_eq!(all.len(), 2);
    assert_eq!((&all[0].value, all[0].revision), (&c, r2));
    assert_eq!((&all[1].value, all[1].revision), (&other, r_other));

    assert!(matches!(
        s.delete_cell("c-1", r1).await,
        Err(StoreError::Conflict { .. })
    ));
    s.delete_cell("c-1", r2).await.unwrap();
    assert!(s.cell("c-1").await.unwrap().is_none());
    match s.update_cell(r2, c.clone()).await {
        Err(StoreError::Conflict { actual, .. }) => assert_eq!(actual, 0),
        other => panic!("an update of a deleted cell: {other:?}"),
    }
    assert!(matches!(
        s.delete_cell("c-1", r2).await,
        Err(StoreError::Conflict { actual: 0, .. })
    ));
    let r3 = s.create_cell(cell("c-1", "edge-a")).await.unwrap();
    assert!(![r1, r2].contains(&r3), "a revision repeated: {r3}");

    for bad in ["", "a/b", "..", "-x"] {
        assert!(
            matches!(s.cell(bad).await, Err(StoreError::Invalid(_))),
            "{bad:?}"
        );
        assert!(
            matches!(
                s.create_cell(cell(bad, "edge-a")).await,
                Err(StoreError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
}

/// Two updaters from the same revision, many times and concurrently:
/// exactly one wins each time, and the record is the winner's.
pub async fn cas_races_have_one_winner<S: ClusterStore>(a: Arc<S>, b: Arc<S>) {
    const CELLS: usize = 16;
    const ROUNDS: usize = 8;
    for i in 0..CELLS {
        a.create_cell(cell(&format!("race-{i}"), "origin"))
            .await
            .unwrap();
    }
    for round in 0..ROUNDS {
        let mut tasks = Vec::new();
        for i in 0..CELLS {
            let id = format!("race-{i}");
            let rev = a.cell(&id).await.unwrap().unwrap().revision;
            for (who, store) in [("left", a.clone()), ("right", b.clone())] {
                let mut c = cell(&id, &format!("{who}-{round}"));
                c.generation = round as u64 + 2;
                tasks.push(tokio::spawn(async move {
                    (c.owner.clone(), store.update_cell(rev, c).await)
                }));
            }
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        for (i, pair) in results.chunks(2).enumerate() {
            let id = format!("race-{i}");
            let winners: Vec<&(String, _)> = pair.iter().filter(|(_, r)| r.is_ok()).collect();
            assert_eq!(winners.len(), 1, "{id} round {round}: {pair:?}");
            for (_, r) in pair {
                if let Err(e) = r {
                    assert!(matches!(e, StoreError::Conflict { .. }), "{e}");
                }
            }
            let (owner, revision) = (&winners[0].0, *winners[0].1.as_ref().unwrap());
            let now = a.cell(&id).await.unwrap().unwrap();
            assert_eq!((&now.value.owner, now.revision), (owner, revision));
        }
    }
}

/// Many planners create the same cell at once: exactly one creates it,
/// the others are told it exists, and the record is the creator's.
pub async fn create_races_have_one_winner<S: ClusterStore>(a: Arc<S>, b: Arc<S>) {
    for round in 0..8 {
        let id = format!("born-{round}");
        let mut tasks = Vec::new();
        for i in 0..16 {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            let c = cell(&id, &format!("creator-{i}"));
            tasks.push(tokio::spawn(async move {
                (c.owner.clone(), store.create_cell(c).await)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (owner, Ok(rev)) => winners.push((owner, rev)),
                (_, Err(StoreError::Exists(_))) => {}
                (_, Err(e)) => panic!("a racing create: {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "{id}: {winners:?}");
        let now = a.cell(&id).await.unwrap().unwrap();
        assert_eq!((now.value.owner, now.revision), winners.remove(0));
    }
}

fn module_name(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Modules round trip, several chunks long; storing again is a no-op;
/// oversized and misnamed ones (not named by their BLAKE3 hash, or not a
/// hash at all) are refused.
pub async fn modules_round_trip<S: ClusterStore>(s: &S) {
    let big = pseudo_random((3 << 20) + 12_345, 7);
    let small = pseudo_random(1000, 9);
    let empty = Vec::new();
    let mut want = Vec::new();
    for m in [&big, &small, &empty] {
        let hash = module_name(m);
        s.put_module(&hash, m).await.unwrap();
        s.put_module(&hash, m).await.unwrap();
        want.push((hash, m.len() as u64));
    }
    for (m, (hash, _)) in [&big, &small, &empty].into_iter().zip(&want) {
        assert_eq!(s.module(hash).await.unwrap().as_ref(), Some(m));
    }
    let mut listed: Vec<(String, u64)> = s
        .modules()
        .await
        .unwrap()
        .into_iter()
        .map(|m| (m.hash, m.bytes))
        .collect();
    listed.sort();
    want.sort();
    assert_eq!(listed, want);
    assert_eq!(s.module(&"0".repeat(64)).await.unwrap(), None);
    assert!(matches!(
        s.module("../x").await,
        Err(StoreError::Invalid(_))
    ));
    // A name that is not the bytes' hash is refused, and nothing is kept.
    let misnamed = "2".repeat(64);
    match s.put_module(&misnamed, &big).await {
        Err(StoreError::Invalid(why)) => assert!(why.contains("not to the name"), "{why}"),
        other => panic!("a misnamed module: {other:?}"),
    }
    assert_eq!(s.module(&misnamed).await.unwrap(), None);
    let huge = vec![0u8; MAX_MODULE_BYTES + 1];
    match s.put_module(&"1".repeat(64), &huge).await {
        Err(StoreError::Invalid(why)) => assert!(why.contains("256 MiB"), "{why}"),
        other => panic!("an oversized module: {other:?}"),
    }
    assert_eq!(s.module(&"1".repeat(64)).await.unwrap(), None);
}

/// Two planners ask to lead: the second waits until the first gives the
/// lead up, then leads.
pub async fn leadership_passes_over<S: ClusterStore>(a: Arc<S>, b: Arc<S>) {
    let first = a.lead("planner-1").await.unwrap();
    assert!(first.held());
    let waiting = tokio::spawn(async move { b.lead("planner-2").await });
    // The second must not lead while the first does.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "two planners lead at once");
    assert!(first.held());
    drop(first);
    let second = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the second planner leads once the first gives up")
        .unwrap()
        .unwrap();
    assert!(second.held());
    // And back again.
    let again = tokio::spawn({
        let a = a.clone();
        async move { a.lead("planner-1").await }
    });
    drop(second);
    let third = tokio::time::timeout(PATIENCE, again)
        .await
        .expect("the lead passes back")
        .unwrap()
        .unwrap();
    assert!(third.held());
}

/// A setting written through one handle is read through the other (a
/// second planner), overwrites replace it, and bad names or values are
/// refused before anything is stored.
pub async fn settings_are_shared<S: ClusterStore>(a: Arc<S>, b: Arc<S>) {
    assert_eq!(b.setting("placement").await.unwrap(), None);
    a.put_setting("placement", "manual").await.unwrap();
    assert_eq!(
        b.setting("placement").await.unwrap().as_deref(),
        Some("manual")
    );
    b.put_setting("placement", "least-loaded").await.unwrap();
    assert_eq!(
        a.setting("placement").await.unwrap().as_deref(),
        Some("least-loaded")
    );
    for bad in ["", "../x", "Placement", &"x".repeat(65)] {
        let e = a.put_setting(bad, "v").await.unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)), "{bad:?}: {e}");
        assert!(matches!(a.setting(bad).await, Err(StoreError::Invalid(_))));
    }
    let long = "v".repeat(roam_cluster::MAX_SETTING_BYTES + 1);
    let e = a.put_setting("placement", &long).await.unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e}");
    assert_eq!(
        a.setting("placement").await.unwrap().as_deref(),
        Some("least-loaded")
    );
}

/// The contract over one backend: `$fixture` is an async fn returning
/// `Option<Fixture<_>>` (`None`: the backend is not installed, skip).
#[macro_export]
macro_rules! contract_tests {
    ($fixture:path) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn nodes_live_expire_and_come_back() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::nodes_live_expire_and_come_back(&*f.a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_planners_share_the_nodes() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::two_planners_share_the_nodes(f.a.clone(), f.b.clone()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cells_compare_and_swap() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::cells_compare_and_swap(&*f.a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn cas_races_have_one_winner() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::cas_races_have_one_winner(f.a.clone(), f.b.clone()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn create_races_have_one_winner() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::create_races_have_one_winner(f.a.clone(), f.b.clone()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn modules_round_trip() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::modules_round_trip(&*f.a).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn settings_are_shared() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::settings_are_shared(f.a.clone(), f.b.clone()).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn leadership_passes_over() {
            let Some(f) = $fixture().await else { return };
            $crate::contract::leadership_passes_over(f.a.clone(), f.b.clone()).await;
        }
    };
}
