//! The API handlers against a real planner on a loopback port with a real
//! redb store in a temporary directory, spoken to over HTTP.

use std::sync::Arc;

use roam_cluster::{CellRecord, CellState, ClusterStore, RedbStore};
use serde_json::{json, Value};

use crate::{Planner, PlannerConfig};

struct Running {
    url: String,
    store: Arc<dyn ClusterStore>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn start(token: Option<&str>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ClusterStore> =
        Arc::new(RedbStore::open(dir.path().join("cluster.redb")).unwrap());
    let mut cfg = PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.checkpoint_interval_s = 0;
    cfg.token = token.map(|t| roam_auth::Token::new(t, "in the test").unwrap());
    let p = Planner::bind(cfg, store.clone()).await.unwrap();
    let url = p.url();
    tokio::spawn(p.serve(std::future::pending()));
    Running {
        url,
        store,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Running {
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        (st, r.json().await.unwrap_or(Value::Null))
    }

    async fn register(&self, name: &str) -> (u16, Value) {
        self.post(
            "/v1/nodes",
            json!({"name": name, "isa": "x86_64", "api": format!("127.0.0.1:1/{name}"),
                "migrate": "127.0.0.1:2", "version": "0.1.0",
                "status": {"machine": {"cores": 4, "memory_total": 8u64 << 30,
                    "memory_available": 8u64 << 30, "load1": 0.0}, "cells": []}}),
        )
        .await
    }
}

fn cell(id: &str, owner: &str) -> CellRecord {
    CellRecord {
        id: id.into(),
        module: "a".repeat(64),
        args: vec!["p".into()],
        env: vec![],
        dirs: vec![],
        max_memory: None,
        service: None,
        owner: owner.into(),
        generation: 1,
        state: CellState::Running,
        checkpoint_interval_s: 0,
        kept: None,
        created_ms: 0,
        handoff: None,
        far: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_register_heartbeat_and_list() {
    let p = start(None).await;
    let (st, v) = p.register("edge-a").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["lease_ms"], crate::DEFAULT_LEASE.as_millis() as u64);
    assert!(v["heartbeat_ms"].as_u64().unwrap() < v["lease_ms"].as_u64().unwrap());
    let hb = json!({"status": {"machine": {"cores": 4, "memory_total": 1, "memory_available": 1,
        "load1": 0.5}, "cells": []}});
    let (st, _) = p.post("/v1/nodes/edge-a/heartbeat", hb.clone()).await;
    assert_eq!(st, 200);
    // Never registered: register first.
    let (st, v) = p.post("/v1/nodes/edge-b/heartbeat", hb.clone()).await;
    assert_eq!(st, 410, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("register again"),
        "{v}"
    );
    // A name that is not one is refused before any handler.
    let (st, v) = p.post("/v1/nodes/..%2Fx/heartbeat", hb).await;
    assert_eq!(st, 400, "{v}");
    // The gateway path is checked like the rest: a good one is kept, a
    // bad id, service or address refused with the field named.
    let with_gw = |gw: Value| {
        json!({"status": {"machine": {"cores": 4, "memory_total": 1, "memory_available": 1,
            "load1": 0.5}, "cells": [], "gateway": gw}})
    };
    let good = json!({"address": "127.0.0.1:7800", "id": "gw-00000000000000a1",
        "connected": true, "rtt_us": 4000,
        "services": [{"service": "kv", "cell": "c-1", "conns": 2, "frames": 9, "bytes": 90}]});
    let (st, v) = p
        .post("/v1/nodes/edge-a/heartbeat", with_gw(good.clone()))
        .await;
    assert_eq!(st, 200, "{v}");
    for (field, bad) in [
        ("id", json!("../gw")),
        ("address", json!("a b:1")),
        (
            "services",
            json!([{"service": "k/v", "cell": "c-1", "conns": 0, "frames": 0,
            "bytes": 0}]),
        ),
    ] {
        let mut g = good.clone();
        g[field] = bad;
        let (st, v) = p.post("/v1/nodes/edge-a/heartbeat", with_gw(g)).await;
        assert_eq!(st, 400, "{field}: {v}");
    }
    let (st, v) = p
        .post(
            "/v1/nodes",
            json!({"name": "edge-c", "isa": "sparc", "api": "h:1", "migrate": "h:2",
                "version": "0.1.0", "status": {"machine": {"cores": 1, "memory_total": 1,
                "memory_available": 1, "load1": 0.0}, "cells": []}}),
        )
        .await;
    assert_eq!(st, 400);
    assert!(v["error"].as_str().unwrap().contains("unknown ISA"), "{v}");
    let (st, v) = p.get("/v1/nodes").await;
    assert_eq!(st, 200);
    let nodes = v.as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{v}");
    assert_eq!(nodes[0]["status"]["gateway"]["rtt_us"], 4000, "{v}");
    assert_eq!(nodes[0]["name"], "edge-a");
    assert_eq!(nodes[0]["alive"], true);
    assert_eq!(nodes[0]["status"]["machine"]["load1"], 0.5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_transaction_wins_once_and_heartbeats_fence_the_loser() {
    let p = start(None).await;
    p.register("edge-a").await;
    p.register("edge-b").await;
    p.store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let req = json!({"from": "edge-a", "generation": 1, "to": "edge-b"});
    let (st, v) = p.post("/v1/cells/c-1/handoff", req.clone()).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = p.post("/v1/cells/c-1/owner", req.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"owner": "edge-b", "generation": 2}));
    // The same transaction again (the source taking it back too late) loses.
    let back = json!({"from": "edge-a", "generation": 1, "to": "edge-a"});
    let (st, v) = p.post("/v1/cells/c-1/owner", back).await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("owned by edge-b at generation 2"),
        "{v}"
    );
    let rec = p.store.cell("c-1").await.unwrap().unwrap().value;
    assert_eq!((rec.owner.as_str(), rec.generation), ("edge-b", 2));
    // edge-a still runs it: its heartbeat tells it to stop; a cell the
    // cluster does not know is left alone.
    let hb = json!({"status": {"machine": {"cores": 4, "memory_total": 1, "memory_available": 1,
        "load1": 0.0}, "cells": ["c-1", "c-unknown"]}});
    let (st, v) = p.post("/v1/nodes/edge-a/heartbeat", hb.clone()).await;
    assert_eq!(st, 200);
    assert_eq!(v["stop"], json!(["c-1"]));
    // With the generation it was decided at: a node that owns the cell at
    // a later one ignores it.
    assert_eq!(v["stop_generations"], json!({"c-1": 2}));
    let (_, v) = p.post("/v1/nodes/edge-b/heartbeat", hb).await;
    assert_eq!(v["stop"], json!([]));
    // A transaction to a node the cluster does not know is refused.
    let (st, _) = p
        .post(
            "/v1/cells/c-1/owner",
            json!({"from": "edge-b", "generation": 2, "to": "edge-z"}),
        )
        .await;
    assert_eq!(st, 404);
    let (st, _) = p.post("/v1/cells/c-none/owner", req).await;
    assert_eq!(st, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_are_content_addressed_and_checked() {
    let p = start(None).await;
    let wasm = b"\0asm\x01\0\0\0".to_vec();
    let r = p
        .http
        .post(format!("{}/v1/modules", p.url))
        .body(wasm.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let hash = blake3::hash(&wasm).to_hex().to_string();
    assert_eq!(v, json!({"hash": hash, "bytes": 8}));
    let got = p
        .http
        .get(format!("{}/v1/modules/{hash}", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), wasm);
    let r = p
        .http
        .post(format!("{}/v1/modules", p.url))
        .body("not wasm at all")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (st, _) = p.get(&format!("/v1/modules/{}", "b".repeat(64))).await;
    assert_eq!(st, 404);
    let (st, _) = p.get("/v1/modules/XYZ").await;
    assert_eq!(st, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_without_nodes_and_policies() {
    let p = start(None).await;
    let wasm = b"\0asm\x01\0\0\0".to_vec();
    let hash = blake3::hash(&wasm).to_hex().to_string();
    // Not uploaded yet.
    let (st, v) = p
        .post("/v1/cells", json!({"module": hash, "args": ["p"]}))
        .await;
    assert_eq!(st, 404, "{v}");
    p.store.put_module(&hash, &wasm).await.unwrap();
    let (st, v) = p
        .post("/v1/cells", json!({"module": hash, "args": ["p"]}))
        .await;
    assert_eq!(st, 503, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no node has registered"),
        "{v}"
    );
    let (st, v) = p
        .post("/v1/cells", json!({"module": hash, "args": []}))
        .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = p.get("/v1/policies").await;
    assert_eq!(st, 200);
    assert_eq!(v["placement"], "least-loaded");
    assert_eq!(v["available"].as_array().unwrap().len(), 7);
    let r = p
        .http
        .put(format!("{}/v1/policies", p.url))
        .json(&json!({"placement": "nope"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = p
        .http
        .put(format!("{}/v1/policies", p.url))
        .json(&json!({"placement": "evacuate"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, v) = p.get("/v1/policies").await;
    assert_eq!(v["placement"], "evacuate");
    let r = p
        .http
        .get(format!("{}/metrics", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(
        text.contains(
            "roam_planner_placements_total{policy=\"least-loaded\",result=\"no-node\"} 1"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_guards_every_route() {
    let p = start(Some("0123456789abcdef0123")).await;
    let (st, v) = p.get("/v1/nodes").await;
    assert_eq!(st, 401, "{v}");
    let (st, _) = p.get("/metrics").await;
    assert_eq!(st, 401);
    let r = p
        .http
        .get(format!("{}/v1/nodes", p.url))
        .bearer_auth("0123456789abcdef0123")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_stream_as_server_sent_events() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = start(None).await;
    let addr = p.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(format!("GET /v1/events HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    // The response head first: the stream is subscribed once it is sent.
    while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
        let k = s.read(&mut buf).await.unwrap();
        assert!(k > 0, "the stream closed");
        seen.extend_from_slice(&buf[..k]);
    }
    let head = String::from_utf8_lossy(&seen).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let (st, _) = p.register("edge-a").await;
    assert_eq!(st, 200);
    loop {
        let text = String::from_utf8_lossy(&seen).to_string();
        // A whole event: it ends with a blank line.
        let event = text
            .find("event: node-registered")
            .and_then(|i| text[i..].find("\n\n").map(|end| &text[i..i + end]));
        if let Some(event) = event {
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_string);
            if let Some(data) = data {
                let v: Value = serde_json::from_str(&data).unwrap();
                assert_eq!(
                    v,
                    json!({"kind": "node-registered", "node": "edge-a", "isa": "x86_64"})
                );
                break;
            }
        }
        let k = s.read(&mut buf).await.unwrap();
        assert!(k > 0, "the stream closed: {text}");
        seen.extend_from_slice(&buf[..k]);
    }
}

/// The placement policy lives in the store: a planner started later on the
/// same store starts with it, and a change made through one planner
/// reaches the other within its refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_kept_in_the_store_and_followed_by_every_planner() {
    let a = start(None).await;
    let put = |url: String, name: &'static str| {
        let http = a.http.clone();
        async move {
            let r = http
                .put(format!("{url}/v1/policies"))
                .json(&json!({"placement": name}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    put(a.url.clone(), "manual").await;
    assert_eq!(
        a.store.setting("placement").await.unwrap().as_deref(),
        Some("manual")
    );
    // A second planner on the same store.
    let mut cfg = PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.checkpoint_interval_s = 0;
    let p = Planner::bind(cfg, a.store.clone()).await.unwrap();
    let b_url = p.url();
    tokio::spawn(p.serve(std::future::pending()));
    let policy = |url: String| {
        let http = a.http.clone();
        async move {
            let v: Value = http
                .get(format!("{url}/v1/policies"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["placement"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(policy(b_url.clone()).await, "manual");
    put(b_url.clone(), "evacuate").await;
    assert_eq!(policy(b_url).await, "evacuate");
    let mut seen = String::new();
    for _ in 0..100 {
        seen = policy(a.url.clone()).await;
        if seen == "evacuate" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "evacuate", "planner a never followed the store");
}

/// Knowing a cell's owner and generation (`GET /v1/cells` shows both) is
/// not enough to take it: only the node its owner handed it to may, and
/// then only the owner may take it back, one generation on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_node_a_cell_was_handed_to_takes_it() {
    let p = start(None).await;
    for node in ["edge-a", "edge-b", "edge-c"] {
        p.register(node).await;
    }
    p.store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let take = |to: &str| json!({"from": "edge-a", "generation": 1, "to": to});
    // Nothing announced: neither edge-b nor edge-c may take it.
    for to in ["edge-b", "edge-c"] {
        let (st, v) = p.post("/v1/cells/c-1/owner", take(to)).await;
        assert_eq!(st, 403, "{to}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("did not hand cell c-1"),
            "{v}"
        );
    }
    // Only the owner, at its generation, announces a hand-off.
    let stale = json!({"from": "edge-a", "generation": 7, "to": "edge-b"});
    let (st, v) = p.post("/v1/cells/c-1/handoff", stale).await;
    assert_eq!(st, 409, "{v}");
    let not_owner = json!({"from": "edge-c", "generation": 1, "to": "edge-c"});
    let (st, v) = p.post("/v1/cells/c-1/handoff", not_owner).await;
    assert_eq!(st, 400, "{v}");
    let not_owner = json!({"from": "edge-c", "generation": 1, "to": "edge-b"});
    let (st, v) = p.post("/v1/cells/c-1/handoff", not_owner).await;
    assert_eq!(st, 409, "{v}");
    let (st, v) = p.post("/v1/cells/c-1/handoff", take("edge-b")).await;
    assert_eq!(st, 200, "{v}");
    // Handed to edge-b: edge-c still may not take it; edge-b may.
    let (st, v) = p.post("/v1/cells/c-1/owner", take("edge-c")).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = p.post("/v1/cells/c-1/owner", take("edge-b")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"owner": "edge-b", "generation": 2}));
    // After an ambiguous commit the source takes it back from edge-b, one
    // generation on; edge-c cannot do the same.
    let back = |to: &str| json!({"from": "edge-b", "generation": 2, "to": to});
    let (st, v) = p.post("/v1/cells/c-1/owner", back("edge-c")).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = p.post("/v1/cells/c-1/owner", back("edge-a")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"owner": "edge-a", "generation": 3}));
    // A node always takes its own cell again (a source after an ambiguous
    // commit the destination never made).
    let own = json!({"from": "edge-a", "generation": 3, "to": "edge-a"});
    let (st, v) = p.post("/v1/cells/c-1/owner", own).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"owner": "edge-a", "generation": 4}));
}
