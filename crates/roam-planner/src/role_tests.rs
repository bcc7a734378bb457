//! Who may call what, over real mutual TLS on a loopback port: a node
//! speaks only for itself and only on nodes' routes, an operator only on
//! operators' routes, a gateway's certificate only on
//! `GET /v1/services/{service}`, and a planner's certificate gets nothing.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use roam_auth::cert::{make_ca, make_client, make_gateway, make_node, make_planner, Pem};
use roam_auth::cert::{Reach, Validity};
use roam_auth::{ClientTls, Identity, Role, TlsFiles, ALPN_HTTP};
use roam_cluster::{CellRecord, CellState, ClusterStore, RedbStore};
use serde_json::{json, Value};

use crate::{Planner, PlannerConfig};

const YEAR: Validity = Validity { days: 365 };

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
    store: Arc<dyn ClusterStore>,
}

impl Cluster {
    fn write(&self, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
        let (c, k) = (
            self.dir.path().join(format!("{name}.pem")),
            self.dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&c, &pem.cert).unwrap();
        std::fs::write(&k, &pem.key).unwrap();
        (c, k)
    }

    /// An HTTPS client presenting `pem` that expects the planner's
    /// certificate.
    fn client(&self, name: &str, pem: &Pem) -> reqwest::Client {
        let (c, k) = self.write(name, pem);
        let tls = ClientTls::load(&self.dir.path().join("ca.pem"), Some(&c), Some(&k)).unwrap();
        let cfg = tls.config_for(ALPN_HTTP, Role::Planner).unwrap();
        reqwest::Client::builder()
            .use_preconfigured_tls((*cfg).clone())
            .build()
            .unwrap()
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
        let r = r.send().await?;
        let st = r.status().as_u16();
        Ok((st, r.json().await.unwrap_or(Value::Null)))
    }

    async fn post(&self, c: &reqwest::Client, path: &str, body: Value) -> (u16, Value) {
        self.send(c.post(format!("{}{path}", self.url)).json(&body))
            .await
            .unwrap()
    }

    async fn get(&self, c: &reqwest::Client, path: &str) -> (u16, Value) {
        self.send(c.get(format!("{}{path}", self.url)))
            .await
            .unwrap()
    }
}

/// A planner with TLS, and the CA that signs every party's certificate.
async fn start() -> (Cluster, Pem) {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca("test CA", YEAR).unwrap();
    std::fs::write(dir.path().join("ca.pem"), &ca.cert).unwrap();
    let lo: IpAddr = [127, 0, 0, 1].into();
    let reach = Reach {
        ips: vec![lo],
        ..Reach::default()
    };
    let store: Arc<dyn ClusterStore> =
        Arc::new(RedbStore::open(dir.path().join("cluster.redb")).unwrap());
    let mut cluster = Cluster {
        dir,
        url: String::new(),
        store: store.clone(),
    };
    let (cert, key) = cluster.write("planner", &make_planner(&ca, "plan", &reach, YEAR).unwrap());
    let id = Identity::load(&TlsFiles {
        ca: cluster.dir.path().join("ca.pem"),
        cert,
        key,
    })
    .unwrap();
    let mut cfg = PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.checkpoint_interval_s = 0;
    cfg.tls = Some(id);
    let p = Planner::bind(cfg, store).await.unwrap();
    cluster.url = p.url();
    assert!(cluster.url.starts_with("https://"), "{}", cluster.url);
    tokio::spawn(p.serve(std::future::pending()));
    (cluster, ca)
}

fn registration(name: &str) -> Value {
    json!({"name": name, "isa": "x86_64", "api": format!("https://{name}:7700"),
        "migrate": format!("{name}:8700"), "version": "0.1.0",
        "status": {"machine": {"cores": 4, "memory_total": 8u64 << 30,
            "memory_available": 8u64 << 30, "load1": 0.0}, "cells": []}})
}

fn heartbeat() -> Value {
    json!({"status": {"machine": {"cores": 4, "memory_total": 1, "memory_available": 1,
        "load1": 0.0}, "cells": []}})
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
async fn a_node_speaks_only_for_itself() {
    let (p, ca) = start().await;
    let a = p.client("edge-a", &make_node(&ca, "edge-a", &[], &[], YEAR).unwrap());
    let b = p.client("edge-b", &make_node(&ca, "edge-b", &[], &[], YEAR).unwrap());

    let (st, v) = p.post(&b, "/v1/nodes", registration("edge-b")).await;
    assert_eq!(st, 200, "{v}");
    // edge-a cannot register as edge-b (and overwrite its addresses)...
    let mut evil = registration("edge-b");
    evil["api"] = json!("https://attacker:7700");
    let (st, v) = p.post(&a, "/v1/nodes", evil).await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("only for `edge-a`"),
        "{v}"
    );
    let nodes = p.store.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].api, "https://edge-b:7700");
    // ...nor heartbeat for it.
    let (st, v) = p.post(&a, "/v1/nodes/edge-b/heartbeat", heartbeat()).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = p.post(&a, "/v1/nodes", registration("edge-a")).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = p.post(&a, "/v1/nodes/edge-a/heartbeat", heartbeat()).await;
    assert_eq!(st, 200, "{v}");

    // edge-a cannot move edge-b's cell to anyone but itself.
    p.store.create_cell(cell("c-1", "edge-b")).await.unwrap();
    let to_b = json!({"from": "edge-b", "generation": 1, "to": "edge-b"});
    let (st, v) = p.post(&a, "/v1/cells/c-1/owner", to_b).await;
    assert_eq!(st, 403, "{v}");
    p.store.create_cell(cell("c-2", "edge-a")).await.unwrap();
    let away = json!({"from": "edge-a", "generation": 1, "to": "edge-b"});
    let (st, v) = p.post(&a, "/v1/cells/c-2/owner", away).await;
    assert_eq!(st, 403, "{v}");
    for id in ["c-1", "c-2"] {
        let c = p.store.cell(id).await.unwrap().unwrap().value;
        assert_eq!(c.generation, 1, "{id} moved");
    }
    // Taking a cell to itself (a migration's commit) is its to make, once
    // the owner handed it over; the hand-off is the owner's alone to make.
    let to_a = json!({"from": "edge-b", "generation": 1, "to": "edge-a"});
    let (st, v) = p.post(&a, "/v1/cells/c-1/owner", to_a.clone()).await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = p.post(&a, "/v1/cells/c-1/handoff", to_a.clone()).await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("only for `edge-a`"),
        "{v}"
    );
    let (st, v) = p.post(&b, "/v1/cells/c-1/handoff", to_a.clone()).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = p.post(&a, "/v1/cells/c-1/owner", to_a).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"owner": "edge-a", "generation": 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_nodes_gateways_and_planners_keep_to_their_roles() {
    let (p, ca) = start().await;
    let alice = p.client("alice", &make_client(&ca, "alice", YEAR).unwrap());
    let a = p.client("edge-a", &make_node(&ca, "edge-a", &[], &[], YEAR).unwrap());
    let (st, v) = p.post(&a, "/v1/nodes", registration("edge-a")).await;
    assert_eq!(st, 200, "{v}");

    // An operator reads and steers, but cannot pose as a node.
    let (st, v) = p.get(&alice, "/v1/nodes").await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = p
        .post(&alice, "/v1/nodes/edge-a/heartbeat", heartbeat())
        .await;
    assert_eq!(st, 403, "{v}");
    let (st, v) = p.post(&alice, "/v1/nodes", registration("edge-b")).await;
    assert_eq!(st, 403, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("client certificate"),
        "{v}"
    );
    p.store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let req = json!({"from": "edge-a", "generation": 1, "to": "edge-a"});
    let (st, v) = p.post(&alice, "/v1/cells/c-1/owner", req).await;
    assert_eq!(st, 403, "{v}");

    // A node does nothing an operator does.
    for path in ["/v1/nodes", "/v1/cells", "/v1/policies"] {
        let (st, v) = p.get(&a, path).await;
        assert_eq!(st, 403, "{path}: {v}");
    }
    let (st, v) = p.post(&a, "/v1/cells/c-1/kill", json!({})).await;
    assert_eq!(st, 403, "{v}");
    assert!(!p
        .store
        .cell("c-1")
        .await
        .unwrap()
        .unwrap()
        .value
        .state
        .ended());

    // A planner's certificate is answered 403 by the listener.
    let other = p.client(
        "other",
        &make_planner(&ca, "other", &Reach::default(), YEAR).unwrap(),
    );
    let (st, v) = p.get(&other, "/v1/nodes").await;
    assert_eq!(st, 403, "{v}");
    assert!(v["error"].as_str().unwrap().contains("not admitted"), "{v}");
    let (st, v) = p.post(&other, "/v1/nodes", registration("edge-b")).await;
    assert_eq!(st, 403, "{v}");
    assert_eq!(p.store.nodes().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_asks_only_who_serves_a_service() {
    let (p, ca) = start().await;
    let gw = p.client(
        "gw",
        &make_gateway(&ca, "gw", &Reach::default(), YEAR).unwrap(),
    );
    let alice = p.client("alice", &make_client(&ca, "alice", YEAR).unwrap());
    let a = p.client("edge-a", &make_node(&ca, "edge-a", &[], &[], YEAR).unwrap());
    let (st, v) = p.post(&a, "/v1/nodes", registration("edge-a")).await;
    assert_eq!(st, 200, "{v}");
    let mut kv = cell("c-1", "edge-a");
    kv.service = Some("kv".into());
    kv.generation = 7;
    p.store.create_cell(kv).await.unwrap();
    let mut gone = cell("c-0", "edge-b");
    gone.service = Some("kv".into());
    gone.state = CellState::Killed;
    p.store.create_cell(gone).await.unwrap();
    p.store.create_cell(cell("c-2", "edge-a")).await.unwrap();

    // Its one question: the live cell of the service, its owner and
    // generation; an ended cell is not listed, an unknown service has none.
    let want = json!({"service": "kv",
        "cells": [{"cell": "c-1", "owner": "edge-a", "generation": 7}]});
    let (st, v) = p.get(&gw, "/v1/services/kv").await;
    assert_eq!((st, &v), (200, &want));
    let (st, v) = p.get(&gw, "/v1/services/web").await;
    assert_eq!((st, v), (200, json!({"service": "web", "cells": []})));
    let (st, v) = p.get(&gw, "/v1/services/..%2Fkv").await;
    assert_eq!(st, 400, "{v}");
    // An operator may ask too; a node may not.
    let (st, v) = p.get(&alice, "/v1/services/kv").await;
    assert_eq!((st, &v), (200, &want));
    let (st, v) = p.get(&a, "/v1/services/kv").await;
    assert_eq!(st, 403, "{v}");

    // Everything else is refused, reads and writes, the dashboard's views,
    // its static page and paths that do not exist.
    for path in [
        "/v1/nodes",
        "/v1/cells",
        "/v1/cells/c-1",
        "/v1/cells/c-1/logs",
        "/v1/modules/0000",
        "/v1/policies",
        "/v1/events",
        "/metrics",
        "/v1/dashboard/nodes",
        "/v1/dashboard/cells",
        "/",
        "/dashboard/app.js",
        "/v1/services",
        "/v1/services/kv/x",
        "/nope",
    ] {
        let (st, v) = p.get(&gw, path).await;
        assert_eq!(st, 403, "GET {path}: {v}");
    }
    let owner = json!({"from": "edge-a", "generation": 7, "to": "edge-a"});
    for (path, body) in [
        ("/v1/nodes", registration("gw")),
        ("/v1/nodes/edge-a/heartbeat", heartbeat()),
        ("/v1/nodes/edge-a/drain", json!({})),
        (
            "/v1/cells",
            json!({"module": "a".repeat(64), "args": ["p"]}),
        ),
        ("/v1/cells/c-1/kill", json!({})),
        ("/v1/cells/c-1/migrate", json!({"to": "edge-a"})),
        ("/v1/cells/c-1/checkpoint", json!({})),
        ("/v1/cells/c-1/owner", owner.clone()),
        ("/v1/cells/c-1/handoff", owner),
        ("/v1/services/kv", json!({})),
    ] {
        let (st, v) = p.post(&gw, path, body).await;
        assert_eq!(st, 403, "POST {path}: {v}");
    }
    let r = gw
        .put(format!("{}/v1/policies", p.url))
        .json(&json!({"placement": "spread"}));
    let (st, v) = p.send(r).await.unwrap();
    assert_eq!(st, 403, "PUT /v1/policies: {v}");
    // Nothing changed.
    let c = p.store.cell("c-1").await.unwrap().unwrap().value;
    assert_eq!((c.owner.as_str(), c.generation), ("edge-a", 7));
    assert!(!c.state.ended());
    assert_eq!(p.store.nodes().await.unwrap().len(), 1);
}
