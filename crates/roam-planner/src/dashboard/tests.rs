//! The dashboard's views with hostile strings in every field a node or the
//! store fills, and its routes on a real planner: the shell public, the
//! data behind the token, other sites' requests refused.

use std::sync::Arc;

use roam_api::sysinfo::Machine;
use roam_api::types::{MigrationSummary, PauseBreakdown};
use roam_cluster::{CellRecord, CellState, ClusterStore, Kept, NodeRecord, NodeState, NodeStatus};

use super::*;
use crate::history::{Decision, MigrationTrace, Outcome, Sample};
use crate::policy::{Candidate, Reason};

const EVIL: &str = "<script>alert(1)</script>\"'&";

/// No raw markup from [`EVIL`] may appear; its escaped form must.
fn assert_escaped(html: &str) {
    assert!(!html.contains("<script"), "{html}");
    assert!(!html.contains("alert(1)</"), "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"),
        "{html}"
    );
}

fn node(name: &str, state: NodeState) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        isa: "aarch64".into(),
        api: format!("http://x/{EVIL}"),
        migrate: "127.0.0.1:1".into(),
        version: EVIL.into(),
        status: NodeStatus {
            machine: Machine {
                cores: 4,
                memory_total: 8 << 30,
                memory_available: 6 << 30,
                load1: 1.5,
            },
            cells: vec![],
            gateway: None,
            usage: vec![],
            power: None,
            memory_server: None,
        },
        state,
        alive: true,
        registered_ms: 1_000,
        heartbeat_ms: 9_000,
        maintenance: None,
    }
}

fn cell(id: &str, owner: &str, state: CellState) -> CellRecord {
    CellRecord {
        id: id.into(),
        module: "0".repeat(64),
        args: vec![EVIL.into(), "8".into()],
        env: vec![],
        dirs: vec![],
        max_memory: Some(64 << 20),
        service: Some("kv".into()),
        owner: owner.into(),
        generation: 1,
        state,
        checkpoint_interval_s: 30,
        kept: Some(Kept {
            holder: "edge-b".into(),
            snapshot: "1".repeat(64),
            bytes: 3 << 20,
            taken_ms: 5_000,
            generation: 1,
        }),
        created_ms: 2_000,
        handoff: None,
        far: None,
    }
}

#[test]
fn nodes_view_escapes_what_nodes_report_and_offers_the_right_button() {
    let nodes = [
        node("edge-a", NodeState::Ready),
        node("edge-b", NodeState::Draining),
    ];
    let mut nodes = nodes;
    // A gateway address is any printable text a node sends.
    nodes[0].status.gateway = Some(roam_api::planner::GatewayPath {
        address: EVIL.replace(' ', ""),
        id: None,
        connected: true,
        rtt_us: Some(4_200),
        services: vec![],
    });
    nodes[1].maintenance = Some(roam_cluster::Maintenance {
        start_ms: 1_796_090_400_000,
        end_ms: 1_796_094_000_000,
        lead_ms: 300_000,
        drained: true,
    });
    nodes[1].status.power = Some(roam_api::power::PowerReport {
        model: "idle=2,busy=1,speed=0.25".parse().unwrap(),
        watts: 3.25,
        joules: 4_200.0,
    });
    let cells = [cell("c-1", "edge-a", CellState::Running)];
    let h = nodes::render(&nodes, &cells, 12_000);
    assert_escaped(&h);
    assert!(h.contains("no model"), "{h}");
    assert!(
        h.contains("maintenance 2026-12-01 02:00:00 UTC to 2026-12-01 03:00:00 UTC"),
        "{h}"
    );
    assert!(
        h.contains("3.2 W<div class=\"sub\">4.2 kJ since start · 4.0 J per unit of work"),
        "{h}"
    );
    assert!(h.contains("4.2 ms<div class=\"sub\">&lt;script"), "{h}");
    assert!(h.contains("no gateway"), "{h}");
    assert!(h.contains("data-act=\"drain\" data-node=\"edge-a\""), "{h}");
    assert!(
        h.contains("data-act=\"undrain\" data-node=\"edge-b\""),
        "{h}"
    );
    assert!(h.contains("2.0 GiB used of 8.0 GiB"), "{h}");
    assert!(h.contains("1.50 on 4 cores"), "{h}");
    assert!(h.contains("3 s ago"), "{h}");
    assert!(h.contains(">aarch64<"), "{h}");
}

#[test]
fn cells_view_escapes_args_and_errors() {
    let nodes = [
        node("edge-a", NodeState::Ready),
        node("edge-b", NodeState::Ready),
    ];
    let cells = [
        cell("c-1", "edge-a", CellState::Running),
        cell("c-2", "edge-a", CellState::Failed { error: EVIL.into() }),
    ];
    let h = cells::render(&nodes, &cells, 62_000);
    assert_escaped(&h);
    // Migrate to the other node only; kill on the live cell.
    assert!(
        h.contains("<option value=\"edge-b\">edge-b (aarch64)</option>"),
        "{h}"
    );
    assert!(!h.contains("<option value=\"edge-a\">"), "{h}");
    assert!(h.contains("data-act=\"kill\" data-cell=\"c-1\""), "{h}");
    assert!(!h.contains("data-act=\"kill\" data-cell=\"c-2\""), "{h}");
    assert!(h.contains("3.0 MiB on edge-b"), "{h}");
    assert!(h.contains("1 min ago"), "{h}");
    assert!(h.contains("64.0 MiB"), "{h}");
}

fn trace(outcome: Outcome) -> MigrationTrace {
    let pipeline = serde_json::json!({
        "bytes_in": 8u64 << 20, "bytes_out": 1u64 << 20, "zero_pages": 1024,
        "unchanged_pages": 0, "initial_pages": 2, "store_pages": 0, "dup_pages": 3,
        "delta_unchanged_bytes": 4096, "compress_in_bytes": 4u64 << 20,
        "compress_out_bytes": 1u64 << 20,
    });
    MigrationTrace {
        id: "m-1".into(),
        cell: "c-1".into(),
        from: "edge-a".into(),
        to: "edge-b".into(),
        from_isa: "x86_64".into(),
        to_isa: "aarch64".into(),
        mode: "pre-copy".into(),
        reason: "user",
        started_ms: 1_000,
        ended_ms: Some(3_000),
        phases: vec![
            (EVIL.into(), 0),
            ("round 1".into(), 400),
            ("paused".into(), 1_900),
        ],
        samples: vec![
            Sample {
                elapsed_ms: 200,
                wire_bytes: 0,
            },
            Sample {
                elapsed_ms: 400,
                wire_bytes: 1 << 20,
            },
            Sample {
                elapsed_ms: 600,
                wire_bytes: 3 << 20,
            },
        ],
        outcome,
        summary: Some(MigrationSummary {
            mode: "pre-copy".into(),
            total_ms: 2_000.0,
            downtime_ms: 40.0,
            wire_bytes: 5 << 20,
            memory_bytes: 16 << 20,
            modified_bytes: 8 << 20,
            rounds: 3,
            pipeline,
            pause: Some(PauseBreakdown {
                to_driver_ms: 2.0,
                encode_ms: 10.0,
                wire_ms: 8.0,
                commit_ms: 20.0,
                final_pages: 12,
                ..PauseBreakdown::default()
            }),
            ..MigrationSummary::default()
        }),
    }
}

#[test]
fn the_timeline_shows_phases_throughput_downtime_and_savings() {
    let h = migrations::render(&[trace(Outcome::Failed(EVIL.into()))], 10_000);
    assert_escaped(&h);
    assert!(h.contains("Downtime 40 ms"), "{h}");
    assert!(h.contains("commit on the destination <b>20 ms</b>"), "{h}");
    assert!(h.contains("round 1 <b>1.50 s</b>"), "{h}");
    assert!(h.contains("<polyline class=\"rate\""), "{h}");
    // 2 MiB in 200 ms: 10 MiB/s at the peak.
    assert!(h.contains("peak 10.0 MiB/s"), "{h}");
    assert!(h.contains("zero pages</td>"), "{h}");
    assert!(h.contains("4.0 MiB</td><td class=\"num\">50 %"), "{h}");
    assert!(h.contains("compression</td>"), "{h}");
    assert!(h.contains("3.0 MiB</td><td class=\"num\">38 %"), "{h}");
    assert_eq!(
        migrations::rates(&trace(Outcome::Done).samples),
        vec![(300.0, 5_242_880.0), (500.0, 10_485_760.0)]
    );
}

#[test]
fn decisions_say_why_each_node_was_or_was_not_chosen() {
    let c = |node: &str, score: Result<i64, Reason>| Candidate {
        node: node.into(),
        cells: 1,
        cores: 4,
        memory_available: 1 << 30,
        score,
    };
    let d = Decision::new(
        EVIL,
        Some("c-1".into()),
        "least-loaded",
        &[
            c("edge-a", Ok(1)),
            c("edge-b", Err(Reason::Draining)),
            c("edge-c", Ok(7)),
        ],
    );
    let h = decisions::render("least-loaded", Some(EVIL), &[d], 10_000);
    assert_escaped(&h);
    assert!(h.contains("→ edge-c"), "{h}");
    assert!(h.contains("<b>edge-c</b> chosen"), "{h}");
    assert!(h.contains("<b>edge-a</b> ranked 2nd"), "{h}");
    assert!(h.contains("<b>edge-b</b> filtered out: draining"), "{h}");
    assert!(h.contains("1 cell on 4 cores, 1.0 GiB free"), "{h}");
    // The chosen node is listed first.
    assert!(h.find("edge-c").unwrap() < h.find("edge-a").unwrap(), "{h}");
}

#[test]
fn the_learned_slowdowns_are_shown_with_their_ratios() {
    use crate::slowdown::{Learn, Table};
    assert!(slowdowns::render(&Table::default()).contains("Nothing learned yet"));
    let mut t = Table::default();
    t.learn("ab12", EVIL, &[("x86_64".into(), 2000)]);
    t.learn("ab12", EVIL, &[("aarch64".into(), 12000)]);
    t.learn("cd34", "only-here", &[("x86_64".into(), 500)]);
    let h = slowdowns::render(&t);
    assert_escaped(&h);
    assert!(h.contains("<th>aarch64</th><th>x86_64</th>"), "{h}");
    assert!(h.contains("aarch64 ÷ x86_64: 6.00×"), "{h}");
    assert!(h.contains("2.00 s <span class=\"sub\">(1.0 runs)"), "{h}");
    // A program known on one ISA has no ratio, and a dash where unknown.
    assert!(
        h.contains("only-here</td><td><code>cd34</code></td><td class=\"num\">–</td>"),
        "{h}"
    );
}

#[test]
fn only_same_origin_browser_requests_pass() {
    let h = |pairs: &[(&'static str, &'static str)]| {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, HeaderValue::from_static(v));
        }
        same_origin(&m)
    };
    // A program: no browser headers.
    assert!(h(&[("host", "127.0.0.1:7600")]).is_ok());
    assert!(h(&[
        ("host", "p:1"),
        ("sec-fetch-site", "same-origin"),
        ("origin", "http://p:1")
    ])
    .is_ok());
    assert!(h(&[("host", "p:1"), ("origin", "https://p:1")]).is_ok());
    assert!(h(&[("host", "p:1"), ("sec-fetch-site", "none")]).is_ok());
    assert!(h(&[("host", "p:1"), ("sec-fetch-site", "cross-site")]).is_err());
    assert!(h(&[("host", "p:1"), ("sec-fetch-site", "same-site")]).is_err());
    assert!(h(&[("host", "p:1"), ("origin", "http://evil:1")]).is_err());
    assert!(h(&[("host", "p:1"), ("origin", "null")]).is_err());
    assert!(h(&[("origin", "http://p:1")]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_is_public_and_the_data_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ClusterStore> =
        Arc::new(roam_cluster::RedbStore::open(dir.path().join("c.redb")).unwrap());
    let mut cfg = crate::PlannerConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.checkpoint_interval_s = 0;
    let token = "dashboard-test-token-0123456789";
    cfg.token = Some(roam_auth::Token::new(token, "in the test").unwrap());
    let p = crate::Planner::bind(cfg, store).await.unwrap();
    let url = p.url();
    tokio::spawn(p.serve(std::future::pending()));
    let http = reqwest::Client::new();

    for (path, kind) in [
        ("/", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/style.css", "text/css"),
    ] {
        let r = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert!(h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'"));
        assert_eq!(h["x-frame-options"], "DENY");
    }
    for view in ["nodes", "cells", "migrations", "decisions"] {
        let path = format!("{url}/v1/dashboard/{view}");
        let r = http.get(&path).send().await.unwrap();
        assert_eq!(r.status(), 401, "{view} without the token");
        let r = http.get(&path).bearer_auth(token).send().await.unwrap();
        assert_eq!(r.status(), 200, "{view}");
        assert_eq!(r.headers()["cache-control"], "no-store");
        let body = r.text().await.unwrap();
        assert!(body.starts_with("<h2>"), "{body}");
    }
    // Another site's page cannot use a browser's credentials, on the
    // dashboard's routes or the API's.
    let r = http
        .post(format!("{url}/v1/nodes/edge-a/drain"))
        .bearer_auth(token)
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http
        .get(format!("{url}/v1/dashboard/nodes"))
        .bearer_auth(token)
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body = r.text().await.unwrap();
    assert!(body.contains("another site"), "{body}");
}
