//! What a node holds: its configuration, runtime, cell table, migrations,
//! lease and links, shared by every task through one `Arc<NodeInner>`.
//!
//! Why a layer of its own: every part of the node reads this state, so it
//! sits below all of them. It holds data and the few rules that keep the
//! data consistent (a cell that stops being here leaves the gateway's
//! routing, an id is checked before it becomes a path); the operations on
//! cells, kept checkpoints, migrations and the planner live in the modules
//! above it (`docs/architecture.md`, "Inside roam-node").

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use roam_runtime::Runtime;
use roam_transfer::ChunkStore;

use crate::cell::CellEntry;
use crate::client::{Client, ClientError};
use crate::config::NodeConfig;
use crate::secure::NodeAuth;
use crate::types::CellState;

mod fence;
mod migrations;
mod services;

pub(crate) use fence::Fence;
pub(crate) use migrations::{Inbound, Migration};
pub(crate) use services::connect as connect_gateway;

/// State shared by every task of a node.
pub(crate) struct NodeInner {
    pub cfg: NodeConfig,
    pub rt: Runtime,
    pub migrate_addr: SocketAddr,
    pub cells: Mutex<HashMap<String, CellEntry>>,
    pub migrations: Mutex<HashMap<String, Arc<Migration>>>,
    pub inbound: Mutex<HashMap<String, Arc<Inbound>>>,
    pub store: Arc<ChunkStore>,
    pub auth: NodeAuth,
    /// Cells admitted but not in `cells` yet (see [`crate::limits`]).
    pub pending: Arc<crate::limits::Pending>,
    /// The link to the gateway (`--gateway`), told where service cells run
    /// (see [`services`]).
    pub gateway: Option<roam_gateway::link::GatewayLink>,
    /// The planner (`--planner`), with this node's credentials.
    pub planner: Option<roam_api::PlannerClient>,
    /// The node's async runtime, for the receiving threads of migrations
    /// that must ask the planner.
    pub tokio: tokio::runtime::Handle,
    /// The node's counters and histograms (`GET /metrics`).
    pub metrics: crate::metrics::Metrics,
    /// The node's own view of its planner lease (see [`Fence`]).
    pub fence: Fence,
    /// One full copy of a cell's memory outside the cell at a time: a kept
    /// checkpoint's snapshot on its owner, or a restore's rebuilt memory.
    /// Admission keeps room for one (`cells::admit`).
    pub copies: Arc<tokio::sync::Semaphore>,
    /// Kept checkpoints being received at once (each streams to disk).
    pub uploads: tokio::sync::Semaphore,
    /// Which node may store or read which cell's kept checkpoints here.
    pub grants: crate::grants::Grants,
    /// The cells' CPU limits (see [`crate::cpu`]).
    pub cpu: Arc<crate::cpu::Cpu>,
    /// The energy estimate, when the node declares a power model.
    pub power: Option<crate::power::Meter>,
    /// The far pages held for other nodes (`--memory-server`).
    pub far_server: Option<crate::limits::FarServer>,
}

/// Kept checkpoints a holder receives at once.
pub(crate) const UPLOADS: usize = 2;

impl NodeInner {
    pub(crate) fn cells(&self) -> std::sync::MutexGuard<'_, HashMap<String, CellEntry>> {
        self.cells.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Set a cell's state, unless it already ended. A service cell that
    /// stops being here (ended, or moved) leaves the gateway's routing.
    pub(crate) fn set_state(&self, id: &str, state: CellState) {
        let mut left = None;
        if let Some(e) = self.cells().get_mut(id) {
            tracing::info!(cell = id, ?state, "cell state");
            let here = |s: &CellState| matches!(s, CellState::Running | CellState::Migrating);
            if !here(&state) {
                if let Some(h) = e.handle.take() {
                    e.memory_lost = h.memory_lost.load(std::sync::atomic::Ordering::Acquire);
                    e.cpu_used = h.cpu_time();
                }
                if here(&e.state) && e.spec.service.is_some() {
                    left = Some(e.spec.clone());
                }
            }
            e.state = state.clone();
        }
        match (left, state) {
            (Some(spec), CellState::Moved { .. }) => self.release_service(&spec),
            (Some(spec), _) => self.unserve(&spec),
            (None, _) => {}
        }
    }

    /// Bytes of output kept per cell.
    pub(crate) fn log_capacity(&self) -> usize {
        usize::try_from(self.cfg.limits.log_bytes).unwrap_or(usize::MAX)
    }

    /// The directory of a cell's files. `id` must have passed
    /// [`roam_wire::ident::check_cell_id`] at the boundary it came through;
    /// an unchecked id here is a bug, and it panics rather than hand out a
    /// path outside `state_dir/cells`.
    pub(crate) fn cell_dir(&self, id: &str) -> PathBuf {
        if let Err(e) = roam_wire::ident::check_cell_id(id) {
            panic!("bug: an unchecked cell id reached the file system: {e}");
        }
        self.cfg.state_dir.join("cells").join(id)
    }

    /// A client of another node's control API, with this node's
    /// credentials.
    pub(crate) fn client(&self, addr: &str) -> Result<Client, ClientError> {
        Client::with_auth(addr, &self.auth.client)
    }

    /// Whether a cell serving `service` may run here: the node has a
    /// gateway, and no other cell here serves the same service.
    pub(crate) fn check_can_serve(&self, service: &str) -> Result<(), String> {
        if self.cfg.gateway.is_none() {
            return Err(format!(
                "node {} has no gateway, so a cell serving `{service}` could not be reached: \
                 start the node with roam node --gateway ADDR",
                self.cfg.name
            ));
        }
        let cells = self.cells();
        let other = cells.values().find(|e| {
            e.spec.service.as_deref() == Some(service)
                && matches!(e.state, CellState::Running | CellState::Migrating)
        });
        match other {
            Some(e) => Err(format!(
                "cell {} already serves `{service}` on node {}: stop or move it first",
                e.spec.id, self.cfg.name
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn features(&self) -> roam_wire::Features {
        roam_wire::Features {
            userfaultfd: roam_runtime::userfaultfd_available(),
        }
    }
}
