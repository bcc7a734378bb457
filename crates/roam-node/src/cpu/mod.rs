//! Each cell's share of the CPU, and the node's share before all cells.
//!
//! Why: a guest is code the node was given, and a guest that loops for
//! ever must take down neither its node (the control API, heartbeats to
//! the planner, migrations) nor the other cells. A cell is one thread of
//! the node process (`crate::cell`), so the limits are per thread, set by
//! the cell's thread itself as it starts running and undone as it ends.
//!
//! The node chooses at start, from what the host offers, in this order
//! (`roam node --cell-cpu-control` forces one):
//!
//! 1. **cgroup v2** with the `cpu` controller: a threaded group per cell
//!    under `roam-NODE` beside the node's own threads, with `cpu.weight`
//!    and `cpu.max` ([`cgroup`]).
//! 2. **cgroup v1** `cpu` controller: the same tree, with `cpu.shares` and
//!    `cpu.cfs_quota_us`.
//! 3. **nice**: each cell's thread at a nice value of 1 to 19 chosen by
//!    its weight. Cells then share the CPU by weight among themselves and
//!    each weighs less than a node thread, but many busy cells together
//!    outweigh the node, and no cap is enforced.
//!
//! With a cgroup, all cells of a node together weigh a quarter of one
//! busy node thread ([`cgroup::CELLS_WEIGHT`]), however many there are.
//! Weights share the CPU only when it is contended: an idle node leaves
//! all of it to its cells. A failure to use the group (permissions, a
//! group removed from outside) never fails the cell: it runs at its nice
//! value instead, and the node says so once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use roam_api::types::{CellCpu, NodeCpu};
pub use roam_wire::{CpuLimits, DEFAULT_CPU_WEIGHT};

pub(crate) mod cgroup;
#[cfg(test)]
mod tests;

use cgroup::{CellGroup, Groups, Version};

/// Why the CPU limits could not be set up as asked.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A node name or cell id that cannot name a group.
    #[error("{0}")]
    Name(String),
    /// The node's cgroup lacks the `cpu` controller.
    #[error("{} has no cpu controller (cgroup.controllers does not list cpu)", .0.display())]
    NoController(PathBuf),
    /// The hierarchy is not mounted, or the node's group is not in it.
    #[error(
        "no {0} cpu hierarchy holds this process (see /proc/self/cgroup and /proc/self/mountinfo)"
    )]
    NotMounted(&'static str),
    /// A file could not be read.
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    /// A control file could not be written.
    #[error("cannot write {1:?} to {0}: {2}")]
    Write(String, String, std::io::Error),
    /// A group could not be made or opened.
    #[error("cannot make the cgroup {0}: {1}")]
    Mkdir(String, std::io::Error),
    /// A group could not be removed.
    #[error("cannot remove the cgroup {0}: {1}")]
    Remove(String, std::io::Error),
    /// `--cell-cpu-control` asked for a mechanism this host does not give.
    #[error("--cell-cpu-control {0}: {1}")]
    Unavailable(Mechanism, Box<CpuError>),
}

impl CpuError {
    /// The group (or a file in it) is gone.
    fn not_found(&self) -> bool {
        matches!(self,
            CpuError::Write(_, _, e) | CpuError::Mkdir(_, e) | CpuError::Read(_, e)
                if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// How cells' CPU is limited on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// A threaded cgroup v2 group per cell.
    CgroupV2,
    /// A cgroup v1 `cpu` group per cell.
    CgroupV1,
    /// A nice value per cell's thread.
    Nice,
}

impl Mechanism {
    /// Its name in the API and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup-v2",
            Mechanism::CgroupV1 => "cgroup-v1",
            Mechanism::Nice => "nice",
        }
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which mechanism a node uses (`roam node --cell-cpu-control`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuControl {
    /// The best the host offers: cgroup v2, else v1, else nice.
    #[default]
    Auto,
    /// This one, or the node does not start.
    Only(Mechanism),
}

impl std::str::FromStr for CpuControl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => CpuControl::Auto,
            "cgroup-v2" => CpuControl::Only(Mechanism::CgroupV2),
            "cgroup-v1" => CpuControl::Only(Mechanism::CgroupV1),
            "nice" => CpuControl::Only(Mechanism::Nice),
            _ => return Err(format!("{s:?}: give auto, cgroup-v2, cgroup-v1 or nice")),
        })
    }
}

/// The nice value of a cell of the default weight (100) without a
/// cgroup; the node's own threads run at 0.
pub(crate) const CELL_NICE: i32 = 10;

/// The nice value of a cell of `weight` without a cgroup: each step of
/// nice is a factor of 1.25 in the kernel's weight, so weight 100 is
/// [`CELL_NICE`], 200 is 7, 50 is 13; always 1 to 19, below the node.
pub(crate) fn nice_for(weight: u32) -> i32 {
    let steps = (f64::from(weight.max(1)) / 100.0).ln() / 1.25f64.ln();
    // In range: |steps| < 42 for any u32.
    (CELL_NICE - steps.round() as i32).clamp(1, 19)
}

/// A node's CPU limits for its cells.
#[derive(Debug)]
pub(crate) struct Cpu {
    mechanism: Mechanism,
    groups: Option<Groups>,
    weight: u32,
    max_millicores: Option<u32>,
    /// A cell already fell back to nice: later ones say it at debug level.
    warned: AtomicBool,
}

/// What a cell got, held by its thread while it runs; leaving drops it.
pub(crate) struct Placement<'a> {
    cpu: &'a Cpu,
    group: Option<CellGroup>,
    pub(crate) applied: CellCpu,
}

impl Drop for Placement<'_> {
    fn drop(&mut self) {
        let (Some(groups), Some(g)) = (&self.cpu.groups, self.group.take()) else {
            return;
        };
        if let Err(e) = groups.leave(&g) {
            tracing::warn!("the cell's cgroup stays until the node starts again: {e}");
        }
    }
}

impl Cpu {
    /// Choose the mechanism for node `node` as `control` says, from this
    /// process's `/proc/self/mountinfo` and `/proc/self/cgroup`, and set up
    /// the node's subtree. Fails only when `control` names a mechanism
    /// this host does not give.
    pub(crate) fn new(
        node: &str,
        control: CpuControl,
        weight: u32,
        max_millicores: Option<u32>,
    ) -> Result<Cpu, CpuError> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let (mechanism, groups) = choose(node, control, &mountinfo, &cgroup)?;
        let cpu = Cpu {
            mechanism,
            groups,
            weight,
            max_millicores,
            warned: AtomicBool::new(false),
        };
        if mechanism == Mechanism::Nice && max_millicores.is_some() {
            tracing::warn!("--cell-cpu-max is not enforced without a cgroup cpu controller");
        }
        Ok(cpu)
    }

    /// What the node uses and its defaults, for `GET /v1/node`.
    pub(crate) fn info(&self) -> NodeCpu {
        NodeCpu {
            mechanism: self.mechanism.as_str().to_string(),
            cell_weight: self.weight,
            cell_max_millicores: self.max_millicores,
            cells_weight: self.groups.as_ref().map(|_| cgroup::CELLS_WEIGHT),
            group: self
                .groups
                .as_ref()
                .map(|g| g.node_path().display().to_string()),
        }
    }

    /// Put the calling thread, cell `id`'s, under its limits: its own
    /// settings, else the node's defaults. Never fails: without its group
    /// the cell runs at its nice value.
    pub(crate) fn enter(&self, id: &str, limits: CpuLimits) -> Placement<'_> {
        let weight = limits.weight.unwrap_or(self.weight);
        let max = limits.max_millicores.or(self.max_millicores);
        if let Some(groups) = &self.groups {
            let tid = rustix::thread::gettid().as_raw_pid();
            match groups.enter(id, weight, max, tid) {
                Ok(g) => {
                    let applied = CellCpu {
                        mechanism: self.mechanism.as_str().to_string(),
                        weight,
                        max_millicores: max,
                        max_enforced: true,
                        nice: None,
                        group: Some(g.path.display().to_string()),
                    };
                    return Placement {
                        cpu: self,
                        group: Some(g),
                        applied,
                    };
                }
                Err(e) => {
                    let msg = "the cell runs at a nice value instead of its cgroup";
                    if self.warned.swap(true, Ordering::Relaxed) {
                        tracing::debug!(cell = %id, "{msg}: {e}");
                    } else {
                        tracing::warn!(cell = %id, "{msg} (said once): {e}");
                    }
                }
            }
        }
        let nice = lower_priority(nice_for(weight));
        Placement {
            cpu: self,
            group: None,
            applied: CellCpu {
                mechanism: Mechanism::Nice.as_str().to_string(),
                weight,
                max_millicores: max,
                max_enforced: false,
                nice,
                group: None,
            },
        }
    }

    /// The node is ending: remove its empty groups (a cell still running
    /// keeps its own; the next start of the node removes it).
    pub(crate) fn shutdown(&self) {
        if let Some(g) = &self.groups {
            g.remove_all();
        }
    }
}

/// Choose and set up the mechanism (see [`Cpu::new`]), logging the
/// choice once.
pub(crate) fn choose(
    node: &str,
    control: CpuControl,
    mountinfo: &str,
    cgroup: &str,
) -> Result<(Mechanism, Option<Groups>), CpuError> {
    let try_one = |v: Version| -> Result<Groups, CpuError> {
        let name = match v {
            Version::V2 => "cgroup v2",
            Version::V1 => "cgroup v1",
        };
        let base = cgroup::find(v, mountinfo, cgroup).ok_or(CpuError::NotMounted(name))?;
        let (groups, stale) = Groups::setup(v, &base, node)?;
        tracing::info!(
            group = %groups.node_path().display(),
            stale_groups_removed = stale,
            "cells' CPU: a {name} group per cell"
        );
        Ok(groups)
    };
    let mech = |v| match v {
        Version::V2 => Mechanism::CgroupV2,
        Version::V1 => Mechanism::CgroupV1,
    };
    let nice_line = "cells' CPU: each cell's thread at nice 1 to 19 by its weight; \
                     no cap, and many busy cells together can outweigh the node";
    match control {
        CpuControl::Only(Mechanism::Nice) => {
            tracing::info!("{nice_line}");
            Ok((Mechanism::Nice, None))
        }
        CpuControl::Only(m) => {
            let v = if m == Mechanism::CgroupV2 {
                Version::V2
            } else {
                Version::V1
            };
            let g = try_one(v).map_err(|e| CpuError::Unavailable(m, Box::new(e)))?;
            Ok((m, Some(g)))
        }
        CpuControl::Auto => {
            let mut why = Vec::new();
            for v in [Version::V2, Version::V1] {
                match try_one(v) {
                    Ok(g) => return Ok((mech(v), Some(g))),
                    Err(e) => why.push(format!("{}: {e}", mech(v))),
                }
            }
            tracing::warn!("{nice_line} ({})", why.join("; "));
            Ok((Mechanism::Nice, None))
        }
    }
}

/// Run the calling thread at nice `target`, unless it already runs
/// nicer (lowering a nice value needs a privilege); the value it runs at.
fn lower_priority(target: i32) -> Option<i32> {
    let now = rustix::process::getpriority_process(None).unwrap_or(0);
    if now >= target {
        return Some(now);
    }
    match rustix::process::setpriority_process(None, target) {
        Ok(()) => Some(target),
        Err(e) => {
            tracing::warn!("cannot lower the priority of a cell's thread: {e}");
            None
        }
    }
}
