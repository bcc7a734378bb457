//! The node's own view of its planner lease, and the cells its fence holds
//! (the rules are in `cluster::fence`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::cell::Decision;

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

    /// Until when the node may run its planner cells (`None` until the
    /// planner first answered).
    pub(crate) fn until(&self) -> Option<Instant> {
        self.state().until
    }

    /// Wait until the deadline changes.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Put the fence up. False when it was up already.
    pub(crate) fn raise(&self) -> bool {
        let mut s = self.state();
        !std::mem::replace(&mut s.up, true)
    }

    /// Hold a cell the fence paused, unless the fence came down meanwhile
    /// (then dropping `reply` resumes the cell).
    pub(crate) fn hold(&self, id: String, reply: std::sync::mpsc::Sender<Decision>) {
        let mut s = self.state();
        if s.up {
            s.held.insert(id, reply);
        }
    }

    /// Take the fence down: the cells it held, to resume. `None` when it
    /// was not up.
    pub(crate) fn lift(&self) -> Option<HashMap<String, std::sync::mpsc::Sender<Decision>>> {
        let mut s = self.state();
        if !s.up {
            return None;
        }
        s.up = false;
        Some(std::mem::take(&mut s.held))
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
