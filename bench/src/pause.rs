//! The pause of a migration, phase by phase, as a table row (T4, T4-KV).
//!
//! Why it exists: a downtime figure alone says nothing about what to cut.
//! The node reports where its pause went (`summary.pause`); this turns one
//! summary into a row in the order the phases happen, with what no phase
//! accounts for, so the table shows exactly what is left of the pause.

use crate::report::Table;

/// The breakdown table's columns (after the caller's label columns).
const COLUMNS: &[&str] = &[
    "downtime ms",
    "capture + handoff",
    "collect dirty",
    "paused pages",
    "final encoding",
    "encode + send",
    "wait for wire",
    "files + log",
    "state encode",
    "commit round trip",
    "dest: behind at the pause",
    "dest: last pages arriving",
    "dest: of which applying",
    "dest: state decode + install + register",
    "dest: final state → running",
    "unaccounted",
    "paused wire KiB",
    "wire floor ms",
];

/// An empty breakdown table whose rows start with `labels`.
pub fn table(labels: &[&str]) -> Table {
    let mut h: Vec<&str> = labels.to_vec();
    h.extend_from_slice(COLUMNS);
    Table::new(&h)
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(f64::NAN)
}

/// One row: `labels`, then the phases of `summary.pause` (empty cells when
/// the node did not report them).
pub fn row(labels: Vec<String>, summary: &serde_json::Value) -> Vec<String> {
    let mut r = labels;
    let Some(p) = summary.get("pause").filter(|p| p.is_object()) else {
        return r;
    };
    let down = f(summary, "downtime_ms");
    let phases = [
        "to_driver_ms",
        "collect_ms",
        "encode_ms",
        "wire_ms",
        "files_log_ms",
        "state_encode_ms",
        "commit_ms",
    ];
    let accounted: f64 = phases.iter().map(|k| f(p, k)).sum();
    let d = p.get("destination").filter(|d| d.is_object());
    let dest = |k: &str| d.map_or(String::new(), |d| format!("{:.1}", f(d, k)));
    let dest_state = d.map_or(String::new(), |d| {
        format!(
            "{:.1}",
            f(d, "decode_ms") + f(d, "install_ms") + f(d, "register_ms")
        )
    });
    r.extend([
        format!("{down:.1}"),
        format!("{:.1}", f(p, "to_driver_ms")),
        format!("{:.1}", f(p, "collect_ms")),
        p.get("final_pages")
            .map(|v| v.to_string())
            .unwrap_or_default(),
        p.get("final_encoding")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string(),
        format!("{:.1}", f(p, "encode_ms")),
        format!("{:.1}", f(p, "wire_ms")),
        format!("{:.1}", f(p, "files_log_ms")),
        format!("{:.1}", f(p, "state_encode_ms")),
        format!("{:.1}", f(p, "commit_ms")),
        p.get("dest_behind_ms")
            .and_then(serde_json::Value::as_f64)
            .map_or(String::new(), |b| format!("{b:.1}")),
        dest("last_pages_read_ms"),
        dest("last_pages_apply_ms"),
        dest_state,
        dest("to_running_ms"),
        format!("{:.1}", down - accounted),
        format!("{:.0}", f(p, "paused_wire_bytes") / 1024.0),
        format!("{:.1}", f(p, "paused_wire_floor_ms")),
    ]);
    r
}

/// Notes explaining the columns.
pub fn notes() -> Vec<String> {
    vec![
        "breakdown columns in ms, in the order the phases happen; capture + handoff … commit \
         round trip add up to the downtime but for `unaccounted` (scheduling between phases)"
            .into(),
        "encode + send: the paused pages read, encoded and queued (it includes waiting for the \
         link once its queue is full); wait for wire: until the last of them was written"
            .into(),
        "dest: behind at the pause: how long after the pause the destination read the last \
         round's end (bytes already written but still in socket buffers and its queue); \
         wall clocks of both nodes, exact on one host"
            .into(),
        "dest columns are measured by the destination: from the first page after the last \
         `RoundDone` read off the connection to the final state read, the part of it spent \
         decoding and writing pages, then the start of the cell"
            .into(),
        "wire floor: the bytes sent while paused at the shaped bandwidth".into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_lists_the_phases_and_what_they_leave_unaccounted() {
        let s = serde_json::json!({
            "downtime_ms": 40.0,
            "pause": {
                "to_driver_ms": 1.0, "collect_ms": 2.0, "final_pages": 10,
                "final_encoding": "direct lz4", "encode_ms": 20.0, "wire_ms": 3.0,
                "files_log_ms": 1.0, "state_encode_ms": 0.5, "commit_ms": 2.5,
                "paused_wire_bytes": 40960, "paused_wire_floor_ms": 0.3,
                "destination": {"decode_ms": 0.1, "install_ms": 0.2, "register_ms": 0.3,
                    "to_running_ms": 1.0, "last_pages_read_ms": 25.0,
                    "last_pages_apply_ms": 4.0, "backlog_ms": 0.0}
            }
        });
        let r = row(vec!["x".into()], &s);
        assert_eq!(r.len(), 1 + COLUMNS.len());
        assert_eq!(r[4], "10");
        assert_eq!(r[5], "direct lz4");
        assert_eq!(r[11], "", "no wall-clock lag reported");
        assert_eq!(r[14], "0.6");
        assert_eq!(r[16], "10.0", "40 ms minus the 30 ms of phases");
        assert_eq!(r[17], "40");
        // A node that reports no breakdown: just the labels.
        assert_eq!(row(vec!["x".into()], &serde_json::json!({})).len(), 1);
    }
}
