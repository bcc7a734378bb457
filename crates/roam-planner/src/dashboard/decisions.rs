//! The policy decisions: the active placement policy, and each placement
//! this planner made (launch, migrate, drain, restore) with every node's
//! verdict, so that a person sees why a cell went where it did, or why it
//! went nowhere.

use std::fmt::Write;

use super::fmt::{bytes, esc, when};
use crate::history::Decision;

/// The decisions as an HTML fragment.
pub(crate) fn render(
    active: &str,
    description: Option<&str>,
    decisions: &[Decision],
    now: u64,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Policy decisions <span class=\"count\">the last {} of this planner</span></h2>\
         <p class=\"policy\">Placement policy: <b>{}</b> — {}</p>",
        decisions.len(),
        esc(active),
        esc(description.unwrap_or(""))
    );
    if decisions.is_empty() {
        h.push_str("<p class=\"empty\">No decision since this planner started.</p>");
        return h;
    }
    h.push_str(
        "<table id=\"decisions-table\"><thead><tr><th>When</th><th>What</th><th>Policy</th>\
         <th>Outcome</th><th>Why: every node's verdict</th></tr></thead><tbody>",
    );
    for d in decisions {
        let cell = d
            .cell
            .as_deref()
            .map(|c| format!(" <code>{}</code>", esc(c)))
            .unwrap_or_default();
        let outcome = match &d.chosen {
            Some(n) => format!("<span class=\"pill ok\">→ {}</span>", esc(n)),
            None => "<span class=\"pill bad\">no node</span>".into(),
        };
        let _ = write!(
            h,
            "<tr class=\"decision\"><td>{}</td><td>{}{cell}</td><td>{}</td><td>{outcome}</td>\
             <td><ul class=\"verdicts\">",
            when(d.at_ms, now),
            esc(&d.what),
            esc(d.policy),
        );
        let mut nodes: Vec<_> = d.nodes.iter().collect();
        // The chosen first, then the other candidates by rank, then the
        // nodes filtered out.
        nodes.sort_by_key(|v| v.verdict.as_ref().map_or(usize::MAX, |r| *r));
        for v in nodes {
            let seen = format!(
                "{} cell{} on {} core{}, {} free",
                v.cells,
                if v.cells == 1 { "" } else { "s" },
                v.cores,
                if v.cores == 1 { "" } else { "s" },
                bytes(v.memory_available)
            );
            let (class, verdict) = match &v.verdict {
                Ok(0) => ("ok", "chosen".to_string()),
                Ok(r) => ("", format!("ranked {}", ordinal(r + 1))),
                Err(why) => ("bad", format!("filtered out: {why}")),
            };
            let _ = write!(
                h,
                "<li class=\"{class}\"><b>{}</b> {} <span class=\"sub\">({})</span></li>",
                esc(&v.node),
                esc(&verdict),
                esc(&seen)
            );
        }
        h.push_str("</ul></td></tr>");
    }
    h.push_str("</tbody></table>");
    h
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, x) if x != 11 => "st",
        (2, x) if x != 12 => "nd",
        (3, x) if x != 13 => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
