//! Maintenance windows against a real planner on redb and simulated nodes
//! (`evac_tests`): the API's checks, and the leader draining a node before
//! its window, moving its cell away, and putting the node back after.

use std::time::Duration;

use roam_cluster::{ClusterStore, NodeState};
use serde_json::{json, Value};

use crate::evac_tests::{
    cell, heartbeats, module, planner, register, send, sim_node, sim_node_with,
};
use crate::unix_ms;

async fn put(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = http.put(url).json(&body).send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// Poll node `name`'s record until `ok`; fail after 10 s.
async fn wait_node(
    store: &std::sync::Arc<dyn ClusterStore>,
    name: &str,
    what: &str,
    ok: impl Fn(&roam_cluster::NodeRecord) -> bool,
) {
    for _ in 0..200 {
        let nodes = store.nodes().await.unwrap();
        if nodes.iter().any(|n| n.name == name && ok(n)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: {:?}", store.nodes().await.unwrap());
}

/// A planner with nodes a and b, heartbeating, and cell c1 running on a.
struct Pair {
    store: std::sync::Arc<dyn ClusterStore>,
    url: String,
    http: reqwest::Client,
    /// b's API address.
    b: String,
    /// What a was asked.
    asked_a: crate::evac_tests::Asked,
    beats: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// [`Pair`], where a takes `keep_delay` to answer a kept checkpoint.
async fn pair(keep_delay: Duration) -> Pair {
    let (store, url, _dir) = planner(None).await;
    let http = reqwest::Client::new();
    let (a, asked_a) = sim_node_with(false, keep_delay).await;
    let (b, _) = sim_node().await;
    register(&http, &url, "a", &a, json!(["c1"])).await;
    register(&http, &url, "b", &b, json!([])).await;
    let beats = heartbeats(&http, &url, &["a", "b"]);
    let (hash, _) = module(&store).await;
    store.create_cell(cell("c1", &hash)).await.unwrap();
    Pair {
        store,
        url,
        http,
        b,
        asked_a,
        beats,
        _dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_are_checked_kept_and_cancelled() {
    let (store, url, _dir) = planner(None).await;
    let http = reqwest::Client::new();
    let (a, _) = sim_node().await;
    register(&http, &url, "a", &a, json!([])).await;
    let now = unix_ms();
    let at = |path: &str| format!("{url}/v1/nodes/{path}/maintenance");
    for (body, why) in [
        (
            json!({"start_ms": now + 60_000, "end_ms": now + 60_000, "lead_ms": 0}),
            "must end after it starts",
        ),
        (
            json!({"start_ms": now - 120_000, "end_ms": now - 60_000, "lead_ms": 0}),
            "already ended",
        ),
        (
            json!({"start_ms": now, "end_ms": now + 40 * 86_400_000u64, "lead_ms": 0}),
            "at most 30 days",
        ),
        (
            json!({"start_ms": now, "end_ms": now + 60_000, "lead_ms": 2 * 86_400_000u64}),
            "at most a day",
        ),
        (
            json!({"start_ms": now + 400 * 86_400_000u64,
                "end_ms": now + 401 * 86_400_000u64, "lead_ms": 0}),
            "within a year",
        ),
    ] {
        let (st, v) = put(&http, at("a"), body).await;
        assert_eq!(st, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains(why), "{v}");
    }
    let window = json!({"start_ms": now + 3_600_000, "end_ms": now + 7_200_000,
        "lead_ms": 300_000});
    let (st, v) = put(&http, at("nobody"), window.clone()).await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = put(&http, at("a"), window).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["maintenance"]["start_ms"], now + 3_600_000, "{v}");
    assert_eq!(v["maintenance"]["drained"], false, "{v}");
    // A node that registers again keeps its window.
    register(&http, &url, "a", &a, json!([])).await;
    let n = store.nodes().await.unwrap();
    assert!(n[0].maintenance.is_some(), "{n:?}");
    let r = http.delete(at("a")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(store.nodes().await.unwrap()[0].maintenance.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_drains_before_the_window_and_undrains_after() {
    let Pair {
        store,
        url,
        http,
        b,
        asked_a,
        beats,
        _dir,
    } = pair(Duration::ZERO).await;
    // A node drained by hand before its window stays drained after it.
    let (c, _) = sim_node().await;
    register(&http, &url, "c", &c, json!([])).await;
    let (st, v) = send(&http, format!("{url}/v1/nodes/c/drain"), Value::Null).await;
    assert_eq!(st, 200, "{v}");

    let now = unix_ms();
    let window = json!({"start_ms": now + 1_500, "end_ms": now + 4_000, "lead_ms": 1_000});
    for node in ["a", "c"] {
        let (st, v) = put(
            &http,
            format!("{url}/v1/nodes/{node}/maintenance"),
            window.clone(),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    // Nothing before the lead.
    let n = store.nodes().await.unwrap();
    assert_eq!(
        n.iter().find(|x| x.name == "a").unwrap().state,
        NodeState::Ready
    );

    wait_node(&store, "a", "a drained for its window", |n| {
        n.state == NodeState::Draining && n.maintenance.is_some_and(|m| m.drained)
    })
    .await;
    assert!(
        unix_ms() >= now + 500,
        "drained before start − lead: {} ms after the declaration",
        unix_ms() - now
    );
    // Its cell was sent to b, the only node in service.
    for _ in 0..100 {
        if asked_a
            .lock()
            .unwrap()
            .iter()
            .any(|(k, _)| k == "migrate c1")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = asked_a.lock().unwrap().clone();
    let (_, req) = asked
        .iter()
        .find(|(k, _)| k == "migrate c1")
        .unwrap_or_else(|| panic!("a was never asked to move c1: {asked:?}"));
    assert_eq!(req["to"], b.as_str(), "{req}");
    assert_eq!(req["mode"], "pre-copy", "{req}");

    // After the window: a is back in service, c (drained by hand) is not,
    // and both windows are gone.
    wait_node(&store, "a", "a back in service", |n| {
        n.state == NodeState::Ready && n.maintenance.is_none()
    })
    .await;
    assert!(unix_ms() >= now + 4_000);
    wait_node(&store, "c", "c's window cleared", |n| {
        n.maintenance.is_none()
    })
    .await;
    let n = store.nodes().await.unwrap();
    assert_eq!(
        n.iter().find(|x| x.name == "c").unwrap().state,
        NodeState::Draining
    );
    beats.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_moved_later_or_cancelled_gives_the_node_back() {
    let (store, url, _dir) = planner(None).await;
    let http = reqwest::Client::new();
    let (a, _) = sim_node().await;
    register(&http, &url, "a", &a, json!([])).await;
    let beats = heartbeats(&http, &url, &["a"]);
    let at = format!("{url}/v1/nodes/a/maintenance");
    let soon = |now: u64| json!({"start_ms": now + 500, "end_ms": now + 60_000, "lead_ms": 1_000});
    let drained = |n: &roam_cluster::NodeRecord| {
        n.state == NodeState::Draining && n.maintenance.is_some_and(|m| m.drained)
    };
    let (st, v) = put(&http, at.clone(), soon(unix_ms())).await;
    assert_eq!(st, 200, "{v}");
    wait_node(&store, "a", "a drained for its window", drained).await;
    // Postponed by an hour: the node takes cells again until the new
    // window's drain begins.
    let later = unix_ms() + 3_600_000;
    let (st, v) = put(
        &http,
        at.clone(),
        json!({"start_ms": later, "end_ms": later + 600_000, "lead_ms": 300_000}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "ready", "{v}");
    assert_eq!(v["maintenance"]["drained"], false, "{v}");
    // Brought forward again, then cancelled while drained: back in service.
    let (st, v) = put(&http, at.clone(), soon(unix_ms())).await;
    assert_eq!(st, 200, "{v}");
    wait_node(&store, "a", "a drained again", drained).await;
    let r = http.delete(&at).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["state"], "ready", "{v}");
    assert!(v["maintenance"].is_null(), "{v}");
    beats.abort();
}

/// A drain while a kept checkpoint of the cell is in progress still moves
/// the cell (the owner serialises the two): a drained node must not keep a
/// cell because a checkpoint happened to overlap the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_a_cell_whose_checkpoint_is_in_progress() {
    let Pair {
        url,
        http,
        asked_a,
        beats,
        _dir,
        ..
    } = pair(Duration::from_secs(3)).await;
    let keep = {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            send(&http, format!("{url}/v1/cells/c1/checkpoint"), Value::Null).await
        })
    };
    let asked = |what: &str| asked_a.lock().unwrap().iter().any(|(k, _)| k == what);
    for _ in 0..100 {
        if asked("keep c1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(asked("keep c1"), "a was never asked to keep c1");
    let (st, v) = send(&http, format!("{url}/v1/nodes/a/drain"), Value::Null).await;
    assert_eq!(st, 200, "{v}");
    assert!(!keep.is_finished(), "the checkpoint ended before the drain");
    let moves = v["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 1, "{v}");
    assert_eq!(moves[0]["cell"], "c1", "{v}");
    assert!(moves[0]["error"].is_null(), "{v}");
    assert!(asked("migrate c1"), "a was never asked to move c1");
    // The checkpoint's own answer is whatever the planner makes of a cell
    // that left meanwhile; it must only come.
    keep.await.unwrap();
    beats.abort();
}
