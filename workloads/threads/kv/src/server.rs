//! State shared by every client thread: the keyspace, the table of
//! connected clients, and counters for INFO.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::store::Store;

/// What CLIENT LIST shows of a connection.
pub struct ClientInfo {
    /// The connection's fd (a WASI fd under roam).
    pub fd: i32,
    /// Set by CLIENT SETNAME.
    pub name: Vec<u8>,
}

/// Everything the client threads share. It lives for the whole run (it is
/// leaked at start), so threads borrow it as `&'static` without counting.
pub struct Server {
    /// The keyspace.
    pub store: Store,
    /// Connected clients by id. Its length is the count of clients, which
    /// `--max-clients` caps; an entry is removed when its thread ends.
    clients: Mutex<BTreeMap<u64, ClientInfo>>,
    /// Most clients at once (`--max-clients`).
    pub max_clients: usize,
    next_id: AtomicU64,
    /// When the server started (INFO's uptime).
    pub started: Instant,
    /// Connections accepted (INFO stats).
    pub connections: AtomicU64,
    /// Commands run (INFO stats); added once per batch, not per command,
    /// so that fifty threads do not fight over one cache line.
    pub commands: AtomicU64,
    /// Connections turned away by `--max-clients` (INFO stats).
    pub rejected: AtomicU64,
}

/// One connection's own state.
pub struct Session {
    /// CLIENT ID.
    pub id: u64,
    /// Set by QUIT: close once the replies so far are sent.
    pub close: bool,
}

impl Server {
    /// A server with an empty keyspace.
    pub fn new(max_clients: usize) -> Server {
        Server {
            store: Store::new(),
            clients: Mutex::new(BTreeMap::new()),
            max_clients,
            next_id: AtomicU64::new(1),
            started: Instant::now(),
            connections: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// The client table (a panicked client thread does not poison it for
    /// the others: its entries are complete at every point).
    pub fn clients(&self) -> MutexGuard<'_, BTreeMap<u64, ClientInfo>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection, unless `--max-clients` are connected
    /// already. The registration ends when the returned guard is dropped.
    pub fn register(&'static self, fd: i32) -> Option<Registration> {
        let mut clients = self.clients();
        if clients.len() >= self.max_clients {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        clients.insert(
            id,
            ClientInfo {
                fd,
                name: Vec::new(),
            },
        );
        Some(Registration { server: self, id })
    }
}

/// A connected client's place in the table; dropping it (when the client's
/// thread ends, however it ends) frees the place.
pub struct Registration {
    server: &'static Server,
    /// The client's id.
    pub id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.server.clients().remove(&self.id);
    }
}
