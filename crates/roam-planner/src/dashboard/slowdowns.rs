//! What the planner learned of each program's CPU time per ISA, shown
//! under the decisions: the figures `offload-by-slowdown` decides with, so
//! that a person can check a decision's "3.0× slower there (learned)"
//! against the runs behind it.

use std::fmt::Write;

use super::fmt::{esc, ms};
use crate::slowdown::Table;

/// The learned table as an HTML fragment.
pub(crate) fn render(table: &Table) -> String {
    let mut h = String::from(
        "<h2>Slowdowns learned <span class=\"count\">CPU time of a whole run, per ISA, from \
         the runs that ended</span></h2>",
    );
    if table.programs.is_empty() {
        h.push_str("<p class=\"empty\">Nothing learned yet: no run has ended.</p>");
        return h;
    }
    let isas: std::collections::BTreeSet<&str> = table
        .programs
        .values()
        .flat_map(|p| p.isas.keys().map(String::as_str))
        .collect();
    h.push_str("<table id=\"slowdowns-table\"><thead><tr><th>Program</th><th>Module</th>");
    for isa in &isas {
        let _ = write!(h, "<th>{}</th>", esc(isa));
    }
    h.push_str("<th>Slowdowns</th></tr></thead><tbody>");
    for (module, p) in &table.programs {
        let _ = write!(
            h,
            "<tr><td>{}</td><td><code>{}</code></td>",
            esc(&p.name),
            esc(&module[..module.len().min(12)])
        );
        for isa in &isas {
            match p.isas.get(*isa) {
                Some(e) => {
                    let _ = write!(
                        h,
                        "<td class=\"num\">{} <span class=\"sub\">({:.1} runs)</span></td>",
                        ms(e.cpu_ms),
                        e.runs
                    );
                }
                None => h.push_str("<td class=\"num\">–</td>"),
            }
        }
        let ratios: Vec<String> = p
            .slowdowns()
            .into_iter()
            .map(|(slow, fast, x)| format!("{} ÷ {}: {x:.2}×", esc(slow), esc(fast)))
            .collect();
        let _ = write!(
            h,
            "<td>{}</td></tr>",
            if ratios.is_empty() {
                "–".to_string()
            } else {
                ratios.join("<br>")
            }
        );
    }
    h.push_str("</tbody></table>");
    h
}
