//! `GET /metrics`: the node's counters in the Prometheus text format, with
//! the `prometheus-client` crate.
//!
//! Why: a fleet is watched by a Prometheus server, not by polling each
//! node's JSON; what an operator asks first (how many cells, how migrations
//! go, how long their pauses are, how stale the kept checkpoints are) is
//! here under stable names. Counters and histograms are updated where
//! things happen; the per-state and per-cell gauges are read from the cell
//! table at each scrape, so they cannot drift from it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::cell::CellEntry;
use crate::ids::unix_ms;
use crate::types::CellState;

type Labels = Vec<(String, String)>;
type F64Gauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The node's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    cells: Family<Labels, Gauge>,
    migrations: Family<Labels, Counter>,
    downtime: Family<Labels, Histogram>,
    bytes: Family<Labels, Histogram>,
    kept: Counter,
    kept_taken_bytes: Counter,
    kept_sent_bytes: Counter,
    checkpoint_age: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    cpu_weight: Family<Labels, Gauge>,
    gateway_rtt: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    cell_cpu: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    cell_memory: Family<Labels, Gauge>,
    /// Far-memory cells: bytes resident here, and bytes on the memory server.
    cell_far: Family<Labels, Gauge>,
    /// As a memory server: bytes held for other nodes, and offered.
    memory_server: Family<Labels, Gauge>,
    gateway_messages: Family<Labels, Counter>,
    /// The power model's estimates: draw and energy (registered only when
    /// the node declares a model).
    power: Option<(F64Gauge, F64Gauge)>,
    /// Unix ms of each cell's newest checkpoint taken here.
    last_checkpoint: Mutex<HashMap<String, u64>>,
}

impl Metrics {
    /// The node's metrics; `power`: it declares a power model.
    pub(crate) fn new(power: bool) -> Metrics {
        let mut registry = Registry::with_prefix("roam_node");
        let cells = Family::<Labels, Gauge>::default();
        registry.register("cells", "Cells on this node, by state", cells.clone());
        let migrations = Family::<Labels, Counter>::default();
        registry.register(
            "migrations",
            "Migrations this node drove, by mode and result",
            migrations.clone(),
        );
        let downtime = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 1 ms to about 65 s.
            Histogram::new(exponential_buckets(0.001, 2.0, 17))
        });
        registry.register_with_unit(
            "migration_downtime",
            "Pause of successful migrations driven by this node",
            Unit::Seconds,
            downtime.clone(),
        );
        let bytes = Family::<Labels, Histogram>::new_with_constructor(|| {
            // 64 KiB to 64 GiB.
            Histogram::new(exponential_buckets(65536.0, 4.0, 11))
        });
        registry.register_with_unit(
            "migration_wire",
            "Bytes written to the connection by successful migrations",
            Unit::Bytes,
            bytes.clone(),
        );
        let kept = Counter::default();
        registry.register(
            "kept_checkpoints",
            "Kept checkpoints taken here and sent to a holder",
            kept.clone(),
        );
        let kept_taken_bytes = Counter::default();
        registry.register_with_unit(
            "kept_checkpoint_taken",
            "Size of the kept checkpoints taken here",
            Unit::Bytes,
            kept_taken_bytes.clone(),
        );
        let kept_sent_bytes = Counter::default();
        registry.register_with_unit(
            "kept_checkpoint_sent",
            "Bytes sent to holders for kept checkpoints (after dedup)",
            Unit::Bytes,
            kept_sent_bytes.clone(),
        );
        let checkpoint_age = Family::default();
        registry.register_with_unit(
            "checkpoint_age",
            "Time since each running cell's newest kept checkpoint",
            Unit::Seconds,
            checkpoint_age.clone(),
        );
        let cpu_weight = Family::default();
        registry.register(
            "cell_cpu_weight",
            "Each running cell's CPU weight, by how it is applied (docs/node-api.md, CPU)",
            cpu_weight.clone(),
        );
        let gateway_rtt = Family::default();
        registry.register_with_unit(
            "gateway_rtt",
            "Round trip to the gateway on this node's link (the smallest of the last pings, or a longer unanswered wait), by gateway id",
            Unit::Seconds,
            gateway_rtt.clone(),
        );
        let cell_cpu = Family::default();
        registry.register_with_unit(
            "cell_cpu",
            "CPU time each running cell's thread has used on this node",
            Unit::Seconds,
            cell_cpu.clone(),
        );
        let cell_memory = Family::default();
        registry.register_with_unit(
            "cell_memory",
            "Each running cell's linear memory",
            Unit::Bytes,
            cell_memory.clone(),
        );
        let cell_far = Family::default();
        registry.register_with_unit(
            "cell_far_memory",
            "Far-memory cells' memory by where it is: `local` (resident here) or `far` (only on the memory server)",
            Unit::Bytes,
            cell_far.clone(),
        );
        let memory_server = Family::default();
        registry.register_with_unit(
            "memory_server",
            "As a memory server (--memory-server): bytes `held` for other nodes' cells, and the `capacity` offered",
            Unit::Bytes,
            memory_server.clone(),
        );
        let gateway_messages = Family::default();
        registry.register(
            "gateway_client_messages",
            "Client-to-cell messages through the gateway link, per service, since its cell started serving here",
            gateway_messages.clone(),
        );
        let power = power.then(|| {
            let (watts, joules) = (F64Gauge::default(), F64Gauge::default());
            registry.register_with_unit(
                "power",
                "Estimated draw since the previous report, by the power model the node declares (--power)",
                Unit::Other("watts".into()),
                watts.clone(),
            );
            registry.register_with_unit(
                "energy",
                "Estimated energy since the node started, by its power model (only grows)",
                Unit::Joules,
                joules.clone(),
            );
            (watts, joules)
        });
        Metrics {
            registry,
            power,
            cpu_weight,
            gateway_rtt,
            gateway_messages,
            cell_cpu,
            cell_memory,
            cell_far,
            memory_server,
            cells,
            migrations,
            downtime,
            bytes,
            kept,
            kept_taken_bytes,
            kept_sent_bytes,
            checkpoint_age,
            last_checkpoint: Mutex::new(HashMap::new()),
        }
    }

    /// A migration this node drove ended.
    pub(crate) fn migration(&self, mode: &str, ok: Option<(f64, u64)>) {
        let result = if ok.is_some() { "ok" } else { "failed" };
        let labels = vec![
            ("mode".to_string(), mode.to_string()),
            ("result".to_string(), result.to_string()),
        ];
        self.migrations.get_or_create(&labels).inc();
        if let Some((downtime_ms, wire_bytes)) = ok {
            let labels = vec![("mode".to_string(), mode.to_string())];
            self.downtime
                .get_or_create(&labels)
                .observe(downtime_ms / 1000.0);
            self.bytes.get_or_create(&labels).observe(wire_bytes as f64);
        }
    }

    /// A kept checkpoint of `cell` was taken and sent.
    pub(crate) fn kept(&self, cell: &str, taken_ms: u64, bytes: u64, sent: u64) {
        self.kept.inc();
        self.kept_taken_bytes.inc_by(bytes);
        self.kept_sent_bytes.inc_by(sent);
        self.last_checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(cell.to_string(), taken_ms);
    }

    /// The text of a scrape.
    pub(crate) fn render(
        &self,
        cells: &HashMap<String, CellEntry>,
        gateway: Option<&roam_gateway::link::GatewayLink>,
        power: Option<&crate::power::Meter>,
        far_server: Option<&crate::limits::FarServer>,
    ) -> String {
        if let (Some((watts, joules)), Some(p)) = (&self.power, power.map(|m| m.peek())) {
            watts.set(p.watts);
            joules.set(p.joules);
        }
        self.cells.clear();
        self.checkpoint_age.clear();
        self.cpu_weight.clear();
        self.gateway_rtt.clear();
        self.gateway_messages.clear();
        self.cell_cpu.clear();
        self.cell_memory.clear();
        self.cell_far.clear();
        if let Some(f) = far_server {
            let page = roam_wire::FAR_PAGE as u64;
            let bytes = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.memory_server
                .get_or_create(&vec![("kind".to_string(), "held".to_string())])
                .set(bytes(f.used_pages() * page));
            self.memory_server
                .get_or_create(&vec![("kind".to_string(), "capacity".to_string())])
                .set(bytes(f.capacity_bytes()));
        }
        if let Some(g) = gateway {
            if let (Some(rtt), Some(id), true) = (g.rtt(), g.gateway_id(), g.is_connected()) {
                self.gateway_rtt
                    .get_or_create(&vec![("gateway".to_string(), id)])
                    .set(rtt.estimate().as_secs_f64());
            }
            for s in g.served() {
                self.gateway_messages
                    .get_or_create(&vec![
                        ("service".to_string(), s.service),
                        ("cell".to_string(), s.cell),
                    ])
                    .inc_by(s.traffic.frames);
            }
        }
        let now = unix_ms();
        let last = self
            .last_checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (id, e) in cells {
            let state = match &e.state {
                CellState::Running => "running",
                CellState::Migrating => "migrating",
                CellState::Exited { .. } => "exited",
                CellState::Failed { .. } => "failed",
                CellState::Killed => "killed",
                CellState::Moved { .. } => "moved",
            };
            self.cells
                .get_or_create(&vec![("state".to_string(), state.to_string())])
                .inc();
            if let (CellState::Running, Some(t)) = (&e.state, last.get(id)) {
                self.checkpoint_age
                    .get_or_create(&vec![("cell".to_string(), id.clone())])
                    .set(now.saturating_sub(*t) as f64 / 1000.0);
            }
            if let (CellState::Running, Some(h)) = (&e.state, &e.handle) {
                let cell = vec![("cell".to_string(), id.clone())];
                if let Some(t) = h.cpu_time() {
                    self.cell_cpu.get_or_create(&cell).set(t.as_secs_f64());
                }
                self.cell_memory
                    .get_or_create(&cell)
                    .set(i64::try_from(h.memory.len()).unwrap_or(i64::MAX));
                if let Some((far, _)) = h.far.get() {
                    let st = far.stats();
                    for (place, pages) in [("local", st.resident), ("far", st.far)] {
                        self.cell_far
                            .get_or_create(&vec![
                                ("cell".to_string(), id.clone()),
                                ("place".to_string(), place.to_string()),
                            ])
                            .set(i64::try_from(pages * 4096).unwrap_or(i64::MAX));
                    }
                }
            }
            let cpu = e.handle.as_ref().and_then(|h| h.cpu.get());
            if let (CellState::Running, Some(cpu)) = (&e.state, cpu) {
                self.cpu_weight
                    .get_or_create(&vec![
                        ("cell".to_string(), id.clone()),
                        ("mechanism".to_string(), cpu.mechanism.clone()),
                    ])
                    .set(i64::from(cpu.weight));
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The content type of [`Metrics::render`]'s text.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sample line: `name{labels} value`, its name declared by a
    /// `# TYPE` line of a known type.
    fn parse(text: &str) -> HashMap<String, String> {
        let mut types = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
                assert!(
                    ["counter", "gauge", "histogram"].contains(&ty),
                    "unknown type in {line}"
                );
                types.insert(name.to_string(), ty.to_string());
            } else if line.starts_with('#') || line.is_empty() {
                continue;
            } else {
                let (name, value) = line.rsplit_once(' ').expect("a sample: name value");
                value
                    .parse::<f64>()
                    .unwrap_or_else(|e| panic!("{line}: value {value}: {e}"));
                let base = name.split('{').next().unwrap();
                let family = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| base.strip_suffix(s).filter(|b| types.contains_key(*b)))
                    .unwrap_or(base);
                assert!(
                    types.contains_key(family),
                    "sample {line} without a # TYPE line"
                );
            }
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        types
    }

    #[test]
    fn the_text_parses_with_the_documented_names_and_types() {
        let m = Metrics::new(true);
        m.migration("pre-copy", Some((12.5, 3 << 20)));
        m.migration("stop-and-copy", None);
        m.kept("c-1", unix_ms(), 1000, 100);
        m.cells
            .get_or_create(&vec![("state".into(), "running".into())])
            .inc();
        m.checkpoint_age
            .get_or_create(&vec![("cell".into(), "c-1".into())])
            .set(1.5);
        m.cpu_weight
            .get_or_create(&vec![
                ("cell".into(), "c-1".into()),
                ("mechanism".into(), "nice".into()),
            ])
            .set(200);
        m.gateway_rtt
            .get_or_create(&vec![("gateway".into(), "gw-00000000000000a1".into())])
            .set(0.004);
        m.cell_cpu
            .get_or_create(&vec![("cell".into(), "c-1".into())])
            .set(0.25);
        m.cell_memory
            .get_or_create(&vec![("cell".into(), "c-1".into())])
            .set(1 << 20);
        m.gateway_messages
            .get_or_create(&vec![
                ("service".into(), "kv".into()),
                ("cell".into(), "c-1".into()),
            ])
            .inc_by(17);
        m.cell_far
            .get_or_create(&vec![
                ("cell".into(), "c-1".into()),
                ("place".into(), "far".into()),
            ])
            .set(4096);
        m.memory_server
            .get_or_create(&vec![("kind".into(), "held".into())])
            .set(8192);
        let (watts, joules) = m.power.as_ref().unwrap();
        watts.set(61.5);
        joules.set(1234.5);
        let mut text = String::new();
        encode(&mut text, &m.registry).unwrap();
        assert!(
            text.contains("\nroam_node_energy_joules 1234.5\n"),
            "{text}"
        );
        let mut bare = String::new();
        encode(&mut bare, &Metrics::new(false).registry).unwrap();
        assert!(!bare.contains("energy"), "{bare}");
        let types = parse(&text);
        let want = [
            ("roam_node_cells", "gauge"),
            ("roam_node_migrations", "counter"),
            ("roam_node_migration_downtime_seconds", "histogram"),
            ("roam_node_migration_wire_bytes", "histogram"),
            ("roam_node_kept_checkpoints", "counter"),
            ("roam_node_kept_checkpoint_taken_bytes", "counter"),
            ("roam_node_kept_checkpoint_sent_bytes", "counter"),
            ("roam_node_checkpoint_age_seconds", "gauge"),
            ("roam_node_cell_cpu_weight", "gauge"),
            ("roam_node_gateway_rtt_seconds", "gauge"),
            ("roam_node_cell_cpu_seconds", "gauge"),
            ("roam_node_cell_memory_bytes", "gauge"),
            ("roam_node_gateway_client_messages", "counter"),
            ("roam_node_cell_far_memory_bytes", "gauge"),
            ("roam_node_memory_server_bytes", "gauge"),
            ("roam_node_power_watts", "gauge"),
            ("roam_node_energy_joules", "gauge"),
        ];
        for (name, ty) in want {
            assert_eq!(
                types.get(name).map(String::as_str),
                Some(ty),
                "{name} in\n{text}"
            );
        }
        assert!(
            text.contains(r#"roam_node_migrations_total{mode="pre-copy",result="ok"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"roam_node_migration_downtime_seconds_count{mode="pre-copy"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("roam_node_kept_checkpoint_sent_bytes_total 100"),
            "{text}"
        );
        assert!(
            text.contains(r#"roam_node_checkpoint_age_seconds{cell="c-1"} 1.5"#),
            "{text}"
        );
    }
}
