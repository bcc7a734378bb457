//! A node's caps: how many cells, how much memory, how large a module, a
//! file tree and a log it accepts.
//!
//! Why: a node takes cells from API clients and from migration peers, and
//! neither is trusted to be reasonable. Every cap is checked at the door,
//! before anything is allocated or paused, and a refusal says which cap,
//! what is in use, and the `roam node` flag that raises it.
//!
//! Memory is accounted by *limits*, not by current sizes: a cell counts
//! for its memory limit from the moment it is admitted, like a
//! reservation. A node therefore never admits more memory than it can
//! give, and a cell that later grows to its limit does not starve the
//! others; the price is that an idle cell with a large limit holds its
//! share. Ask for a smaller limit at launch (`roam launch --max-memory`)
//! to fit more cells.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::size::human;
use crate::types::CellState;

/// Default [`NodeLimits::max_cells`].
pub const DEFAULT_MAX_CELLS: usize = 64;
/// Default [`NodeLimits::cell_memory`]: 1 GiB.
pub const DEFAULT_CELL_MEMORY: u64 = 1 << 30;
/// Default [`NodeLimits::max_cell_memory`]: 4 GiB (all a wasm32 memory can
/// address).
pub const DEFAULT_MAX_CELL_MEMORY: u64 = 4 << 30;
/// Default [`NodeLimits::max_module_bytes`]: 256 MiB.
pub const DEFAULT_MAX_MODULE: u64 = 256 << 20;
/// Default [`NodeLimits::max_files_bytes`]: 1 GiB.
pub const DEFAULT_MAX_FILES: u64 = 1 << 30;
/// Default [`NodeLimits::max_file_entries`].
pub const DEFAULT_MAX_FILE_ENTRIES: u64 = 100_000;
/// Default [`NodeLimits::log_bytes`]: 4 MiB.
pub const DEFAULT_LOG: u64 = 4 << 20;

/// The caps of a node. Every field has a `roam node` flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLimits {
    /// Most cells running (or arriving) at once (`--max-cells`).
    pub max_cells: usize,
    /// Most memory all cells' limits may add up to (`--max-total-memory`).
    /// `None`: the machine's physical memory less
    /// [`crate::NodeConfig::memory_reserve`].
    pub max_total_memory: Option<u64>,
    /// Memory limit of a launched cell that asks for none
    /// (`--cell-memory`).
    pub cell_memory: u64,
    /// Largest memory limit a cell may have, launched or arriving
    /// (`--max-cell-memory`).
    pub max_cell_memory: u64,
    /// Largest module accepted by upload or migration
    /// (`--max-module-size`).
    pub max_module_bytes: u64,
    /// Most bytes of sandbox files an arriving cell may bring
    /// (`--max-files-size`).
    pub max_files_bytes: u64,
    /// Most sandbox file-tree entries an arriving cell may bring
    /// (`--max-file-entries`).
    pub max_file_entries: u64,
    /// Bytes of output kept per cell; older output is dropped and counted
    /// (`--log-size`).
    pub log_bytes: u64,
}

impl Default for NodeLimits {
    fn default() -> Self {
        NodeLimits {
            max_cells: DEFAULT_MAX_CELLS,
            max_total_memory: None,
            cell_memory: DEFAULT_CELL_MEMORY,
            max_cell_memory: DEFAULT_MAX_CELL_MEMORY,
            max_module_bytes: DEFAULT_MAX_MODULE,
            max_files_bytes: DEFAULT_MAX_FILES,
            max_file_entries: DEFAULT_MAX_FILE_ENTRIES,
            log_bytes: DEFAULT_LOG,
        }
    }
}

impl NodeLimits {
    /// Check the limits make sense together (at node start).
    pub fn validate(&self) -> Result<(), String> {
        if self.cell_memory > self.max_cell_memory {
            return Err(format!(
                "--cell-memory {} is larger than --max-cell-memory {}",
                human(self.cell_memory),
                human(self.max_cell_memory)
            ));
        }
        if self.max_cell_memory > roam_runtime::DEFAULT_MAX_MEMORY {
            return Err(format!(
                "--max-cell-memory {} is more than a wasm32 memory can address (4 GiB)",
                human(self.max_cell_memory)
            ));
        }
        if self.log_bytes == 0 || self.log_bytes > (1 << 30) {
            return Err("--log-size must be between 1 B and 1 GiB".into());
        }
        Ok(())
    }
}

/// Cells admitted but not yet in the cell table (migrations arriving),
/// with their memory limits: they count against the caps too.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    map: Mutex<HashMap<String, u64>>,
}

/// Holds a [`Pending`] admission; dropping it releases it.
pub(crate) struct Admission {
    pending: Arc<Pending>,
    key: String,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.pending
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// What a node has committed: cells and memory limits.
struct Use {
    cells: usize,
    memory: u64,
}

fn in_use(n: &crate::node::NodeInner, pending: &HashMap<String, u64>) -> Use {
    let cells = n.cells();
    let live = cells
        .values()
        .filter(|e| matches!(e.state, CellState::Running | CellState::Migrating));
    let (mut count, mut memory) = (0, 0u64);
    for e in live {
        count += 1;
        memory = memory.saturating_add(e.spec.max_memory);
    }
    Use {
        cells: count + pending.len(),
        memory: memory.saturating_add(pending.values().sum::<u64>()),
    }
}

/// The memory all cells' limits may add up to on this node.
pub(crate) fn total_memory_cap(n: &crate::node::NodeInner) -> u64 {
    n.cfg.limits.max_total_memory.unwrap_or_else(|| {
        let total = crate::sysinfo::Machine::read().memory_total;
        if total == 0 {
            u64::MAX
        } else {
            total.saturating_sub(n.cfg.memory_reserve)
        }
    })
}

/// Admit one more cell with memory limit `max_memory`, or say which cap
/// refuses it. The admission holds until dropped: drop it once the cell is
/// in the cell table (or has failed to start).
pub(crate) fn admit(
    n: &crate::node::NodeInner,
    key: &str,
    max_memory: u64,
) -> Result<Admission, String> {
    let l = &n.cfg.limits;
    if max_memory > l.max_cell_memory {
        return Err(format!(
            "the cell's memory limit {} is over node {}'s per-cell maximum {} \
             (raise it with roam node --max-cell-memory)",
            human(max_memory),
            n.cfg.name,
            human(l.max_cell_memory)
        ));
    }
    let mut map = n.pending.map.lock().unwrap_or_else(PoisonError::into_inner);
    let used = in_use(n, &map);
    if used.cells >= l.max_cells {
        return Err(format!(
            "node {} is full: {} cells run or arrive here, its limit is {} \
             (stop or move a cell, or raise roam node --max-cells)",
            n.cfg.name, used.cells, l.max_cells
        ));
    }
    let cap = total_memory_cap(n);
    if used.memory.saturating_add(max_memory) > cap {
        return Err(format!(
            "node {} lacks memory for the cell: its cells' limits add up to {} of {}, \
             the cell needs {} more (ask for a smaller --max-memory, or raise roam node \
             --max-total-memory)",
            n.cfg.name,
            human(used.memory),
            human(cap),
            human(max_memory)
        ));
    }
    map.insert(key.to_string(), max_memory);
    Ok(Admission {
        pending: n.pending.clone(),
        key: key.to_string(),
    })
}

/// Admit an arriving cell (a migration offer), or say which cap refuses
/// it. The cell's memory limit becomes the smaller of its own and this
/// node's per-cell maximum; its memory now must fit under it.
pub(crate) fn admit_offer(
    n: &crate::node::NodeInner,
    offer: &mut roam_wire::Offer,
) -> Result<Admission, String> {
    let l = &n.cfg.limits;
    if offer.module_len > l.max_module_bytes {
        return Err(format!(
            "the cell's module is {}, over node {}'s limit of {} \
             (raise it with roam node --max-module-size)",
            human(offer.module_len),
            n.cfg.name,
            human(l.max_module_bytes)
        ));
    }
    let limit = offer.cell.max_memory.min(l.max_cell_memory);
    if offer.memory_bytes > limit {
        return Err(format!(
            "the cell's memory is {}, over its limit of {} on node {} \
             (the cell's own limit is {}, the node's per-cell maximum {}; \
             raise it with roam node --max-cell-memory)",
            human(offer.memory_bytes),
            human(limit),
            n.cfg.name,
            human(offer.cell.max_memory),
            human(l.max_cell_memory)
        ));
    }
    offer.cell.max_memory = limit;
    admit(n, &offer.migration_id, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_consistent_and_bad_combinations_are_named() {
        assert!(NodeLimits::default().validate().is_ok());
        let l = NodeLimits {
            cell_memory: 2 << 30,
            max_cell_memory: 1 << 30,
            ..NodeLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--cell-memory"));
    }
}
