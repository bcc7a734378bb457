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

/// A peer that links to the gateway's control port with the certificate
/// of `who` (TLS, ALPN and the gateway's role checked as a node does),
/// says it is `who`, and sends `Serve` for `kv`.
struct Rogue {
    rt: tokio::runtime::Runtime,
    rd: tokio::io::ReadHalf<
        roam_node::roam_auth::tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    >,
    wr: tokio::io::WriteHalf<
        roam_node::roam_auth::tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    >,
}

impl Rogue {
    fn link(control: &str, who: &str) -> Rogue {
        use roam_gateway::proto::{Hello, ToGateway, PROTOCOL_VERSION};
        use roam_node::roam_auth::{tokio_rustls, ClientTls, Role};
        let pki = pki();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let tls = ClientTls::load(
            std::path::Path::new(&pki.p("ca.pem")),
            Some(std::path::Path::new(&pki.p(&format!("{who}.pem")))),
            Some(std::path::Path::new(&pki.p(&format!("{who}-key.pem")))),
        )
        .unwrap();
        let cfg = tls
            .config_for(roam_gateway::ALPN_GATEWAY, Role::Gateway)
            .unwrap();
        let (rd, wr) = rt.block_on(async {
            let tcp = tokio::net::TcpStream::connect(control).await.unwrap();
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let s = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await
                .expect("the TLS handshake with the gateway");
            tokio::io::split(s)
        });
        let mut r = Rogue { rt, rd, wr };
        r.send(&ToGateway::Hello(Hello {
            version: PROTOCOL_VERSION,
            node: who.into(),
            window: 256 << 10,
        }));
        r
    }

    fn send(&mut self, m: &roam_gateway::proto::ToGateway) {
        use tokio::io::AsyncWriteExt;
        let mut b = Vec::new();
        m.encode(&mut b).unwrap();
        // The gateway may have closed the link already; what it said is
        // read next.
        let _ = self.rt.block_on(self.wr.write_all(&b));
    }

    fn serve(&mut self, cell: &str, generation: u64) {
        self.send(&roam_gateway::proto::ToGateway::Serve {
            service: "kv".into(),
            cell: cell.into(),
            generation,
            conns: vec![],
        });
    }

    /// The next message within `d`: `Err` if none, `Ok(None)` once the
    /// gateway closed the link.
    fn recv(&mut self, d: Duration) -> Result<Option<roam_gateway::proto::ToNode>, ()> {
        use roam_gateway::proto::{read_frame, ToNode};
        let rd = &mut self.rd;
        match self
            .rt
            .block_on(async { tokio::time::timeout(d, read_frame(rd)).await })
        {
            Err(_) => Err(()),
            Ok(Err(_)) => Ok(None),
            Ok(Ok((k, p))) => Ok(Some(ToNode::decode(k, &p).unwrap())),
        }
    }
}

/// A `roam` process with a log file, killed on drop.
fn spawn_logged_kill(args: &[&str], log: &std::path::Path) -> KillOnDrop {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(args)
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap());
    KillOnDrop(cmd.spawn().unwrap())
}

/// `roam gateway --planner`, everything under mutual TLS: a process with a
/// valid node certificate that does not own the service's cell, and one
/// with an operator's certificate, link to the gateway's control port and
/// send `Serve` for the service at a generation above the real one. No
/// client byte reaches them; the real cell keeps serving.
#[test]
fn only_the_node_the_planner_names_may_serve_a_service() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
    let tls = [
        "--tls-ca".to_string(),
        pki.p("ca.pem"),
        "--tls-cert".into(),
        pki.p("plan.pem"),
        "--tls-key".into(),
        pki.p("plan-key.pem"),
    ];
    let pport = free_port();
    let planner_url = format!("https://127.0.0.1:{pport}");
    let store = format!("redb:{}", dir.path().join("cluster.redb").display());
    let mut args = vec!["planner", "--listen"];
    let listen = format!("127.0.0.1:{pport}");
    args.extend([listen.as_str(), "--store", store.as_str()]);
    args.extend(tls.iter().map(String::as_str));
    let _planner = spawn_logged_kill(&args, &dir.path().join("planner.log"));
    wait_for("the planner to listen", SLOW, || {
        read("planner.log")
            .contains("roam planner listening")
            .then_some(())
    });

    let (port, control) = (free_port(), format!("127.0.0.1:{}", free_port()));
    let listen = format!("127.0.0.1:{port}");
    let (ca, cert, key) = (pki.p("ca.pem"), pki.p("gw.pem"), pki.p("gw-key.pem"));
    let _gw = spawn_logged_kill(
        &[
            "gateway",
            "--listen",
            &listen,
            "--service",
            "kv",
            "--resp",
            "--control",
            &control,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--planner",
            &planner_url,
        ],
        &dir.path().join("gateway.log"),
    );
    wait_for("the gateway to listen", SLOW, || {
        TcpStream::connect(&control).ok()
    });
    let mut flags = pki.node_flags("node-a");
    flags.extend([
        "--gateway".to_string(),
        control.clone(),
        "--planner".into(),
        planner_url.clone(),
    ]);
    let node = AuthNode::start(&flags);
    let logs = || {
        format!(
            "--- node ---\n{}\n--- gateway ---\n{}\n--- planner ---\n{}",
            node.log(),
            read("gateway.log"),
            read("planner.log")
        )
    };
    let alice = pki.client("ca.pem", Some("alice"), None);
    wait_for("node-a to register", SLOW, || {
        let out = run_client(&["nodes", "--planner", &planner_url], &alice);
        text(&out.stdout).contains("node-a").then_some(())
    });
    let mut launch = client_cmd(
        &["launch", "--planner", &planner_url, "--service", "kv"],
        &alice,
    );
    launch.arg(workload("kvserver"));
    let out = run_bounded(launch, SLOW);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        logs()
    );
    let cell = text(&out.stdout).trim().to_string();

    let ping = |s: &mut TcpStream| {
        s.write_all(b"PING\r\n").unwrap();
        let mut reply = [0u8; 7];
        let got = s.read_exact(&mut reply);
        assert!(
            got.is_ok() && &reply == b"+PONG\r\n",
            "PING through the gateway: {got:?} {:?}\n{}",
            text(&reply),
            logs()
        );
    };
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    ping(&mut client);

    // Another node of the cluster, at a generation far above the cell's:
    // the planner does not name it, so it is answered Stale.
    let mut rogue = Rogue::link(&control, "node-b");
    assert!(
        matches!(
            rogue.recv(Duration::from_secs(20)),
            Ok(Some(roam_gateway::proto::ToNode::Welcome { .. }))
        ),
        "{}",
        logs()
    );
    rogue.serve(&cell, 1000);
    match rogue.recv(Duration::from_secs(20)) {
        Ok(Some(roam_gateway::proto::ToNode::Stale {
            generation,
            current,
            ..
        })) => assert!(generation == 1000 && current < 1000, "{current}"),
        other => panic!("expected Stale, got {other:?}\n{}", logs()),
    }
    // An operator's certificate is no node at all: refused at Hello.
    let mut op = Rogue::link(&control, "alice");
    op.serve(&cell, 1000);
    match op.recv(Duration::from_secs(20)) {
        Ok(Some(roam_gateway::proto::ToNode::Refused { reason })) => {
            assert!(reason.contains("certificate"), "{reason}")
        }
        other => panic!("expected Refused, got {other:?}\n{}", logs()),
    }

    // The real cell keeps serving old and new clients; the rogue gets no
    // Open and no byte.
    ping(&mut client);
    let mut late = TcpStream::connect(("127.0.0.1", port)).unwrap();
    late.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    ping(&mut late);
    match rogue.recv(Duration::from_millis(500)) {
        Err(()) => {}
        Ok(m) => panic!("the rogue node got {m:?}\n{}", logs()),
    }
    let gw_log = read("gateway.log");
    assert!(
        gw_log.contains("Serve refused") && gw_log.contains("not `node-b`"),
        "{}",
        logs()
    );
}
