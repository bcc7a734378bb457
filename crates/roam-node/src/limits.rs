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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::size::human;

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
    /// Most bytes of sandbox files a cell may hold (its disk quota: past
    /// it a write that grows a file fails with `EDQUOT`), carry in a kept
    /// checkpoint, or bring when it arrives (`--max-files-size`).
    pub max_files_bytes: u64,
    /// Most sandbox file-tree entries an arriving cell may bring
    /// (`--max-file-entries`).
    pub max_file_entries: u64,
    /// Bytes of output kept per cell; older output is dropped and counted
    /// (`--log-size`).
    pub log_bytes: u64,
    /// CPU weight of a cell that asks for none, 1 to 10000
    /// (`--cell-cpu-weight`; see `crate::cpu`).
    pub cell_cpu_weight: u32,
    /// CPU cap of a cell that asks for none, thousandths of a core
    /// (`--cell-cpu-max`); `None`: no cap.
    pub cell_cpu_max_millicores: Option<u32>,
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
            cell_cpu_weight: roam_wire::DEFAULT_CPU_WEIGHT,
            cell_cpu_max_millicores: None,
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
        roam_wire::CpuLimits {
            weight: Some(self.cell_cpu_weight),
            max_millicores: self.cell_cpu_max_millicores,
        }
        .check()
        .map_err(|e| format!("--cell-cpu-weight or --cell-cpu-max: {e}"))?;
        Ok(())
    }
}

/// Cells admitted but not yet in the cell table (migrations arriving),
/// with their memory limits: they count against the caps too.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub(crate) map: Mutex<HashMap<String, u64>>,
}

/// Holds a [`Pending`] admission; dropping it releases it.
pub(crate) struct Admission {
    pub(crate) pending: Arc<Pending>,
    pub(crate) key: String,
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
        let l = NodeLimits {
            cell_cpu_weight: 0,
            ..NodeLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--cell-cpu-weight"));
        let l = NodeLimits {
            cell_cpu_max_millicores: Some(5),
            ..NodeLimits::default()
        };
        assert!(l.validate().unwrap_err().contains("--cell-cpu-max"));
    }
}

/// The far pages this node holds for other nodes as a memory server
/// (`--memory-server SIZE`), all connections together; served by
/// `migrate::far`.
#[derive(Debug)]
pub(crate) struct FarServer {
    capacity: u64,
    used: AtomicU64,
}

impl FarServer {
    /// A server that holds at most `bytes`.
    pub(crate) fn new(bytes: u64) -> FarServer {
        FarServer {
            capacity: bytes / roam_wire::FAR_PAGE as u64,
            used: AtomicU64::new(0),
        }
    }

    /// Pages it can still take.
    pub(crate) fn free_pages(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used.load(Ordering::Relaxed))
    }

    /// Pages held now.
    pub(crate) fn used_pages(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes it offers in all.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.capacity * roam_wire::FAR_PAGE as u64
    }

    /// Take `n` more pages, or refuse.
    pub(crate) fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + n <= self.capacity).then_some(u + n)
            })
            .is_ok()
    }

    pub(crate) fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}
