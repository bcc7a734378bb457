//! Kept checkpoints and evacuation against simulated nodes: small HTTP
//! servers that speak the parts of the real node API the planner drives
//! (module upload, `keep`, `restore`) and record what they were asked, so
//! the test can check the planner's side of the exchange exactly. The
//! planner and its redb store are real; a node dies by no longer sending
//! heartbeats.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use roam_cluster::{CellRecord, CellState, ClusterStore, RedbStore};
use serde_json::{json, Value};

use crate::{Planner, PlannerConfig};

pub(crate) type Asked = Arc<Mutex<Vec<(String, Value)>>>;

const SNAPSHOT: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// A simulated node: its API address and what it was asked.
pub(crate) async fn sim_node() -> (String, Asked) {
    sim_node_with(false, Duration::ZERO).await
}

/// A simulated node that, if `refuse`, fails every restore, and takes
/// `keep_delay` to answer a kept checkpoint.
pub(crate) async fn sim_node_with(refuse: bool, keep_delay: Duration) -> (String, Asked) {
    let asked: Asked = Arc::default();
    let app = Router::new()
        .route(
            "/v1/modules",
            post(|State(a): State<Asked>, body: Bytes| async move {
                a.lock()
                    .unwrap()
                    .push(("modules".into(), json!(body.len())));
                // A node prepares the module: it knows it by another hash.
                let hash = blake3::hash(&[&body[..], b"prepared"].concat())
                    .to_hex()
                    .to_string();
                Json(json!({"hash": hash, "bytes": body.len()}))
            }),
        )
        .route(
            "/v1/cells",
            post(|State(a): State<Asked>, Json(v): Json<Value>| async move {
                a.lock().unwrap().push(("launch".into(), v.clone()));
                Json(json!({"id": v["id"], "state": "running", "program": "p",
                    "module": v["module"], "memory_bytes": 0, "uptime_ms": 0, "hops": 0}))
            }),
        )
        .route(
            "/v1/cells/restore",
            post(
                move |State(a): State<Asked>, Json(v): Json<Value>| async move {
                    a.lock().unwrap().push(("restore".into(), v.clone()));
                    if refuse {
                        let e = json!({"error": "cannot load the snapshot: disk full"});
                        return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, Json(e));
                    }
                    let info = json!({"id": v["id"], "state": "running", "program": "p",
                    "module": v["module"], "memory_bytes": 0, "uptime_ms": 0, "hops": 0});
                    (axum::http::StatusCode::OK, Json(info))
                },
            ),
        )
        .route(
            "/v1/cells/{id}/keep",
            post(
                move |State(a): State<Asked>, Path(id): Path<String>, Json(v): Json<Value>| async move {
                    a.lock().unwrap().push((format!("keep {id}"), v));
                    tokio::time::sleep(keep_delay).await;
                    Json(
                        json!({"snapshot": SNAPSHOT, "bytes": 4096, "sent_bytes": 1024,
                        "taken_ms": 1_700_000_000_000u64}),
                    )
                },
            ),
        )
        .route(
            "/v1/cells/{id}/migrate",
            post(
                |State(a): State<Asked>, Path(id): Path<String>, Json(v): Json<Value>| async move {
                    a.lock().unwrap().push((format!("migrate {id}"), v));
                    Json(json!({"migration": format!("m-{id}")}))
                },
            ),
        )
        .route(
            "/v1/kept/{id}/grant",
            post(
                |State(a): State<Asked>, Path(id): Path<String>, Json(v): Json<Value>| async move {
                    a.lock().unwrap().push((format!("grant {id}"), v));
                    Json(json!({}))
                },
            ),
        )
        .with_state(asked.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, asked)
}

/// A running cell on node `a`, at generation 1, without checkpoints.
pub(crate) fn cell(id: &str, module: &str) -> CellRecord {
    CellRecord {
        id: id.into(),
        module: module.into(),
        args: vec!["p".into(), "x".into()],
        env: vec![("K".into(), "V".into())],
        dirs: vec![],
        max_memory: Some(64 << 20),
        service: None,
        owner: "a".into(),
        generation: 1,
        state: CellState::Running,
        checkpoint_interval_s: 0,
        kept: None,
        created_ms: 0,
        handoff: None,
        far: None,
    }
}

pub(crate) async fn send(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = http.post(url).json(&body).send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

async fn wait_cell(
    store: &Arc<dyn ClusterStore>,
    id: &str,
    ok: impl Fn(&CellRecord) -> bool,
) -> CellRecord {
    for _ in 0..600 {
        let c = store.cell(id).await.unwrap().unwrap().value;
        if ok(&c) {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "cell {id} never reached the expected state: {:?}",
        store.cell(id).await.unwrap()
    );
}

/// A planner on a fresh redb store, serving: the store, its URL, and the
/// temp dir to keep.
pub(crate) async fn planner(
    lease: Option<Duration>,
) -> (Arc<dyn ClusterStore>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ClusterStore> =
        Arc::new(RedbStore::open(dir.path().join("cluster.redb")).unwrap());
    let mut cfg = PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.checkpoint_interval_s = 0;
    if let Some(lease) = lease {
        cfg.lease = lease;
    }
    let p = Planner::bind(cfg, store.clone()).await.unwrap();
    let url = p.url();
    tokio::spawn(p.serve(std::future::pending()));
    (store, url, dir)
}

/// What a simulated node reports about its machine.
fn machine() -> Value {
    json!({"cores": 4, "memory_total": 8u64 << 30, "memory_available": 8u64 << 30,
        "load1": 0.0})
}

/// Register node `name` reachable at `api`, reporting `cells` running.
pub(crate) async fn register(
    http: &reqwest::Client,
    url: &str,
    name: &str,
    api: &str,
    cells: Value,
) {
    let (st, v) = send(
        http,
        format!("{url}/v1/nodes"),
        json!({"name": name, "isa": "x86_64", "api": api, "migrate": "127.0.0.1:9",
            "version": "0.1.0", "status": {"machine": machine(), "cells": cells}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// Heartbeat for `names` every 200 ms, reporting no cells, until aborted.
pub(crate) fn heartbeats(
    http: &reqwest::Client,
    url: &str,
    names: &[&'static str],
) -> tokio::task::JoinHandle<()> {
    let (http, url, names) = (http.clone(), url.to_string(), names.to_vec());
    tokio::spawn(async move {
        loop {
            for n in &names {
                let body = json!({"status": {"machine": machine(), "cells": []}});
                let _ = send(&http, format!("{url}/v1/nodes/{n}/heartbeat"), body).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// A module in the store: its hash and bytes.
pub(crate) async fn module(store: &Arc<dyn ClusterStore>) -> (String, Vec<u8>) {
    let wasm = b"\0asm\x01\0\0\0".to_vec();
    let hash = blake3::hash(&wasm).to_hex().to_string();
    store.put_module(&hash, &wasm).await.unwrap();
    (hash, wasm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_nodes_cells_come_back_from_their_kept_checkpoints_or_are_lost() {
    let (store, url, _dir) = planner(Some(Duration::from_secs(2))).await;
    let (a_api, a_asked) = sim_node().await;
    let (b_api, b_asked) = sim_node().await;
    let http = reqwest::Client::new();
    register(&http, &url, "a", &a_api, json!([])).await;
    register(&http, &url, "b", &b_api, json!([])).await;
    // b keeps heartbeating; a stops after the checkpoint below.
    let beats = heartbeats(&http, &url, &["b"]);
    let (module, wasm) = module(&store).await;
    store.create_cell(cell("c-kept", &module)).await.unwrap();
    store.create_cell(cell("c-bare", &module)).await.unwrap();

    // A kept checkpoint now: a (the owner) is asked to keep it on b.
    let (st, kept) = send(
        &http,
        format!("{url}/v1/cells/c-kept/checkpoint"),
        json!(null),
    )
    .await;
    assert_eq!(st, 200, "{kept}");
    assert_eq!(
        kept,
        json!({"holder": "b", "snapshot": SNAPSHOT, "bytes": 4096,
            "taken_ms": 1_700_000_000_000u64, "generation": 1})
    );
    assert_eq!(
        a_asked.lock().unwrap().clone(),
        vec![(
            "keep c-kept".to_string(),
            json!({"holder": b_api, "holder_name": "b"})
        )]
    );
    // The holder was told first that a, the owner, may store it.
    assert_eq!(
        b_asked.lock().unwrap().first().cloned(),
        Some((
            "grant c-kept".to_string(),
            json!({"node": "a", "access": "store"})
        ))
    );
    // The owner is never its own holder: with b gone there is none.
    // (Checked by the policy's tests; here, the record names b.)
    let rec = store.cell("c-kept").await.unwrap().unwrap().value;
    assert_eq!(rec.kept.unwrap().holder, "b");

    // a dies (no heartbeats): c-kept comes back on b from b's checkpoint,
    // as generation 2; c-bare, without a checkpoint, is lost.
    let back = wait_cell(&store, "c-kept", |c| {
        c.state == CellState::Running && c.owner == "b"
    })
    .await;
    assert_eq!(back.generation, 2);
    let lost = wait_cell(&store, "c-bare", |c| {
        matches!(c.state, CellState::Lost { .. })
    })
    .await;
    match lost.state {
        CellState::Lost { error } => assert!(error.contains("no kept checkpoint"), "{error}"),
        s => panic!("{s:?}"),
    }
    assert_eq!(lost.owner, "a");
    let asked = b_asked.lock().unwrap().clone();
    assert_eq!(asked[0].0, "grant c-kept");
    assert_eq!(asked[1], ("modules".to_string(), json!(wasm.len())));
    let prepared = blake3::hash(&[&wasm[..], b"prepared"].concat())
        .to_hex()
        .to_string();
    assert_eq!(
        asked[2],
        (
            "restore".to_string(),
            json!({"id": "c-kept", "module": prepared, "args": ["p", "x"],
                "env": [["K", "V"]], "dirs": [], "max_memory": 64u64 << 20,
                "service": null, "generation": 2, "holder": b_api,
                "snapshot": SNAPSHOT})
        )
    );
    assert_eq!(asked.len(), 3, "{asked:?}");
    // a comes back: its registration tells it to stop what it no longer owns.
    let (st, v) = send(
        &http,
        format!("{url}/v1/nodes"),
        json!({"name": "a", "isa": "x86_64", "api": a_api, "migrate": "127.0.0.1:9",
            "version": "0.1.0", "status": {"machine": machine(), "cells": ["c-kept", "c-bare"]}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stop"], json!(["c-kept", "c-bare"]));
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("roam_planner_evacuations_total{result=\"restored\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("roam_planner_evacuations_total{result=\"lost\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("roam_planner_kept_checkpoint_age_seconds{cell=\"c-kept\"}"),
        "{text}"
    );
    beats.abort();
}

/// Nodes a (never heartbeats: it dies), b and c (simulated, heartbeating)
/// on a planner with a 2 s lease, and a module in the store.
struct Trio {
    store: Arc<dyn ClusterStore>,
    b_asked: Asked,
    c_api: String,
    c_asked: Asked,
    beats: tokio::task::JoinHandle<()>,
    module: String,
    _dir: tempfile::TempDir,
}

/// Start a [`Trio`]; b refuses every restore if `b_refuses`.
async fn trio(b_refuses: bool) -> Trio {
    let (store, url, dir) = planner(Some(Duration::from_secs(2))).await;
    let (b_api, b_asked) = sim_node_with(b_refuses, Duration::ZERO).await;
    let (c_api, c_asked) = sim_node().await;
    let http = reqwest::Client::new();
    for (name, api) in [("a", "127.0.0.1:9"), ("b", &b_api), ("c", &c_api)] {
        register(&http, &url, name, api, json!([])).await;
    }
    let beats = heartbeats(&http, &url, &["b", "c"]);
    let (module, _) = module(&store).await;
    Trio {
        store,
        b_asked,
        c_api,
        c_asked,
        beats,
        module,
        _dir: dir,
    }
}

/// A restore that the first chosen node (the checkpoint's holder) refuses
/// is tried on the next node, under a new generation, instead of losing
/// the cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_restore_is_tried_on_another_node() {
    let Trio {
        store,
        b_asked,
        c_asked,
        beats,
        module,
        _dir: _guard,
        ..
    } = trio(true).await;
    let mut rec = cell("c-kept", &module);
    rec.kept = Some(roam_cluster::Kept {
        holder: "b".into(),
        snapshot: SNAPSHOT.into(),
        bytes: 4096,
        taken_ms: 1_700_000_000_000,
        generation: 1,
    });
    store.create_cell(rec).await.unwrap();

    // a never heartbeats: it dies. The holder b is tried first and fails.
    let back = wait_cell(&store, "c-kept", |c| {
        c.state == CellState::Running && c.owner == "c"
    })
    .await;
    assert_eq!(back.generation, 3, "one generation per node tried");
    let restores = |asked: &Asked| {
        asked
            .lock()
            .unwrap()
            .iter()
            .filter(|(what, _)| what == "restore")
            .map(|(_, v)| v["generation"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(restores(&b_asked), vec![json!(2)]);
    assert_eq!(restores(&c_asked), vec![json!(3)]);
    // b, the holder, was told that c may read that one version; b restoring
    // from its own copy needed no grant.
    let grants: Vec<Value> = b_asked
        .lock()
        .unwrap()
        .iter()
        .filter(|(what, _)| what == "grant c-kept")
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(
        grants,
        vec![json!({"node": "c", "access": "read", "snapshot": SNAPSHOT})]
    );
    beats.abort();
}

/// A cell restored onto the holder of its kept checkpoint has its only copy
/// on its owner: the leader keeps a new one on another node at once, not a
/// whole interval later (a second death would otherwise lose the cell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_restored_onto_its_holder_is_kept_elsewhere_at_once() {
    // An hour's interval, and none (a checkpoint kept by hand).
    for interval in [3600, 0] {
        restored_onto_holder(interval).await;
    }
}

async fn restored_onto_holder(interval: u64) {
    let Trio {
        store,
        b_asked,
        c_api,
        beats,
        module,
        _dir: _guard,
        ..
    } = trio(false).await;
    let mut rec = cell("c-kept", &module);
    // A checkpoint just taken: nothing is due.
    rec.checkpoint_interval_s = interval;
    rec.kept = Some(roam_cluster::Kept {
        holder: "b".into(),
        snapshot: SNAPSHOT.into(),
        bytes: 4096,
        taken_ms: crate::unix_ms(),
        generation: 1,
    });
    store.create_cell(rec).await.unwrap();

    // a dies; the cell comes back on b, its holder, and is kept on c.
    let kept = wait_cell(&store, "c-kept", |c| {
        c.owner == "b" && c.kept.as_ref().is_some_and(|k| k.holder == "c")
    })
    .await;
    assert_eq!(kept.generation, 2);
    assert_eq!(kept.kept.unwrap().generation, 2);
    let keeps: Vec<Value> = b_asked
        .lock()
        .unwrap()
        .iter()
        .filter(|(what, _)| what == "keep c-kept")
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(keeps[0], json!({"holder": c_api, "holder_name": "c"}));
    beats.abort();
}

/// The leader learns that a cell ended from its owner's heartbeats: once a
/// heartbeat no longer lists the cell, it asks the owner, records the end
/// and announces it, without anyone reading the cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_is_learned_from_the_owners_heartbeats() {
    let (store, url, _dir) = planner(None).await;
    // The owner: its cell exited with status 3.
    let app = Router::new().route(
        "/v1/cells/{id}",
        axum::routing::get(|Path(id): Path<String>| async move {
            Json(
                json!({"id": id, "state": "exited", "code": 3, "program": "p",
                "module": "m", "memory_bytes": 0, "uptime_ms": 5, "hops": 0}),
            )
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await });
    let http = reqwest::Client::new();
    let (module, _) = module(&store).await;
    store.create_cell(cell("c-done", &module)).await.unwrap();
    let mut events = http.get(format!("{url}/v1/events")).send().await.unwrap();
    register(&http, &url, "a", &api, json!(["c-done"])).await;
    // Listed: the record stands.
    tokio::time::sleep(crate::leader::TICK * 3).await;
    let rec = store.cell("c-done").await.unwrap().unwrap().value;
    assert_eq!(rec.state, CellState::Running);
    // No longer listed: the leader asks and records the exit.
    let (st, v) = send(
        &http,
        format!("{url}/v1/nodes/a/heartbeat"),
        json!({"status": {"machine": machine(), "cells": []}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let rec = wait_cell(&store, "c-done", |c| c.state.ended()).await;
    assert_eq!(rec.state, CellState::Exited { code: 3 });
    let mut seen = String::new();
    while !seen.contains("event: ended") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), events.chunk())
            .await
            .expect("no ended event within 10 s")
            .unwrap()
            .expect("the event stream ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains(r#""cell":"c-done""#), "{seen}");
}

/// A burst of launches, faster than heartbeats report them, spreads over
/// the nodes: placements count the planner's own launches, not only what
/// the last full read of the cells saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_launches_spreads_over_the_nodes() {
    let (store, url, _dir) = planner(None).await;
    let http = reqwest::Client::new();
    let mut asked = Vec::new();
    for name in ["a", "b", "c"] {
        let (api, a) = sim_node().await;
        asked.push(a);
        register(&http, &url, name, &api, json!([])).await;
    }
    let (module, _) = module(&store).await;
    for _ in 0..9 {
        let (st, v) = send(
            &http,
            format!("{url}/v1/cells"),
            json!({"module": module, "args": ["p"]}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    let launches: Vec<usize> = asked
        .iter()
        .map(|a| {
            a.lock()
                .unwrap()
                .iter()
                .filter(|(w, _)| w == "launch")
                .count()
        })
        .collect();
    assert_eq!(launches, vec![3, 3, 3]);
}
