//! Mutual TLS on the control port: a node with its node certificate is
//! served; a node claiming another node's name, or speaking plain TCP, is
//! never admitted.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use roam_auth::cert::{make_ca, make_node, Pem, Validity};
use roam_auth::{ClientTls, Identity, TlsFiles};
use roam_gateway::link::GatewayLink;
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
    let (gc, gk) = write(
        dir.path(),
        "gw",
        &make_node(&ca, "gw", &[], &[], year).unwrap(),
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
