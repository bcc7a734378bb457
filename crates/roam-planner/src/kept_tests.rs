//! The leader bounds the kept checkpoints it starts at once: due on the
//! same tick, they would each cost their owner a copy of a cell's memory
//! at the same time. A simulated owner answers `keep` slowly and counts
//! how many it is answering at once; the planner and its store are real.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use roam_cluster::{ClusterStore, RedbStore};
use serde_json::{json, Value};

use crate::{Planner, PlannerConfig};

const SNAPSHOT: &str = "6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b6b";

/// Keeps under way now, the most at once, and the total answered.
#[derive(Default)]
struct Count {
    now: AtomicUsize,
    most: AtomicUsize,
    done: AtomicUsize,
}

/// A node that takes 300 ms to keep a checkpoint.
async fn slow_owner(count: Arc<Count>) -> String {
    let app =
        Router::new()
            .route(
                "/v1/cells/{id}/keep",
                post(
                    |State(c): State<Arc<Count>>,
                     Path(_id): Path<String>,
                     Json(_v): Json<Value>| async move {
                        let now = c.now.fetch_add(1, Ordering::SeqCst) + 1;
                        c.most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        c.now.fetch_sub(1, Ordering::SeqCst);
                        c.done.fetch_add(1, Ordering::SeqCst);
                        Json(
                            json!({"snapshot": SNAPSHOT, "bytes": 4096, "sent_bytes": 1024,
                        "taken_ms": crate::unix_ms()}),
                        )
                    },
                ),
            )
            // Every node here also holds: it takes the planner's grants.
            .route(
                "/v1/kept/{id}/grant",
                post(|Path(_id): Path<String>| async { Json(json!({})) }),
            )
            .with_state(count);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

async fn send(http: &reqwest::Client, url: String, body: Value) -> u16 {
    http.post(url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_checkpoints_start_at_most_kept_parallel_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ClusterStore> =
        Arc::new(RedbStore::open(dir.path().join("cluster.redb")).unwrap());
    let mut cfg = PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.kept_parallel = 2;
    let p = Planner::bind(cfg, store.clone()).await.unwrap();
    let url = p.url();
    tokio::spawn(p.serve(std::future::pending()));

    let count = Arc::new(Count::default());
    let a_api = slow_owner(count.clone()).await;
    // b holds: it takes the planner's grants (its keep route is never
    // called).
    let b_api = slow_owner(Arc::new(Count::default())).await;
    let ids: Vec<String> = (0..6).map(|i| format!("c-{i}")).collect();
    let machine = json!({"cores": 4, "memory_total": 8u64 << 30,
        "memory_available": 8u64 << 30, "load1": 0.0});
    let http = reqwest::Client::new();
    for (name, api) in [("a", a_api.as_str()), ("b", b_api.as_str())] {
        let st = send(
            &http,
            format!("{url}/v1/nodes"),
            json!({"name": name, "isa": "x86_64", "api": api, "migrate": "127.0.0.1:9",
                "version": "0.1.0", "status": {"machine": machine, "cells": []}}),
        )
        .await;
        assert_eq!(st, 200);
    }
    // Six cells on a, every one due at once (created long ago, a 1 s
    // interval); b can hold their checkpoints.
    for id in &ids {
        let mut c = crate::evac_tests::cell(id, "m");
        c.checkpoint_interval_s = 1;
        store.create_cell(c).await.unwrap();
    }
    let beats = {
        let (http, url, ids) = (http.clone(), url.clone(), ids.clone());
        tokio::spawn(async move {
            loop {
                for (n, cells) in [("a", json!(ids)), ("b", json!([]))] {
                    let body = json!({"status": {"machine": machine, "cells": cells}});
                    send(&http, format!("{url}/v1/nodes/{n}/heartbeat"), body).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // Every cell gets its checkpoint, two at a time at most.
    for _ in 0..200 {
        let mut kept = 0;
        for id in &ids {
            let c = store.cell(id).await.unwrap().unwrap().value;
            kept += usize::from(c.kept.is_some());
        }
        if kept == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    beats.abort();
    for id in &ids {
        let c = store.cell(id).await.unwrap().unwrap().value;
        assert!(c.kept.is_some(), "cell {id} has no kept checkpoint");
    }
    assert!(count.done.load(Ordering::SeqCst) >= ids.len());
    let most = count.most.load(Ordering::SeqCst);
    assert!(
        most <= 2,
        "{most} kept checkpoints ran at once; the bound is 2"
    );
    assert_eq!(most, 2, "the bound is used");
}
