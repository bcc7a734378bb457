//! The node's registries of migrations: those it drives (for `GET
//! /v1/migrations/{id}`) and those it receives (the commit state that the
//! resolve endpoint and the receiving thread agree on).
//!
//! Why in the state: both ends of a migration and the HTTP API read these
//! entries, so they live below all three.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::types::{MigrationStatus, MigrationSummary, Resolution};

/// A migration this node drives, as seen by `GET /v1/migrations/{id}`.
pub(crate) struct Migration {
    pub id: String,
    pub cell: String,
    pub mode: roam_wire::Mode,
    pub started: Instant,
    pub round: AtomicU32,
    pub pages_in: AtomicU64,
    pub wire_bytes: Arc<AtomicU64>,
    pub memory_bytes: AtomicU64,
    /// The gateway was told to hold the cell's service: a failed migration
    /// must serve it again from here.
    pub held: std::sync::atomic::AtomicBool,
    phase: Mutex<String>,
    end: Mutex<Option<Result<MigrationSummary, String>>>,
}

impl Migration {
    pub(crate) fn new(id: String, cell: String, mode: roam_wire::Mode) -> Migration {
        Migration {
            id,
            cell,
            mode,
            started: Instant::now(),
            round: AtomicU32::new(0),
            pages_in: AtomicU64::new(0),
            wire_bytes: Arc::new(AtomicU64::new(0)),
            memory_bytes: AtomicU64::new(0),
            held: std::sync::atomic::AtomicBool::new(false),
            phase: Mutex::new("connecting".into()),
            end: Mutex::new(None),
        }
    }

    pub(crate) fn phase(&self, p: impl Into<String>) {
        let p = p.into();
        tracing::info!(migration = %self.id, cell = %self.cell, phase = %p, "migration phase");
        *self.phase.lock().unwrap_or_else(PoisonError::into_inner) = p;
    }

    pub(crate) fn finish(&self, r: Result<MigrationSummary, String>) {
        match &r {
            Ok(s) => tracing::info!(
                migration = %self.id, cell = %self.cell, total_ms = s.total_ms,
                downtime_ms = s.downtime_ms, wire_bytes = s.wire_bytes, "migration done"
            ),
            Err(e) => {
                tracing::warn!(migration = %self.id, cell = %self.cell, error = %e, "migration failed")
            }
        }
        self.phase(if r.is_ok() { "done" } else { "failed" });
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
    }

    pub(crate) fn status(&self) -> MigrationStatus {
        let end = self
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        MigrationStatus {
            id: self.id.clone(),
            cell: self.cell.clone(),
            mode: self.mode.as_str().into(),
            phase: self
                .phase
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            round: self.round.load(Ordering::Relaxed),
            pages_in: self.pages_in.load(Ordering::Relaxed),
            wire_bytes: self.wire_bytes.load(Ordering::Relaxed),
            memory_bytes: self.memory_bytes.load(Ordering::Relaxed),
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            done: end.is_some(),
            error: end.as_ref().and_then(|r| r.as_ref().err().cloned()),
            summary: end.and_then(Result::ok),
        }
    }
}

/// A migration this node receives: the commit state the resolve endpoint
/// and the receiving thread agree on.
pub(crate) struct Inbound {
    /// The source node's name (from its hello).
    source: String,
    /// The arriving cell's id.
    cell: String,
    state: Mutex<InboundState>,
    timings: Mutex<Option<crate::types::DestTimings>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InboundState {
    Receiving,
    Started,
    Aborted,
}

impl Inbound {
    pub(crate) fn new(source: &str, cell: &str) -> Arc<Inbound> {
        Arc::new(Inbound {
            source: source.to_string(),
            cell: cell.to_string(),
            state: Mutex::new(InboundState::Receiving),
            timings: Mutex::new(None),
        })
    }

    /// The source node's name.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Whether this migration brings cell `id` and has not been aborted
    /// (a started one enters the cell table a moment after it starts).
    pub(crate) fn brings(&self, id: &str) -> bool {
        self.cell == id
            && *self.state.lock().unwrap_or_else(PoisonError::into_inner) != InboundState::Aborted
    }

    /// The cell was about to start but must not after all (its ownership
    /// transaction lost): it never starts.
    pub(crate) fn unstart(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = InboundState::Aborted;
    }

    /// Record the destination's share of the commit (once started).
    pub(crate) fn set_timings(&self, t: crate::types::DestTimings) {
        *self.timings.lock().unwrap_or_else(PoisonError::into_inner) = Some(t);
    }

    /// The destination's share of the commit, once the cell started.
    pub(crate) fn timings(&self) -> Option<crate::types::DestTimings> {
        self.timings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The receiver wants to start the cell: allowed unless aborted.
    pub(crate) fn try_start(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if *s == InboundState::Receiving {
            *s = InboundState::Started;
        }
        *s == InboundState::Started
    }

    /// The migration failed here, or the source gave up: never start.
    /// Returns what actually holds.
    pub(crate) fn abort(&self) -> Resolution {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if *s == InboundState::Receiving {
            *s = InboundState::Aborted;
        }
        match *s {
            InboundState::Started => Resolution::Running,
            _ => Resolution::Aborted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aborted_migration_never_starts_and_a_started_one_stays_running() {
        let a = Inbound::new("src", "c");
        assert_eq!(a.abort(), Resolution::Aborted);
        assert!(!a.try_start(), "aborted before the start: must never start");
        assert_eq!(a.abort(), Resolution::Aborted);

        let b = Inbound::new("src", "c");
        assert!(b.try_start());
        assert_eq!(
            b.abort(),
            Resolution::Running,
            "a started cell cannot be aborted"
        );
        assert!(b.try_start());
    }
}
