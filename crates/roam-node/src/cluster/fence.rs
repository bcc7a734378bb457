//! A node fences itself: when the planner has not answered a heartbeat for
//! most of the lease, the node pauses its planner cells and holds them
//! until the planner answers again.
//!
//! Why: the planner declares a node dead when its lease runs out and
//! restores the node's cells elsewhere from their kept checkpoints. A node
//! that is only cut off (a broken link, a frozen process) does not know
//! that. Without this fence its copies would run on, next to the restored
//! ones, until the link came back and the heartbeat's answer told it to
//! stop them. With it, the node stops running them *before* the planner can
//! give them away: its local deadline is the send time of the last answered
//! heartbeat plus nine tenths of the lease, which is earlier than the
//! planner's deadline (the planner counts from when it received that
//! heartbeat, which is later).
//!
//! When the planner answers again, held cells it listed under `stop` are
//! released (they live elsewhere now) and the others resume where they
//! paused. Only cells started by the planner (with a generation) are
//! fenced; a cell launched on the node directly keeps running.
//!
//! A cell that reaches no migration point within
//! [`roam_runtime::STOP_GRACE`] cannot be paused, so it cannot be held
//! either: the fence kills it (state `killed`) rather than let it run on.
//! The planner restores it elsewhere from its kept checkpoint, if it has one.
//!
//! A process frozen whole (SIGSTOP, a paused VM) cannot fence itself while
//! frozen: when it thaws, its cells and this watcher wake together, and a
//! cell may run a few instructions before the watcher pauses it. Those are
//! instructions between two migration points, not whole turns of work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cell::{CellHandle, Decision};
use crate::state::NodeInner;
use crate::types::CellState;

/// Watch the deadline for as long as the node runs: raise the fence when
/// it passes, lift it when the planner renews it.
pub(crate) async fn watch(n: Arc<NodeInner>) {
    loop {
        let until = n.fence.until();
        let now = Instant::now();
        match until {
            None => n.fence.changed().await,
            Some(t) if now < t => {
                lift(&n);
                tokio::select! {
                    _ = tokio::time::sleep_until(t.into()) => {}
                    _ = n.fence.changed() => {}
                }
            }
            Some(t) => {
                raise(&n, now - t);
                n.fence.changed().await;
            }
        }
    }
}

/// Pause every running planner cell and hold it.
fn raise(n: &Arc<NodeInner>, late: Duration) {
    if !n.fence.raise() {
        return;
    }
    let handles: Vec<(String, Arc<CellHandle>)> = {
        n.cells()
            .iter()
            .filter(|(_, e)| e.state == CellState::Running && e.spec.generation.is_some())
            .filter_map(|(id, e)| Some((id.clone(), e.handle.clone()?)))
            .collect()
    };
    tracing::warn!(
        cells = handles.len(),
        late_ms = late.as_millis() as u64,
        "no answer from the planner for most of the lease: pausing this node's planner \
         cells until it answers (it may give them to another node)"
    );
    for (id, h) in handles {
        let n = n.clone();
        tokio::spawn(async move {
            let Some(p) = h.pause_or_kill().await else {
                // Killed: it reached no migration point in time, so it
                // could not be held (or it ended meanwhile, or a migration
                // or a kill took it). Never left running behind the fence.
                if h.controller.is_killed() {
                    tracing::warn!(
                        cell = %id,
                        "the cell reached no migration point within {} ms, so the fence killed it",
                        roam_runtime::STOP_GRACE.as_millis()
                    );
                    n.set_state(&id, CellState::Killed);
                }
                return;
            };
            // Lifted meanwhile: dropping the reply resumes the cell.
            n.fence.hold(id, p.reply);
        });
    }
}

/// Resume every held cell.
fn lift(n: &NodeInner) {
    let Some(held) = n.fence.lift() else {
        return;
    };
    tracing::info!(
        cells = held.len(),
        "the planner answers again: held cells resume"
    );
    for (_, reply) in held {
        let _ = reply.send(Decision::Resume);
    }
}
