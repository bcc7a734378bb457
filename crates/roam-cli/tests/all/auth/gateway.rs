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

/// A planner, a gateway with `--planner` for service `kv` and nodes, all
/// under mutual TLS, killed on drop.
struct Checked {
    dir: tempfile::TempDir,
    planner_url: String,
    /// Where clients connect.
    port: u16,
    /// Where nodes connect.
    control: String,
    nodes: Vec<Option<AuthNode>>,
    _planner: KillOnDrop,
    _gw: KillOnDrop,
}

impl Checked {
    fn start(names: &[&str], planner_flags: &[&str]) -> Checked {
        let pki = pki();
        let dir = tempfile::tempdir().unwrap();
        let pport = free_port();
        let planner_url = format!("https://127.0.0.1:{pport}");
        let store = format!("redb:{}", dir.path().join("cluster.redb").display());
        let listen = format!("127.0.0.1:{pport}");
        let (ca, pc, pk) = (pki.p("ca.pem"), pki.p("plan.pem"), pki.p("plan-key.pem"));
        let mut args = vec!["planner", "--listen", &listen, "--store", &store];
        args.extend(["--tls-ca", &ca, "--tls-cert", &pc, "--tls-key", &pk]);
        args.extend(planner_flags);
        let planner = spawn_logged_kill(&args, &dir.path().join("planner.log"));
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
        wait_for("the planner to listen", SLOW, || {
            read("planner.log")
                .contains("roam planner listening")
                .then_some(())
        });
        let (port, control) = (free_port(), format!("127.0.0.1:{}", free_port()));
        let listen = format!("127.0.0.1:{port}");
        let (gc, gk) = (pki.p("gw.pem"), pki.p("gw-key.pem"));
        let gw = spawn_logged_kill(
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
                &gc,
                "--tls-key",
                &gk,
                "--planner",
                &planner_url,
            ],
            &dir.path().join("gateway.log"),
        );
        wait_for("the gateway to listen", SLOW, || {
            TcpStream::connect(&control).ok()
        });
        let nodes = names
            .iter()
            .map(|name| {
                let mut flags = pki.node_flags(name);
                flags.extend([
                    "--gateway".to_string(),
                    control.clone(),
                    "--planner".into(),
                    planner_url.clone(),
                ]);
                Some(AuthNode::start(&flags))
            })
            .collect();
        let c = Checked {
            dir,
            planner_url,
            port,
            control,
            nodes,
            _planner: planner,
            _gw: gw,
        };
        wait_for("the nodes to register", SLOW, || {
            let out = c.roam(&["nodes"]);
            names
                .iter()
                .all(|n| text(&out.stdout).contains(n))
                .then_some(())
        });
        c
    }

    fn read(&self, f: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default()
    }

    fn logs(&self) -> String {
        let mut all = String::new();
        for n in self.nodes.iter().flatten() {
            all += &format!("--- node ---\n{}\n", n.log());
        }
        format!(
            "{all}--- gateway ---\n{}\n--- planner ---\n{}",
            self.read("gateway.log"),
            self.read("planner.log")
        )
    }

    /// `roam ARGS --planner URL` as operator alice.
    fn roam(&self, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--planner", &self.planner_url]);
        run_client(&all, &pki().client("ca.pem", Some("alice"), None))
    }

    /// Launch the KV server for `kv` (on `on`, if given): its cell id.
    fn launch_kv(&self, on: Option<&str>) -> String {
        let alice = pki().client("ca.pem", Some("alice"), None);
        let mut args = vec!["launch", "--planner", &self.planner_url, "--service", "kv"];
        if let Some(on) = on {
            args.extend(["--on", on]);
        }
        let mut launch = client_cmd(&args, &alice);
        launch.arg(workload("kvserver"));
        let out = run_bounded(launch, SLOW);
        assert!(
            out.status.success(),
            "roam launch: {}\n{}",
            text(&out.stderr),
            self.logs()
        );
        text(&out.stdout).trim().to_string()
    }

    /// The cell's record at the planner.
    fn cell(&self, id: &str) -> Value {
        let out = self.roam(&["cells", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let cells: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        cells.into_iter().find(|c| c["id"] == id).expect("the cell")
    }

    /// A client of `kv` through the gateway.
    fn client(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// `cmd` on `s` is answered `want`.
    fn ask(&self, s: &mut TcpStream, cmd: &[u8], want: &[u8]) {
        s.write_all(cmd).unwrap();
        let mut reply = vec![0u8; want.len()];
        let got = s.read_exact(&mut reply);
        assert!(
            got.is_ok() && reply == want,
            "{:?} through the gateway: {got:?} {:?}\n{}",
            text(cmd),
            text(&reply),
            self.logs()
        );
    }
}

/// `roam gateway --planner`, everything under mutual TLS: a process with a
/// valid node certificate that does not own the service's cell, and one
/// with an operator's certificate, link to the gateway's control port and
/// send `Serve` for the service at a generation above the real one. No
/// client byte reaches them; the real cell keeps serving.
#[test]
fn only_the_node_the_planner_names_may_serve_a_service() {
    let c = Checked::start(&["node-a"], &[]);
    let cell = c.launch_kv(None);
    let (control, logs) = (c.control.clone(), || c.logs());
    let ping = |s: &mut TcpStream| c.ask(s, b"PING\r\n", b"+PONG\r\n");
    let mut client = c.client();
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
    let mut late = c.client();
    ping(&mut late);
    match rogue.recv(Duration::from_millis(500)) {
        Err(()) => {}
        Ok(m) => panic!("the rogue node got {m:?}\n{}", logs()),
    }
    let gw_log = c.read("gateway.log");
    assert!(
        gw_log.contains("Serve refused") && gw_log.contains("not `node-b`"),
        "{}",
        logs()
    );
}

/// With `--planner`, the flows that move a service's cell are followed:
/// a migration through the planner (the destination owns the cell before
/// it serves), and a restore from a kept checkpoint on another node after
/// the owner died (the planner moved the record one generation up before
/// the node restored). No `Serve` of theirs is refused.
#[test]
fn a_checked_gateway_follows_a_migration_and_a_restore() {
    let mut c = Checked::start(
        &["node-a", "node-b"],
        &["--checkpoint-interval", "1", "--lease", "5"],
    );
    let cell = c.launch_kv(Some("node-a"));
    let mut client = c.client();
    c.ask(&mut client, b"SET k v\r\n", b"+OK\r\n");
    let before = c.cell(&cell);
    assert_eq!(before["owner"], "node-a", "{before}");

    let out = c.roam(&["migrate", &cell, "--to", "node-b", "--mode", "pre-copy"]);
    assert!(
        out.status.success(),
        "roam migrate: {}\n{}",
        text(&out.stderr),
        c.logs()
    );
    let moved = c.cell(&cell);
    assert_eq!(moved["owner"], "node-b", "{moved}");
    assert!(moved["generation"].as_u64() > before["generation"].as_u64());
    // The same client, served by the destination.
    c.ask(&mut client, b"GET k\r\n", b"$1\r\nv\r\n");

    // Wait for a checkpoint of the cell kept on node-a, then kill node-b:
    // the planner restores the cell on node-a, one generation up.
    let gen = moved["generation"].as_u64().unwrap();
    wait_for_or(
        "a checkpoint kept on node-a",
        Duration::from_secs(60),
        || c.logs(),
        || {
            let r = c.cell(&cell);
            (r["kept"]["holder"] == "node-a" && r["kept"]["generation"].as_u64() == Some(gen))
                .then_some(())
        },
    );
    c.nodes[1] = None;
    let restored = wait_for_or(
        "the cell restored on node-a",
        Duration::from_secs(90),
        || c.logs(),
        || {
            let r = c.cell(&cell);
            (r["owner"] == "node-a"
                && r["generation"].as_u64() > Some(gen)
                && r["state"]["state"] == "running")
                .then_some(r)
        },
    );
    // A new client reaches the restored cell (the gateway holds it until
    // node-a serves, if it has not yet).
    let mut late = c.client();
    c.ask(&mut late, b"PING\r\n", b"+PONG\r\n");
    let gw_log = c.read("gateway.log");
    assert!(
        !gw_log.contains("Serve refused"),
        "{restored}\n{}",
        c.logs()
    );
    assert!(!gw_log.contains("cannot check"), "{}", c.logs());
}
