//! The moves the leader decides by itself, by the cluster's placement
//! policy: follow-the-client ([`crate::follow`]) moves service cells
//! nearer their clients, energy-unbalanced ([`crate::energy`]) moves busy
//! cells to cheaper cores, offload-by-slowdown ([`crate::offload`]) moves
//! the cells that lose least to slower nodes when a node is over its
//! cores. Each policy judges; this module applies the verdicts the same
//! way for all: never a cell the planner is already
//! moving, never one whose owner is dead or draining (evacuation and drain
//! move those), a pre-copy move, and a decision people see once the move
//! has started.

use std::collections::HashSet;
use std::sync::Arc;

use roam_cluster::{CellRecord, NodeRecord, NodeState};

use crate::follow::{micros, Cost};
use crate::history::Decision;
use crate::policy::{self, Ctx, Load, Policy, Want};
use crate::{lock, Inner};

/// What each policy remembers between ticks.
#[derive(Debug, Default)]
pub(crate) struct Trackers {
    follow: crate::follow::Tracker,
    energy: crate::energy::Tracker,
    offload: crate::offload::Tracker,
}

/// One leader tick: judge and move by the policy in force; forget what
/// the other policies remembered. `live`: the ids of the cells that have
/// not ended, as the leader's tick already collected them.
pub(crate) fn tick(
    n: &Arc<Inner>,
    nodes: &[NodeRecord],
    cells: &[CellRecord],
    live: &HashSet<&str>,
    t: &mut Trackers,
    now: u64,
) {
    let placement = n.placement();
    if placement != crate::follow::FollowTheClient.name() {
        t.follow = Default::default();
    }
    let energy = [
        crate::energy::EnergyUnbalanced.name(),
        crate::energy::EnergyBalanced.name(),
    ];
    if !energy.contains(&placement) {
        t.energy = Default::default();
    }
    let live = |id: &str| live.contains(id);
    learn(n, live);
    let offload = crate::offload::OffloadBySlowdown.name();
    if placement != offload {
        t.offload = Default::default();
    }
    let mut load = Load::of_cells(cells);
    // Looked up once per cell: a set, not a scan of every node.
    let ready_nodes: HashSet<&str> = nodes
        .iter()
        .filter(|x| x.alive && x.state == NodeState::Ready)
        .map(|x| x.name.as_str())
        .collect();
    let ready = |name: &str| ready_nodes.contains(name);
    if placement == offload {
        use crate::offload::OffloadBySlowdown;
        t.offload.retain(live);
        let any = Want::default();
        let view = ctx(nodes, cells, &load, &any);
        let table = lock(&n.learner).table.clone();
        let busy = |id: &str| lock(&n.busy).contains(id);
        let moves = t
            .offload
            .judge(now, &view, &table, &busy, &|id| last_move(n, id));
        for m in moves {
            let Some(c) = cells.iter().find(|c| c.id == m.cell) else {
                continue;
            };
            let want = want(c);
            let ctx = ctx(nodes, cells, &load, &want);
            let decision = Decision::new(
                m.what.clone(),
                Some(c.id.clone()),
                OffloadBySlowdown.name(),
                &policy::explain(&OffloadBySlowdown, &ctx),
            );
            if start(
                n,
                nodes,
                c,
                &m.to,
                OffloadBySlowdown.name(),
                m.what,
                decision,
            ) {
                t.offload.moving(&c.id, now);
                load.add(&m.to);
            }
        }
    } else if placement == crate::follow::FollowTheClient.name() {
        use crate::follow::{FollowTheClient, Verdict};
        t.follow.retain(live);
        for c in cells.iter().filter(|c| crate::follow::movable(c)) {
            if lock(&n.busy).contains(&c.id) || !ready(&c.owner) {
                continue;
            }
            let want = want(c);
            let ctx = ctx(nodes, cells, &load, &want);
            let Verdict::Move { to, from_us, to_us } =
                t.follow.judge(now, c, &ctx, || last_move(n, &c.id))
            else {
                continue;
            };
            let what = format!(
                "follow the client: {} from {} ({}) to {} ({})",
                c.service.as_deref().unwrap_or("?"),
                c.owner,
                micros(from_us),
                to,
                micros(to_us)
            );
            let decision = Decision::new(
                what.clone(),
                Some(c.id.clone()),
                FollowTheClient.name(),
                &policy::explain(&FollowTheClient, &ctx),
            );
            if start(n, nodes, c, &to, FollowTheClient.name(), what, decision) {
                t.follow.moving(&c.id, now);
                load.add(&to);
            }
        }
    } else if energy.contains(&placement) {
        use crate::energy::{EnergyBalanced, EnergyUnbalanced, Verdict};
        let unbalanced = placement == EnergyUnbalanced.name();
        let policy: &dyn Policy = if unbalanced {
            &EnergyUnbalanced
        } else {
            &EnergyBalanced
        };
        t.energy.retain(live);
        for c in cells.iter().filter(|c| crate::energy::movable(c)) {
            if lock(&n.busy).contains(&c.id) || !ready(&c.owner) {
                continue;
            }
            let want = want(c);
            let ctx = ctx(nodes, cells, &load, &want);
            let last = || last_move(n, &c.id);
            let verdict = if unbalanced {
                t.energy.judge(now, c, &ctx, last)
            } else {
                t.energy.judge_balanced(now, c, &ctx, last)
            };
            let (to, what) = match verdict {
                Verdict::Stay(_) => continue,
                Verdict::Move {
                    to,
                    from_j,
                    to_j,
                    saves_j,
                } => {
                    let what = format!(
                        "save energy: {} from {} ({from_j:.1} J per unit of work) to {to} \
                         ({to_j:.1} J), about {} saved",
                        c.id,
                        c.owner,
                        roam_api::power::joules(saves_j)
                    );
                    (to, what)
                }
                Verdict::Balance {
                    to,
                    from_per_core,
                    to_per_core,
                } => {
                    let what = format!(
                        "even the load: {} from {} ({from_per_core:.2} cells per core) to {to} \
                         ({to_per_core:.2} with it)",
                        c.id, c.owner
                    );
                    (to, what)
                }
            };
            let decision = Decision::new(
                what.clone(),
                Some(c.id.clone()),
                policy.name(),
                &policy::explain(policy, &ctx),
            );
            if start(n, nodes, c, &to, policy.name(), what, decision) {
                t.energy.moving(&c.id, now);
                // The next cell this tick must not count on the same core.
                load.add(&to);
            }
        }
    }
}

/// Forget the runs of cells that are gone, and write what was learned to
/// the store when it changed (in the background: a slow store must not
/// hold the tick).
fn learn(n: &Arc<Inner>, live: impl Fn(&str) -> bool) {
    let text = {
        let mut l = lock(&n.learner);
        l.retain(live);
        // One write at a time, so that an older table never lands last.
        if !l.dirty || l.saving {
            return;
        }
        l.dirty = false;
        l.saving = true;
        crate::slowdown::encode(&l.table)
    };
    let n = n.clone();
    tokio::spawn(async move {
        let r = n.store.put_setting(crate::slowdown::SETTING, &text).await;
        let mut l = lock(&n.learner);
        l.saving = false;
        if let Err(e) = r {
            tracing::warn!("cannot keep the slowdown table: {e}");
            l.dirty = true;
        }
    });
}

fn want(c: &CellRecord) -> Want {
    Want {
        cell: Some(c.id.clone()),
        max_memory: c.max_memory,
        ..Want::default()
    }
}

fn ctx<'a>(
    nodes: &'a [NodeRecord],
    cells: &'a [CellRecord],
    load: &Load,
    want: &'a Want,
) -> Ctx<'a> {
    Ctx {
        nodes,
        cells,
        load: load.clone(),
        want,
    }
}

/// Start a pre-copy move of `c` to `to` for `reason`; `false` when either
/// node is gone from the view. The decision is recorded once the move has
/// started.
fn start(
    n: &Arc<Inner>,
    nodes: &[NodeRecord],
    c: &CellRecord,
    to: &str,
    reason: &'static str,
    what: String,
    decision: Decision,
) -> bool {
    let (Some(source), Some(dest)) = (
        nodes.iter().find(|x| x.name == c.owner),
        nodes.iter().find(|x| x.name == to),
    ) else {
        return false;
    };
    let (n, c, source, dest) = (n.clone(), c.clone(), source.clone(), dest.clone());
    tokio::spawn(async move {
        match crate::moves::start(&n, &c, &source, &dest, "pre-copy", reason).await {
            // Only a move that started is a decision people see.
            Ok(_) => {
                tracing::info!(cell = %c.id, "{what}");
                n.history.decided(decision);
            }
            Err(e) => tracing::warn!(cell = %c.id, "{reason}: the move did not start: {}", e.1),
        }
    });
    true
}

/// When `cell`'s newest finished move ended, and what it cost.
fn last_move(n: &Inner, cell: &str) -> Option<(u64, Option<Cost>)> {
    let t = n
        .history
        .migrations()
        .into_iter()
        .find(|t| t.cell == cell && t.ended_ms.is_some())?;
    let cost = t.summary.map(|s| Cost::reported(s.total_ms, s.downtime_ms));
    Some((t.ended_ms?, cost))
}
