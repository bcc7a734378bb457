//! Cluster state: which nodes exist and are alive, which cells exist, which
//! node owns each cell, where each cell's newest kept checkpoint is, and the
//! module repository. The planner is the only writer; nodes reach the state
//! through the planner's API, never directly.
//!
//! Why one trait with two backends: one machine wants nothing to install
//! (an embedded, crash-safe database file); a fleet wants the state to
//! outlive any one planner (etcd, with leases for liveness and
//! transactions for ownership). The planner is written once against
//! [`ClusterStore`] and cannot tell them apart, and the tests run the same
//! contract over both.
//!
//! Ownership is the one rule everything else leans on: a cell's `owner`
//! changes only through [`ClusterStore::update_cell`], a compare-and-swap
//! on the record's revision, so of two nodes racing for a cell exactly one
//! wins (see `docs/control-plane.md`).

#![deny(missing_docs)]

mod embedded;
mod etcd;
mod record;
mod spec;
mod types;

pub use embedded::RedbStore;
pub use etcd::{
    EtcdAccess, EtcdAccessError, EtcdAccessFiles, EtcdStore, CALL_TIMEOUT as ETCD_CALL_TIMEOUT,
    LEADER_TTL as ETCD_LEADER_TTL, MAX_PASSWORD_BYTES as ETCD_MAX_PASSWORD_BYTES,
};
pub use spec::{StoreSpec, StoreSpecError, DEFAULT_ETCD_PREFIX};
pub use types::*;

/// The largest module the repository takes: larger uploads are refused
/// with [`StoreError::Invalid`] before anything is stored.
pub const MAX_MODULE_BYTES: usize = 256 << 20;

use std::time::Duration;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A compare-and-swap lost: the record changed since it was read.
    #[error("{what} changed since it was read (revision {expected}, now {actual}); read it again")]
    Conflict {
        /// The record, e.g. `cell c-1234`.
        what: String,
        /// The revision the caller expected.
        expected: u64,
        /// The revision the store holds (0: the record is gone).
        actual: u64,
    },
    /// A record that must exist does not.
    #[error("{0} does not exist")]
    NotFound(String),
    /// A record that must not exist does.
    #[error("{0} already exists")]
    Exists(String),
    /// The caller passed something the store refuses before touching any
    /// key: a malformed cell id, node name or module hash, or a module
    /// larger than [`MAX_MODULE_BYTES`].
    #[error("{0}")]
    Invalid(String),
    /// A node's lease ran out: it must register again.
    #[error("node {0} is not registered or its lease expired; it must register again")]
    Expired(String),
    /// The backend failed (I/O, the database, the network to etcd).
    #[error("cluster store ({backend}): {message}")]
    Backend {
        /// `redb` or `etcd`.
        backend: &'static str,
        /// What failed, with the backend's own words.
        message: String,
    },
    /// A stored record could not be read back (written by a newer roam, or
    /// damaged).
    #[error("cluster store: record {key} is unreadable: {message}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// A result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// A record and the revision it was read at; pass the revision back to
/// [`ClusterStore::update_cell`] to change the record only if nobody else
/// did in between.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The record.
    pub value: T,
    /// Its revision: changes on every write, never repeats for one key.
    pub revision: u64,
}

/// The cluster's state. Every method is atomic on its own; there are no
/// multi-call transactions beyond the compare-and-swap of
/// [`update_cell`](ClusterStore::update_cell).
#[async_trait::async_trait]
pub trait ClusterStore: Send + Sync + 'static {
    /// `redb` or `etcd`, for logs and `/metrics`.
    fn backend(&self) -> &'static str;

    // --- nodes ---

    /// Register `node` (or register it again: same name, new record) and
    /// start its liveness lease of `ttl`. It stays alive while
    /// [`heartbeat`](Self::heartbeat)s come more often than `ttl`.
    async fn register_node(&self, node: NodeRecord, ttl: Duration) -> StoreResult<()>;

    /// Renew `name`'s lease and record its latest `status`.
    /// [`StoreError::Expired`] if the lease already ran out (the node was
    /// declared dead and must register again).
    async fn heartbeat(&self, name: &str, status: NodeStatus) -> StoreResult<()>;

    /// Every node ever registered and not removed, with `alive` set from
    /// its lease.
    async fn nodes(&self) -> StoreResult<Vec<NodeRecord>>;

    /// Set a node's administrative state (ready, draining). Not found if
    /// the node was never registered.
    async fn set_node_state(&self, name: &str, state: NodeState) -> StoreResult<()>;

    /// Replace a node's maintenance window with `new`, and its state with
    /// `state` if given, in one change, but only if its window is still
    /// `expected` (what the caller read): `Ok(false)`, with nothing
    /// changed, when someone changed it since. Not found if the node was
    /// never registered. Registering again keeps a node's state and
    /// window.
    async fn swap_node_maintenance(
        &self,
        name: &str,
        expected: Option<Maintenance>,
        new: Option<Maintenance>,
        state: Option<NodeState>,
    ) -> StoreResult<bool>;

    /// Forget a node (an operator removed it).
    async fn remove_node(&self, name: &str) -> StoreResult<()>;

    // --- cells ---

    /// Create a cell record; [`StoreError::Exists`] if its id is taken.
    /// The revision it was written at.
    async fn create_cell(&self, cell: CellRecord) -> StoreResult<u64>;

    /// One cell, or `None`.
    async fn cell(&self, id: &str) -> StoreResult<Option<Versioned<CellRecord>>>;

    /// Every cell.
    async fn cells(&self) -> StoreResult<Vec<Versioned<CellRecord>>>;

    /// Replace a cell's record if its revision is still `expected`:
    /// the new revision, or [`StoreError::Conflict`]. This is the only way
    /// a cell's owner changes.
    async fn update_cell(&self, expected: u64, cell: CellRecord) -> StoreResult<u64>;

    /// Delete a cell's record if its revision is still `expected`.
    async fn delete_cell(&self, id: &str, expected: u64) -> StoreResult<()>;

    // --- the module repository ---

    /// Store a module's bytes under its BLAKE3 `hash` (64 lowercase hex
    /// digits, checked by the caller). Storing it again is a no-op.
    async fn put_module(&self, hash: &str, bytes: &[u8]) -> StoreResult<()>;

    /// A module's bytes, or `None`.
    async fn module(&self, hash: &str) -> StoreResult<Option<Vec<u8>>>;

    /// The hashes and sizes of every stored module.
    async fn modules(&self) -> StoreResult<Vec<ModuleRecord>>;

    // --- settings ---

    /// Record cluster-wide setting `name` (e.g. `placement`), so that every
    /// planner, and a planner started later, uses the same. Names are
    /// checked by [`check_setting`].
    async fn put_setting(&self, name: &str, value: &str) -> StoreResult<()>;

    /// A setting's value, or `None` if it was never set.
    async fn setting(&self, name: &str) -> StoreResult<Option<String>>;

    // --- planners ---

    /// Wait until this planner (`id`) leads the cluster. Only the leader
    /// acts on its own (evacuates dead nodes, takes periodic checkpoints);
    /// every planner answers the API. The returned [`Leadership`] says when
    /// the lead is lost.
    async fn lead(&self, id: &str) -> StoreResult<Leadership>;
}

/// The longest setting value. The largest the planner writes is the
/// slowdown it learned per program (up to 500 programs, about 150 KiB).
pub const MAX_SETTING_BYTES: usize = 256 << 10;

/// Refuse a setting name that is not 1 to 64 of `[a-z0-9-]`, or a value
/// over [`MAX_SETTING_BYTES`], before it touches a key.
pub fn check_setting(name: &str, value: Option<&str>) -> StoreResult<()> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        return Err(StoreError::Invalid(format!(
            "setting name {name:?}: expected 1 to 64 of a-z, 0-9 and -"
        )));
    }
    if let Some(v) = value.filter(|v| v.len() > MAX_SETTING_BYTES) {
        return Err(StoreError::Invalid(format!(
            "setting {name}: {} bytes, more than {MAX_SETTING_BYTES}",
            v.len()
        )));
    }
    Ok(())
}

/// This planner leads until [`lost`](Leadership::lost) resolves. Dropping
/// it gives the lead up.
pub struct Leadership {
    lost: tokio::sync::watch::Receiver<bool>,
    _hold: Box<dyn Send + Sync>,
}

impl Leadership {
    /// A lead that ends when `lost` turns true (or its sender drops);
    /// `hold` keeps whatever maintains it (a keep-alive task, a lock).
    pub fn new(lost: tokio::sync::watch::Receiver<bool>, hold: Box<dyn Send + Sync>) -> Self {
        Leadership { lost, _hold: hold }
    }

    /// Resolves once the lead is lost.
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|l| *l).await;
    }

    /// Whether the lead is still held.
    pub fn held(&self) -> bool {
        !*self.lost.borrow()
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("held", &self.held())
            .finish()
    }
}
