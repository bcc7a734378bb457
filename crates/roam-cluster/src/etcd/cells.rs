//! Cells in etcd: one key per cell, `cells/<id>`, whose `mod_revision` is
//! the record's revision. Every change is one transaction that compares
//! it, so of two planners (or two requests) changing a cell from the same
//! revision exactly one wins, and the loser learns the current revision
//! from the same transaction.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::EtcdStore;
use crate::record::{self, decode, encode};
use crate::{CellRecord, StoreError, StoreResult, Versioned};

pub(super) async fn create(store: &EtcdStore, cell: CellRecord) -> StoreResult<u64> {
    record::check_cell(&cell.id)?;
    let key = store.key("cells", &cell.id);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key, encode(&cell)?, None)]);
    let resp = store.txn("create a cell", txn).await?;
    if !resp.succeeded() {
        return Err(StoreError::Exists(format!("cell {}", cell.id)));
    }
    Ok(resp.header().map_or(0, |h| h.revision()) as u64)
}

pub(super) async fn get(store: &EtcdStore, id: &str) -> StoreResult<Option<Versioned<CellRecord>>> {
    record::check_cell(id)?;
    let key = store.key("cells", id);
    match store.get_one("read a cell", &key).await? {
        None => Ok(None),
        Some((bytes, rev)) => Ok(Some(Versioned {
            value: decode(&key, &bytes)?,
            revision: rev as u64,
        })),
    }
}

pub(super) async fn list(store: &EtcdStore) -> StoreResult<Vec<Versioned<CellRecord>>> {
    let mut out = Vec::new();
    for (id, bytes, rev) in store.list("cells", 0).await?.0 {
        out.push(Versioned {
            value: decode(&store.key("cells", &id), &bytes)?,
            revision: rev as u64,
        });
    }
    Ok(out)
}

pub(super) async fn update(store: &EtcdStore, expected: u64, cell: CellRecord) -> StoreResult<u64> {
    record::check_cell(&cell.id)?;
    let key = store.key("cells", &cell.id);
    let conflict = |actual| StoreError::Conflict {
        what: format!("cell {}", cell.id),
        expected,
        actual,
    };
    if expected == 0 || expected > i64::MAX as u64 {
        // A missing key's mod_revision is 0: never let a compare with 0
        // create a cell.
        let actual = get(store, &cell.id).await?.map_or(0, |c| c.revision);
        return Err(conflict(actual));
    }
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            expected as i64,
        )])
        .and_then([TxnOp::put(key.clone(), encode(&cell)?, None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = store.txn("update a cell", txn).await?;
    if !resp.succeeded() {
        return Err(conflict(actual_revision(&resp)));
    }
    Ok(resp.header().map_or(0, |h| h.revision()) as u64)
}

pub(super) async fn delete(store: &EtcdStore, id: &str, expected: u64) -> StoreResult<()> {
    record::check_cell(id)?;
    let key = store.key("cells", id);
    let conflict = |actual| StoreError::Conflict {
        what: format!("cell {id}"),
        expected,
        actual,
    };
    if expected == 0 || expected > i64::MAX as u64 {
        let actual = get(store, id).await?.map_or(0, |c| c.revision);
        return Err(conflict(actual));
    }
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            expected as i64,
        )])
        .and_then([TxnOp::delete(key.clone(), None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = store.txn("delete a cell", txn).await?;
    if !resp.succeeded() {
        return Err(conflict(actual_revision(&resp)));
    }
    Ok(())
}

/// A cell's current revision, from the `or_else` get of a failed txn.
fn actual_revision(resp: &TxnResponse) -> u64 {
    resp.op_responses()
        .into_iter()
        .find_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().first().map_or(0, |kv| kv.mod_revision())),
            _ => None,
        })
        .unwrap_or(0) as u64
}
