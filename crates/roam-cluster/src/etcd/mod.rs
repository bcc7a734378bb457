//! The etcd backend: the cluster state in an etcd cluster, so that it
//! outlives any one planner and several planners can share it (one leads,
//! by election; all answer the API).
//!
//! Keys, under a prefix (`/roam/` unless told otherwise):
//!
//! - `nodes/<name>`: the node record, with the id of its lease;
//! - `alive/<name>`: empty, attached to the node's lease (TTL from
//!   registration). The node is alive while this key exists; a heartbeat
//!   renews the lease once (any planner can: its id is in the record);
//! - `cells/<id>`: the cell record; its revision is the key's
//!   `mod_revision`, so a compare-and-swap is one `Txn` comparing it;
//! - `modules/<hash>/<n>`: a module's chunks of at most 1 MiB, and
//!   `manifests/<hash>`: its length and chunk count, written after every
//!   chunk, so a reader that finds a manifest finds the whole module;
//! - `leader`: the election the planners campaign in.
//!
//! Every call is bounded by [`CALL_TIMEOUT`]: an etcd that died or cannot
//! be reached is a [`StoreError::Backend`] naming the endpoints, never a
//! hang.
//!
//! The connection may use TLS and log in as an etcd user ([`EtcdAccess`]);
//! an etcd that refuses either is told apart from one that is down, and
//! the error names the flag to fix.

mod access;
mod call;
pub use access::{EtcdAccess, EtcdAccessError, EtcdAccessFiles, MAX_PASSWORD_BYTES};
use call::{backend, bounded, explained};
mod cells;
mod lead;
pub use lead::LEADER_TTL;
mod modules;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnResponse,
};

use crate::record::{self, decode, encode, now_ms, StoredNode};
use crate::{
    CellRecord, ClusterStore, Leadership, Maintenance, ModuleRecord, NodeRecord, NodeState,
    NodeStatus, StoreError, StoreResult, Versioned,
};

/// Keys under one kind, as (name, value, mod_revision).
type Listing = Vec<(String, Vec<u8>, i64)>;

/// The longest any one etcd call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How many keys one listing call reads at most (a page).
const PAGE: i64 = 500;

/// How many times a read-modify-write of a node record retries when
/// another planner wrote it in between.
const NODE_RETRIES: usize = 16;

/// The cluster state in etcd. Cheap to share: calls run concurrently.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    prefix: String,
    /// TLS and login, for the election's own connection too.
    access: EtcdAccess,
    /// The node records this planner last wrote in a heartbeat, with their
    /// `mod_revision`: a heartbeat then needs no read.
    seen: Arc<Mutex<HashMap<String, (StoredNode, i64)>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("access", &self.access)
            .finish()
    }
}

impl EtcdStore {
    /// Connect to etcd at `endpoints` (`host:port` or `http://host:port`)
    /// and keep every key under `prefix` (e.g. `/roam/`; a `/` is added if
    /// it does not end with one), over a plain connection and without
    /// logging in. Fails if no endpoint answers within [`CALL_TIMEOUT`].
    pub async fn connect(endpoints: &[String], prefix: &str) -> StoreResult<EtcdStore> {
        EtcdStore::connect_with(endpoints, prefix, &EtcdAccess::default()).await
    }

    /// [`EtcdStore::connect`] with TLS and a login as `access` says. With
    /// TLS, give endpoints as `host:port` (or `https://host:port`). A
    /// refused certificate or login fails here, and says so.
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        access: &EtcdAccess,
    ) -> StoreResult<EtcdStore> {
        if endpoints.is_empty() {
            return Err(StoreError::Invalid(
                "no etcd endpoint given; name at least one, as host:port".into(),
            ));
        }
        if prefix.bytes().any(|b| b.is_ascii_control()) {
            return Err(StoreError::Invalid(format!(
                "the etcd key prefix {prefix:?} contains control characters"
            )));
        }
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let endpoints = endpoints.to_vec();
        let options = access.apply(
            ConnectOptions::new()
                .with_connect_timeout(CALL_TIMEOUT)
                .with_timeout(CALL_TIMEOUT)
                .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2)),
        );
        // A refused certificate or login shows first here, or at the
        // first call: both say what to fix.
        let hint = {
            let prefix = prefix.clone();
            move |e: &etcd_client::Error| access::hint(access, &prefix, e)
        };
        let client = explained(
            &endpoints,
            "connect",
            Client::connect(&endpoints, Some(options)),
            &hint,
        )
        .await?;
        let store = EtcdStore {
            client,
            endpoints,
            prefix,
            access: access.clone(),
            seen: Arc::default(),
        };
        // Connecting is lazy; ask once so a wrong address fails here (a
        // key under the prefix: etcd roles may grant nothing else).
        let ping = format!("{}ping", store.prefix);
        explained(
            &store.endpoints,
            "connect",
            store.client.kv_client().get(ping, None),
            &hint,
        )
        .await?;
        Ok(store)
    }

    /// The prefix every key lives under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}/{name}", self.prefix)
    }

    /// Run one etcd call, bounded by [`CALL_TIMEOUT`].
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> StoreResult<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        bounded(&self.endpoints, what, f(self.client.clone())).await
    }

    async fn txn(&self, what: &str, txn: Txn) -> StoreResult<TxnResponse> {
        self.call(what, |mut c| async move { c.txn(txn).await })
            .await
    }

    /// One key's value and `mod_revision`, or `None`.
    async fn get_one(&self, what: &str, key: &str) -> StoreResult<Option<(Vec<u8>, i64)>> {
        let key = key.to_string();
        let resp = self
            .call(what, |mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// Every key under `kind/`, as (name, value, mod_revision), page by
    /// page, every page at one revision (`at`, or the newest when 0) so the
    /// listing is one consistent view; and that revision.
    async fn list(&self, kind: &str, mut at: i64) -> StoreResult<(Listing, i64)> {
        let start = format!("{}{kind}/", self.prefix);
        let end = prefix_end(&start);
        let mut from = start.clone().into_bytes();
        let mut out = Vec::new();
        loop {
            let (key, end2) = (from.clone(), end.clone());
            let resp = self
                .call(&format!("list {kind}"), |mut c| async move {
                    c.get(
                        key,
                        Some(
                            GetOptions::new()
                                .with_range(end2)
                                .with_limit(PAGE)
                                .with_revision(at),
                        ),
                    )
                    .await
                })
                .await?;
            if at == 0 {
                at = resp.header().map_or(0, |h| h.revision());
            }
            for kv in resp.kvs() {
                let name = String::from_utf8_lossy(&kv.key()[start.len()..]).into_owned();
                out.push((name, kv.value().to_vec(), kv.mod_revision()));
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((out, at)),
            }
        }
    }

    async fn read_node(&self, name: &str) -> StoreResult<Option<(StoredNode, i64)>> {
        let key = self.key("nodes", name);
        match self.get_one("read a node", &key).await? {
            None => Ok(None),
            Some((bytes, rev)) => Ok(Some((decode(&key, &bytes)?, rev))),
        }
    }

    /// Rewrite a node's record with `change`, if nobody else wrote it in
    /// between (retrying a few times): `None` if the node does not exist.
    async fn change_node(
        &self,
        name: &str,
        mut change: impl FnMut(&mut StoredNode),
    ) -> StoreResult<Option<StoredNode>> {
        let key = self.key("nodes", name);
        for _ in 0..NODE_RETRIES {
            let Some((mut stored, rev)) = self.read_node(name).await? else {
                return Ok(None);
            };
            change(&mut stored);
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.clone(), encode(&stored)?, None)]);
            if self.txn("update a node", txn).await?.succeeded() {
                return Ok(Some(stored));
            }
        }
        Err(StoreError::Conflict {
            what: format!("node {name}"),
            expected: 0,
            actual: 0,
        })
    }

    fn seen_node(&self, name: &str) -> Option<(StoredNode, i64)> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(name).cloned()
    }

    fn remember_node(&self, name: &str, stored: StoredNode, rev: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(name.to_string(), (stored, rev));
    }

    fn forget_node(&self, name: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.remove(name);
    }

    /// Renew `lease` once: false if etcd no longer has it. Opening the
    /// keep-alive stream renews it and reads etcd's answer; a lease that
    /// ran out answers with a TTL of 0, which etcd-client reports as a
    /// keep-alive error.
    async fn renew(&self, lease: i64) -> StoreResult<bool> {
        self.call("renew a lease", |c| async move {
            match c.lease_client().keep_alive(lease).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Revoke a lease, best effort: it runs out on its own anyway.
    async fn revoke(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let _ = self
            .call("revoke a lease", |c| async move {
                c.lease_client().revoke(lease).await
            })
            .await;
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A lease TTL in whole seconds, at least 1 (etcd's unit and minimum).
fn ttl_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}

#[async_trait::async_trait]
impl ClusterStore for EtcdStore {
    fn backend(&self) -> &'static str {
        "etcd"
    }

    async fn register_node(&self, mut node: NodeRecord, ttl: Duration) -> StoreResult<()> {
        record::check_node(&node.name)?;
        self.forget_node(&node.name);
        let secs = ttl_secs(ttl);
        let lease = self
            .call("grant a lease", |c| async move {
                c.lease_client().grant(secs, None).await
            })
            .await?
            .id();
        let previous = self.read_node(&node.name).await.ok().flatten();
        let now = now_ms();
        if node.registered_ms == 0 {
            node.registered_ms = now;
        }
        node.heartbeat_ms = now;
        node.alive = false;
        // A node registering again keeps what operators set (as read just
        // before; the embedded store does this inside its transaction).
        if let Some((before, _)) = &previous {
            node.state = before.node.state;
            node.maintenance = before.node.maintenance;
        }
        let name = node.name.clone();
        let stored = StoredNode {
            node,
            ttl_ms: secs as u64 * 1000,
            expires_ms: 0,
            lease,
        };
        let txn = Txn::new().and_then([
            TxnOp::put(self.key("nodes", &name), encode(&stored)?, None),
            TxnOp::put(
                self.key("alive", &name),
                Vec::new(),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ]);
        if let Err(e) = self.txn("register a node", txn).await {
            self.revoke(lease).await;
            return Err(e);
        }
        if let Some((old, _)) = previous {
            if old.lease != lease {
                self.revoke(old.lease).await;
            }
        }
        Ok(())
    }

    async fn heartbeat(&self, name: &str, status: NodeStatus) -> StoreResult<()> {
        record::check_node(name)?;
        let key = self.key("nodes", name);
        // The record this planner last wrote saves a read; if it is stale
        // (another planner wrote since), the write below says so and the
        // record is read again.
        let cached = self.seen_node(name);
        let mut fresh = cached.is_none();
        let mut read = match cached {
            Some(c) => Some(c),
            None => self.read_node(name).await?,
        };
        let mut renewed = None;
        for _ in 0..NODE_RETRIES {
            let Some((mut stored, rev)) = read.take() else {
                self.forget_node(name);
                return Err(StoreError::Expired(name.to_string()));
            };
            let lease = stored.lease;
            if renewed != Some(lease) {
                if !self.renew(lease).await? {
                    if !fresh {
                        // Perhaps registered again, with another lease.
                        read = self.read_node(name).await?;
                        fresh = true;
                        continue;
                    }
                    self.forget_node(name);
                    return Err(StoreError::Expired(name.to_string()));
                }
                renewed = Some(lease);
            }
            stored.node.status = status.clone();
            stored.node.heartbeat_ms = now_ms();
            // Write the record only if it is the one read (not changed,
            // removed or registered again meanwhile).
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.clone(), encode(&stored)?, None)]);
            let resp = self.txn("record a heartbeat", txn).await?;
            if resp.succeeded() {
                let rev = resp.header().map_or(0, |h| h.revision());
                self.remember_node(name, stored, rev);
                return Ok(());
            }
            read = self.read_node(name).await?;
            fresh = true;
        }
        Err(StoreError::Conflict {
            what: format!("node {name}"),
            expected: 0,
            actual: 0,
        })
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRecord>> {
        // Both listings at one revision: one consistent view.
        let (records, at) = self.list("nodes", 0).await?;
        let (alive, _) = self.list("alive", at).await?;
        let alive: std::collections::HashSet<String> =
            alive.into_iter().map(|(name, _, _)| name).collect();
        let mut out = Vec::new();
        for (name, bytes, _) in records {
            let stored: StoredNode = decode(&self.key("nodes", &name), &bytes)?;
            let mut node = stored.node;
            node.alive = alive.contains(&name);
            out.push(node);
        }
        Ok(out)
    }

    async fn set_node_state(&self, name: &str, state: NodeState) -> StoreResult<()> {
        record::check_node(name)?;
        self.forget_node(name);
        match self.change_node(name, |s| s.node.state = state).await? {
            Some(_) => Ok(()),
            None => Err(StoreError::NotFound(format!("node {name}"))),
        }
    }

    async fn swap_node_maintenance(
        &self,
        name: &str,
        expected: Option<Maintenance>,
        new: Option<Maintenance>,
        state: Option<NodeState>,
    ) -> StoreResult<bool> {
        record::check_node(name)?;
        self.forget_node(name);
        let mut swapped = false;
        let changed = self
            .change_node(name, |s| {
                swapped = s.node.maintenance == expected;
                if swapped {
                    s.node.maintenance = new;
                    if let Some(st) = state {
                        s.node.state = st;
                    }
                }
            })
            .await?;
        match changed {
            Some(_) => Ok(swapped),
            None => Err(StoreError::NotFound(format!("node {name}"))),
        }
    }

    async fn remove_node(&self, name: &str) -> StoreResult<()> {
        record::check_node(name)?;
        self.forget_node(name);
        let Some((stored, _)) = self.read_node(name).await? else {
            return Err(StoreError::NotFound(format!("node {name}")));
        };
        let txn = Txn::new().and_then([
            TxnOp::delete(self.key("nodes", name), None),
            TxnOp::delete(self.key("alive", name), None),
        ]);
        self.txn("remove a node", txn).await?;
        self.revoke(stored.lease).await;
        Ok(())
    }

    async fn create_cell(&self, cell: CellRecord) -> StoreResult<u64> {
        cells::create(self, cell).await
    }

    async fn cell(&self, id: &str) -> StoreResult<Option<Versioned<CellRecord>>> {
        cells::get(self, id).await
    }

    async fn cells(&self) -> StoreResult<Vec<Versioned<CellRecord>>> {
        cells::list(self).await
    }

    async fn update_cell(&self, expected: u64, cell: CellRecord) -> StoreResult<u64> {
        cells::update(self, expected, cell).await
    }

    async fn delete_cell(&self, id: &str, expected: u64) -> StoreResult<()> {
        cells::delete(self, id, expected).await
    }

    async fn put_module(&self, hash: &str, bytes: &[u8]) -> StoreResult<()> {
        modules::put(self, hash, bytes).await
    }

    async fn module(&self, hash: &str) -> StoreResult<Option<Vec<u8>>> {
        modules::get(self, hash).await
    }

    async fn modules(&self) -> StoreResult<Vec<ModuleRecord>> {
        modules::list(self).await
    }

    async fn put_setting(&self, name: &str, value: &str) -> StoreResult<()> {
        crate::check_setting(name, Some(value))?;
        let (key, value) = (self.key("settings", name), value.to_string());
        self.call("store a setting", |mut c| async move {
            c.put(key, value, None).await
        })
        .await?;
        Ok(())
    }

    async fn setting(&self, name: &str) -> StoreResult<Option<String>> {
        crate::check_setting(name, None)?;
        let key = self.key("settings", name);
        let Some((bytes, _)) = self.get_one("read a setting", &key).await? else {
            return Ok(None);
        };
        if bytes.len() > crate::MAX_SETTING_BYTES {
            return Err(StoreError::Corrupt {
                key,
                message: format!("{} bytes, more than a setting holds", bytes.len()),
            });
        }
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                key,
                message: format!("not UTF-8: {e}"),
            })
    }

    async fn lead(&self, id: &str) -> StoreResult<Leadership> {
        lead::lead(self, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_first_key_after_the_prefix() {
        assert_eq!(prefix_end("/roam/cells/"), b"/roam/cells0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
        assert_eq!(ttl_secs(Duration::from_secs(10)), 10);
    }
}
