//! Placement policies, in the style of the Kubernetes scheduling
//! framework: every policy first *filters* the nodes (which ones can take
//! the cell at all, and why not), then *scores* those left (which one is
//! best). The planner picks the highest score; ties go to the node whose
//! name sorts first, so a placement is reproducible.
//!
//! Why a framework and not one function: the policies that decide on their
//! own (follow the client, slowdown, energy) come later and plug in here;
//! they see the same [`Ctx`] (nodes with their measured load, cells) and
//! the placement that finds no node answers with every node's reason.

use std::collections::HashMap;
use std::fmt;

use roam_cluster::{CellRecord, NodeRecord, NodeState};

/// The placement policy a planner starts with.
pub const DEFAULT_PLACEMENT: &str = "least-loaded";

/// Memory limit assumed for a cell that asks for none (a node's default
/// `--cell-memory`).
pub const DEFAULT_CELL_MEMORY: u64 = 1 << 30;

/// What a placement sees.
#[derive(Debug, Clone)]
pub struct Ctx<'a> {
    /// Every node the cluster knows, alive or not.
    pub nodes: &'a [NodeRecord],
    /// The cells a placement may need to look at: at least the record of
    /// the cell being placed, when it exists (a migration, an evacuation, a
    /// kept checkpoint). Not necessarily every cell: see `load`.
    pub cells: &'a [CellRecord],
    /// How many cells each node owns, as the planner last knew.
    pub load: Load,
    /// What is being placed.
    pub want: &'a Want,
}

impl<'a> Ctx<'a> {
    /// A context whose load is counted from `cells` (every cell).
    pub fn new(nodes: &'a [NodeRecord], cells: &'a [CellRecord], want: &'a Want) -> Ctx<'a> {
        Ctx {
            nodes,
            cells,
            load: Load::of_cells(cells),
            want,
        }
    }
}

/// Cells per node: those that have not ended, by owner.
///
/// Why apart from the cells: reading every cell record for each placement
/// costs O(cells) store reads (megabytes from etcd at 10,000 cells); the
/// planner keeps the owners in memory instead and counts from them.
#[derive(Debug, Clone, Default)]
pub struct Load(HashMap<String, usize>);

impl Load {
    /// Count `(owner, ended)` pairs.
    pub fn of<'b>(cells: impl IntoIterator<Item = (&'b str, bool)>) -> Load {
        let mut m: HashMap<String, usize> = HashMap::new();
        for (owner, ended) in cells {
            if !ended {
                *m.entry(owner.to_string()).or_default() += 1;
            }
        }
        Load(m)
    }

    /// Count every cell of `cells`; a cell on its way to a node counts on
    /// that node too (it arrives there, and a second cell sent to the same
    /// free core meanwhile would share it).
    pub fn of_cells(cells: &[CellRecord]) -> Load {
        let mut load = Load::of(cells.iter().map(|c| (c.owner.as_str(), c.state.ended())));
        for c in cells {
            if let roam_cluster::CellState::Migrating { to } = &c.state {
                load.add(to);
            }
        }
        load
    }

    /// Cells `node` owns that have not ended.
    pub fn on(&self, node: &str) -> usize {
        self.0.get(node).copied().unwrap_or(0)
    }

    /// Count one more cell on `node`: one the planner is moving there.
    pub fn add(&mut self, node: &str) {
        *self.0.entry(node.to_string()).or_default() += 1;
    }
}

/// The cell being placed and the constraints on it.
#[derive(Debug, Clone, Default)]
pub struct Want {
    /// The cell, when it exists already (a migration, an evacuation).
    pub cell: Option<String>,
    /// Its memory limit, bytes (`None`: the node's default).
    pub max_memory: Option<u64>,
    /// The node the user named (`manual`).
    pub node: Option<String>,
    /// Nodes it must not go to, with why (its owner, a dead owner).
    pub exclude: Vec<(String, &'static str)>,
}

/// Why a node was filtered out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Its lease expired.
    Dead,
    /// It is being drained.
    Draining,
    /// Excluded by the caller (the owner, the source).
    Excluded(&'static str),
    /// Not enough memory available for the cell's limit.
    Memory {
        /// The cell's limit, bytes.
        need: u64,
        /// What the node reports available, bytes.
        available: u64,
    },
    /// The user named another node.
    NotNamed,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Dead => f.write_str("dead (no heartbeat within its lease)"),
            Reason::Draining => f.write_str("draining"),
            Reason::Excluded(why) => f.write_str(why),
            Reason::Memory { need, available } => write!(
                f,
                "{} of memory available, the cell's limit is {}",
                human(*available),
                human(*need)
            ),
            Reason::NotNamed => f.write_str("not the node asked for"),
        }
    }
}

/// A placement policy.
pub trait Policy: Send + Sync {
    /// Its name, as `PUT /v1/policies` takes it.
    fn name(&self) -> &'static str;
    /// One line on what it does.
    fn description(&self) -> &'static str;
    /// Whether `node` can take the cell at all.
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason>;
    /// How good `node` is for the cell (higher is better); only called on
    /// nodes that passed [`filter`](Policy::filter).
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64;
}

/// No node passed the filter.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", no_node_message(.policy, .reasons))]
pub struct NoNode {
    /// The policy that found none.
    pub policy: &'static str,
    /// Each node and why it was filtered out.
    pub reasons: Vec<(String, Reason)>,
}

fn no_node_message(policy: &str, reasons: &[(String, Reason)]) -> String {
    if reasons.is_empty() {
        return format!(
            "no node to place the cell on ({policy} policy): no node has registered; \
             start one with `roam node --planner ...`"
        );
    }
    let why: Vec<String> = reasons.iter().map(|(n, r)| format!("{n}: {r}")).collect();
    format!(
        "no node can take the cell ({policy} policy): {}; start or free a node, or name \
         another one",
        why.join("; ")
    )
}

/// Run `policy` over `ctx`: the best node, or every node's reason.
pub fn place<'a>(policy: &dyn Policy, ctx: &Ctx<'a>) -> Result<&'a NodeRecord, NoNode> {
    let mut reasons = Vec::new();
    let mut best: Option<(i64, &'a NodeRecord)> = None;
    for node in ctx.nodes {
        if let Err(r) = policy.filter(ctx, node) {
            reasons.push((node.name.clone(), r));
            continue;
        }
        let s = policy.score(ctx, node);
        let better = match best {
            None => true,
            Some((bs, bn)) => s > bs || (s == bs && node.name < bn.name),
        };
        if better {
            best = Some((s, node));
        }
    }
    best.map(|(_, n)| n).ok_or(NoNode {
        policy: policy.name(),
        reasons,
    })
}

/// One node as a policy judged it: what it saw, and the score or the
/// reason it was filtered out. What the dashboard shows of a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The node.
    pub node: String,
    /// Cells it owns that have not ended, as the placement counted.
    pub cells: usize,
    /// Its cores.
    pub cores: usize,
    /// Memory it reported available, bytes.
    pub memory_available: u64,
    /// Its score, or why it was filtered out.
    pub score: Result<i64, Reason>,
}

/// Every node of `ctx` as `policy` judges it, in node order: the same
/// filter and score [`place`] uses, kept for people to read.
pub fn explain(policy: &dyn Policy, ctx: &Ctx) -> Vec<Candidate> {
    ctx.nodes
        .iter()
        .map(|node| Candidate {
            node: node.name.clone(),
            cells: cells_on(ctx, &node.name),
            cores: node.status.machine.cores,
            memory_available: node.status.machine.memory_available,
            score: policy.filter(ctx, node).map(|()| policy.score(ctx, node)),
        })
        .collect()
}

/// The filter every shipped policy starts with: alive, ready, not
/// excluded, memory for the cell's limit (when the node reports its
/// memory).
pub fn base_filter(ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
    if let Some((_, why)) = ctx.want.exclude.iter().find(|(n, _)| *n == node.name) {
        return Err(Reason::Excluded(why));
    }
    if !node.alive {
        return Err(Reason::Dead);
    }
    if node.state == NodeState::Draining {
        return Err(Reason::Draining);
    }
    let need = ctx.want.max_memory.unwrap_or(DEFAULT_CELL_MEMORY);
    let available = node.status.machine.memory_available;
    // 0: the node did not report its memory; it decides on admission.
    if available > 0 && available < need {
        return Err(Reason::Memory { need, available });
    }
    Ok(())
}

/// Cells a node owns that have not ended.
pub fn cells_on(ctx: &Ctx, node: &str) -> usize {
    ctx.load.on(node)
}

/// The least-loaded score: fewer cells per core first, then more memory
/// available (MiB, capped so that it never outweighs one cell).
pub(crate) fn load_score(ctx: &Ctx, node: &NodeRecord) -> i64 {
    let cores = node.status.machine.cores.max(1) as i64;
    let per_core_milli = (cells_on(ctx, &node.name) as i64) * 1000 / cores;
    let mem_mib = ((node.status.machine.memory_available >> 20) as i64).min(999_999);
    -per_core_milli * 1_000_000 + mem_mib
}

/// `manual`: the node the user names, if it can take the cell.
#[derive(Debug, Default)]
pub struct Manual;

impl Policy for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }
    fn description(&self) -> &'static str {
        "the node the user names (launch --node, migrate --to), if it is alive, ready and has \
         the memory"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        if ctx.want.node.as_deref() != Some(node.name.as_str()) {
            return Err(Reason::NotNamed);
        }
        base_filter(ctx, node)
    }
    fn score(&self, _: &Ctx, _: &NodeRecord) -> i64 {
        0
    }
}

/// `least-loaded` (the default): fewest cells per core, then most memory
/// available.
#[derive(Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least-loaded"
    }
    fn description(&self) -> &'static str {
        "the live, ready node with the fewest cells per core, then the most memory available"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        base_filter(ctx, node)
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        load_score(ctx, node)
    }
}

/// `evacuate`: where a dead or draining node's cells go, and where kept
/// checkpoints are held. Never the cell's owner (the caller excludes it)
/// and never a node of the same fate; among the rest, the least loaded,
/// and for a cell with a kept checkpoint its holder first (the snapshot is
/// already there).
#[derive(Debug, Default)]
pub struct Evacuate;

impl Policy for Evacuate {
    fn name(&self) -> &'static str {
        "evacuate"
    }
    fn description(&self) -> &'static str {
        "where a dead or draining node's cells and kept checkpoints go: never the owner; the \
         checkpoint's holder first, then the least loaded"
    }
    fn filter(&self, ctx: &Ctx, node: &NodeRecord) -> Result<(), Reason> {
        if let Some(cell) = ctx.want.cell.as_deref() {
            if let Some(c) = ctx.cells.iter().find(|c| c.id == cell) {
                if c.owner == node.name {
                    return Err(Reason::Excluded("the cell's owner"));
                }
            }
        }
        base_filter(ctx, node)
    }
    fn score(&self, ctx: &Ctx, node: &NodeRecord) -> i64 {
        let holder = ctx.want.cell.as_deref().is_some_and(|cell| {
            ctx.cells
                .iter()
                .any(|c| c.id == cell && c.kept.as_ref().is_some_and(|k| k.holder == node.name))
        });
        load_score(ctx, node) + if holder { 1 << 50 } else { 0 }
    }
}

/// Every shipped policy.
pub fn all() -> Vec<Box<dyn Policy>> {
    vec![
        Box::new(LeastLoaded),
        Box::new(Manual),
        Box::new(Evacuate),
        Box::new(crate::follow::FollowTheClient),
        Box::new(crate::energy::EnergyBalanced),
        Box::new(crate::energy::EnergyUnbalanced),
        Box::new(crate::offload::OffloadBySlowdown),
    ]
}

/// The policy called `name`.
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    all().into_iter().find(|p| p.name() == name)
}

/// Bytes for a person: `1.5 GiB`.
pub fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use roam_api::sysinfo::Machine;
    use roam_cluster::{CellState, Kept, NodeStatus};

    /// A node record as the planner keeps it (also for `follow_tests`).
    pub(crate) fn node(name: &str, alive: bool, cores: usize, mem_gib: u64) -> NodeRecord {
        NodeRecord {
            name: name.into(),
            isa: "x86_64".into(),
            api: format!("{name}:7700"),
            migrate: format!("{name}:8700"),
            version: "0.1.0".into(),
            status: NodeStatus {
                machine: Machine {
                    cores,
                    memory_total: mem_gib << 30,
                    memory_available: mem_gib << 30,
                    load1: 0.0,
                },
                cells: vec![],
                gateway: None,
                usage: vec![],
                power: None,
                memory_server: None,
            },
            state: NodeState::Ready,
            alive,
            registered_ms: 0,
            heartbeat_ms: 0,
            maintenance: None,
        }
    }

    /// A cell record as the planner keeps it (also for `energy_tests`).
    pub(crate) fn cell(id: &str, owner: &str, state: CellState) -> CellRecord {
        CellRecord {
            id: id.into(),
            module: "0".repeat(64),
            args: vec!["p".into()],
            env: vec![],
            dirs: vec![],
            max_memory: None,
            service: None,
            owner: owner.into(),
            generation: 1,
            state,
            checkpoint_interval_s: 0,
            kept: None,
            created_ms: 0,
            handoff: None,
            far: None,
        }
    }

    #[test]
    fn least_loaded_prefers_fewer_cells_per_core() {
        let nodes = [node("a", true, 2, 8), node("b", true, 8, 8)];
        // a: 1 cell on 2 cores (0.5/core); b: 2 cells on 8 cores (0.25/core).
        let cells = [
            cell("c1", "a", CellState::Running),
            cell("c2", "b", CellState::Running),
            cell("c3", "b", CellState::Running),
            // Ended cells do not count.
            cell("c4", "b", CellState::Killed),
        ];
        let want = Want::default();
        let ctx = Ctx::new(&nodes, &cells, &want);
        assert_eq!(place(&LeastLoaded, &ctx).unwrap().name, "b");
    }

    #[test]
    fn least_loaded_breaks_ties_on_memory_then_name() {
        let nodes = [
            node("c", true, 4, 4),
            node("b", true, 4, 16),
            node("a", true, 4, 16),
        ];
        let want = Want::default();
        let ctx = Ctx::new(&nodes, &[], &want);
        assert_eq!(place(&LeastLoaded, &ctx).unwrap().name, "a");
    }

    #[test]
    fn no_node_lists_every_reason() {
        let mut draining = node("b", true, 4, 8);
        draining.state = NodeState::Draining;
        let nodes = [
            node("a", false, 4, 8),
            draining,
            node("c", true, 4, 1),
            node("d", true, 4, 8),
        ];
        let want = Want {
            max_memory: Some(2 << 30),
            exclude: vec![("d".into(), "the cell's owner")],
            ..Want::default()
        };
        let ctx = Ctx::new(&nodes, &[], &want);
        let e = place(&LeastLoaded, &ctx).unwrap_err();
        assert_eq!(
            e.reasons,
            vec![
                ("a".to_string(), Reason::Dead),
                ("b".to_string(), Reason::Draining),
                (
                    "c".to_string(),
                    Reason::Memory {
                        need: 2 << 30,
                        available: 1 << 30
                    }
                ),
                ("d".to_string(), Reason::Excluded("the cell's owner")),
            ]
        );
        let msg = e.to_string();
        assert!(msg.contains("a: dead"), "{msg}");
        assert!(msg.contains("c: 1.0 GiB of memory available"), "{msg}");
        let empty = Ctx::new(&[], &[], &want);
        assert!(place(&LeastLoaded, &empty)
            .unwrap_err()
            .to_string()
            .contains("no node has registered"));
    }

    #[test]
    fn manual_takes_only_the_named_node_and_still_checks_it() {
        let nodes = [node("a", true, 4, 8), node("b", false, 4, 8)];
        let mut want = Want {
            node: Some("a".into()),
            ..Want::default()
        };
        let ctx = Ctx::new(&nodes, &[], &want);
        assert_eq!(place(&Manual, &ctx).unwrap().name, "a");
        want.node = Some("b".into());
        let ctx = Ctx::new(&nodes, &[], &want);
        let e = place(&Manual, &ctx).unwrap_err();
        assert_eq!(
            e.reasons,
            vec![
                ("a".to_string(), Reason::NotNamed),
                ("b".to_string(), Reason::Dead)
            ]
        );
    }

    #[test]
    fn evacuate_never_picks_the_owner_and_prefers_the_holder() {
        // The owner is the least loaded, but must never be chosen.
        let nodes = [
            node("owner", true, 64, 64),
            node("busy", true, 1, 8),
            node("idle", true, 8, 8),
        ];
        let mut c = cell("c1", "owner", CellState::Running);
        let mut cells = vec![c.clone(), cell("c2", "busy", CellState::Running)];
        let want = Want {
            cell: Some("c1".into()),
            ..Want::default()
        };
        let ctx = Ctx::new(&nodes, &cells, &want);
        assert_eq!(place(&Evacuate, &ctx).unwrap().name, "idle");
        // With a checkpoint kept on `busy`, `busy` wins: the snapshot is there.
        c.kept = Some(Kept {
            holder: "busy".into(),
            snapshot: "0".repeat(64),
            bytes: 1,
            taken_ms: 0,
            generation: 1,
        });
        cells[0] = c;
        let ctx = Ctx::new(&nodes, &cells, &want);
        assert_eq!(place(&Evacuate, &ctx).unwrap().name, "busy");
        // Only the owner alive: no node, and the reason says so.
        let alone = [node("owner", true, 8, 8)];
        let ctx = Ctx::new(&alone, &cells, &want);
        let e = place(&Evacuate, &ctx).unwrap_err();
        assert_eq!(
            e.reasons,
            vec![("owner".to_string(), Reason::Excluded("the cell's owner"))]
        );
    }

    #[test]
    fn policies_are_found_by_name() {
        for p in all() {
            assert_eq!(by_name(p.name()).unwrap().name(), p.name());
        }
        assert!(by_name("nope").is_none());
    }
}
