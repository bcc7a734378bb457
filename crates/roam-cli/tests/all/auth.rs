//! Authentication, end to end: `roam cert`, nodes with mutual TLS and
//! bearer tokens, and the clients and peers they must refuse.
//!
//! Each refusal is checked twice: the command fails, and the node's state
//! did not change (no cell was launched). A migration between two nodes
//! with mutual TLS is compared with an uninterrupted run, like the plain
//! migrations in `nodes.rs`.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::*;

mod gateway;

fn launch_args(node: &AuthNode) -> Vec<String> {
    let mut v: Vec<String> = vec!["launch".into(), "--node".into(), node.url.clone()];
    v.push(workload(WORKLOAD).to_str().unwrap().to_string());
    v.push("--".into());
    v.extend(SMALL.iter().map(|s| s.to_string()));
    v
}

/// `roam launch` of the workload with `creds`.
fn try_launch(node: &AuthNode, creds: &[String]) -> Output {
    let args = launch_args(node);
    // The credentials go before `--`, which ends roam's own options.
    let dash = args.iter().position(|a| a == "--").unwrap();
    let mut cmd = client_cmd(&[], &[]);
    cmd.args(&args[..dash]).args(creds).args(&args[dash..]);
    run_bounded(cmd, SLOW)
}

#[test]
fn cert_writes_the_files_with_safe_modes_and_says_what_next() {
    let pki = pki();
    for f in [
        "ca-key.pem",
        "node-a-key.pem",
        "node-b-key.pem",
        "alice-key.pem",
    ] {
        let m = std::fs::metadata(pki.dir.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, 0o600, "{f} has mode {m:o}");
    }
    for f in ["ca.pem", "node-a.pem", "alice.pem"] {
        let pem = std::fs::read_to_string(pki.dir.join(f)).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{f}: {pem}");
    }
    let ca_out = text(&pki.outputs[0].stdout);
    assert!(
        ca_out.contains("ca-key.pem") && ca_out.contains("roam cert node"),
        "{ca_out}"
    );
    let node_out = text(&pki.outputs[2].stdout);
    assert!(
        node_out.contains("10.0.0.5") && node_out.contains("b.local"),
        "{node_out}"
    );
    assert!(node_out.contains("--tls-cert"), "{node_out}");
    assert!(node_out.contains("node certificate"), "{node_out}");
    let far_out = text(&pki.outputs[9].stdout);
    assert!(
        far_out.contains("10.0.0.7")
            && !far_out.contains("127.0.0.1")
            && !far_out.contains("localhost"),
        "{far_out}"
    );
    let gw_out = text(&pki.outputs[7].stdout);
    assert!(
        gw_out.contains("gateway certificate")
            && gw_out.contains("client: only the planner's GET /v1/services"),
        "{gw_out}"
    );
    assert!(text(&pki.outputs[8].stdout).contains("planner certificate"));

    // Nothing is overwritten without --force, and nothing is written at all.
    let d = tempfile::tempdir().unwrap();
    let ds = d.path().to_str().unwrap();
    assert!(roam_cert(&["ca", "--out", ds]).status.success());
    let before = std::fs::read(d.path().join("ca-key.pem")).unwrap();
    let again = roam_cert(&["ca", "--out", ds]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("--force"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(std::fs::read(d.path().join("ca-key.pem")).unwrap(), before);

    // A symlink planted where a key goes is never written through, even
    // with --force: the link is replaced, its target untouched.
    let victim = d.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, d.path().join("n1-key.pem")).unwrap();
    let refused = roam_cert(&["node", "n1", "--ca", ds, "--out", ds]);
    assert!(!refused.status.success());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!d.path().join("n1.pem").exists(), "half a pair was written");
    let forced = roam_cert(&["node", "n1", "--ca", ds, "--out", ds, "--force"]);
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let key = std::fs::symlink_metadata(d.path().join("n1-key.pem")).unwrap();
    assert!(key.file_type().is_file() && key.permissions().mode() & 0o777 == 0o600);

    // Names that could become paths are refused.
    let bad = roam_cert(&["node", "../x", "--ca", ds, "--out", ds]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("DNS name"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn mtls_nodes_migrate_a_workload_cell_unchanged() {
    let pki = pki();
    let expected = reference(&SMALL);
    let a = AuthNode::start(&pki.node_flags("node-a"));
    let b = AuthNode::start(&pki.node_flags("node-b"));
    assert!(a.url.starts_with("https://"), "{}", a.url);
    let creds = pki.client("ca.pem", Some("alice"), None);
    let out = try_launch(&a, &creds);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        a.log()
    );
    let id = text(&out.stdout).trim().to_string();
    let state_bytes = SMALL[0].parse::<u64>().unwrap() << 20;
    wait_for("the cell to allocate its state", SLOW, || {
        let c = a.cell(&creds, &id).unwrap();
        assert_eq!(c["state"], "running", "{c}\n{}", a.log());
        (c["memory_bytes"].as_u64().unwrap() >= state_bytes).then_some(())
    });
    let mig = run_bounded(
        client_cmd(
            &[
                "migrate", &id, "--from", &a.url, "--to", &b.url, "--mode", "pre-copy", "--json",
            ],
            &creds,
        ),
        SLOW,
    );
    assert!(
        mig.status.success(),
        "roam migrate: {}\n{}\n{}",
        text(&mig.stderr),
        a.log(),
        b.log()
    );
    let start = Instant::now();
    let end = loop {
        let c = b.cell(&creds, &id).expect("the cell is on the destination");
        if !matches!(c["state"].as_str(), Some("running" | "migrating")) {
            break c;
        }
        assert!(start.elapsed() < SLOW, "the cell did not end\n{}", b.log());
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(end["hops"], 1, "{end}");
    assert_eq!(a.cell(&creds, &id).unwrap()["state"], "moved");
    // Through the source: the log request follows the cell to the
    // destination over TLS.
    let logs = run_client(&["logs", &id, "--node", &a.url], &creds);
    assert!(logs.status.success(), "roam logs: {}", text(&logs.stderr));
    assert_eq!(
        text(&logs.stdout),
        text(&expected),
        "the migrated cell's output differs from an uninterrupted run\n{}\n{}",
        a.log(),
        b.log()
    );
}

#[test]
fn clients_without_the_right_credentials_are_refused_and_launch_nothing() {
    let pki = pki();
    let mut flags = pki.node_flags("node-a");
    flags.extend(["--token-file".to_string(), pki.p("token")]);
    let n = AuthNode::start(&flags);
    let refused: [(&str, Vec<String>, &str); 5] = [
        (
            "no client certificate",
            pki.client("ca.pem", None, Some("token")),
            "",
        ),
        (
            "a certificate from another CA",
            pki.client("evil/ca.pem", Some("evil/mallory"), Some("token")),
            "",
        ),
        (
            "our CA, another CA's client certificate",
            pki.client("ca.pem", Some("evil/mallory"), Some("token")),
            "",
        ),
        (
            "a wrong token",
            pki.client("ca.pem", Some("alice"), Some("wrong-token")),
            "bearer token",
        ),
        (
            "no token",
            pki.client("ca.pem", Some("alice"), None),
            "bearer token",
        ),
    ];
    for (what, creds, says) in &refused {
        let out = try_launch(&n, creds);
        assert!(
            !out.status.success(),
            "{what}: roam launch succeeded: {}",
            text(&out.stdout)
        );
        let err = text(&out.stderr);
        assert!(err.contains(says), "{what}: {err}");
    }
    // Plain HTTP to the TLS port gets nowhere either.
    let plain = n.url.replace("https://", "http://");
    let out = run_client(&["cells", "--node", &plain], &[]);
    assert!(!out.status.success(), "plain HTTP was answered");
    // The node's state is unchanged: no cell, no module.
    assert_eq!(n.cells(&pki.alice()), Vec::<Value>::new(), "{}", n.log());
    let log = n.log();
    assert!(log.contains("TLS handshake refused"), "{log}");
    assert!(!log.contains("launched"), "a cell was launched:\n{log}");
    // And the right credentials work.
    let out = try_launch(&n, &pki.alice());
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), n.log());
    assert_eq!(n.cells(&pki.alice()).len(), 1);
}

#[test]
fn a_gateway_certificate_opens_no_node_and_the_planners_does() {
    let pki = pki();
    let node = AuthNode::start(&pki.node_flags("node-a"));
    let gw = pki.client("ca.pem", Some("gw"), None);
    let out = try_launch(&node, &gw);
    assert!(
        !out.status.success(),
        "a gateway certificate launched a cell"
    );
    let out = run_client(&["cells", "--node", &node.url, "--json"], &gw);
    assert!(!out.status.success(), "a gateway certificate listed cells");
    // The planner (and operators) are served.
    let plan = pki.client("ca.pem", Some("plan"), None);
    let out = run_client(&["cells", "--node", &node.url, "--json"], &plan);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        node.log()
    );
    assert!(node.cells(&pki.alice()).is_empty());
}

/// Per route: the control API admits another node's certificate (nodes
/// call each other's `resolve` and kept-checkpoint routes), but a node may
/// not launch or list cells there; the planner and operators may.
#[test]
fn another_nodes_certificate_launches_and_lists_nothing() {
    let pki = pki();
    let node = AuthNode::start(&pki.node_flags("node-a"));
    let b = pki.client("ca.pem", Some("node-b"), None);
    let out = try_launch(&node, &b);
    assert!(!out.status.success(), "a node certificate launched a cell");
    assert!(
        text(&out.stderr).contains("only a planner or client certificate may"),
        "{}",
        text(&out.stderr)
    );
    let out = run_client(&["cells", "--node", &node.url, "--json"], &b);
    assert!(!out.status.success(), "a node certificate listed cells");
    assert!(node.cells(&pki.alice()).is_empty());
    let out = try_launch(&node, &pki.alice());
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        node.log()
    );
}

#[test]
fn a_node_refuses_a_certificate_of_another_role_at_start() {
    let pki = pki();
    for (cert, role) in [("gw", "gateway"), ("plan", "planner"), ("alice", "client")] {
        let err = node_fails(&[
            "--name",
            cert,
            "--listen",
            "127.0.0.1:0",
            "--migrate-listen",
            "127.0.0.1:0",
            "--tls-ca",
            &pki.p("ca.pem"),
            "--tls-cert",
            &pki.p(&format!("{cert}.pem")),
            "--tls-key",
            &pki.p(&format!("{cert}-key.pem")),
        ]);
        assert!(
            err.contains("not a node certificate") && err.contains(role),
            "{role}: {err}"
        );
    }
}

#[test]
fn a_token_alone_protects_a_plain_control_api() {
    let pki = pki();
    let n = AuthNode::start(&["--token-file".to_string(), pki.p("token")]);
    assert!(n.url.starts_with("http://"), "{}", n.url);
    let token = |t: &str| vec!["--token-file".to_string(), pki.p(t)];
    for creds in [vec![], token("wrong-token")] {
        let out = try_launch(&n, &creds);
        assert!(!out.status.success(), "{creds:?}: launched");
        assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));
    }
    assert!(n.cells(&token("token")).is_empty());
    let out = try_launch(&n, &token("token"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(n.cells(&token("token")).len(), 1);
}

/// What the migration port sends a plain TCP client that connects and
/// then sends a frame header: everything until the port closes, or 3 s.
fn plain_probe(addr: &str) -> (Vec<u8>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut first = vec![0u8; 4096];
    let n = s.read(&mut first).unwrap_or(0);
    first.truncate(n);
    // A frame header (length, CRC) and a few payload bytes.
    let _ = s.write_all(&[16, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    (first, rest)
}

#[test]
fn plain_tcp_to_the_tls_migration_port_is_refused_before_any_message() {
    let pki = pki();
    // A plain node's migration port sends its Hello at once: the probe
    // sees it.
    let plain = AuthNode::start(&[]);
    let (hello, _) = plain_probe(&plain.migrate);
    assert!(
        !hello.is_empty(),
        "the probe does not see a plain node's Hello"
    );

    let n = AuthNode::start(&pki.node_flags("node-b"));
    let (first, rest) = plain_probe(&n.migrate);
    assert!(first.is_empty(), "the TLS port spoke first: {first:?}");
    // At most a TLS alert (content type 21), never a roam frame.
    assert!(
        rest.is_empty() || rest[0] == 21,
        "the TLS port answered a plain client: {rest:?}"
    );
    wait_for("the refusal in the log", Duration::from_secs(20), || {
        n.log()
            .contains("TLS handshake refused before any message")
            .then_some(())
    });
    // The protocol never started: no offer was read (its log line names
    // the source's ISA).
    assert!(!n.log().contains("from_isa"), "{}", n.log());
}

#[test]
fn a_node_of_another_cluster_cannot_push_a_cell() {
    let pki = pki();
    let b = AuthNode::start(&pki.node_flags("node-b"));
    // node-c has a certificate of another CA (and trusts only that CA).
    let c = AuthNode::start(&pki.node_flags("node-c"));
    let evil_creds = pki.client("evil/ca.pem", Some("evil/mallory"), None);
    let out = try_launch(&c, &evil_creds);
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), c.log());
    let id = text(&out.stdout).trim().to_string();
    let mig = run_client(
        &[
            "migrate",
            &id,
            "--from",
            &c.url,
            "--to",
            &b.url,
            "--mode",
            "stop-and-copy",
        ],
        &evil_creds,
    );
    assert!(!mig.status.success(), "the migration went through");
    assert!(
        b.cells(&pki.client("ca.pem", Some("alice"), None))
            .is_empty(),
        "the destination took a cell:\n{}",
        b.log()
    );
    assert!(!b.log().contains("from_isa"), "{}", b.log());
}

fn node_fails(args: &[&str]) -> String {
    let d = tempfile::tempdir().unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("node").arg("--state-dir").arg(d.path()).args(args);
    let out = run_bounded(cmd, Duration::from_secs(30));
    assert!(!out.status.success(), "roam node {args:?} started");
    text(&out.stderr)
}

#[test]
fn a_node_listens_beyond_loopback_only_with_credentials_or_insecure() {
    let err = node_fails(&["--listen", "0.0.0.0:0", "--migrate-listen", "127.0.0.1:0"]);
    for s in [
        "control API on 0.0.0.0:0",
        "--tls-ca",
        "--token-file",
        "--insecure",
        "roam cert",
    ] {
        assert!(err.contains(s), "missing {s:?} in: {err}");
    }
    let err = node_fails(&["--listen", "127.0.0.1:0", "--migrate-listen", "0.0.0.0:0"]);
    assert!(err.contains("migration port on 0.0.0.0:0"), "{err}");
    // A token protects the control API, not the migration port.
    let pki = pki();
    let err = node_fails(&[
        "--listen",
        "0.0.0.0:0",
        "--migrate-listen",
        "0.0.0.0:0",
        "--token-file",
        &pki.p("token"),
    ]);
    assert!(err.contains("migration port"), "{err}");
    // A certificate that is not the node's own.
    let mut flags: Vec<&str> = vec!["--listen", "127.0.0.1:0", "--migrate-listen", "127.0.0.1:0"];
    let wrong = pki.node_flags("node-a");
    let mut wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
    wrong[1] = "node-z";
    flags.extend(wrong);
    let err = node_fails(&flags);
    assert!(err.contains("not for node `node-z`"), "{err}");

    let open = AuthNode::start(&[
        "--listen".into(),
        "0.0.0.0:0".into(),
        "--migrate-listen".into(),
        "0.0.0.0:0".into(),
        "--insecure".into(),
    ]);
    assert!(open.url.starts_with("http://0.0.0.0:"), "{}", open.url);
    let tls = AuthNode::start(&{
        let mut f = pki.node_flags("node-a");
        f.extend([
            "--listen".into(),
            "0.0.0.0:0".into(),
            "--migrate-listen".into(),
            "0.0.0.0:0".into(),
        ]);
        f
    });
    assert!(tls.url.starts_with("https://0.0.0.0:"), "{}", tls.url);
}
