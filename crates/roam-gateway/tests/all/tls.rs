//! Mutual TLS on the control port: a node with its node certificate is
//! served; a node claiming another node's name, a certificate of another
//! role (an operator's, the gateway's, the planner's), or plain TCP is
//! never admitted, and never receives a client's bytes. A plain control
//! port beyond loopback needs `insecure`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use roam_auth::cert::{
    make_ca, make_client, make_gateway, make_node, make_planner, Pem, Reach, Validity,
};
use roam_auth::{ClientTls, Identity, TlsFiles};
use roam_gateway::link::GatewayLink;
use roam_gateway::server::{BindError, Gateway, GatewayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::peer::{TestGateway, LONG};
use crate::program::Cell;

fn write(dir: &Path, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&c, &pem.cert).unwrap();
    std::fs::write(&k, &pem.key).unwrap();
    (c, k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_need_their_own_node_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let year = Validity { days: 365 };
    let ca = make_ca("test CA", year).unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca.cert).unwrap();
    let lo: IpAddr = [127, 0, 0, 1].into();
    let reach = Reach {
        ips: vec![lo],
        ..Reach::default()
    };
    let (gc, gk) = write(
        dir.path(),
        "gw",
        &make_gateway(&ca, "gw", &reach, year).unwrap(),
    );
    let (ac, ak) = write(
        dir.path(),
        "node-a",
        &make_node(&ca, "node-a", &[], &[], year).unwrap(),
    );
    let id = Identity::load(&TlsFiles {
        ca: ca_file.clone(),
        cert: gc,
        key: gk,
    })
    .unwrap();
    let gw = TestGateway::start(|c| c.tls = Some(id)).await;
    let tls = ClientTls::load(&ca_file, Some(&ac), Some(&ak)).unwrap();
    let addr = gw.control.to_string();

    // node-a's certificate, claiming to be node-b: refused after Hello.
    let impostor = GatewayLink::connect(&addr, Some(&tls), "node-b").unwrap();
    // Plain TCP to a TLS port: the handshake fails.
    let plain = GatewayLink::connect(&addr, None, "node-a").unwrap();
    assert!(!impostor.wait_connected(Duration::from_millis(500)).await);
    assert!(!plain.wait_connected(Duration::from_millis(10)).await);
    assert_eq!(gw.handle.stats().links, 0);

    let a = GatewayLink::connect(&addr, Some(&tls), "node-a").unwrap();
    assert!(a.wait_connected(LONG).await);
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    let errors = cell.errors.clone();
    let run = cell.start();
    let mut c = TcpStream::connect(gw.service).await.unwrap();
    c.write_all(b"abc").await.unwrap();
    let mut got = [0u8; 3];
    tokio::time::timeout(LONG, c.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"bcd");
    run.pause().await;
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    assert_eq!(gw.handle.stats().links, 1);
}

fn gateway_files(dir: &Path, ca: &Pem, pem: &Pem, name: &str) -> TlsFiles {
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.cert).unwrap();
    let (cert, key) = write(dir, name, pem);
    TlsFiles {
        ca: ca_file,
        cert,
        key,
    }
}

/// Before roles, the gateway and the planner held node certificates, and
/// any of them could link as a node and take a service's clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_of_other_roles_cannot_link_as_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let year = Validity { days: 365 };
    let ca = make_ca("test CA", year).unwrap();
    let lo: IpAddr = [127, 0, 0, 1].into();
    let reach = Reach {
        ips: vec![lo],
        ..Reach::default()
    };
    let files = gateway_files(
        dir.path(),
        &ca,
        &make_gateway(&ca, "gw", &reach, year).unwrap(),
        "gw",
    );
    let gw = TestGateway::start(|c| c.tls = Some(Identity::load(&files).unwrap())).await;
    let addr = gw.control.to_string();
    let as_tls = |name: &str, pem: &Pem| {
        let (c, k) = write(dir.path(), name, pem);
        ClientTls::load(&files.ca, Some(&c), Some(&k)).unwrap()
    };
    // Each certificate claims the name it was issued for, so only its role
    // can stop it.
    let others = [
        (
            "alice",
            as_tls("alice", &make_client(&ca, "alice", year).unwrap()),
        ),
        (
            "gw2",
            as_tls("gw2", &make_gateway(&ca, "gw2", &reach, year).unwrap()),
        ),
        (
            "plan",
            as_tls("plan", &make_planner(&ca, "plan", &reach, year).unwrap()),
        ),
    ];
    let mut links = Vec::new();
    for (name, tls) in &others {
        let l = GatewayLink::connect(&addr, Some(tls), name).unwrap();
        let cell = Cell::new();
        // What an attacker would send at once: serve the service, at a
        // generation no real node would reach.
        l.serve("kv", "c-evil", u64::MAX / 2, cell.hub()).unwrap();
        links.push((l, cell.start()));
    }
    for (l, _) in &links {
        assert!(!l.wait_connected(Duration::from_millis(700)).await);
    }
    assert_eq!(gw.handle.stats().links, 0);

    // The real node serves the service, and its client's bytes reach it
    // (and only it).
    let node = as_tls("node-a", &make_node(&ca, "node-a", &[], &[], year).unwrap());
    let a = GatewayLink::connect(&addr, Some(&node), "node-a").unwrap();
    assert!(a.wait_connected(LONG).await);
    let cell = Cell::new();
    a.serve("kv", "c-1", 0, cell.hub()).unwrap();
    let run = cell.start();
    let mut c = TcpStream::connect(gw.service).await.unwrap();
    c.write_all(b"abc").await.unwrap();
    let mut got = [0u8; 3];
    tokio::time::timeout(LONG, c.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"bcd");
    run.pause().await;
    assert_eq!(gw.handle.stats().links, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_a_node_certificate_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let year = Validity { days: 365 };
    let ca = make_ca("test CA", year).unwrap();
    let lo: IpAddr = [127, 0, 0, 1].into();
    let any = "127.0.0.1:0".parse().unwrap();
    // A gateway started with a node's certificate refuses to start: it
    // would hold a key that opens nodes' control APIs.
    let node_pem = make_node(&ca, "gw", &[], &[lo], year).unwrap();
    let files = gateway_files(dir.path(), &ca, &node_pem, "gw");
    let mut cfg = GatewayConfig::new("kv", any, any);
    cfg.tls = Some(Identity::load(&files).unwrap());
    let e = Gateway::bind(cfg)
        .await
        .err()
        .expect("a node certificate was accepted");
    assert!(matches!(e, BindError::Role(_)), "{e}");
    assert!(e.to_string().contains("roam cert gateway"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_control_port_beyond_loopback_needs_insecure() {
    let any = "127.0.0.1:0".parse().unwrap();
    for wild in ["0.0.0.0:0", "[::]:0"] {
        let mut cfg = GatewayConfig::new("kv", any, wild.parse().unwrap());
        let e = Gateway::bind(cfg.clone()).await.err().expect("bound");
        assert!(matches!(e, BindError::Unauthenticated(_)), "{e}");
        assert!(e.to_string().contains("--insecure"), "{e}");
        cfg.insecure = true;
        if let Err(e) = Gateway::bind(cfg).await {
            // A machine without IPv6 cannot bind [::]; that is not the
            // refusal under test.
            assert!(matches!(e, BindError::Listen { .. }), "{e}");
        }
    }
    let cfg = GatewayConfig::new("kv", any, any);
    Gateway::bind(cfg)
        .await
        .expect("a plain loopback control port binds");
}
