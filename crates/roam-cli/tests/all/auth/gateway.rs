//! A node with mutual TLS links to a gateway with mutual TLS, with its own
//! node certificate (`roam node --gateway` reuses `--tls-*`), and a service
//! cell it launches is reachable through the gateway, which holds a gateway
//! certificate.

use super::*;

/// A child process killed on drop.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_mtls_node_serves_a_cell_through_an_mtls_gateway() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gateway.log");
    let (port, control) = (free_port(), format!("127.0.0.1:{}", free_port()));
    let mut cmd = roam(Isa::X86_64);
    // The gateway presents its gateway certificate.
    cmd.args(["gateway", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--service", "kv", "--resp", "--control", &control])
        .args(["--tls-ca", &pki.p("ca.pem"), "--tls-cert", &pki.p("gw.pem")])
        .args(["--tls-key", &pki.p("gw-key.pem")])
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap());
    let gw = KillOnDrop(cmd.spawn().unwrap());
    let gw_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the gateway to listen", SLOW, || {
        TcpStream::connect(&control).ok()
    });
    let mut flags = pki.node_flags("node-a");
    flags.extend(["--gateway".to_string(), control.clone()]);
    let node = AuthNode::start(&flags);
    let creds = pki.client("ca.pem", Some("alice"), None);
    let mut launch = client_cmd(&["launch", "--node", &node.url, "--service", "kv"], &creds);
    launch.arg(workload("kvserver"));
    let out = run_bounded(launch, SLOW);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}\n{}",
        text(&out.stderr),
        node.log(),
        gw_log()
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    let got = s.read_exact(&mut reply);
    drop(gw);
    assert!(
        got.is_ok() && &reply == b"+PONG\r\n",
        "PING through the TLS gateway: {got:?} {:?}\n{}\n{}",
        text(&reply),
        node.log(),
        gw_log()
    );
    assert!(node.log().contains("gateway link up"), "{}", node.log());
}
