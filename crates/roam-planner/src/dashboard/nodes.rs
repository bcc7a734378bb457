//! The nodes view: each node with its ISA, state, load and memory, the
//! cells it owns, and the drain and undrain buttons.

use std::fmt::Write;

use roam_cluster::{CellRecord, NodeRecord, NodeState};

use super::fmt::{bar, bytes, esc, when};

/// The nodes, by name, as an HTML fragment.
pub(crate) fn render(nodes: &[NodeRecord], cells: &[CellRecord], now: u64) -> String {
    let mut nodes: Vec<&NodeRecord> = nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let alive = nodes.iter().filter(|n| n.alive).count();
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Nodes <span class=\"count\">{} registered, {alive} alive</span></h2>",
        nodes.len()
    );
    if nodes.is_empty() {
        h.push_str(
            "<p class=\"empty\">No node has registered. Start one with \
             <code>roam node --planner URL</code>.</p>",
        );
        return h;
    }
    h.push_str(
        "<table id=\"nodes-table\"><thead><tr><th>Node</th><th>ISA</th><th>State</th>\
         <th>Load</th><th>Memory</th><th>Cells</th><th>Gateway round trip</th><th>Power</th>\
         <th>Heartbeat</th><th>Actions</th>\
         </tr></thead><tbody>",
    );
    for n in nodes {
        row(&mut h, n, cells, now);
    }
    h.push_str("</tbody></table>");
    h
}

fn row(h: &mut String, n: &NodeRecord, cells: &[CellRecord], now: u64) {
    let name = esc(&n.name);
    let m = &n.status.machine;
    let (state, class) = match (n.alive, n.state) {
        (false, _) => ("dead", "bad"),
        (true, NodeState::Draining) => ("draining", "warn"),
        (true, NodeState::Ready) => ("ready", "ok"),
    };
    let owned = cells
        .iter()
        .filter(|c| c.owner == n.name && !c.state.ended())
        .count();
    let cores = m.cores.max(1);
    let load = m.load1 / cores as f64;
    let used = m.memory_total.saturating_sub(m.memory_available);
    let mem_frac = if m.memory_total == 0 {
        0.0
    } else {
        used as f64 / m.memory_total as f64
    };
    let _ = write!(
        h,
        "<tr class=\"node\" data-node=\"{name}\"><td><b>{name}</b>\
         <div class=\"sub\">{api} · roam {version}</div></td>\
         <td><span class=\"isa\">{isa}</span></td>\
         <td><span class=\"pill {class}\">{state}</span>{window}</td>\
         <td>{load_bar}<div class=\"sub\">{load1:.2} on {cores} cores</div></td>",
        api = esc(&n.api),
        version = esc(&n.version),
        isa = esc(&n.isa),
        load_bar = bar(load, if load > 1.0 { "hot" } else { "fill" }),
        load1 = m.load1,
        window = n.maintenance.map_or(String::new(), |w| format!(
            "<div class=\"sub\">maintenance {} to {}</div>",
            super::fmt::date(w.start_ms),
            super::fmt::date(w.end_ms)
        )),
    );
    if m.memory_total == 0 {
        h.push_str("<td><span class=\"sub\">not reported</span></td>");
    } else {
        let _ = write!(
            h,
            "<td>{}<div class=\"sub\">{} used of {}, {} free</div></td>",
            bar(mem_frac, if mem_frac > 0.9 { "hot" } else { "fill" }),
            bytes(used),
            bytes(m.memory_total),
            bytes(m.memory_available)
        );
    }
    let _ = write!(
        h,
        "<td>{owned}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"actions\">",
        gateway(n),
        power(n),
        when(n.heartbeat_ms, now)
    );
    let (act, label) = match n.state {
        NodeState::Ready => ("drain", "Drain"),
        NodeState::Draining => ("undrain", "Undrain"),
    };
    let _ = write!(
        h,
        "<button type=\"button\" data-act=\"{act}\" data-node=\"{name}\">{label}</button>\
         </td></tr>"
    );
}

/// The node's estimated draw and energy, and its model's cost of work.
fn power(n: &NodeRecord) -> String {
    let Some(p) = &n.status.power else {
        return "<span class=\"sub\">no model</span>".into();
    };
    format!(
        "{}<div class=\"sub\">{} since start · {:.1} J per unit of work</div>",
        roam_api::power::watts(p.watts),
        roam_api::power::joules(p.joules),
        p.model.joules_per_work()
    )
}

/// The node's link to its gateway: the round trip and which gateway.
fn gateway(n: &NodeRecord) -> String {
    let Some(g) = &n.status.gateway else {
        return "<span class=\"sub\">no gateway</span>".into();
    };
    let which = esc(crate::follow::gateway_of(n).unwrap_or_default());
    if !g.connected {
        return format!(
            "<span class=\"pill bad\">link down</span><div class=\"sub\">{which}</div>"
        );
    }
    let rtt = g
        .rtt_us
        .map_or("not measured".into(), crate::follow::micros);
    format!("{rtt}<div class=\"sub\">{which}</div>")
}
