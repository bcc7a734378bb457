//! Admission: whether a cell may start or arrive here, under the node's
//! caps (`crate::limits`), counting the cells already admitted.

use std::collections::HashMap;
use std::sync::PoisonError;

use crate::limits::Admission;
use crate::size::human;
use crate::state::NodeInner;
use crate::types::CellState;

/// What a node has committed: cells and memory limits.
struct Use {
    cells: usize,
    memory: u64,
    /// The largest memory limit among them.
    largest: u64,
}

fn in_use(n: &NodeInner, pending: &HashMap<String, u64>) -> Use {
    let cells = n.cells();
    let live = cells
        .values()
        .filter(|e| matches!(e.state, CellState::Running | CellState::Migrating));
    let (mut count, mut memory, mut largest) = (0, 0u64, 0u64);
    for e in live {
        count += 1;
        let here = local_memory(&e.spec);
        memory = memory.saturating_add(here);
        largest = largest.max(here);
    }
    Use {
        cells: count + pending.len(),
        memory: memory.saturating_add(pending.values().sum::<u64>()),
        largest: largest.max(pending.values().copied().max().unwrap_or(0)),
    }
}

/// What a cell may hold on its node: its memory limit, or its local budget
/// if it has far memory (the rest lives on a memory server).
pub(crate) fn local_memory(spec: &roam_wire::CellSpec) -> u64 {
    match &spec.far {
        Some(f) => spec.max_memory.min(f.local_memory),
        None => spec.max_memory,
    }
}

/// The memory all cells' limits may add up to on this node.
pub(crate) fn total_memory_cap(n: &NodeInner) -> u64 {
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
pub(crate) fn admit(n: &NodeInner, key: &str, max_memory: u64) -> Result<Admission, String> {
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
    // A key taken twice would be released by the first drop and leave the
    // second uncounted: a peer that reuses a migration id must not fit more
    // than the caps allow.
    if map.contains_key(key) {
        return Err(format!(
            "{key} is already being admitted on node {}: one at a time",
            n.cfg.name
        ));
    }
    let used = in_use(n, &map);
    if used.cells >= l.max_cells {
        return Err(format!(
            "node {} is full: {} cells run or arrive here, its limit is {} \
             (stop or move a cell, or raise roam node --max-cells)",
            n.cfg.name, used.cells, l.max_cells
        ));
    }
    let cap = total_memory_cap(n);
    // In a cluster, the planner asks for kept checkpoints, each one more
    // copy of a cell's memory (one at a time: `NodeInner::copies`), so
    // room for the largest cell's stays free.
    let room = if n.planner.is_some() {
        used.largest.max(max_memory)
    } else {
        0
    };
    if used.memory.saturating_add(max_memory).saturating_add(room) > cap {
        let kept = if room > 0 {
            format!(
                ", and {} stays free for a kept checkpoint of the largest cell",
                human(room)
            )
        } else {
            String::new()
        };
        return Err(format!(
            "node {} lacks memory for the cell: its cells' limits add up to {} of {}{kept}; \
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
    n: &NodeInner,
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
    offer
        .cell
        .cpu
        .check()
        .map_err(|e| format!("the cell's CPU settings are refused: {e}"))?;
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
    if let Some(far) = &offer.cell.far {
        far.check()
            .map_err(|e| format!("the cell's far memory is refused: {e}"))?;
        if !n.features().userfaultfd {
            return Err(format!(
                "node {} ({}) cannot run a far-memory cell: userfaultfd is not available here",
                n.cfg.name,
                roam_runtime::host_isa()
            ));
        }
    }
    // Keys of migrations and of launches never meet, whatever ids a peer
    // chooses.
    let here = local_memory(&offer.cell);
    admit(n, &format!("migration {}", offer.migration_id), here)
}
