//! The contract over redb, and what only an embedded store does: keep
//! everything across a close and a reopen (a planner restart), refuse a
//! second opener, report damaged records.

use std::sync::Arc;
use std::time::Duration;

use roam_cluster::{ClusterStore, NodeState, RedbStore, StoreError};

use crate::contract::{cell, eventually, node, Fixture};

async fn fixture() -> Option<Fixture<RedbStore>> {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(RedbStore::open(dir.path().join("cluster.redb")).unwrap());
    Some(Fixture {
        a: store.clone(),
        b: store,
        _guard: Box::new(dir),
    })
}

contract_tests!(fixture);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.redb");
    let store = RedbStore::open(&path).unwrap();
    store
        .register_node(node("edge-a"), Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .register_node(node("edge-b"), Duration::from_secs(3600))
        .await
        .unwrap();
    store
        .set_node_state("edge-b", NodeState::Draining)
        .await
        .unwrap();
    let r1 = store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    let r2 = store.create_cell(cell("c-2", "edge-b")).await.unwrap();
    let mut moved = cell("c-2", "edge-a");
    moved.generation = 2;
    let r2 = store.update_cell(r2, moved).await.unwrap();
    // A node that died while the planner ran stays dead across the
    // restart (it may have been fenced); the others get a fresh lease.
    store
        .register_node(node("gone"), Duration::from_secs(1))
        .await
        .unwrap();
    eventually("the lease of `gone` running out", || async {
        let nodes = store.nodes().await.unwrap();
        !nodes.iter().find(|n| n.name == "gone").unwrap().alive
    })
    .await;
    let module: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    let hash = blake3::hash(&module).to_hex().to_string();
    store.put_module(&hash, &module).await.unwrap();
    let (nodes, cells, modules) = (
        store.nodes().await.unwrap(),
        store.cells().await.unwrap(),
        store.modules().await.unwrap(),
    );

    // A second planner cannot open the file while the first has it.
    match RedbStore::open(&path) {
        Err(StoreError::Backend { message, .. }) => {
            assert!(message.contains("another process"), "{message}")
        }
        other => panic!("a second open: {other:?}"),
    }

    drop(store);
    let store = RedbStore::open(&path).unwrap();
    assert_eq!(store.nodes().await.unwrap(), nodes);
    assert_eq!(store.cells().await.unwrap(), cells);
    assert_eq!(store.modules().await.unwrap(), modules);
    assert_eq!(store.module(&hash).await.unwrap(), Some(module));
    for n in &nodes {
        assert_eq!(n.alive, n.name != "gone", "{n:?}");
    }
    assert!(matches!(
        store.heartbeat("gone", Default::default()).await,
        Err(StoreError::Expired(_))
    ));
    let revisions: Vec<u64> = cells.iter().map(|c| c.revision).collect();
    assert!(revisions.contains(&r1) && revisions.contains(&r2));
    // The revision counter survives too: a new write never reuses one.
    let r3 = store.create_cell(cell("c-3", "edge-a")).await.unwrap();
    assert!(r3 > r1.max(r2), "{r3} after {r1}, {r2}");
    // And the nodes' leases go on: a heartbeat is accepted.
    store.heartbeat("edge-a", Default::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_is_corrupt_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.redb");
    let store = RedbStore::open(&path).unwrap();
    store.create_cell(cell("good", "edge-a")).await.unwrap();
    drop(store);

    // Damage one record behind the store's back.
    {
        const CELLS: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("cells");
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(CELLS)
            .unwrap()
            .insert("bad", &b"{\"v\":1,\"record\":{\"id\":3}}"[..])
            .unwrap();
        txn.commit().unwrap();
    }

    let store = RedbStore::open(&path).unwrap();
    match store.cell("bad").await {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "cells/bad"),
        other => panic!("a damaged record: {other:?}"),
    }
    assert!(matches!(
        store.cells().await,
        Err(StoreError::Corrupt { .. })
    ));
    // The others are still readable one by one.
    assert_eq!(
        store.cell("good").await.unwrap().unwrap().value,
        cell("good", "edge-a")
    );
}

/// A module changed in the database file behind the store's back is
/// `Corrupt` on read, never handed to a node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_module_is_corrupt_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.redb");
    let module = b"\0asm\x01\0\0\0 the module as uploaded".to_vec();
    let hash = blake3::hash(&module).to_hex().to_string();
    let store = RedbStore::open(&path).unwrap();
    store.put_module(&hash, &module).await.unwrap();
    assert_eq!(store.module(&hash).await.unwrap(), Some(module.clone()));
    drop(store);
    {
        const MODULES: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("modules");
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let mut changed = module.clone();
        changed[9] ^= 0x20;
        txn.open_table(MODULES)
            .unwrap()
            .insert(hash.as_str(), changed.as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    let store = RedbStore::open(&path).unwrap();
    match store.module(&hash).await {
        Err(StoreError::Corrupt { key, message }) => {
            assert_eq!(key, format!("modules/{hash}"));
            assert!(message.contains("hash to"), "{message}");
        }
        other => panic!("a changed module: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redb_spec_opens_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let spec: roam_cluster::StoreSpec = format!("redb:{}", dir.path().join("c.redb").display())
        .parse()
        .unwrap();
    let store = spec.open().await.unwrap();
    assert_eq!(store.backend(), "redb");
    let rev = store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    assert_eq!(store.cell("c-1").await.unwrap().unwrap().revision, rev);
}
