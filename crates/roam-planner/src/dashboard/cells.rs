//! The cells view: where each cell runs, its service, its state and kept
//! checkpoint, and the migrate and kill buttons; ended cells below.

use std::fmt::Write;

use roam_cluster::{CellRecord, CellState, NodeRecord, NodeState};

use super::fmt::{bytes, esc, when};

/// Ended cells shown (the newest).
const ENDED_SHOWN: usize = 50;

/// The cells as an HTML fragment: those that have not ended, then the
/// newest that have.
pub(crate) fn render(nodes: &[NodeRecord], cells: &[CellRecord], now: u64) -> String {
    let mut cells: Vec<&CellRecord> = cells.iter().collect();
    cells.sort_by(|a, b| (b.created_ms, &b.id).cmp(&(a.created_ms, &a.id)));
    let (live, ended): (Vec<&CellRecord>, Vec<&CellRecord>) =
        cells.into_iter().partition(|c| !c.state.ended());
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Cells <span class=\"count\">{} live, {} ended</span></h2>",
        live.len(),
        ended.len()
    );
    if live.is_empty() {
        h.push_str(
            "<p class=\"empty\">No live cell. Launch one with <code>roam launch</code>.</p>",
        );
    } else {
        // Where a cell may be sent: live, ready nodes.
        let mut targets: Vec<&NodeRecord> = nodes
            .iter()
            .filter(|n| n.alive && n.state == NodeState::Ready)
            .collect();
        targets.sort_by(|a, b| a.name.cmp(&b.name));
        h.push_str(
            "<table id=\"cells-table\"><thead><tr><th>Cell</th><th>State</th><th>Node</th>\
             <th>Service</th><th>Memory limit</th><th>Kept checkpoint</th><th>Launched</th>\
             <th>Actions</th></tr></thead><tbody>",
        );
        for c in &live {
            live_row(&mut h, c, nodes, &targets, now);
        }
        h.push_str("</tbody></table>");
    }
    if !ended.is_empty() {
        let _ = write!(
            h,
            "<h3>Ended <span class=\"count\">newest {} of {}</span></h3>\
             <table id=\"ended-table\"><thead><tr><th>Cell</th><th>How it ended</th>\
             <th>Last node</th><th>Service</th><th>Launched</th></tr></thead><tbody>",
            ended.len().min(ENDED_SHOWN),
            ended.len()
        );
        for c in ended.iter().take(ENDED_SHOWN) {
            let _ = write!(
                h,
                "<tr class=\"cell ended\" data-cell=\"{id}\"><td><code>{id}</code>{prog}</td>\
                 <td>{state}</td><td>{owner}</td><td>{service}</td><td>{launched}</td></tr>",
                id = esc(&c.id),
                prog = program(c),
                state = state(&c.state),
                owner = esc(&c.owner),
                service = service(c),
                launched = when(c.created_ms, now),
            );
        }
        h.push_str("</tbody></table>");
    }
    h
}

fn live_row(
    h: &mut String,
    c: &CellRecord,
    nodes: &[NodeRecord],
    targets: &[&NodeRecord],
    now: u64,
) {
    let id = esc(&c.id);
    let isa = nodes
        .iter()
        .find(|n| n.name == c.owner)
        .map(|n| format!(" <span class=\"isa\">{}</span>", esc(&n.isa)))
        .unwrap_or_default();
    let kept = match &c.kept {
        Some(k) => format!(
            "{} on {}<div class=\"sub\">{}</div>",
            bytes(k.bytes),
            esc(&k.holder),
            when(k.taken_ms, now)
        ),
        None if c.checkpoint_interval_s == 0 => "<span class=\"sub\">off</span>".into(),
        None => "<span class=\"sub\">none yet</span>".into(),
    };
    let limit = c.max_memory.map_or_else(|| "node default".into(), bytes);
    let _ = write!(
        h,
        "<tr class=\"cell\" data-cell=\"{id}\"><td><code>{id}</code>{prog}</td>\
         <td>{state}</td><td>{owner}{isa}</td><td>{service}</td><td>{limit}</td>\
         <td>{kept}</td><td>{launched}</td><td class=\"actions\">",
        prog = program(c),
        state = state(&c.state),
        owner = esc(&c.owner),
        service = service(c),
        launched = when(c.created_ms, now),
    );
    if c.state == CellState::Running {
        let _ = write!(
            h,
            "<select data-for=\"{id}\" aria-label=\"destination of {id}\">\
             <option value=\"\">policy chooses</option>"
        );
        for n in targets.iter().filter(|n| n.name != c.owner) {
            let name = esc(&n.name);
            let _ = write!(
                h,
                "<option value=\"{name}\">{name} ({})</option>",
                esc(&n.isa)
            );
        }
        let _ = write!(
            h,
            "</select><button type=\"button\" data-act=\"migrate\" data-cell=\"{id}\">\
             Migrate</button>"
        );
    }
    let _ = write!(
        h,
        "<button type=\"button\" class=\"danger\" data-act=\"kill\" data-cell=\"{id}\">\
         Kill</button></td></tr>"
    );
}

/// The program's name and arguments, shortened.
fn program(c: &CellRecord) -> String {
    let mut s = c.args.join(" ");
    if s.chars().count() > 60 {
        s = s.chars().take(59).collect::<String>() + "…";
    }
    format!("<div class=\"sub\">{}</div>", esc(&s))
}

fn service(c: &CellRecord) -> String {
    match &c.service {
        Some(s) => format!("<span class=\"svc\">{}</span>", esc(s)),
        None => "<span class=\"sub\">–</span>".into(),
    }
}

/// A cell's state as a coloured label, with the detail it carries.
pub(crate) fn state(s: &CellState) -> String {
    let (label, class, detail) = match s {
        CellState::Placing => ("placing", "warn", None),
        CellState::Running => ("running", "ok", None),
        CellState::Migrating { to } => ("migrating", "warn", Some(format!("to {to}"))),
        CellState::Restoring => ("restoring", "warn", None),
        CellState::Exited { code } => (
            "exited",
            if *code == 0 { "ok" } else { "bad" },
            Some(format!("code {code}")),
        ),
        CellState::Failed { error } => ("failed", "bad", Some(error.clone())),
        CellState::Killed => ("killed", "muted", None),
        CellState::Lost { error } => ("lost", "bad", Some(error.clone())),
    };
    let detail = detail
        .map(|d| format!("<div class=\"sub\">{}</div>", esc(&d)))
        .unwrap_or_default();
    format!("<span class=\"pill {class}\">{label}</span>{detail}")
}
