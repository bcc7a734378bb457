//! What this planner remembers of the recent past for people to read: the
//! migrations it started, with their progress over time and the source's
//! summary, and the placement decisions it took, with every node's
//! verdict. The dashboard (`dashboard/`) renders it.
//!
//! Why in memory and not in the cluster store: it is a view for people,
//! not state anything decides on. The planner already reads each
//! migration's progress from its source every 200 ms to learn when it ends
//! (`moves.rs`); keeping those readings costs a few kilobytes per
//! migration, while writing them to etcd would cost a store write per poll.
//! The price: each planner knows only what it did itself, and forgets it
//! when it restarts (`docs/dashboard.md` says so).

use std::collections::VecDeque;
use std::sync::Mutex;

use roam_api::types::{MigrationStatus, MigrationSummary};

use crate::policy::{Candidate, Reason};
use crate::{lock, unix_ms};

/// Migrations remembered; the oldest is forgotten first.
pub const MAX_MIGRATIONS: usize = 64;
/// Decisions remembered; the oldest is forgotten first.
pub const MAX_DECISIONS: usize = 128;
/// Progress samples kept per migration; past it every other sample is
/// dropped, so a long migration keeps its whole course at a coarser grain.
pub const MAX_SAMPLES: usize = 512;

/// One reading of a migration's progress on its source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Milliseconds since the migration started, as the source counts.
    pub elapsed_ms: u64,
    /// Bytes written to the connection so far.
    pub wire_bytes: u64,
}

/// How a migration ended, as far as the planner knows.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Still under way (or the planner stopped following it).
    Running,
    /// The destination runs the cell.
    Done,
    /// It failed; the cell runs on its source still.
    Failed(String),
    /// The planner could not read its progress any more, and stopped
    /// following it (the source is gone): why.
    Unfollowed(String),
}

/// A migration this planner started.
#[derive(Debug, Clone)]
pub struct MigrationTrace {
    /// Its id on the source.
    pub id: String,
    /// The cell.
    pub cell: String,
    /// The source node.
    pub from: String,
    /// The destination node.
    pub to: String,
    /// Source and destination ISAs, as registered.
    pub from_isa: String,
    /// Destination ISA.
    pub to_isa: String,
    /// `pre-copy`, `stop-and-copy` or `post-copy`.
    pub mode: String,
    /// Who asked: `user` or `drain`.
    pub reason: &'static str,
    /// When it started, Unix ms.
    pub started_ms: u64,
    /// When the planner saw it end, Unix ms.
    pub ended_ms: Option<u64>,
    /// Each phase the source reported, with when it was first seen (ms
    /// since the start); at the poll's grain, so a phase shorter than a
    /// poll may be missing.
    pub phases: Vec<(String, u64)>,
    /// Progress over time.
    pub samples: Vec<Sample>,
    /// How it ended.
    pub outcome: Outcome,
    /// The source's summary, when it succeeded.
    pub summary: Option<MigrationSummary>,
}

/// What a node looked like to a placement, and the policy's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The node.
    pub node: String,
    /// Cells it owned.
    pub cells: usize,
    /// Its cores.
    pub cores: usize,
    /// Memory it reported available, bytes.
    pub memory_available: u64,
    /// `Ok(rank)` among the nodes that passed the filter (0: chosen), or
    /// why it was filtered out.
    pub verdict: Result<usize, String>,
}

/// A placement decision.
#[derive(Debug, Clone)]
pub struct Decision {
    /// When, Unix ms.
    pub at_ms: u64,
    /// What was being placed: `launch`, `migrate`, `drain of NODE`,
    /// `restore`.
    pub what: String,
    /// The cell, when it existed already.
    pub cell: Option<String>,
    /// The policy that decided.
    pub policy: &'static str,
    /// The node chosen, if any.
    pub chosen: Option<String>,
    /// Every node and its verdict.
    pub nodes: Vec<Verdict>,
}

impl Decision {
    /// A decision from a policy's candidates (as [`crate::policy::explain`]
    /// gives them, in node order).
    pub fn new(
        what: impl Into<String>,
        cell: Option<String>,
        policy: &'static str,
        candidates: &[Candidate],
    ) -> Decision {
        // Rank the nodes that passed: best score first, ties by name (the
        // order `policy::place` breaks them in).
        let mut passed: Vec<(i64, &str)> = candidates
            .iter()
            .filter_map(|c| c.score.as_ref().ok().map(|s| (*s, c.node.as_str())))
            .collect();
        passed.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let rank = |node: &str| passed.iter().position(|(_, n)| *n == node);
        let nodes: Vec<Verdict> = candidates
            .iter()
            .map(|c| Verdict {
                node: c.node.clone(),
                cells: c.cells,
                cores: c.cores,
                memory_available: c.memory_available,
                verdict: match &c.score {
                    Ok(_) => Ok(rank(&c.node).unwrap_or(usize::MAX)),
                    Err(r) => Err(reason_text(r)),
                },
            })
            .collect();
        Decision {
            at_ms: unix_ms(),
            what: what.into(),
            cell,
            policy,
            chosen: passed.first().map(|(_, n)| n.to_string()),
            nodes,
        }
    }
}

fn reason_text(r: &Reason) -> String {
    r.to_string()
}

/// The planner's recent past.
#[derive(Debug, Default)]
pub struct History {
    migrations: Mutex<VecDeque<MigrationTrace>>,
    decisions: Mutex<VecDeque<Decision>>,
}

impl History {
    /// A migration started.
    pub fn migration_started(&self, t: MigrationTrace) {
        let mut m = lock(&self.migrations);
        if m.len() >= MAX_MIGRATIONS {
            m.pop_front();
        }
        m.push_back(t);
    }

    /// A reading of migration `id`'s progress.
    pub fn migration_progress(&self, id: &str, s: &MigrationStatus) {
        self.with(id, |t| {
            let at = s.elapsed_ms;
            if t.phases.last().is_none_or(|(p, _)| *p != s.phase) {
                t.phases.push((s.phase.clone(), at));
            }
            push_sample(
                &mut t.samples,
                Sample {
                    elapsed_ms: at,
                    wire_bytes: s.wire_bytes,
                },
            );
        });
    }

    /// Migration `id` ended.
    pub fn migration_ended(&self, id: &str, outcome: Outcome, summary: Option<MigrationSummary>) {
        self.with(id, |t| {
            t.ended_ms = Some(unix_ms());
            t.outcome = outcome;
            if let Some(s) = &summary {
                let end = s.total_ms.max(0.0) as u64;
                push_sample(
                    &mut t.samples,
                    Sample {
                        elapsed_ms: end,
                        wire_bytes: s.wire_bytes,
                    },
                );
            }
            t.summary = summary;
        });
    }

    fn with(&self, id: &str, f: impl FnOnce(&mut MigrationTrace)) {
        if let Some(t) = lock(&self.migrations).iter_mut().rev().find(|t| t.id == id) {
            f(t);
        }
    }

    /// A placement decision was taken.
    pub fn decided(&self, d: Decision) {
        let mut q = lock(&self.decisions);
        if q.len() >= MAX_DECISIONS {
            q.pop_front();
        }
        q.push_back(d);
    }

    /// The migrations remembered, newest first.
    pub fn migrations(&self) -> Vec<MigrationTrace> {
        lock(&self.migrations).iter().rev().cloned().collect()
    }

    /// The decisions remembered, newest first.
    pub fn decisions(&self) -> Vec<Decision> {
        lock(&self.decisions).iter().rev().cloned().collect()
    }
}

/// Append `s` unless it repeats the last sample's time; past
/// [`MAX_SAMPLES`], thin the samples to every other one first.
fn push_sample(v: &mut Vec<Sample>, s: Sample) {
    if v.last().is_some_and(|l| l.elapsed_ms >= s.elapsed_ms) {
        return;
    }
    if v.len() >= MAX_SAMPLES {
        let mut i = 0;
        v.retain(|_| {
            i += 1;
            i % 2 == 1
        });
    }
    v.push(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_thin_out_instead_of_growing_without_bound() {
        let mut v = Vec::new();
        for t in 1..=5000u64 {
            push_sample(
                &mut v,
                Sample {
                    elapsed_ms: t,
                    wire_bytes: t,
                },
            );
        }
        assert!(v.len() <= MAX_SAMPLES, "{}", v.len());
        assert_eq!(v.first().unwrap().elapsed_ms, 1);
        assert_eq!(v.last().unwrap().elapsed_ms, 5000);
        // A repeated or older time is not a new sample.
        let n = v.len();
        push_sample(
            &mut v,
            Sample {
                elapsed_ms: 5000,
                wire_bytes: 1,
            },
        );
        assert_eq!(v.len(), n);
    }

    #[test]
    fn decisions_rank_the_nodes_that_passed_and_keep_the_others_reasons() {
        let c = |node: &str, score: Result<i64, Reason>| Candidate {
            node: node.into(),
            cells: 0,
            cores: 1,
            memory_available: 0,
            score,
        };
        let d = Decision::new(
            "launch",
            None,
            "least-loaded",
            &[c("a", Ok(5)), c("b", Err(Reason::Draining)), c("c", Ok(9))],
        );
        assert_eq!(d.chosen.as_deref(), Some("c"));
        assert_eq!(d.nodes[0].verdict, Ok(1));
        assert_eq!(d.nodes[1].verdict, Err("draining".to_string()));
        assert_eq!(d.nodes[2].verdict, Ok(0));
        let h = History::default();
        for _ in 0..MAX_DECISIONS + 3 {
            h.decided(d.clone());
        }
        assert_eq!(h.decisions().len(), MAX_DECISIONS);
    }
}
