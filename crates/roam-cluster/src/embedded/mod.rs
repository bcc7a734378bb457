//! The embedded backend: one redb database file, for a planner alone on one
//! machine with nothing to install.
//!
//! Why redb: it is pure Rust (no C library to cross-build for aarch64 and
//! riscv64), crash-safe by design (copy-on-write B-trees, a commit is an
//! atomic switch of the root), has real serialisable write transactions,
//! and locks its file so that two planners cannot share it by accident.
//!
//! Layout: tables `nodes` (name → node record and its lease deadline),
//! `cells` (id → revision and cell record), `modules` (hash → bytes),
//! `module_sizes` (hash → length, so listing does not read blobs) and
//! `meta` (the format version and the revision counter). Every cell write
//! takes the next value of the one global counter, so a revision never
//! repeats, even across a delete and a create of the same id.
//!
//! Liveness is a deadline (`expires_ms`) per node, compared with the clock
//! on read. A planner that was down could not take heartbeats, so opening
//! the store gives every node that was alive when the planner last wrote it
//! (`meta/clock_ms`, written at least every second) a fresh lease: a
//! planner restart is not counted against the nodes, and a node already
//! dead stays dead. Heartbeats commit without waiting for the
//! disk (at most one durable commit a second carries them), because a lost
//! heartbeat costs nothing after that fresh lease; every other write is
//! durable when its call returns.
//!
//! redb is blocking: reads run on tokio's blocking pool, writes on one
//! writer thread that commits every waiting write in one transaction
//! ([`writer`]: group commit, one fsync for many calls).

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod writer;

use redb::{
    Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use crate::record::{self, decode, encode, now_ms, StoredNode};
use crate::{
    CellRecord, ClusterStore, Leadership, Maintenance, ModuleRecord, NodeRecord, NodeState,
    NodeStatus, StoreError, StoreResult, Versioned,
};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const CELLS: TableDefinition<&str, &[u8]> = TableDefinition::new("cells");
const MODULES: TableDefinition<&str, &[u8]> = TableDefinition::new("modules");
const MODULE_SIZES: TableDefinition<&str, u64> = TableDefinition::new("module_sizes");
const SETTINGS: TableDefinition<&str, &str> = TableDefinition::new("settings");

const META_FORMAT: &str = "format";
const META_REVISION: &str = "revision";
/// The last time a planner wrote the store (Unix ms): its leases were kept
/// until then.
const META_CLOCK: &str = "clock_ms";

/// How often, at most, a heartbeat waits for the disk.
const DURABLE_EVERY: Duration = Duration::from_secs(1);

/// A cell as stored: its record and the revision it was written at.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredCell {
    revision: u64,
    cell: CellRecord,
}

/// The cluster state in one redb database file. Only one process can have
/// it open; [`RedbStore::open`] says so if another one does.
pub struct RedbStore {
    /// First, so that dropping the store stops the writer thread (and lets
    /// go of the file) before anything else.
    writer: writer::Writer,
    inner: Arc<Inner>,
    /// Held by the [`Leadership`] of the one planner leading (in this
    /// process: the file lock already keeps other processes out).
    lead: Arc<tokio::sync::Mutex<()>>,
}

struct Inner {
    db: Database,
    path: PathBuf,
    last_durable: Mutex<Instant>,
}

/// `result`'s error as a backend error naming the file.
trait OrBackend<T> {
    fn or_backend(self, inner: &Inner) -> StoreResult<T>;
}

impl<T, E: Display> OrBackend<T> for Result<T, E> {
    fn or_backend(self, inner: &Inner) -> StoreResult<T> {
        self.map_err(|e| inner.backend(e))
    }
}

impl Inner {
    fn backend(&self, e: impl Display) -> StoreError {
        StoreError::Backend {
            backend: "redb",
            message: format!("{}: {e}", self.path.display()),
        }
    }

    /// The next revision, from the global counter (in `txn`).
    fn next_revision(&self, txn: &WriteTransaction) -> StoreResult<u64> {
        let mut meta = txn.open_table(META).or_backend(self)?;
        let next = meta
            .get(META_REVISION)
            .or_backend(self)?
            .map_or(0, |v| v.value())
            + 1;
        meta.insert(META_REVISION, next).or_backend(self)?;
        Ok(next)
    }

    fn read_node(&self, txn: &WriteTransaction, name: &str) -> StoreResult<Option<StoredNode>> {
        let nodes = txn.open_table(NODES).or_backend(self)?;
        let got = nodes.get(name).or_backend(self)?;
        got.map(|v| decode(&format!("nodes/{name}"), v.value()))
            .transpose()
    }

    fn write_node(&self, txn: &WriteTransaction, stored: &StoredNode) -> StoreResult<()> {
        let bytes = encode(stored)?;
        let mut nodes = txn.open_table(NODES).or_backend(self)?;
        nodes
            .insert(stored.node.name.as_str(), bytes.as_slice())
            .or_backend(self)?;
        Ok(())
    }

    fn read_cell(&self, txn: &WriteTransaction, id: &str) -> StoreResult<Option<StoredCell>> {
        let cells = txn.open_table(CELLS).or_backend(self)?;
        let got = cells.get(id).or_backend(self)?;
        got.map(|v| decode(&format!("cells/{id}"), v.value()))
            .transpose()
    }

    fn write_cell(&self, txn: &WriteTransaction, stored: &StoredCell) -> StoreResult<()> {
        let bytes = encode(stored)?;
        let mut cells = txn.open_table(CELLS).or_backend(self)?;
        cells
            .insert(stored.cell.id.as_str(), bytes.as_slice())
            .or_backend(self)?;
        Ok(())
    }

    /// Run `f` in one write transaction and commit it durably.
    fn write<T>(&self, f: impl FnOnce(&WriteTransaction) -> StoreResult<T>) -> StoreResult<T> {
        let txn = self.db.begin_write().or_backend(self)?;
        let out = f(&txn)?;
        txn.commit().or_backend(self)?;
        Ok(out)
    }
}

fn node_alive(stored: StoredNode, now: u64) -> NodeRecord {
    let mut node = stored.node;
    node.alive = now < stored.expires_ms;
    node
}

impl RedbStore {
    /// Change node `name`'s record durably with `f`; not found if it was
    /// never registered.
    async fn change_node(
        &self,
        name: &str,
        f: impl FnOnce(&mut NodeRecord) + Send + 'static,
    ) -> StoreResult<()> {
        record::check_node(name)?;
        let name = name.to_string();
        self.writer
            .write(true, move |inner, txn| {
                let Some(mut stored) = inner.read_node(txn, &name)? else {
                    return Err(StoreError::NotFound(format!("node {name}")));
                };
                f(&mut stored.node);
                inner.write_node(txn, &stored)
            })
            .await
    }

    /// Open the database at `path`, creating it if it does not exist.
    ///
    /// Fails with a [`StoreError::Backend`] that says so when another
    /// process (another planner) has the file open, and with
    /// [`StoreError::Corrupt`] when it was written by a newer roam.
    pub fn open(path: impl AsRef<Path>) -> StoreResult<RedbStore> {
        let path = path.as_ref().to_path_buf();
        let db = match redb::Builder::new().set_cache_size(64 << 20).create(&path) {
            Ok(db) => db,
            Err(DatabaseError::DatabaseAlreadyOpen) => {
                return Err(StoreError::Backend {
                    backend: "redb",
                    message: format!(
                        "{} is already open in another process (another roam planner?): \
                         one embedded store serves one planner; stop the other planner, \
                         give this one another --store, or use etcd to run several planners",
                        path.display()
                    ),
                })
            }
            Err(e) => {
                return Err(StoreError::Backend {
                    backend: "redb",
                    message: format!("cannot open {}: {e}", path.display()),
                })
            }
        };
        let inner = Inner {
            db,
            path,
            last_durable: Mutex::new(Instant::now()),
        };
        inner.write(|txn| {
            // Create every table, so readers never meet a missing one.
            for table in [NODES, CELLS, MODULES] {
                txn.open_table(table).or_backend(&inner)?;
            }
            txn.open_table(MODULE_SIZES).or_backend(&inner)?;
            txn.open_table(SETTINGS).or_backend(&inner)?;
            let mut meta = txn.open_table(META).or_backend(&inner)?;
            let format = meta.get(META_FORMAT).or_backend(&inner)?.map(|v| v.value());
            match format {
                None => {
                    meta.insert(META_FORMAT, u64::from(record::FORMAT))
                        .or_backend(&inner)?;
                }
                Some(f) if f == u64::from(record::FORMAT) => {}
                Some(f) => {
                    return Err(StoreError::Corrupt {
                        key: format!("{}: meta/{META_FORMAT}", inner.path.display()),
                        message: format!(
                            "format version {f}, this roam reads version {}; \
                             run the roam that wrote it",
                            record::FORMAT
                        ),
                    })
                }
            }
            let clock = meta
                .get(META_CLOCK)
                .or_backend(&inner)?
                .map_or(0, |v| v.value());
            drop(meta);
            // A planner restart is not counted against the nodes: each node
            // that was alive when the planner last wrote the store gets a
            // fresh lease from now. A node already dead then stays dead (it
            // may have been fenced and its cells restored elsewhere).
            let now = now_ms();
            let mut fresh = Vec::new();
            {
                let nodes = txn.open_table(NODES).or_backend(&inner)?;
                for entry in nodes.iter().or_backend(&inner)? {
                    let (key, value) = entry.or_backend(&inner)?;
                    let key = key.value().to_string();
                    // An unreadable node is left as it is: reading it will
                    // say what is wrong, and the rest still opens.
                    if let Ok(mut stored) =
                        decode::<StoredNode>(&format!("nodes/{key}"), value.value())
                    {
                        if stored.expires_ms > clock {
                            stored.expires_ms = stored.expires_ms.max(now + stored.ttl_ms);
                            fresh.push(stored);
                        }
                    }
                }
            }
            for stored in &fresh {
                inner.write_node(txn, stored)?;
            }
            Ok(())
        })?;
        let inner = Arc::new(inner);
        Ok(RedbStore {
            writer: writer::Writer::start(inner.clone())?,
            inner,
            lead: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Run `f` on the blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| {
                self.inner
                    .backend(format!("a store call did not finish: {e}"))
            })?
    }
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .finish()
    }
}

#[async_trait::async_trait]
impl ClusterStore for RedbStore {
    fn backend(&self) -> &'static str {
        "redb"
    }

    async fn register_node(&self, mut node: NodeRecord, ttl: Duration) -> StoreResult<()> {
        record::check_node(&node.name)?;
        self.writer
            .write(true, move |inner, txn| {
                let now = now_ms();
                let ttl_ms = (ttl.as_millis() as u64).max(1);
                if node.registered_ms == 0 {
                    node.registered_ms = now;
                }
                node.heartbeat_ms = now;
                node.alive = false;
                // A node registering again keeps what operators set.
                if let Some(before) = inner.read_node(txn, &node.name)? {
                    node.state = before.node.state;
                    node.maintenance = before.node.maintenance;
                }
                let stored = StoredNode {
                    node,
                    ttl_ms,
                    expires_ms: now + ttl_ms,
                    lease: 0,
                };
                inner.write_node(txn, &stored)
            })
            .await
    }

    async fn heartbeat(&self, name: &str, status: NodeStatus) -> StoreResult<()> {
        record::check_node(name)?;
        let name = name.to_string();
        // Not durable on its own: see the module docs.
        self.writer
            .write(false, move |inner, txn| {
                let now = now_ms();
                let Some(mut stored) = inner.read_node(txn, &name)? else {
                    return Err(StoreError::Expired(name));
                };
                if now >= stored.expires_ms {
                    return Err(StoreError::Expired(name));
                }
                stored.node.status = status;
                stored.node.heartbeat_ms = now;
                stored.expires_ms = now + stored.ttl_ms;
                inner.write_node(txn, &stored)
            })
            .await
    }

    async fn nodes(&self) -> StoreResult<Vec<NodeRecord>> {
        self.run(|inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let nodes = txn.open_table(NODES).or_backend(inner)?;
            let now = now_ms();
            let mut out = Vec::new();
            for entry in nodes.iter().or_backend(inner)? {
                let (key, value) = entry.or_backend(inner)?;
                let stored: StoredNode = decode(&format!("nodes/{}", key.value()), value.value())?;
                out.push(node_alive(stored, now));
            }
            Ok(out)
        })
        .await
    }

    async fn set_node_state(&self, name: &str, state: NodeState) -> StoreResult<()> {
        self.change_node(name, move |n| n.state = state).await
    }

    async fn swap_node_maintenance(
        &self,
        name: &str,
        expected: Option<Maintenance>,
        new: Option<Maintenance>,
        state: Option<NodeState>,
    ) -> StoreResult<bool> {
        record::check_node(name)?;
        let name = name.to_string();
        self.writer
            .write(true, move |inner, txn| {
                let Some(mut stored) = inner.read_node(txn, &name)? else {
                    return Err(StoreError::NotFound(format!("node {name}")));
                };
                if stored.node.maintenance != expected {
                    return Ok(false);
                }
                stored.node.maintenance = new;
                if let Some(s) = state {
                    stored.node.state = s;
                }
                inner.write_node(txn, &stored)?;
                Ok(true)
            })
            .await
    }

    async fn remove_node(&self, name: &str) -> StoreResult<()> {
        record::check_node(name)?;
        let name = name.to_string();
        self.writer
            .write(true, move |inner, txn| {
                let mut nodes = txn.open_table(NODES).or_backend(inner)?;
                let removed = nodes.remove(name.as_str()).or_backend(inner)?.is_some();
                if removed {
                    Ok(())
                } else {
                    Err(StoreError::NotFound(format!("node {name}")))
                }
            })
            .await
    }

    async fn create_cell(&self, cell: CellRecord) -> StoreResult<u64> {
        record::check_cell(&cell.id)?;
        self.writer
            .write(true, move |inner, txn| {
                if inner.read_cell(txn, &cell.id)?.is_some() {
                    return Err(StoreError::Exists(format!("cell {}", cell.id)));
                }
                let revision = inner.next_revision(txn)?;
                inner.write_cell(txn, &StoredCell { revision, cell })?;
                Ok(revision)
            })
            .await
    }

    async fn cell(&self, id: &str) -> StoreResult<Option<Versioned<CellRecord>>> {
        record::check_cell(id)?;
        let id = id.to_string();
        self.run(move |inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let cells = txn.open_table(CELLS).or_backend(inner)?;
            let got = cells.get(id.as_str()).or_backend(inner)?;
            let Some(value) = got else { return Ok(None) };
            let stored: StoredCell = decode(&format!("cells/{id}"), value.value())?;
            Ok(Some(Versioned {
                value: stored.cell,
                revision: stored.revision,
            }))
        })
        .await
    }

    async fn cells(&self) -> StoreResult<Vec<Versioned<CellRecord>>> {
        self.run(|inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let cells = txn.open_table(CELLS).or_backend(inner)?;
            let mut out = Vec::new();
            for entry in cells.iter().or_backend(inner)? {
                let (key, value) = entry.or_backend(inner)?;
                let stored: StoredCell = decode(&format!("cells/{}", key.value()), value.value())?;
                out.push(Versioned {
                    value: stored.cell,
                    revision: stored.revision,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn update_cell(&self, expected: u64, cell: CellRecord) -> StoreResult<u64> {
        record::check_cell(&cell.id)?;
        self.writer
            .write(true, move |inner, txn| {
                let actual = inner.read_cell(txn, &cell.id)?.map_or(0, |s| s.revision);
                if actual != expected || actual == 0 {
                    return Err(StoreError::Conflict {
                        what: format!("cell {}", cell.id),
                        expected,
                        actual,
                    });
                }
                let revision = inner.next_revision(txn)?;
                inner.write_cell(txn, &StoredCell { revision, cell })?;
                Ok(revision)
            })
            .await
    }

    async fn delete_cell(&self, id: &str, expected: u64) -> StoreResult<()> {
        record::check_cell(id)?;
        let id = id.to_string();
        self.writer
            .write(true, move |inner, txn| {
                let actual = inner.read_cell(txn, &id)?.map_or(0, |s| s.revision);
                if actual != expected || actual == 0 {
                    return Err(StoreError::Conflict {
                        what: format!("cell {id}"),
                        expected,
                        actual,
                    });
                }
                let mut cells = txn.open_table(CELLS).or_backend(inner)?;
                cells.remove(id.as_str()).or_backend(inner)?;
                Ok(())
            })
            .await
    }

    async fn put_module(&self, hash: &str, bytes: &[u8]) -> StoreResult<()> {
        record::check_hash(hash)?;
        record::check_module_size(hash, bytes.len())?;
        record::check_module_name(hash, bytes)?;
        let hash = hash.to_string();
        let bytes = bytes.to_vec();
        self.writer
            .write(true, move |inner, txn| {
                let mut sizes = txn.open_table(MODULE_SIZES).or_backend(inner)?;
                if sizes.get(hash.as_str()).or_backend(inner)?.is_some() {
                    return Ok(());
                }
                sizes
                    .insert(hash.as_str(), bytes.len() as u64)
                    .or_backend(inner)?;
                let mut modules = txn.open_table(MODULES).or_backend(inner)?;
                modules
                    .insert(hash.as_str(), bytes.as_slice())
                    .or_backend(inner)?;
                Ok(())
            })
            .await
    }

    async fn module(&self, hash: &str) -> StoreResult<Option<Vec<u8>>> {
        record::check_hash(hash)?;
        let hash = hash.to_string();
        self.run(move |inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let modules = txn.open_table(MODULES).or_backend(inner)?;
            let Some(got) = modules.get(hash.as_str()).or_backend(inner)? else {
                return Ok(None);
            };
            let bytes = got.value().to_vec();
            record::check_module_read(&format!("modules/{hash}"), &hash, &bytes)?;
            Ok(Some(bytes))
        })
        .await
    }

    async fn modules(&self) -> StoreResult<Vec<ModuleRecord>> {
        self.run(|inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let sizes = txn.open_table(MODULE_SIZES).or_backend(inner)?;
            let mut out = Vec::new();
            for entry in sizes.iter().or_backend(inner)? {
                let (key, value) = entry.or_backend(inner)?;
                out.push(ModuleRecord {
                    hash: key.value().to_string(),
                    bytes: value.value(),
                });
            }
            Ok(out)
        })
        .await
    }

    async fn put_setting(&self, name: &str, value: &str) -> StoreResult<()> {
        crate::check_setting(name, Some(value))?;
        let (name, value) = (name.to_string(), value.to_string());
        self.writer
            .write(true, move |inner, txn| {
                let mut settings = txn.open_table(SETTINGS).or_backend(inner)?;
                settings
                    .insert(name.as_str(), value.as_str())
                    .or_backend(inner)?;
                Ok(())
            })
            .await
    }

    async fn setting(&self, name: &str) -> StoreResult<Option<String>> {
        crate::check_setting(name, None)?;
        let name = name.to_string();
        self.run(move |inner| {
            let txn = inner.db.begin_read().or_backend(inner)?;
            let settings = txn.open_table(SETTINGS).or_backend(inner)?;
            let got = settings.get(name.as_str()).or_backend(inner)?;
            Ok(got.map(|v| v.value().to_string()))
        })
        .await
    }

    async fn lead(&self, id: &str) -> StoreResult<Leadership> {
        // The file lock keeps every other process out, so leading is only
        // about this process: one `Leadership` at a time.
        let guard = self.lead.clone().lock_owned().await;
        tracing::info!(planner = id, store = %self.inner.path.display(), "leading (embedded store)");
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
        Ok(Leadership::new(lost_rx, Box::new((lost_tx, guard))))
    }
}
