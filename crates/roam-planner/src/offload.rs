//! `offload-by-slowdown`: HEXO's consolidation. Jobs start on the fastest
//! nodes; when one has more cells than cores, the cell that would lose the
//! least on a slower node with a free core goes there, and comes back when
//! a fast core is free again.
//!
//! **Fast and slow.** Nodes rank by their declared speed (the power
//! model's `speed`, `roam node --power`; 1 without one): the servers and
//! the boards of HEXO. What a particular program loses on a particular
//! node comes from what the planner learned of it ([`crate::slowdown`]).
//!
//! **Placement.** The fastest node with room: a free core, or a single
//! cell over its cores while a slower node has a free core (the leader
//! then chooses which of its cells leaves, the new one included, by
//! slowdown, as HEXO does). Without room anywhere, the node with the
//! fewest cells per unit of speed.
//!
//! **The moves** ([`Tracker::judge`]), every leader tick:
//! 1. *Offload.* A node with more running cells than cores, for
//!    [`HOLD_MS`], sends the cell with the lowest predicted slowdown to a
//!    slower node that has a free core (HEXO's victim).
//! 2. *Bring back.* A node with a free core, for [`HOLD_MS`], takes back
//!    from a slower node the cell that gains the most (the highest
//!    slowdown), if it gains at least [`MIN_GAIN`].
//!
//! A cell moves at most once per cool-down, as with the other policies
//! that move cells by themselves; each move is a decision the dashboard
//! shows, with the predictions behind it.

use std::collections::HashMap;

use roam_cluster::{CellRecord, CellState, NodeRecord};

use crate::follow::{Cost, Moves};
use crate::policy::{base_filter, cells_on, Ctx, Policy, Reason};
use crate::slowdown::{speed_of, Basis, Learn, Prediction, Table};

/// A state (a node over its cores, a free fast core) must hold this long
/// before a cell moves for it, ms: a migration under way shows a cell on
/// two nodes for a moment.
pub const HOLD_MS: u64 = 1_000;
/// A cell comes back to a faster node only if it runs this many times
/// faster there.
pub const MIN_GAIN: f64 = 1.2;

/// `offload-by-slowdown` as a placement policy.
#[derive(Debug, Default)]
pub struct OffloadBySlowdown;

fn free(ctx: &Ctx, node: &NodeRecord) -> bool {
    cells_on(ctx, &node.name) < node.status.machine.cores.max(1)
}

/// Speed in thousandths, bounded: the score's first part.
fn speed_milli(node: &NodeRecord) -> i64 {
    (speed_of(node) * 1000.0).round().clamp(0.0, 1e9) as i64
}

impl Policy for OffloadBySlowdown {
    fn name(&self) -> &'static str {
        "offload-by-slowdown"
    }
    fn description(&self) -> &'static str {
        "the fastest node with a free core (by declared speed); the leader moves the cell that \
         loses least, by the slowdown learned per program, from a node with more cells than \
         cores to a slower node with a free core, and brings cells back when a fast core frees \
         up (HEXO)"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        base_filter(ctx, node)
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        let speed = speed_milli(node);
        // Room: a free core, or one cell over when a slower node has a
        // free core for whichever cell the leader then sends away.
        let over = (cells_on(ctx, &node.name) + 1).saturating_sub(node.status.machine.cores.max(1));
        let slower_free = || {
            ctx.nodes.iter().any(|n| {
                n.name != node.name
                    && speed_milli(n) < speed
                    && free(ctx, n)
                    && base_filter(ctx, n).is_ok()
            })
        };
        if over == 0 || (over == 1 && slower_free()) {
            return 2_000_000_000_000 + speed;
        }
        // Cells per unit of speed, thousandths, fewer first.
        let per_speed = (cells_on(ctx, &node.name) as i64 + 1) * 1_000_000 / speed.max(1);
        1_000_000_000_000 - per_speed.min(999_999_999_999)
    }
}

/// When a cell's newest finished move ended, and what it cost.
pub type LastMove<'a> = dyn Fn(&str) -> Option<(u64, Option<Cost>)> + 'a;

/// What the leader decided for one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// The cell.
    pub cell: String,
    /// Where it goes.
    pub to: String,
    /// Why, for people: the predictions behind the choice.
    pub what: String,
}

/// What the policy remembers between ticks.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Node → since when it has been over its cores.
    over_since: HashMap<String, u64>,
    /// Node → since when it has had a free core.
    free_since: HashMap<String, u64>,
    /// Cell → its moves, for the cool-down.
    moves: HashMap<String, Moves>,
}

/// Whether `to` reports the memory for `c`'s limit (0: it reports none,
/// and decides on admission).
fn fits(c: &CellRecord, to: &NodeRecord) -> bool {
    let need = c.max_memory.unwrap_or(crate::policy::DEFAULT_CELL_MEMORY);
    let available = to.status.machine.memory_available;
    available == 0 || available >= need
}

/// The running cells on `node` the leader may move.
fn running_on<'a>(cells: &'a [CellRecord], node: &str) -> impl Iterator<Item = &'a CellRecord> {
    let node = node.to_string();
    cells
        .iter()
        .filter(move |c| c.owner == node && c.state == CellState::Running)
}

impl Tracker {
    /// Forget cells that ended.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.moves.retain(|id, _| live(id));
    }

    /// A move of `cell` starts at `now_ms`.
    pub fn moving(&mut self, cell: &str, now_ms: u64) {
        self.moves
            .entry(cell.to_string())
            .or_default()
            .started(now_ms);
    }

    fn cooling(&mut self, cell: &str, now_ms: u64, last_move: &LastMove<'_>) -> bool {
        let m = self.moves.entry(cell.to_string()).or_default();
        m.saw(last_move(cell));
        m.cooling(now_ms).is_some()
    }

    /// Track how long each node has been over its cores, or had a free
    /// one; `held(since)` then says whether that has lasted.
    fn watch(&mut self, now_ms: u64, ctx: &Ctx) {
        for n in ctx.nodes {
            let (on, cores) = (cells_on(ctx, &n.name), n.status.machine.cores.max(1));
            let track = |m: &mut HashMap<String, u64>, yes: bool| {
                if yes {
                    m.entry(n.name.clone()).or_insert(now_ms);
                } else {
                    m.remove(&n.name);
                }
            };
            // A cell migrating away still counts on its source until it
            // is gone; it is not a reason to send another.
            let staying = ctx
                .cells
                .iter()
                .filter(|c| c.owner == n.name && !c.state.ended())
                .filter(|c| !matches!(c.state, CellState::Migrating { .. }))
                .count();
            track(&mut self.over_since, staying > cores);
            track(&mut self.free_since, on < cores);
        }
    }

    /// This tick's moves: at most one off each node over its cores, and
    /// one onto each node with a free core. `busy`: cells the planner is
    /// already working on; `last_move` as in `follow::Tracker::judge`.
    pub fn judge(
        &mut self,
        now_ms: u64,
        ctx: &Ctx,
        table: &Table,
        busy: &dyn Fn(&str) -> bool,
        last_move: &LastMove<'_>,
    ) -> Vec<Move> {
        self.watch(now_ms, ctx);
        let held = |m: &HashMap<String, u64>, node: &str| {
            m.get(node)
                .is_some_and(|t| now_ms.saturating_sub(*t) >= HOLD_MS)
        };
        let usable: Vec<&NodeRecord> = ctx
            .nodes
            .iter()
            .filter(|n| n.alive && n.state == roam_cluster::NodeState::Ready)
            .collect();
        let mut taken: Vec<String> = Vec::new();
        let mut moves = Vec::new();
        let predict = |c: &CellRecord, from: &NodeRecord, to: &NodeRecord| {
            let declared = speed_of(from) / speed_of(to);
            // The table tells ISAs apart, not two nodes of one ISA.
            if from.isa == to.isa {
                return Prediction {
                    slowdown: declared,
                    basis: Basis::Declared,
                };
            }
            table.predict(&c.module, &from.isa, &to.isa, declared)
        };
        // 1. Offload from nodes over their cores, slowest victim first.
        for from in &usable {
            if !held(&self.over_since, &from.name) {
                continue;
            }
            let mut best: Option<(f64, &CellRecord, &NodeRecord, Basis)> = None;
            for to in usable.iter().filter(|to| {
                speed_of(to) < speed_of(from)
                    && free(ctx, to)
                    && !taken.contains(&to.name)
                    && to.name != from.name
            }) {
                for c in running_on(ctx.cells, &from.name) {
                    if !fits(c, to) || busy(&c.id) || self.cooling(&c.id, now_ms, last_move) {
                        continue;
                    }
                    let p = predict(c, from, to);
                    if best.as_ref().is_none_or(|b| p.slowdown < b.0) {
                        best = Some((p.slowdown, c, to, p.basis));
                    }
                }
            }
            if let Some((s, c, to, basis)) = best {
                taken.push(to.name.clone());
                // The next offload from here waits for a new hold.
                self.over_since.remove(&from.name);
                moves.push(Move {
                    cell: c.id.clone(),
                    to: to.name.clone(),
                    what: format!(
                        "offload: {} ({}) from {} ({} cells on {} cores) to {}, {s:.1}× slower \
                         there ({}), the least of its cells",
                        c.id,
                        program(table, c),
                        from.name,
                        cells_on(ctx, &from.name),
                        from.status.machine.cores.max(1),
                        to.name,
                        basis.as_str()
                    ),
                });
            }
        }
        // 2. Bring back onto free fast cores, the biggest gain first.
        for to in &usable {
            if !held(&self.free_since, &to.name) || taken.contains(&to.name) {
                continue;
            }
            let mut best: Option<(f64, &CellRecord, &NodeRecord, Basis)> = None;
            for from in usable.iter().filter(|f| speed_of(f) < speed_of(to)) {
                for c in running_on(ctx.cells, &from.name) {
                    if !fits(c, to)
                        || busy(&c.id)
                        || moves.iter().any(|m| m.cell == c.id)
                        || self.cooling(&c.id, now_ms, last_move)
                    {
                        continue;
                    }
                    // Its slowdown where it is, against where it would go.
                    let gain = predict(c, to, from);
                    if best.as_ref().is_none_or(|b| gain.slowdown > b.0) {
                        best = Some((gain.slowdown, c, from, gain.basis));
                    }
                }
            }
            if let Some((gain, c, from, basis)) = best.filter(|b| b.0 >= MIN_GAIN) {
                taken.push(to.name.clone());
                moves.push(Move {
                    cell: c.id.clone(),
                    to: to.name.clone(),
                    what: format!(
                        "bring back: {} ({}) from {} to {}, which has a free core and runs it \
                         {gain:.1}× faster ({}), the most of the cells on slower nodes",
                        c.id,
                        program(table, c),
                        from.name,
                        to.name,
                        basis.as_str()
                    ),
                });
            }
        }
        moves
    }
}

/// A cell's program, for people: its learned name, else its first
/// argument.
fn program<'a>(table: &'a Table, c: &'a CellRecord) -> &'a str {
    table
        .programs
        .get(&c.module)
        .map(|p| p.name.as_str())
        .filter(|n| !n.is_empty())
        .or(c.args.first().map(String::as_str))
        .unwrap_or("?")
}

#[cfg(test)]
#[path = "offload_tests.rs"]
mod tests;
