//! `GET /metrics`: the planner's numbers in the Prometheus/OpenMetrics
//! text format, for an operator's Prometheus and for the scale benchmark.
//!
//! Counters and the store's latency are recorded as things happen; the
//! gauges that describe the cluster (nodes by liveness, cells by state,
//! kept-checkpoint age) are computed from the store at each scrape, so they
//! can never drift from it.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use roam_cluster::{CellRecord, CellState, NodeRecord, NodeState};

type Labels = Vec<(String, String)>;

fn label(k: &str, v: &str) -> Labels {
    vec![(k.to_string(), v.to_string())]
}

fn store_histogram() -> Histogram {
    // 50 µs to ~1.6 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// The planner's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    nodes: Family<Labels, Gauge>,
    cells: Family<Labels, Gauge>,
    kept_age: Family<Labels, Gauge<f64, AtomicU64>>,
    power: Family<Labels, Gauge<f64, AtomicU64>>,
    energy: Family<Labels, Gauge<f64, AtomicU64>>,
    leader: Gauge,
    placements: Family<Labels, Counter>,
    evacuations: Family<Labels, Counter>,
    migrations: Family<Labels, Counter>,
    checkpoints: Family<Labels, Counter>,
    store: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("roam_planner");
        let m = Metrics {
            nodes: Family::default(),
            cells: Family::default(),
            kept_age: Family::default(),
            power: Family::default(),
            energy: Family::default(),
            leader: Gauge::default(),
            placements: Family::default(),
            evacuations: Family::default(),
            migrations: Family::default(),
            checkpoints: Family::default(),
            store: Family::new_with_constructor(store_histogram),
            registry: Registry::default(),
        };
        registry.register(
            "nodes",
            "Nodes by liveness (alive, dead) and state (ready, draining)",
            m.nodes.clone(),
        );
        registry.register("cells", "Cells by state", m.cells.clone());
        registry.register(
            "kept_checkpoint_age_seconds",
            "Age of each cell's newest kept checkpoint",
            m.kept_age.clone(),
        );
        registry.register(
            "node_power_watts",
            "Each live node's estimated draw, by the power model it declares (roam node --power)",
            m.power.clone(),
        );
        registry.register(
            "node_energy_joules",
            "Each live node's estimated energy since it started, as its last heartbeat reported",
            m.energy.clone(),
        );
        registry.register(
            "leader",
            "1 while this planner leads the cluster",
            m.leader.clone(),
        );
        registry.register(
            "placements",
            "Cells placed, by policy and result",
            m.placements.clone(),
        );
        registry.register(
            "evacuations",
            "Cells of dead nodes, by result (restored, lost)",
            m.evacuations.clone(),
        );
        registry.register(
            "migrations",
            "Migrations asked by the planner, by reason and result",
            m.migrations.clone(),
        );
        registry.register(
            "checkpoints",
            "Kept checkpoints, by result",
            m.checkpoints.clone(),
        );
        registry.register(
            "store_operation_seconds",
            "Latency of cluster store operations, by operation",
            m.store.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// A placement by `policy` ended with `result` (`placed`, `failed`).
    pub fn placement(&self, policy: &str, result: &str) {
        let mut l = label("policy", policy);
        l.push(("result".into(), result.into()));
        self.placements.get_or_create(&l).inc();
    }

    /// An evacuated cell ended with `result`.
    pub fn evacuation(&self, result: &str) {
        self.evacuations
            .get_or_create(&label("result", result))
            .inc();
    }

    /// A migration for `reason` (`user`, `drain`) ended with `result`.
    pub fn migration(&self, reason: &str, result: &str) {
        let mut l = label("reason", reason);
        l.push(("result".into(), result.into()));
        self.migrations.get_or_create(&l).inc();
    }

    /// A kept checkpoint ended with `result` (`kept`, `failed`).
    pub fn checkpoint(&self, result: &str) {
        self.checkpoints
            .get_or_create(&label("result", result))
            .inc();
    }

    /// A store operation took `d`.
    pub fn store_op(&self, op: &str, d: Duration) {
        self.store
            .get_or_create(&label("op", op))
            .observe(d.as_secs_f64());
    }

    /// Whether this planner leads.
    pub fn set_leader(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }

    /// The text exposition, with the cluster gauges computed from `nodes`
    /// and `cells` as of `now_ms`.
    pub fn render(&self, nodes: &[NodeRecord], cells: &[CellRecord], now_ms: u64) -> String {
        self.nodes.clear();
        for n in nodes {
            let mut l = label("liveness", if n.alive { "alive" } else { "dead" });
            let state = match n.state {
                NodeState::Ready => "ready",
                NodeState::Draining => "draining",
            };
            l.push(("state".into(), state.into()));
            self.nodes.get_or_create(&l).inc();
        }
        self.power.clear();
        self.energy.clear();
        for n in nodes.iter().filter(|n| n.alive) {
            if let Some(p) = &n.status.power {
                self.power
                    .get_or_create(&label("node", &n.name))
                    .set(p.watts);
                self.energy
                    .get_or_create(&label("node", &n.name))
                    .set(p.joules);
            }
        }
        self.cells.clear();
        self.kept_age.clear();
        for c in cells {
            self.cells
                .get_or_create(&label("state", state_name(&c.state)))
                .inc();
            if let (Some(k), false) = (&c.kept, c.state.ended()) {
                let age = now_ms.saturating_sub(k.taken_ms) as f64 / 1000.0;
                self.kept_age.get_or_create(&label("cell", &c.id)).set(age);
            }
        }
        let mut out = String::new();
        // Writing into a String does not fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// A cell state's name, as in the API.
pub fn state_name(s: &CellState) -> &'static str {
    match s {
        CellState::Placing => "placing",
        CellState::Running => "running",
        CellState::Migrating { .. } => "migrating",
        CellState::Restoring => "restoring",
        CellState::Exited { .. } => "exited",
        CellState::Failed { .. } => "failed",
        CellState::Killed => "killed",
        CellState::Lost { .. } => "lost",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_computed_gauges() {
        let m = Metrics::default();
        m.placement("least-loaded", "placed");
        m.placement("least-loaded", "placed");
        m.store_op("cells", Duration::from_millis(2));
        m.set_leader(true);
        let text = m.render(&[], &[], 0);
        assert!(
            text.contains(
                "roam_planner_placements_total{policy=\"least-loaded\",result=\"placed\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("roam_planner_leader 1"), "{text}");
        assert!(
            text.contains("roam_planner_store_operation_seconds_count{op=\"cells\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn live_nodes_with_a_power_model_have_power_and_energy() {
        let m = Metrics::default();
        let report = roam_api::power::PowerReport {
            model: "idle=2,busy=1".parse().unwrap(),
            watts: 3.5,
            joules: 120.0,
        };
        let mut board = crate::policy::tests::node("board", true, 2, 1);
        board.status.power = Some(report);
        let mut dead = crate::policy::tests::node("dead", false, 2, 1);
        dead.status.power = Some(report);
        let bare = crate::policy::tests::node("bare", true, 2, 1);
        let text = m.render(&[board, dead, bare], &[], 0);
        assert!(
            text.contains("roam_planner_node_power_watts{node=\"board\"} 3.5"),
            "{text}"
        );
        assert!(
            text.contains("roam_planner_node_energy_joules{node=\"board\"} 120.0"),
            "{text}"
        );
        assert!(!text.contains("node=\"dead\""), "{text}");
        assert!(!text.contains("node=\"bare\""), "{text}");
    }
}
