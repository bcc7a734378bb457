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
//! heartbeat plus [`SHARE`] of the lease, which is earlier than the
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::cell::Decision;
use crate::node::NodeInner;
use crate::types::CellState;

/// The share of the lease a node may run its cells without an answer from
/// the planner: 9/10. The planner declares the node dead only after the
/// whole lease counted from a later instant, then restores its cells at its
/// next tick, so the rest is the node's margin to pause them.
const SHARE: (u32, u32) = (9, 10);

/// The node's own view of its lease.
#[derive(Default)]
pub(crate) struct Fence {
    state: Mutex<State>,
    /// Woken when the deadline changes.
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// Until when the node may run its planner cells. `None` until the
    /// planner first answered.
    until: Option<Instant>,
    /// Whether the fence is up (cells are being paused or held).
    up: bool,
    /// Cells paused by the fence, with where their decision goes.
    held: HashMap<String, std::sync::mpsc::Sender<Decision>>,
}

impl Fence {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The planner answered a heartbeat sent at `sent`, with this lease.
    pub(crate) fn renew(&self, sent: Instant, lease: Duration) {
        let run = lease * SHARE.0 / SHARE.1;
        self.state().until = Some(sent + run);
        self.changed.notify_one();
    }

    /// The planner says the lease has already expired: fence now.
    pub(crate) fn expire(&self) {
        let mut s = self.state();
        if s.until.is_some() {
            s.until = Some(Instant::now());
        }
        drop(s);
        self.changed.notify_one();
    }

    /// End a held cell's thread (it was given to another node, or killed).
    /// False when the fence does not hold the cell.
    pub(crate) fn release(&self, id: &str) -> bool {
        match self.state().held.remove(id) {
            Some(reply) => {
                let _ = reply.send(Decision::Release);
                true
            }
            None => false,
        }
    }
}

/// Watch the deadline for as long as the node runs: raise the fence when
/// it passes, lift it when the planner renews it.
pub(crate) async fn watch(n: Arc<NodeInner>) {
    loop {
        let until = n.fence.state().until;
        let now = Instant::now();
        match until {
            None => n.fence.changed.notified().await,
            Some(t) if now < t => {
                lift(&n);
                tokio::select! {
                    _ = tokio::time::sleep_until(t.into()) => {}
                    _ = n.fence.changed.notified() => {}
                }
            }
            Some(t) => {
                raise(&n, now - t);
                n.fence.changed.notified().await;
            }
        }
    }
}

/// Pause every running planner cell and hold it.
fn raise(n: &Arc<NodeInner>, late: Duration) {
    let handles: Vec<(String, Arc<crate::cell::CellHandle>)> = {
        let mut s = n.fence.state();
        if s.up {
            return;
        }
        s.up = true;
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
            let mut s = n.fence.state();
            if s.up {
                s.held.insert(id, p.reply);
            }
            // Lifted meanwhile: dropping the reply resumes the cell.
        });
    }
}

/// Resume every held cell.
fn lift(n: &NodeInner) {
    let held = {
        let mut s = n.fence.state();
        if !s.up {
            return;
        }
        s.up = false;
        std::mem::take(&mut s.held)
    };
    tracing::info!(
        cells = held.len(),
        "the planner answers again: held cells resume"
    );
    for (_, reply) in held {
        let _ = reply.send(Decision::Resume);
    }
}
