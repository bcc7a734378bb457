//! Following a migration from the command line: a progress bar while it
//! runs, and the summary of where its time and bytes went when it is done.
//! Both `roam migrate` forms use it, the one that names the source node and
//! the one through the planner.

use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use roam_node::types::{MigrationStatus, MigrationSummary, PauseBreakdown};
use roam_node::Client;

use crate::human::bytes;

/// Follow migration `mid` on its source `src` to its end, with a progress
/// bar (none with `json`, which prints the final status instead).
pub async fn follow(src: &Client, mid: &str, json: bool) -> Result<MigrationStatus> {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {msg:32} {bar:30} {bytes}/{total_bytes} wire {prefix}",
        )
        .expect("a valid template"),
    );
    let mut last = (Instant::now(), 0u64);
    let status: MigrationStatus = loop {
        let s = src.migration(mid).await?;
        if s.done {
            break s;
        }
        let now = Instant::now();
        let dt = now.duration_since(last.0).as_secs_f64();
        if dt >= 0.5 {
            let rate = (s.wire_bytes.saturating_sub(last.1)) as f64 * 8.0 / dt / 1e6;
            bar.set_prefix(format!("{} ({rate:.1} Mbit/s)", bytes(s.wire_bytes)));
            last = (now, s.wire_bytes);
        }
        bar.set_length(s.memory_bytes.max(1));
        bar.set_position((s.pages_in * 4096).min(s.memory_bytes.max(1)));
        bar.set_message(s.phase.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    }
    Ok(status)
}

pub fn print_summary(cell: &str, from: &str, to: &str, s: &MigrationSummary) {
    println!(
        "migrated {cell} {from} → {to} ({} → {}), {}",
        s.from_isa, s.to_isa, s.mode
    );
    println!("  total time     {:>10.1} ms", s.total_ms);
    println!(
        "  downtime       {:>10.1} ms  (pages while paused {:.1} ms, commit {:.1} ms)",
        s.downtime_ms, s.paused_pages_ms, s.commit_ms
    );
    if let Some(b) = &s.pause {
        print_breakdown(b);
    }
    println!("  rounds         {:>10}", s.rounds);
    if let Some(t) = &s.tracking {
        println!("  dirty tracking {t:>10}");
    }
    println!("  memory         {:>13}", bytes(s.memory_bytes));
    println!("  modified state {:>13}", bytes(s.modified_bytes));
    println!(
        "  on the wire    {:>13}  ({:.3} × modified state)",
        bytes(s.wire_bytes),
        s.wire_bytes as f64 / s.modified_bytes.max(1) as f64
    );
    if let Some(p) = &s.post_copy {
        println!(
            "  post-copy      {} pages on demand in {} requests, {} pushed, complete after {:.1} ms",
            p.demand_pages, p.requests, p.pushed_pages, p.complete_ms
        );
    }
    if s.pipeline.is_object() {
        let n = |k: &str| s.pipeline[k].as_u64().unwrap_or(0);
        let ms = |k: &str| n(k) as f64 / 1e6;
        println!(
            "  pipeline       {} pages: {} zero, {} unchanged, {} as deltas, {} compressed; {} in → {} out",
            n("pages_in"),
            n("zero_pages"),
            n("unchanged_pages"),
            n("delta_pages"),
            n("compressed_pages"),
            bytes(n("bytes_in")),
            bytes(n("bytes_out")),
        );
        println!(
            "                 hashing {:.1} ms, dedup {:.1} ms, compression {:.1} ms",
            ms("hash_nanos"),
            ms("dedup_nanos"),
            ms("compress_nanos")
        );
    }
}

/// The downtime phase by phase, indented under it.
fn print_breakdown(b: &PauseBreakdown) {
    let row = |what: &str, v: f64| println!("    {what:<34} {v:>8.1} ms");
    println!(
        "    (pause requested → migration point {:.1} ms, while the cell ran)",
        b.request_to_point_ms
    );
    row("capture and handoff", b.to_driver_ms);
    row("last dirty pages collected", b.collect_ms);
    row(
        &format!(
            "{} paused pages encoded ({})",
            b.final_pages, b.final_encoding
        ),
        b.encode_ms,
    );
    row("… and on the wire", b.wire_ms);
    row("files and log", b.files_log_ms);
    row("execution state encoded", b.state_encode_ms);
    row(
        &format!("commit ({} B of state)", b.state_bytes),
        b.commit_ms,
    );
    if b.paused_wire_floor_ms > 0.0 {
        println!(
            "    ({} B on the wire while paused: {:.1} ms at the shaped bandwidth)",
            b.paused_wire_bytes, b.paused_wire_floor_ms
        );
    }
    if let Some(behind) = b.dest_behind_ms {
        row("  destination behind at the pause", behind);
    }
    if let Some(d) = &b.destination {
        row("  destination: last pages arriving", d.last_pages_read_ms);
        row("  destination: … of which applying", d.last_pages_apply_ms);
        row("  destination: pages still applying", d.backlog_ms);
        row("  destination: state decoded", d.decode_ms);
        row("  destination: state installed", d.install_ms);
        row("  destination: commit point, serve", d.register_ms);
        row("  destination: final state → running", d.to_running_ms);
    }
}
