//! How much slower each program runs on each ISA, learned from the jobs
//! the cluster has run: what `offload-by-slowdown` ([`crate::offload`])
//! predicts with.
//!
//! **Why learned, and not HEXO's regression.** HEXO predicts a job's
//! slowdown on a board from three hardware counters read on the server
//! (instructions, last-level cache references and misses per second; r =
//! 0.95 on its boards). Many nodes expose no counters at all: virtual
//! machines above all, where `perf` answers "not supported". A static
//! estimate from the module's code was tried and failed: weighting each
//! function by call-graph frequency puts libc's formatting loops ahead of
//! the program's kernel. What every node does have is the CPU time of each
//! cell's thread, and the planner sees every job end. So it learns, per
//! program (module hash) and ISA, the CPU time one run takes:
//!
//! - a run that stayed on one ISA is one observation of that ISA's time;
//! - a run split across two ISAs, A then B, whose time on A is known, did
//!   `cpu_A / T_A` of its work on A, so B did the rest in `cpu_B`: `T_B =
//!   cpu_B / (1 − cpu_A / T_A)`, an observation weighted by the share B did
//!   (and symmetrically when B's time is the known one). Only when B did at
//!   least half of the work: a small remainder is mostly the move's fixed
//!   costs, and dividing by its share magnifies them.
//!
//! A program's slowdown from ISA A to ISA B is `T_B / T_A` once both are
//! known. Before, the planner predicts the median slowdown it has learned
//! from A to B, or else the nodes' declared speeds (their power model's
//! `speed`). The table is kept in the store (setting [`SETTING`]), so a new
//! leader starts from what the old one learned, and shown by
//! `GET /v1/slowdowns`, `roam slowdowns` and the dashboard.
//!
//! The assumption, as HEXO's: a program does the same work per CPU second
//! through its run. A job whose phases differ in kind learns an average.

use std::collections::HashMap;

use roam_cluster::NodeRecord;

/// The store setting the table is kept in.
pub const SETTING: &str = "slowdown-table";
/// Most programs the table keeps; past it, the least observed go.
pub const MAX_PROGRAMS: usize = 500;
/// A split run teaches nothing when the known side did more of the work
/// than this: the rest is too small to time (a move's fixed costs, cache
/// and page warm-up on the new node, weigh on it more than on a run).
const MAX_KNOWN_SHARE: f64 = 0.5;
/// An estimate moves towards a new observation by at least this much, so
/// that a program whose runs change is followed.
const MIN_STEP: f64 = 0.2;

/// One program's time on one ISA.
pub use roam_api::planner::LearnedTime as Estimate;

/// What the planner has learned of one program.
pub use roam_api::planner::LearnedProgram as Program;

/// Module hash → what was learned of it (the API's answer, too).
pub use roam_api::planner::Slowdowns as Table;

/// A prediction, and whether it was learned for this program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Time on the destination over time on the source.
    pub slowdown: f64,
    /// Where it comes from.
    pub basis: Basis,
}

/// Where a prediction comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// This program's own times on both ISAs.
    Learned,
    /// The median of the programs learned between the two ISAs.
    Median,
    /// The nodes' declared speeds.
    Declared,
}

impl Basis {
    /// For people.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Learned => "learned",
            Basis::Median => "median of learned programs",
            Basis::Declared => "declared speeds",
        }
    }
}

/// Learning and predicting on the table.
pub trait Learn {
    /// Take in one run of `module`: CPU ms per ISA, in the order it ran.
    fn learn(&mut self, module: &str, name: &str, stints: &[(String, u64)]);
    /// The predicted slowdown of `module` moving from a node of `from` to
    /// a node of `to`; `declared`: the nodes' speed ratio (`speed_from /
    /// speed_to`), the last resort.
    fn predict(&self, module: &str, from: &str, to: &str, declared: f64) -> Prediction;
}

impl Learn for Table {
    /// Take in one run of `module`: CPU ms per ISA, in the order it ran.
    fn learn(&mut self, module: &str, name: &str, stints: &[(String, u64)]) {
        let mut by_isa: Vec<(&str, f64)> = Vec::new();
        for (isa, ms) in stints {
            match by_isa.iter_mut().find(|(i, _)| i == isa) {
                Some((_, t)) => *t += *ms as f64,
                None => by_isa.push((isa, *ms as f64)),
            }
        }
        let p = self.programs.entry(module.to_string()).or_default();
        if p.name.is_empty() {
            p.name = name.chars().take(64).collect();
        }
        match by_isa.as_slice() {
            [(isa, t)] if *t > 0.0 => observe(p, isa, *t, 1.0),
            [(a, ta), (b, tb)] => {
                let known = |isa: &str| p.isas.get(isa).map(|e| e.cpu_ms);
                // Learn the unknown side from the other; when both are
                // known, the side that did most of this run's work.
                let (from, f_ms, to, t_ms) = match (known(a), known(b)) {
                    (Some(wa), Some(_)) if *ta / wa >= MAX_KNOWN_SHARE => (*b, *tb, *a, *ta),
                    (Some(_), _) => (*a, *ta, *b, *tb),
                    (None, Some(_)) => (*b, *tb, *a, *ta),
                    (None, None) => return,
                };
                let whole = known(from).expect("chosen for being known");
                let share = f_ms / whole;
                if whole > 0.0 && share < MAX_KNOWN_SHARE && t_ms > 0.0 {
                    observe(p, to, t_ms / (1.0 - share), 1.0 - share);
                }
            }
            // Three ISAs in one run, or nothing measured: too little to
            // apportion.
            _ => {}
        }
        trim(self);
    }

    /// The predicted slowdown of `module` moving from a node of `from` to
    /// a node of `to`; `declared`: the nodes' speed ratio (`speed_from /
    /// speed_to`), the last resort.
    fn predict(&self, module: &str, from: &str, to: &str, declared: f64) -> Prediction {
        if let Some(p) = self.programs.get(module) {
            if let (Some(a), Some(b)) = (p.isas.get(from), p.isas.get(to)) {
                if a.cpu_ms > 0.0 {
                    return Prediction {
                        slowdown: b.cpu_ms / a.cpu_ms,
                        basis: Basis::Learned,
                    };
                }
            }
        }
        let mut known: Vec<f64> = self
            .programs
            .values()
            .filter_map(|p| {
                let (a, b) = (p.isas.get(from)?, p.isas.get(to)?);
                (a.cpu_ms > 0.0).then(|| b.cpu_ms / a.cpu_ms)
            })
            .collect();
        if known.is_empty() {
            return Prediction {
                slowdown: declared,
                basis: Basis::Declared,
            };
        }
        known.sort_by(f64::total_cmp);
        Prediction {
            slowdown: known[known.len() / 2],
            basis: Basis::Median,
        }
    }
}

/// Keep at most [`MAX_PROGRAMS`]: the least observed go first.
fn trim(t: &mut Table) {
    {
        while t.programs.len() > MAX_PROGRAMS {
            let runs = |p: &Program| p.isas.values().map(|e| e.runs).sum::<f64>();
            let least = t
                .programs
                .iter()
                .min_by(|a, b| runs(a.1).total_cmp(&runs(b.1)))
                .map(|(k, _)| k.clone())
                .expect("more than MAX_PROGRAMS");
            t.programs.remove(&least);
        }
    }
}

/// Move `p`'s estimate on `isa` towards `ms`, as a mean of the runs seen,
/// at least [`MIN_STEP`] of the way.
fn observe(p: &mut Program, isa: &str, ms: f64, weight: f64) {
    if !ms.is_finite() || ms <= 0.0 {
        return;
    }
    let e = p.isas.entry(isa.to_string()).or_insert(Estimate {
        cpu_ms: ms,
        runs: 0.0,
    });
    let step = (weight / (e.runs + weight)).max(MIN_STEP);
    e.cpu_ms += (ms - e.cpu_ms) * step;
    e.runs += weight;
}

/// The runs under way: cell → CPU ms per ISA so far. Kept in memory by
/// each planner, from the migrations it followed and the ends it
/// settled; the leader writes the table to the store. A run under way
/// when a leader took over, or whose end another planner settled first,
/// teaches nothing.
#[derive(Debug, Default)]
pub struct Learner {
    runs: HashMap<String, Run>,
    /// What was learned.
    pub table: Table,
    /// The table changed since it was last written to the store.
    pub dirty: bool,
    /// A write of the table to the store is under way.
    pub saving: bool,
}

#[derive(Debug, Default)]
struct Run {
    stints: Vec<(String, u64)>,
}

/// Runs followed at once; past it, new ones are not followed.
const MAX_RUNS: usize = 100_000;

impl Learner {
    /// A learner that starts from `table`.
    pub fn new(table: Table) -> Learner {
        Learner {
            table,
            ..Learner::default()
        }
    }

    /// Cell `cell` left a node of `isa` (a finished migration) after
    /// `cpu_ms` of CPU there.
    pub fn moved(&mut self, cell: &str, isa: &str, cpu_ms: u64) {
        if self.runs.len() >= MAX_RUNS && !self.runs.contains_key(cell) {
            return;
        }
        let run = self.runs.entry(cell.to_string()).or_default();
        run.stints.push((isa.to_string(), cpu_ms));
    }

    /// Cell `cell` (program `module`, called `name`) ended on a node of
    /// `isa` after `cpu_ms` of CPU there; `exited`: the program exited (a
    /// failed or killed run did not do its whole work, and teaches
    /// nothing).
    ///
    /// `generation`: the cell's owner generation at its end, one more
    /// than its moves. A run with fewer stints than that (a move this
    /// planner did not follow, a leader that took over mid-run, a restore
    /// from a kept checkpoint) is not whole here, and teaches nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn ended(
        &mut self,
        cell: &str,
        module: &str,
        name: &str,
        isa: &str,
        generation: u64,
        cpu_ms: u64,
        exited: bool,
    ) {
        let mut run = self.runs.remove(cell).unwrap_or_default();
        if !exited || run.stints.len() as u64 + 1 != generation {
            return;
        }
        run.stints.push((isa.to_string(), cpu_ms));
        self.table.learn(module, name, &run.stints);
        self.dirty = true;
    }

    /// Forget runs of cells that are gone without an end seen.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.runs.retain(|id, _| live(id));
    }
}

/// The table the store keeps, or an empty one when it keeps none or it
/// cannot be read (the planner learns again).
pub(crate) async fn stored(store: &dyn roam_cluster::ClusterStore) -> Table {
    match store.setting(SETTING).await {
        Ok(Some(text)) => serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!("the stored slowdown table cannot be read ({e}); learning again");
            Table::default()
        }),
        Ok(None) => Table::default(),
        Err(e) => {
            tracing::warn!("cannot read the slowdown table ({e}); learning again");
            Table::default()
        }
    }
}

/// `table` as the store keeps it: JSON, the least observed programs left
/// out until it fits in a setting.
pub(crate) fn encode(table: &Table) -> String {
    let mut t = table.clone();
    loop {
        let text = serde_json::to_string(&t).expect("a table serializes");
        if text.len() <= roam_cluster::MAX_SETTING_BYTES || t.programs.is_empty() {
            return text;
        }
        let keep = t.programs.len() * 9 / 10;
        let runs = |p: &Program| p.isas.values().map(|e| e.runs).sum::<f64>();
        let mut order: Vec<(String, f64)> = t
            .programs
            .iter()
            .map(|(k, p)| (k.clone(), runs(p)))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (k, _) in order.into_iter().skip(keep) {
            t.programs.remove(&k);
        }
    }
}

/// A node's declared speed (its power model's), 1 without one.
pub fn speed_of(node: &NodeRecord) -> f64 {
    crate::energy::model_of(node).map_or(1.0, |m| m.speed)
}

#[cfg(test)]
#[path = "slowdown_tests.rs"]
mod tests;
