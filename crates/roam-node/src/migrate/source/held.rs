//! The paused cell during a migration, resumed here unless the migration
//! committed.
//!
//! Why a guard: a migration can fail at a dozen points after the pause,
//! and each one must lift pre-copy's dirty tracking and then resume the
//! cell. Dropping a [`Held`] does both, so an early return, a `?` or a
//! panic cannot leave the cell paused or tracked; only [`Held::release`],
//! called once the cell runs on the destination, ends it here.

use std::time::Instant;

use roam_runtime::DirtyTracker;
use roam_snapshot::Snapshot;

use crate::cell::{Decision, Paused};

/// A paused cell and, during pre-copy's last round, its dirty tracking.
pub(super) struct Held {
    paused: Option<Paused>,
    tracker: Option<DirtyTracker>,
}

impl Held {
    pub(super) fn new(paused: Paused) -> Held {
        Held {
            paused: Some(paused),
            tracker: None,
        }
    }

    fn paused(&self) -> &Paused {
        self.paused
            .as_ref()
            .expect("a Held holds its cell until dropped")
    }

    /// When the cell reached its migration point.
    pub(super) fn at(&self) -> Instant {
        self.paused().at
    }

    /// The paused state (memory stays live in the cell).
    pub(super) fn snapshot(&self) -> &Snapshot {
        &self.paused().snapshot
    }

    /// Keep pre-copy's tracking on until the cell resumes or moves.
    pub(super) fn track(&mut self, t: DirtyTracker) {
        self.tracker = Some(t);
    }

    /// Pre-copy's tracking, while it is on.
    pub(super) fn tracker(&mut self) -> Option<&mut DirtyTracker> {
        self.tracker.as_mut()
    }

    /// Lift the dirty tracking. Lifting write protection from the whole
    /// memory takes tens of milliseconds for hundreds of MiB, so after a
    /// commit it is done off the pause.
    pub(super) fn stop_tracking(&mut self) {
        if let Some(t) = self.tracker.take() {
            tokio::task::block_in_place(|| drop(t));
        }
    }

    /// The cell runs on the destination: end its thread here.
    pub(super) fn release(mut self) {
        self.stop_tracking();
        if let Some(p) = self.paused.take() {
            let _ = p.reply.send(Decision::Release);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stop_tracking();
        if let Some(p) = self.paused.take() {
            tracing::debug!("the migration did not commit: the cell resumes here");
            let _ = p.reply.send(Decision::Resume);
        }
    }
}
