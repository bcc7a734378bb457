//! The planner's web dashboard in a real headless Chromium: the page a
//! person opens at `/`, its views filled by its script, its buttons
//! clicked, what they did checked through the API.
//!
//! Two stories. On a planner with a token: the page shows nothing until
//! the token is typed in; a node registered with markup in its version and
//! address shows that markup as text; drain and undrain from the page's
//! buttons change the node's state. On a real cluster (a plain planner on
//! loopback and two real nodes): the views show the nodes, the cells, a
//! migration's timeline and the policy decisions; draining a node from
//! the page moves its cells; killing a cell from the page kills it; and
//! each view is saved as a screenshot (into `ROAM_DASHBOARD_SCREENSHOTS`
//! when set, the way `docs/dashboard/*.png` are made).
//!
//! Chromium is Debian's `chromium`: under `CI=true` a missing one fails
//! the test, naming it; elsewhere the test is skipped with the reason.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use super::common::*;

/// How long a view may take to show what the test waits for.
const VIEW: Duration = Duration::from_secs(60);
const TOKEN: &str = "dashboard-token-0123456789abcdef";

/// One HTTP/1.0 request with the bearer token: status and body as JSON.
fn authed(addr: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let reply = text(&buf);
    let status = reply.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = &reply[reply.find("\r\n\r\n").unwrap() + 4..];
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A `roam planner` with a token, on the embedded store; killed on drop.
struct TokenPlanner {
    child: std::process::Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl TokenPlanner {
    fn start() -> TokenPlanner {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = roam(Isa::X86_64);
        // A long lease: the registered node sends no heartbeat.
        cmd.args(["planner", "--listen", &addr, "--checkpoint-interval", "0"])
            .args(["--lease", "600"])
            .arg("--store")
            .arg(format!(
                "redb:{}",
                dir.path().join("cluster.redb").display()
            ))
            .arg("--token-file")
            .arg(&token);
        let mut child = spawn_logged(&mut cmd, &dir.path().join("planner.log"));
        // The page's shell is public: it answers before any token.
        wait_for("the planner to serve its page", SLOW, || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("the planner exited ({st})");
            }
            http_get(&addr, "/").ok().filter(|(st, _)| *st == 200)
        });
        TokenPlanner { child, addr, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("planner.log")).unwrap_or_default()
    }

    fn node_state(&self, name: &str) -> String {
        let (st, nodes) = authed(&self.addr, "GET", "/v1/nodes", None);
        assert_eq!(st, 200, "{nodes}");
        let n = nodes.as_array().unwrap().iter().find(|n| n["name"] == name);
        n.map_or_else(String::new, |n| n["state"].as_str().unwrap().to_string())
    }
}

impl Drop for TokenPlanner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Click the button `selector` (confirmations accepted) and wait for the
/// status line to say `expect`.
fn click(b: &mut Browser, selector: &str, expect: &str) {
    b.wait(
        &format!("the button {selector}"),
        VIEW,
        &format!("!!document.querySelector('{selector}')"),
    );
    b.eval(&format!(
        "window.confirm = () => true; document.querySelector('{selector}').click(); true"
    ));
    let js = format!(
        "document.getElementById('status').textContent.includes({}) && \
         document.getElementById('status').textContent",
        json!(expect)
    );
    b.wait(&format!("the status line to say {expect:?}"), VIEW, &js);
}

#[test]
fn dashboard_needs_the_token_escapes_what_nodes_say_and_drains_from_its_buttons() {
    if !have_chromium() {
        return;
    }
    let p = TokenPlanner::start();
    let url = format!("http://{}", p.addr);

    // Without the token the page loads but shows no data, and says why.
    let dom = dump_dom(&format!("{url}/#nodes"), 5000);
    assert!(dom.contains("The planner needs its token"), "{dom}");
    assert!(!dom.contains("<table"), "{dom}");

    // A node whose version and address carry markup.
    let (st, v) = authed(
        &p.addr,
        "POST",
        "/v1/nodes",
        Some(&json!({"name": "evil", "isa": "riscv64",
            "api": "http://x/<img/src=x/onerror=document.title='pwned'>",
            "migrate": "127.0.0.1:2", "version": "<script>document.title='pwned'</script>",
            "status": {"machine": {"cores": 4, "memory_total": 8u64 << 30,
                "memory_available": 6u64 << 30, "load1": 0.5}, "cells": []}})),
    );
    assert_eq!(st, 200, "{v}\n{}", p.log());

    let mut b = Browser::open(&format!("{url}/#nodes"), 1400, 900);
    b.wait(
        "the page to ask for the token",
        VIEW,
        "document.getElementById('status').textContent.includes('needs its token')",
    );
    b.eval(&format!(
        "document.getElementById('token').value = {}; \
         document.getElementById('auth').requestSubmit(); true",
        json!(TOKEN)
    ));
    b.wait(
        "the node to show",
        VIEW,
        "!!document.querySelector('tr.node[data-node=\"evil\"]')",
    );
    // The markup shows as text and did nothing.
    let seen = b.eval(
        "({title: document.title, imgs: document.querySelectorAll('img').length, \
          scripts: document.querySelectorAll('script').length, \
          text: document.getElementById('view-nodes').innerText, \
          stored: sessionStorage.getItem('roam-planner-token'), \
          kept: localStorage.length})",
    );
    assert_eq!(seen["title"], "roam planner", "{seen}");
    assert_eq!(seen["imgs"], 0, "{seen}");
    assert_eq!(seen["scripts"], 1, "{seen}");
    let t = seen["text"].as_str().unwrap();
    assert!(t.contains("<script>document.title='pwned'</script>"), "{t}");
    assert!(
        t.contains("<img/src=x/onerror=document.title='pwned'>"),
        "{t}"
    );
    assert!(t.contains("riscv64"), "{t}");
    // The token stays in this tab only.
    assert_eq!(seen["stored"], TOKEN, "{seen}");
    assert_eq!(seen["kept"], 0, "{seen}");

    click(
        &mut b,
        "button[data-act=\"drain\"][data-node=\"evil\"]",
        "Draining evil",
    );
    assert_eq!(p.node_state("evil"), "draining", "{}", p.log());
    click(
        &mut b,
        "button[data-act=\"undrain\"][data-node=\"evil\"]",
        "undrain done",
    );
    assert_eq!(p.node_state("evil"), "ready", "{}", p.log());
}

/// Where the screenshots go: `ROAM_DASHBOARD_SCREENSHOTS` (relative to
/// the repository) or a temporary directory.
fn shots() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("ROAM_DASHBOARD_SCREENSHOTS") {
        Some(d) => {
            let d = repo_root().join(d);
            std::fs::create_dir_all(&d).unwrap();
            (d, None)
        }
        None => {
            let t = tempfile::tempdir().unwrap();
            (t.path().to_path_buf(), Some(t))
        }
    }
}

#[test]
fn dashboard_shows_a_real_cluster_and_its_buttons_move_and_kill_cells() {
    if !have_chromium() {
        return;
    }
    let p = Planner::start(None, &["--checkpoint-interval", "0"]);
    let a = registered_node(&p, "edge-a");
    let _b = registered_node(&p, "edge-b");
    let hash = p.upload(&std::fs::read(workload(WORKLOAD)).unwrap());
    let long = ["dirty", "8", "4", "600"];
    let (st, c1) = p.api_post(
        "/v1/cells",
        json!({"module": hash, "args": long, "node": "edge-a"}),
    );
    assert_eq!(st, 200, "{c1}\n{}", p.log());
    let c1 = c1["id"].as_str().unwrap().to_string();
    // The second by policy: least-loaded picks the idle edge-b.
    let (st, c2) = p.api_post("/v1/cells", json!({"module": hash, "args": long}));
    assert_eq!(st, 200, "{c2}\n{}", p.log());
    assert_eq!(c2["owner"], "edge-b", "{c2}");
    let c2 = c2["id"].as_str().unwrap().to_string();
    wait_for("the first cell to allocate its state", SLOW, || {
        let c = a.cell(&c1)?;
        (c["memory_bytes"].as_u64()? >= 8 << 20).then_some(())
    });
    let (st, m) = p.api_post(&format!("/v1/cells/{c1}/migrate"), json!({"to": "edge-b"}));
    assert_eq!(st, 200, "{m}\n{}", p.log());
    p.wait_cell(&c1, "the move to edge-b", |c| {
        c["owner"] == "edge-b" && c["state"]["state"] == "running"
    });

    // What a page loaded without a session shows, as the DOM after its
    // script ran.
    let url = p.url.clone();
    let dom = dump_dom(&format!("{url}/#cells"), 5000);
    for s in [c1.as_str(), c2.as_str(), "edge-b", "x86_64", "Migrate"] {
        assert!(dom.contains(s), "no {s:?} in the cells view:\n{dom}");
    }
    let dom = dump_dom(&format!("{url}/#nodes"), 5000);
    for s in ["edge-a", "edge-b", "ready", "data-act=\"drain\""] {
        assert!(dom.contains(s), "no {s:?} in the nodes view:\n{dom}");
    }

    // Drain edge-b from the page: both cells move to edge-a.
    let mut b = Browser::open(&format!("{url}/#nodes"), 1400, 900);
    click(
        &mut b,
        "button[data-act=\"drain\"][data-node=\"edge-b\"]",
        "Draining edge-b: 2 cell(s) moving",
    );
    for id in [&c1, &c2] {
        p.wait_cell(id, "the drained cell to run on edge-a", |c| {
            c["owner"] == "edge-a" && c["state"]["state"] == "running"
        });
    }
    click(
        &mut b,
        "button[data-act=\"undrain\"][data-node=\"edge-b\"]",
        "undrain done",
    );
    let (_, nodes) = p.api_get("/v1/nodes");
    assert!(
        nodes
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["state"] == "ready"),
        "{nodes}"
    );

    // Each view, checked and photographed.
    let (dir, _keep) = shots();
    let views = [
        ("nodes", "document.querySelectorAll('tr.node').length === 2 && !!document.querySelector('tr.node[data-node=\"edge-b\"] button[data-act=\"drain\"]')"),
        ("cells", "document.querySelectorAll('#cells-table tr.cell').length === 2"),
        ("migrations", "document.querySelectorAll('article.migration .pill.ok').length === 3 && document.querySelectorAll('figure.savings').length === 3"),
        ("decisions", "document.querySelectorAll('tr.decision').length >= 5"),
    ];
    for (view, ready) in views {
        b.eval(&format!("location.hash = '{view}'; true"));
        b.wait(&format!("the {view} view"), VIEW, ready);
        let shown = b.eval(&format!("document.getElementById('view-{view}').innerText"));
        let shown = shown.as_str().unwrap();
        let expect: &[&str] = match view {
            "nodes" => &["edge-a", "edge-b", "x86_64", "cores"],
            "cells" => &[&c1, &c2, "edge-a", "running"],
            "migrations" => &[
                &c1,
                "edge-a",
                "edge-b",
                "Downtime",
                "Bytes saved by each pipeline stage",
                "zero pages",
            ],
            _ => &[
                "drain of edge-b",
                "least-loaded",
                "manual",
                "chosen",
                "filtered out: the cell's owner",
            ],
        };
        for s in expect {
            assert!(shown.contains(s), "no {s:?} in the {view} view:\n{shown}");
        }
        b.screenshot(&dir.join(format!("{view}.png")));
    }

    // Kill the second cell from the page.
    b.eval("location.hash = 'cells'; true");
    click(
        &mut b,
        &format!("button[data-act=\"kill\"][data-cell=\"{c2}\"]"),
        "kill done",
    );
    assert_eq!(p.cell(&c2)["state"]["state"], "killed");
    assert_eq!(p.cell(&c1)["state"]["state"], "running");
}
