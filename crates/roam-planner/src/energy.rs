//! Energy-aware placement: Popcorn's balanced and unbalanced policies on
//! the power model each node declares (`roam node --power`, see
//! [`roam_api::power`]).
//!
//! **What a node costs.** A node draws its idle power whether or not it
//! runs cells, and a fixed power per busy core on top. A unit of work
//! therefore costs `busy / speed` joules beyond the idle draw on that
//! node ([`PowerModel::joules_per_work`]): that is what the policies rank
//! nodes by. The idle draw is the same whichever node a cell goes to, as
//! long as no node is switched off, so it does not enter the choice; it
//! does enter the energy the nodes report.
//!
//! - **`energy-balanced`** spreads cells like `least-loaded` (fewest cells
//!   per core) and, among nodes equally loaded, takes the one where work
//!   costs least. Performance first, energy as the tie-break. The leader
//!   also moves a busy cell to where the policy would place it when that
//!   evens the cells per core out ([`Tracker::judge_balanced`]).
//! - **`energy-unbalanced`** packs: the node where work costs least that
//!   still has a free core (fewer cells than cores), then the next; when
//!   every core is taken, the least loaded. The leader also moves running,
//!   CPU-busy cells onto a cheaper node as soon as one has a free core
//!   ([`Tracker::judge`]), damped like follow-the-client and only when the
//!   energy saved over the cell's expected remaining run beats the energy
//!   of the move.
//!
//! Nodes without a model rank after every node with one: the planner
//! cannot say what work costs there.

use std::collections::HashMap;

use roam_api::power::PowerModel;
use roam_cluster::{CellRecord, CellState, NodeRecord};

use crate::follow::{Cost, Moves};
use crate::policy::{base_filter, cells_on, Ctx, Policy, Reason};

/// A cheaper node must cost at least this fraction less per unit of work
/// for a running cell to move there.
pub const MIN_GAIN: f64 = 0.2;
/// A cell busier than this (cores) is worth moving; an idler one saves
/// too little.
pub const MIN_BUSY_CORES: f64 = 0.25;
/// Some cheaper node with a free core must have been there this long
/// (not necessarily the same one), ms.
pub const HOLD_MS: u64 = 2_000;
/// `energy-balanced` moves a cell only once it has run this many times
/// as long as a move of it takes.
pub const BALANCE_PAYBACK: f64 = 5.0;
/// The longest remaining run the planner assumes for a cell, ms.
pub const MAX_HORIZON_MS: u64 = 3_600_000;

/// The power model `node` reports, if any.
pub fn model_of(node: &NodeRecord) -> Option<PowerModel> {
    node.status.power.map(|p| p.model)
}

/// Millijoules per unit of work on `node`, capped; no model ranks last.
fn cost_milli(node: &NodeRecord) -> i64 {
    const UNKNOWN: i64 = 999_999;
    model_of(node).map_or(UNKNOWN, |m| {
        ((m.joules_per_work() * 1000.0).round() as i64).clamp(0, UNKNOWN - 1)
    })
}

/// Cells per core, thousandths, capped at 1,000 cells per core.
fn per_core_milli(ctx: &Ctx, node: &NodeRecord) -> i64 {
    let cores = node.status.machine.cores.max(1) as i64;
    ((cells_on(ctx, &node.name) as i64) * 1000 / cores).min(1_000_000)
}

/// Whether `node` has a core no cell of the cluster's takes.
fn has_free_core(ctx: &Ctx, node: &NodeRecord) -> bool {
    cells_on(ctx, &node.name) < node.status.machine.cores.max(1)
}

/// `energy-balanced`: fewest cells per core, then least energy per unit of
/// work, then most memory available.
#[derive(Debug, Default)]
pub struct EnergyBalanced;

impl Policy for EnergyBalanced {
    fn name(&self) -> &'static str {
        "energy-balanced"
    }
    fn description(&self) -> &'static str {
        "the live, ready node with the fewest cells per core; among those equally loaded, the \
         one where work costs the least energy by its declared power model; the leader also \
         moves CPU-busy cells to even the cells per core out (damped)"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        base_filter(ctx, node)
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        let mem_mib = ((node.status.machine.memory_available >> 20) as i64).min(999_999);
        // Each part capped below the next one's unit: 1e6 · 1e12 < i64::MAX.
        -per_core_milli(ctx, node) * 1_000_000_000_000 - cost_milli(node) * 1_000_000 + mem_mib
    }
}

/// `energy-unbalanced`: the cheapest node with a free core, else the least
/// loaded; the leader also moves busy cells to cheaper free cores.
#[derive(Debug, Default)]
pub struct EnergyUnbalanced;

impl Policy for EnergyUnbalanced {
    fn name(&self) -> &'static str {
        "energy-unbalanced"
    }
    fn description(&self) -> &'static str {
        "packs cells onto the nodes where work costs the least energy by their declared power \
         models, a cell per core, then the least loaded; the leader also moves CPU-busy cells \
         to a cheaper node when one has a free core (damped, and only when it saves more than \
         the move costs)"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        base_filter(ctx, node)
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        let load = per_core_milli(ctx, node);
        if has_free_core(ctx, node) {
            // Above every full node; cheapest first, then least loaded.
            4_000_000_000_000_000_000 - cost_milli(node) * 1_000_000_000 - load
        } else {
            -load * 1_000_000 - cost_milli(node)
        }
    }
}

/// What the leader remembers of one cell between ticks.
#[derive(Debug, Clone, Default)]
struct Watch {
    owner: String,
    generation: u64,
    /// When the leader first saw the cell on this owner, ms.
    since_ms: u64,
    /// The owner's last heartbeat time and the cell's CPU counter then.
    sample: Option<(u64, u64)>,
    /// Cores the cell kept busy between the last two heartbeats.
    busy: Option<f64>,
    /// Since when some cheaper node has had a free core for it.
    beaten_since: Option<u64>,
    moves: Moves,
}

impl Watch {
    /// The damping both energy rules share, once a better node is there:
    /// it must have been there for [`HOLD_MS`], and the cell's last move
    /// must be out of its cool-down; then the cost of a move of this cell.
    fn damped(
        &mut self,
        now_ms: u64,
        last_move: impl FnOnce() -> Option<(u64, Option<Cost>)>,
    ) -> Result<Cost, Wait> {
        let since = *self.beaten_since.get_or_insert(now_ms);
        let held = now_ms.saturating_sub(since);
        if held < HOLD_MS {
            return Err(Wait::Held(held));
        }
        self.moves.saw(last_move());
        if let Some(ago) = self.moves.cooling(now_ms) {
            return Err(Wait::Cooling(ago));
        }
        Ok(self.moves.cost())
    }
}

/// Why a move waits: the better node has been there this long only, or
/// the cell moved this long ago (ms).
enum Wait {
    Held(u64),
    Cooling(u64),
}

/// The verdict on one cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Leave it; why.
    Stay(String),
    /// Move it to `to` to save energy (`energy-unbalanced`).
    Move {
        /// The destination.
        to: String,
        /// Joules per unit of work on the owner and on `to`.
        from_j: f64,
        /// See `from_j`.
        to_j: f64,
        /// Estimated joules saved over the expected remaining run, net of
        /// the move's.
        saves_j: f64,
    },
    /// Move it to `to` to even the load out (`energy-balanced`).
    Balance {
        /// The destination.
        to: String,
        /// Cells per core on the owner now.
        from_per_core: f64,
        /// Cells per core on `to` once the cell is there.
        to_per_core: f64,
    },
}

/// The leader's memory of the cells the energy policies watch.
#[derive(Debug, Default)]
pub struct Tracker {
    cells: HashMap<String, Watch>,
}

impl Tracker {
    /// Forget cells that are not in `live`.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.cells.retain(|id, _| live(id));
    }

    /// A move of `cell` starts at `now_ms` (see `follow::Tracker::moving`).
    pub fn moving(&mut self, cell: &str, now_ms: u64) {
        let w = self.cells.entry(cell.to_string()).or_default();
        w.moves.started(now_ms);
        w.beaten_since = None;
    }

    /// What every judgement starts with: the watch of `c` (started afresh
    /// on a new owner or generation) and the cores it kept busy between
    /// its owner's last two heartbeats, or why the cell stays.
    fn busy(&mut self, now_ms: u64, c: &CellRecord, ctx: &Ctx) -> Result<f64, Verdict> {
        let w = self.cells.entry(c.id.clone()).or_default();
        if w.owner != c.owner || w.generation != c.generation {
            *w = Watch {
                owner: c.owner.clone(),
                generation: c.generation,
                since_ms: now_ms,
                moves: w.moves,
                ..Watch::default()
            };
        }
        let Some(owner) = ctx.nodes.iter().find(|n| n.name == c.owner) else {
            return Err(Verdict::Stay("its owner is not registered".into()));
        };
        if let Some(u) = owner.status.usage.iter().find(|u| u.cell == c.id) {
            let beat = owner.heartbeat_ms;
            match w.sample {
                Some((at, cpu)) if beat > at => {
                    w.busy =
                        (u.cpu_ms >= cpu).then(|| (u.cpu_ms - cpu) as f64 / (beat - at) as f64);
                    w.sample = Some((beat, u.cpu_ms));
                }
                Some(_) => {}
                None => w.sample = Some((beat, u.cpu_ms)),
            }
        }
        w.busy.filter(|b| *b >= MIN_BUSY_CORES).ok_or_else(|| {
            w.beaten_since = None;
            Verdict::Stay("not CPU-busy".into())
        })
    }

    /// Judge running cell `c` at `now_ms` for `energy-unbalanced`;
    /// `ctx.want` names the cell. `last_move` as in
    /// `follow::Tracker::judge`.
    pub fn judge(
        &mut self,
        now_ms: u64,
        c: &CellRecord,
        ctx: &Ctx,
        last_move: impl FnOnce() -> Option<(u64, Option<Cost>)>,
    ) -> Verdict {
        let busy = match self.busy(now_ms, c, ctx) {
            Ok(b) => b,
            Err(v) => return v,
        };
        let w = self.cells.get_mut(&c.id).expect("watched by busy()");
        let Some(owner) = ctx.nodes.iter().find(|n| n.name == c.owner) else {
            return Verdict::Stay("its owner is not registered".into());
        };
        let Some(from) = model_of(owner) else {
            return Verdict::Stay("its owner declares no power model".into());
        };
        let Ok(best) = crate::policy::place(&EnergyUnbalanced, ctx) else {
            return Verdict::Stay("no node can take it".into());
        };
        let to = match model_of(best) {
            Some(m) if best.name != c.owner && has_free_core(ctx, best) => m,
            _ => {
                w.beaten_since = None;
                return Verdict::Stay("no cheaper node has a free core".into());
            }
        };
        let (from_j, to_j) = (from.joules_per_work(), to.joules_per_work());
        if to_j > from_j * (1.0 - MIN_GAIN) {
            w.beaten_since = None;
            return Verdict::Stay(format!(
                "{} is cheaper by {:.0} % only",
                best.name,
                (1.0 - to_j / from_j) * 100.0
            ));
        }
        let cost = match w.damped(now_ms, last_move) {
            Ok(cost) => cost,
            Err(Wait::Cooling(ago)) => return Verdict::Stay(format!("moved {ago} ms ago")),
            Err(Wait::Held(ms)) => {
                return Verdict::Stay(format!("{} free for {ms} ms only", best.name))
            }
        };
        // A cell that has run for a while is likely to run as long again.
        let horizon_s = now_ms.saturating_sub(w.since_ms).min(MAX_HORIZON_MS) as f64 / 1000.0;
        let work_per_s = busy * from.speed;
        let saved = work_per_s * (from_j - to_j) * horizon_s;
        // The move keeps a core busy on each side while it lasts.
        let spent = cost.took_ms / 1000.0 * (from.busy_watts_per_core + to.busy_watts_per_core);
        if saved <= spent {
            return Verdict::Stay(format!(
                "the move (about {spent:.0} J) does not pay yet ({saved:.0} J saved over {horizon_s:.0} s)"
            ));
        }
        Verdict::Move {
            to: best.name.clone(),
            from_j,
            to_j,
            saves_j: saved - spent,
        }
    }

    /// Judge running cell `c` at `now_ms` for `energy-balanced`: move a
    /// busy cell to the node `energy-balanced` would place it on when that
    /// evens the cells per core out (the owner, less the cell, stays above
    /// the destination with it), damped like the unbalanced rule, and only
    /// once the cell has run [`BALANCE_PAYBACK`] times as long as a move
    /// takes.
    pub fn judge_balanced(
        &mut self,
        now_ms: u64,
        c: &CellRecord,
        ctx: &Ctx,
        last_move: impl FnOnce() -> Option<(u64, Option<Cost>)>,
    ) -> Verdict {
        if let Err(v) = self.busy(now_ms, c, ctx) {
            return v;
        }
        let w = self.cells.get_mut(&c.id).expect("watched by busy()");
        let Some(owner) = ctx.nodes.iter().find(|n| n.name == c.owner) else {
            return Verdict::Stay("its owner is not registered".into());
        };
        let Ok(best) = crate::policy::place(&EnergyBalanced, ctx) else {
            return Verdict::Stay("no node can take it".into());
        };
        let cores = |n: &NodeRecord| n.status.machine.cores.max(1);
        let (on_owner, on_best) = (cells_on(ctx, &owner.name), cells_on(ctx, &best.name));
        // After the move: the owner has one cell fewer, `best` one more.
        // Compared by cross-multiplication: cells per core, exactly.
        if best.name == c.owner || on_owner * cores(best) <= (on_best + 1) * cores(owner) {
            w.beaten_since = None;
            return Verdict::Stay("the load is as even as a move can make it".into());
        }
        let cost = match w.damped(now_ms, last_move) {
            Ok(cost) => cost,
            Err(Wait::Cooling(ago)) => return Verdict::Stay(format!("moved {ago} ms ago")),
            Err(Wait::Held(ms)) => {
                return Verdict::Stay(format!("{} less loaded for {ms} ms only", best.name))
            }
        };
        let ran = now_ms.saturating_sub(w.since_ms);
        if (ran as f64) < BALANCE_PAYBACK * cost.took_ms {
            return Verdict::Stay(format!(
                "ran {ran} ms here, less than {BALANCE_PAYBACK} moves' length"
            ));
        }
        Verdict::Balance {
            to: best.name.clone(),
            from_per_core: on_owner as f64 / cores(owner) as f64,
            to_per_core: (on_best + 1) as f64 / cores(best) as f64,
        }
    }
}

/// Whether `c` is one the leader may move now by this policy.
pub fn movable(c: &CellRecord) -> bool {
    c.state == CellState::Running
}

#[cfg(test)]
#[path = "energy_tests.rs"]
mod tests;
