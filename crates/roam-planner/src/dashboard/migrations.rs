//! The migration timeline: each migration this planner started, newest
//! first, with its phases, its throughput over time, its downtime and
//! where that went, and the bytes each pipeline stage saved.
//!
//! Where the numbers come from: the phases and the throughput from the
//! planner's reads of the migration's progress on its source (every
//! 200 ms, `moves.rs`); the downtime, its breakdown and the pipeline's
//! counters from the summary the source reports when it is done
//! (`roam_api::types::MigrationSummary`). Charts are inline SVG.

use std::fmt::Write;

use roam_api::types::MigrationSummary;
use serde_json::Value;

use super::fmt::{bar, bytes, esc, ms, rate, when};
use crate::history::{MigrationTrace, Outcome, Sample};

/// Page size of the transfer pipeline's counters.
const PAGE: u64 = 4096;
/// The course's last segment.
const DOWNTIME: &str = "downtime (cell paused)";
/// The charts' width in SVG units.
const W: f64 = 600.0;

/// The timeline as an HTML fragment.
pub(crate) fn render(migrations: &[MigrationTrace], now: u64) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<h2>Migrations <span class=\"count\">the last {} this planner started</span></h2>",
        migrations.len()
    );
    if migrations.is_empty() {
        h.push_str(
            "<p class=\"empty\">No migration since this planner started. Migrate a cell \
             from the Cells view, or drain a node.</p>",
        );
        return h;
    }
    for m in migrations {
        one(&mut h, m, now);
    }
    h
}

fn one(h: &mut String, m: &MigrationTrace, now: u64) {
    let (label, class) = match &m.outcome {
        Outcome::Running => ("under way", "warn"),
        Outcome::Done => ("done", "ok"),
        Outcome::Failed(_) => ("failed", "bad"),
        Outcome::Unfollowed(_) => ("unknown", "muted"),
    };
    let _ = write!(
        h,
        "<article class=\"migration\" data-migration=\"{id}\" data-cell=\"{cell}\">\
         <header><span class=\"pill {class}\">{label}</span> <code>{cell}</code> \
         <b>{from}</b> <span class=\"isa\">{from_isa}</span> → <b>{to}</b> \
         <span class=\"isa\">{to_isa}</span> <span class=\"sub\">{mode}, asked by {reason}, \
         started {started}</span></header>",
        id = esc(&m.id),
        cell = esc(&m.cell),
        from = esc(&m.from),
        from_isa = esc(&m.from_isa),
        to = esc(&m.to),
        to_isa = esc(&m.to_isa),
        mode = esc(&m.mode),
        reason = esc(m.reason),
        started = when(m.started_ms, now),
    );
    if let Outcome::Failed(why) | Outcome::Unfollowed(why) = &m.outcome {
        let _ = write!(h, "<p class=\"error\">{}</p>", esc(why));
    }
    if let Some(s) = &m.summary {
        let _ = write!(
            h,
            "<dl class=\"facts\"><dt>Total</dt><dd>{}</dd><dt>Downtime</dt><dd class=\"down\">{}\
             </dd><dt>Memory</dt><dd>{}</dd><dt>Modified</dt><dd>{}</dd><dt>On the wire</dt>\
             <dd>{}</dd><dt>Rounds</dt><dd>{}</dd></dl>",
            ms(s.total_ms),
            ms(s.downtime_ms),
            bytes(s.memory_bytes),
            bytes(s.modified_bytes),
            bytes(s.wire_bytes),
            s.rounds
        );
    }
    phases(h, m);
    if let Some(s) = &m.summary {
        downtime(h, s);
    }
    throughput(h, m);
    if let Some(s) = &m.summary {
        savings(h, s);
    }
    h.push_str("</article>");
}

/// Segments `(name, start ms, end ms)` of a bar, and the bar as SVG with
/// a legend.
fn segments_svg(h: &mut String, title: &str, total: f64, segs: &[(String, f64, f64)]) {
    if total <= 0.0 || segs.is_empty() {
        return;
    }
    let _ = write!(
        h,
        "<figure class=\"phases\"><figcaption>{}</figcaption>\
         <svg viewBox=\"0 0 {W} 18\" preserveAspectRatio=\"none\" role=\"img\" \
         aria-label=\"{}\">",
        esc(title),
        esc(title)
    );
    // The downtime in the course has its own colour; the other phases
    // take the palette's in turn.
    let class = |i: usize, name: &str| {
        if name == DOWNTIME {
            "phdown".to_string()
        } else {
            format!("ph{}", i % 7)
        }
    };
    for (i, (name, a, b)) in segs.iter().enumerate() {
        let x = a / total * W;
        let w = ((b - a) / total * W).max(0.5);
        let _ = write!(
            h,
            "<rect class=\"{}\" x=\"{x:.1}\" y=\"0\" width=\"{w:.1}\" height=\"18\">\
             <title>{}: {}</title></rect>",
            class(i, name),
            esc(name),
            esc(&ms(b - a))
        );
    }
    h.push_str("</svg><ul class=\"legend\">");
    for (i, (name, a, b)) in segs.iter().enumerate() {
        let _ = write!(
            h,
            "<li><i class=\"{}\"></i>{} <b>{}</b></li>",
            class(i, name),
            esc(name),
            esc(&ms(b - a))
        );
    }
    h.push_str("</ul></figure>");
}

/// The migration's course: the phases seen on the source until the pause,
/// then the downtime.
fn phases(h: &mut String, m: &MigrationTrace) {
    let total = match &m.summary {
        Some(s) => s.total_ms,
        None => m.samples.last().map_or(0.0, |s| s.elapsed_ms as f64),
    };
    let paused_at = m
        .summary
        .as_ref()
        .map(|s| (s.total_ms - s.downtime_ms).max(0.0));
    let end = paused_at.unwrap_or(total);
    let mut segs: Vec<(String, f64, f64)> = Vec::new();
    let seen = &m.phases;
    for (i, (name, at)) in seen.iter().enumerate() {
        let a = *at as f64;
        if a >= end {
            break;
        }
        let b = seen.get(i + 1).map_or(end, |(_, t)| (*t as f64).min(end));
        segs.push((name.clone(), a, b));
    }
    // Before the first reading: the migration was starting.
    let first = segs.first().map_or(end, |s| s.1);
    if first > 0.0 {
        segs.insert(0, ("starting".into(), 0.0, first));
    }
    if let Some(p) = paused_at {
        segs.push((DOWNTIME.into(), p, total));
    }
    segments_svg(
        h,
        "Phases (as the planner saw them, read every 200 ms)",
        total,
        &segs,
    );
}

/// Where the downtime went, from the source's breakdown.
fn downtime(h: &mut String, s: &MigrationSummary) {
    let Some(b) = &s.pause else {
        return;
    };
    let parts = [
        ("to the migration point's handoff", b.to_driver_ms),
        ("collecting dirty pages", b.collect_ms),
        ("encoding the last pages", b.encode_ms),
        ("last pages on the wire", b.wire_ms),
        ("files and log", b.files_log_ms),
        ("encoding the execution state", b.state_encode_ms),
        ("commit on the destination", b.commit_ms),
    ];
    let mut segs = Vec::new();
    let mut t = 0.0;
    for (name, d) in parts {
        if d > 0.0 {
            segs.push((name.to_string(), t, t + d));
            t += d;
        }
    }
    let title = format!(
        "Downtime {} ({} pages sent while paused, {} on the wire)",
        ms(s.downtime_ms),
        b.final_pages,
        bytes(b.paused_wire_bytes)
    );
    segments_svg(h, &title, t.max(s.downtime_ms), &segs);
}

/// Throughput over time: the rate between consecutive readings.
fn throughput(h: &mut String, m: &MigrationTrace) {
    let pts = rates(&m.samples);
    let total_ms = m.summary.as_ref().map_or_else(
        || m.samples.last().map_or(0.0, |s| s.elapsed_ms as f64),
        |s| s.total_ms,
    );
    if pts.len() < 2 {
        if let Some(s) = &m.summary {
            let avg = if s.total_ms > 0.0 {
                s.wire_bytes as f64 / (s.total_ms / 1000.0)
            } else {
                0.0
            };
            let _ = write!(
                h,
                "<p class=\"sub\">Throughput: {} on average; the migration was too short for \
                 the planner to read its course.</p>",
                rate(avg)
            );
        }
        return;
    }
    let peak = pts.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1.0);
    let span = total_ms.max(pts.last().map_or(1.0, |p| p.0)).max(1.0);
    let mut line = String::new();
    for (t, r) in &pts {
        let _ = write!(line, "{:.1},{:.1} ", t / span * W, 100.0 - r / peak * 95.0);
    }
    let _ = write!(
        h,
        "<figure class=\"chart\"><figcaption>Throughput on the wire (peak {}, over {})\
         </figcaption><svg viewBox=\"0 0 {W} 100\" preserveAspectRatio=\"none\" role=\"img\" \
         aria-label=\"throughput over time\"><line class=\"axis\" x1=\"0\" y1=\"100\" \
         x2=\"{W}\" y2=\"100\"/><polyline class=\"rate\" points=\"{}\"/></svg></figure>",
        rate(peak),
        ms(span),
        line.trim_end()
    );
}

/// `(midpoint ms, bytes/s)` between consecutive samples.
pub(crate) fn rates(samples: &[Sample]) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .filter_map(|w| {
            let dt = w[1].elapsed_ms.checked_sub(w[0].elapsed_ms)?;
            if dt == 0 {
                return None;
            }
            let db = w[1].wire_bytes.saturating_sub(w[0].wire_bytes);
            let mid = (w[0].elapsed_ms + w[1].elapsed_ms) as f64 / 2.0;
            Some((mid, db as f64 * 1000.0 / dt as f64))
        })
        .collect()
}

/// The bytes each pipeline stage removed, from the source's counters.
fn savings(h: &mut String, s: &MigrationSummary) {
    let Some(p) = s.pipeline.as_object() else {
        h.push_str("<p class=\"sub\">The source reported no pipeline statistics.</p>");
        return;
    };
    let n = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
    let bytes_in = n("bytes_in");
    if bytes_in == 0 {
        h.push_str("<p class=\"sub\">No page went through the pipeline.</p>");
        return;
    }
    let stages = [
        ("unchanged since sent", n("unchanged_pages") * PAGE),
        ("zero pages", n("zero_pages") * PAGE),
        ("the module's initial image", n("initial_pages") * PAGE),
        ("in the destination's chunk store", n("store_pages") * PAGE),
        ("duplicates in the stream", n("dup_pages") * PAGE),
        (
            "delta against the page sent before",
            n("delta_unchanged_bytes"),
        ),
        (
            "compression",
            n("compress_in_bytes").saturating_sub(n("compress_out_bytes")),
        ),
    ];
    let _ = write!(
        h,
        "<figure class=\"savings\"><figcaption>Bytes saved by each pipeline stage \
         ({} of pages in, {} out)</figcaption><table><tbody>",
        bytes(bytes_in),
        bytes(n("bytes_out"))
    );
    for (name, saved) in stages {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.0} %</td>\
             </tr>",
            esc(name),
            bar(saved as f64 / bytes_in as f64, "fill"),
            bytes(saved),
            saved as f64 * 100.0 / bytes_in as f64
        );
    }
    h.push_str("</tbody></table></figure>");
}
