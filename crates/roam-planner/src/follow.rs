//! `follow-the-client`: a service cell runs on the node nearest its
//! clients, and moves when they move (H-Container's follow-the-user).
//!
//! **The signal.** Clients reach a service through a gateway, and the
//! gateway reaches the cell over its node's link. Every node measures that
//! link's round-trip time with pings on the link itself (protocol 3 of the
//! gateway protocol) and reports it, with each service's client traffic,
//! in its heartbeat ([`roam_api::planner::GatewayPath`]). A client's
//! request pays its own path to the gateway, which is the same whichever
//! node runs the cell, plus this one; so the node with the shortest link
//! to the clients' gateway is the nearest. Only nodes linked to the same
//! gateway as the cell's owner are candidates: the clients are held there.
//!
//! **The decision** ([`Tracker::judge`]), every leader tick, for each
//! running cell that serves a service:
//! 1. The cell must have clients: its traffic grew within [`ACTIVE_MS`]. A
//!    move of an idle service gains nothing and costs a pause.
//! 2. The best node by the policy (alive, ready, memory, lowest round
//!    trip) must beat the owner's round trip by [`MIN_GAIN`] and by
//!    [`MIN_GAIN_US`]: small differences are noise, not a move.
//! 3. **Damping.** Some node must have beaten the owner so for [`HOLD_MS`], and no
//!    move of the cell may have ended within its cool-down (the larger of
//!    [`COOLDOWN_MS`] and [`COOLDOWN_MOVES`] times its last move's length). A
//!    path that flips faster than that never moves the cell.
//! 4. **The cost of the move.** A closed-loop client's rate is inversely
//!    proportional to its round trip. Moving takes `T` (the migration,
//!    during which the cell still serves from the old node) and pauses the
//!    cell for `D`. Over a stay of `H` from now, moving wins when
//!    `(H − T) · (rtt_now / rtt_best − 1) > D`. The planner cannot know
//!    `H`; it takes how long the new situation has already held (a user
//!    who has been near another edge for ten seconds is likely to stay ten
//!    more). `T` and `D` are the cell's last migration's, or defaults
//!    before it has one ([`DEFAULT_MOVE_MS`], [`DEFAULT_PAUSE_MS`]).
//!
//! Each move is recorded as a decision (the dashboard shows it, with every
//! node's verdict) and counted in `/metrics` under the reason
//! `follow-the-client`.

use std::collections::HashMap;

use roam_cluster::{CellRecord, CellState, NodeRecord};

use crate::policy::{base_filter, load_score, Ctx, Policy, Reason};

/// Traffic must have grown within this long for the cell to move.
pub const ACTIVE_MS: u64 = 6_000;
/// The best node must beat the owner's round trip by this fraction...
pub const MIN_GAIN: f64 = 0.2;
/// ... and by this much, microseconds.
pub const MIN_GAIN_US: u64 = 500;
/// The same node must stay best this long, ms.
pub const HOLD_MS: u64 = 1_000;
/// No move within this long of the cell's last one, ms...
pub const COOLDOWN_MS: u64 = 5_000;
/// ... nor within this many times the last move's length.
pub const COOLDOWN_MOVES: u64 = 5;
/// A move's length before the cell has moved once, ms.
pub const DEFAULT_MOVE_MS: f64 = 2_000.0;
/// A move's pause before the cell has moved once, ms.
pub const DEFAULT_PAUSE_MS: f64 = 300.0;

/// `follow-the-client` as a placement policy: among the nodes linked to
/// the cell's gateway, the one with the shortest round trip to it. Nodes
/// that have not measured one yet come last, by load.
#[derive(Debug, Default)]
pub struct FollowTheClient;

/// A node's round trip to its gateway, microseconds, if measured and up.
pub fn rtt_of(node: &NodeRecord) -> Option<u64> {
    let g = node.status.gateway.as_ref()?;
    g.connected.then_some(g.rtt_us?)
}

/// Which gateway a node reaches: the id the gateway gave, else the
/// address the node dialed.
pub fn gateway_of(node: &NodeRecord) -> Option<&str> {
    let g = node.status.gateway.as_ref()?;
    Some(g.id.as_deref().unwrap_or(&g.address))
}

/// The gateway of the cell's owner: where its clients are.
fn clients_gateway<'a>(ctx: &Ctx<'a>) -> Option<&'a str> {
    let cell = ctx.want.cell.as_deref()?;
    let owner = &ctx.cells.iter().find(|c| c.id == cell)?.owner;
    gateway_of(ctx.nodes.iter().find(|n| &n.name == owner)?)
}

impl Policy for FollowTheClient {
    fn name(&self) -> &'static str {
        "follow-the-client"
    }
    fn description(&self) -> &'static str {
        "the node with the shortest measured round trip to the gateway the cell's clients use; \
         the leader also moves running service cells there when their clients move (damped, \
         and only when the gain outweighs the move)"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        base_filter(ctx, node)?;
        if let Some(gw) = clients_gateway(ctx) {
            if gateway_of(node) != Some(gw) {
                return Err(Reason::Excluded(
                    "not linked to the gateway of the cell's clients",
                ));
            }
        }
        Ok(())
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        match rtt_of(node) {
            // Microseconds, capped: a known round trip always beats none.
            Some(us) => -(us.min(1 << 40) as i64),
            None => i64::MIN / 2 + load_score(ctx, node).clamp(-(1 << 60), 1 << 60) / 4,
        }
    }
}

/// What the leader remembers of one cell between ticks.
#[derive(Debug, Clone, Default)]
struct Watch {
    /// Owner and generation the rest was seen under.
    owner: String,
    generation: u64,
    /// Client messages the owner last reported, and when that number grew.
    frames: u64,
    grew_ms: Option<u64>,
    /// Since when some node has beaten the owner's round trip by the
    /// margins.
    beaten_since: Option<u64>,
    /// The cell's moves, for the cool-down.
    moves: Moves,
}

/// What a policy that moves cells by itself remembers of one cell's
/// moves: when the last one started or ended, and what it cost. Both
/// follow-the-client and energy-unbalanced cool down by it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moves {
    moved_ms: Option<u64>,
    cost: Option<Cost>,
}

impl Moves {
    /// A move starts at `now_ms`.
    pub fn started(&mut self, now_ms: u64) {
        self.moved_ms = Some(now_ms);
    }

    /// Take in the cell's newest finished move, if any: when it ended and
    /// what it cost.
    pub fn saw(&mut self, last: Option<(u64, Option<Cost>)>) {
        if let Some((at, cost)) = last {
            self.moved_ms = Some(self.moved_ms.map_or(at, |m| m.max(at)));
            self.cost = cost.or(self.cost);
        }
    }

    /// The last move's cost, or the defaults before the cell has moved.
    pub fn cost(&self) -> Cost {
        self.cost.unwrap_or(Cost {
            took_ms: DEFAULT_MOVE_MS,
            pause_ms: DEFAULT_PAUSE_MS,
        })
    }

    /// How long ago the last move was, while the cell still cools down
    /// from it: the larger of [`COOLDOWN_MS`] and [`COOLDOWN_MOVES`] times
    /// its length.
    pub fn cooling(&self, now_ms: u64) -> Option<u64> {
        let t = self.moved_ms?;
        let cool = COOLDOWN_MS.max(COOLDOWN_MOVES.saturating_mul(self.cost().took_ms as u64));
        let ago = now_ms.saturating_sub(t);
        (ago < cool).then_some(ago)
    }
}

/// What one move of the cell cost, as its migration reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Start to end, ms.
    pub took_ms: f64,
    /// The cell's pause, ms.
    pub pause_ms: f64,
}

/// The longest move or pause the policy believes, ms: the figures come
/// from the source node's report.
const MAX_COST_MS: f64 = 600_000.0;

impl Cost {
    /// A node's figures, made finite and bounded (`0..=`[`MAX_COST_MS`]).
    pub fn reported(took_ms: f64, pause_ms: f64) -> Cost {
        let clean = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, MAX_COST_MS)
            } else {
                MAX_COST_MS
            }
        };
        Cost {
            took_ms: clean(took_ms),
            pause_ms: clean(pause_ms),
        }
    }
}

/// The verdict on one cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Leave it; why.
    Stay(String),
    /// Move it to `to`.
    Move {
        /// The destination.
        to: String,
        /// The owner's round trip, µs.
        from_us: u64,
        /// The destination's, µs.
        to_us: u64,
    },
}

/// The leader's memory of every service cell it watches.
#[derive(Debug, Default)]
pub struct Tracker {
    cells: HashMap<String, Watch>,
}

impl Tracker {
    /// Forget cells that are not in `live`.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.cells.retain(|id, _| live(id));
    }

    /// A move of `cell` starts at `now_ms`: its cool-down counts from
    /// here, and again from its end once the planner has seen it end
    /// (`last_move` in [`judge`](Self::judge)), so a move that fails is not
    /// retried at once either.
    pub fn moving(&mut self, cell: &str, now_ms: u64) {
        let w = self.cells.entry(cell.to_string()).or_default();
        w.moves.started(now_ms);
        w.beaten_since = None;
    }

    /// Judge running cell `c` at `now_ms`, given what `ctx` (whose `want`
    /// names the cell and excludes nothing) says of the nodes.
    /// `last_move` is asked, before a move is decided, for when the cell's
    /// newest finished move ended and what it cost: the planner's own
    /// moves, a user's, and those a previous leader saw end.
    pub fn judge(
        &mut self,
        now_ms: u64,
        c: &CellRecord,
        ctx: &Ctx,
        last_move: impl FnOnce() -> Option<(u64, Option<Cost>)>,
    ) -> Verdict {
        let w = self.cells.entry(c.id.clone()).or_default();
        let fresh = w.owner != c.owner || w.generation != c.generation;
        if fresh {
            // A new owner, or a first look: its counter is only a
            // baseline, and nothing seen before applies but the moves.
            *w = Watch {
                owner: c.owner.clone(),
                generation: c.generation,
                moves: w.moves,
                ..Watch::default()
            };
        }
        let Some(service) = c.service.as_deref() else {
            return Verdict::Stay("serves no service".into());
        };
        let Some(owner) = ctx.nodes.iter().find(|n| n.name == c.owner) else {
            return Verdict::Stay("its owner is not registered".into());
        };
        let frames = owner
            .status
            .gateway
            .as_ref()
            .and_then(|g| {
                g.services
                    .iter()
                    .find(|s| s.service == service && s.cell == c.id)
            })
            .map_or(0, |s| s.frames);
        if frames > w.frames && !fresh {
            w.grew_ms = Some(now_ms);
        }
        w.frames = frames;
        if w.grew_ms
            .is_none_or(|t| now_ms.saturating_sub(t) > ACTIVE_MS)
        {
            w.beaten_since = None;
            return Verdict::Stay("no client traffic lately".into());
        }
        let Some(from_us) = rtt_of(owner) else {
            return Verdict::Stay("its owner has not measured its gateway link".into());
        };
        let Ok(best) = crate::policy::place(&FollowTheClient, ctx) else {
            return Verdict::Stay("no node can take it".into());
        };
        let to_us = match rtt_of(best) {
            Some(us) if best.name != c.owner => us,
            _ => {
                w.beaten_since = None;
                return Verdict::Stay("its owner is the nearest".into());
            }
        };
        let gain = from_us.saturating_sub(to_us);
        if gain < MIN_GAIN_US || (gain as f64) < MIN_GAIN * from_us as f64 {
            w.beaten_since = None;
            return Verdict::Stay(format!("{} is nearer by {} only", best.name, micros(gain)));
        }
        // How long some node has beaten the owner by the margins: two
        // near nodes taking turns as the best still count as one spell.
        let since = *w.beaten_since.get_or_insert(now_ms);
        let held = now_ms.saturating_sub(since);
        if held < HOLD_MS {
            return Verdict::Stay(format!("{} nearer for {held} ms only", best.name));
        }
        w.moves.saw(last_move());
        let cost = w.moves.cost();
        if let Some(ago) = w.moves.cooling(now_ms) {
            return Verdict::Stay(format!("moved {ago} ms ago"));
        }
        let ratio = from_us as f64 / to_us.max(1) as f64;
        if (held as f64 - cost.took_ms) * (ratio - 1.0) <= cost.pause_ms {
            return Verdict::Stay(format!(
                "the move (about {:.0} ms, pause {:.0} ms) does not pay yet",
                cost.took_ms, cost.pause_ms
            ));
        }
        Verdict::Move {
            to: best.name.clone(),
            from_us,
            to_us,
        }
    }
}

/// Microseconds for a person: `850 µs`, `4.2 ms`.
pub fn micros(us: u64) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else {
        format!("{:.1} ms", us as f64 / 1000.0)
    }
}

/// Whether `c` is one the leader may move now by this policy.
pub fn movable(c: &CellRecord) -> bool {
    c.state == CellState::Running && c.service.is_some()
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
