use std::path::Path;

use super::*;
use crate::{cert_names_node, ClientTls, Identity, TlsFiles, ALPN_HTTP};

mod roles;

fn local() -> Reach {
    Reach {
        local: true,
        ..Reach::default()
    }
}

const YEAR: Validity = Validity { days: 365 };

fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

fn write(dir: &Path, name: &str, p: &Pem) -> (std::path::PathBuf, std::path::PathBuf) {
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&c, &p.cert).unwrap();
    std::fs::write(&k, &p.key).unwrap();
    (c, k)
}

fn identity(dir: &Path, ca: &Path, name: &str, p: &Pem) -> Result<Identity, crate::LoadError> {
    let (cert, key) = write(dir, name, p);
    Identity::load(&TlsFiles {
        ca: ca.to_path_buf(),
        cert,
        key,
    })
}

#[test]
fn node_and_client_certificates_round_trip_through_the_loader() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("test cluster CA", Validity { days: 3650 }).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let ip: IpAddr = "10.0.0.5".parse().unwrap();
    let node = make_node(&ca, "edge-a", &["edge-a.local".into()], &[ip], YEAR).unwrap();
    let id = identity(d.path(), &ca_file, "edge-a", &node).unwrap();
    id.check_own_name("edge-a").unwrap();
    id.check_own_role(Role::Node).unwrap();
    // The node's name is its CN: an extra DNS name is where it can be
    // reached, not who it is.
    cert_names_node(&der(&ca.cert), &der(&node.cert), "edge-a").unwrap();
    for n in ["edge-a.local", "localhost"] {
        assert!(
            cert_names_node(&der(&ca.cert), &der(&node.cert), n).is_err(),
            "{n}"
        );
    }
    let other = id.check_own_name("edge-b").unwrap_err();
    assert_eq!(other.name, "edge-b");

    // An operator's certificate loads as a client but never names a node.
    let client = make_client(&ca, "alice", YEAR).unwrap();
    let (c, k) = write(d.path(), "alice", &client);
    ClientTls::load(&ca_file, Some(&c), Some(&k))
        .unwrap()
        .config(ALPN_HTTP)
        .unwrap();
    assert!(id.check_node(&der(&client.cert), "alice").is_err());
    assert!(cert_names_node(&der(&ca.cert), &der(&client.cert), "alice").is_err());
}

#[test]
fn a_certificate_from_a_foreign_ca_does_not_chain() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let theirs = make_ca("theirs", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let foreign = make_node(&theirs, "edge-a", &[], &[], YEAR).unwrap();
    let e = identity(d.path(), &ca_file, "edge-a", &foreign).unwrap_err();
    assert!(
        matches!(e, crate::LoadError::Identity { .. }),
        "a foreign node certificate loaded: {e}"
    );
    assert!(e.to_string().contains("roam cert"), "{e}");
    let ours = make_node(&ca, "edge-b", &[], &[], YEAR).unwrap();
    let id = identity(d.path(), &ca_file, "edge-b", &ours).unwrap();
    assert!(id.check_node(&der(&foreign.cert), "edge-a").is_err());
    assert!(cert_names_node(&der(&ca.cert), &der(&foreign.cert), "edge-a").is_err());
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let a = make_node(&ca, "edge-a", &[], &[], YEAR).unwrap();
    let b = make_node(&ca, "edge-b", &[], &[], YEAR).unwrap();
    let mixed = Pem {
        cert: a.cert,
        key: b.key,
    };
    assert!(identity(d.path(), &ca_file, "edge-a", &mixed).is_err());
}

#[test]
fn names_that_cannot_be_dns_names_are_refused() {
    let ca = make_ca("ours", YEAR).unwrap();
    for bad in ["", "a_b", "-a", "a..b", "a/b", "../x"] {
        assert!(!valid_node_name(bad), "{bad:?}");
        assert!(matches!(
            make_node(&ca, bad, &[], &[], YEAR),
            Err(CertError::BadName(_))
        ));
    }
    assert!(valid_node_name("edge-a.local"));
    let not_a_ca = Pem {
        cert: "junk".into(),
        key: "junk".into(),
    };
    assert!(matches!(
        make_node(&not_a_ca, "edge-a", &[], &[], YEAR),
        Err(CertError::BadCa(_))
    ));
}

/// A real handshake over an in-memory pipe: the server requires a client
/// certificate from its CA.
#[tokio::test]
async fn the_server_refuses_clients_without_a_certificate_of_its_ca() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let theirs = make_ca("theirs", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let (theirs_file, _) = write(d.path(), "theirs", &theirs);
    let server = identity(
        d.path(),
        &ca_file,
        "edge-a",
        &make_node_reach(&ca, "edge-a", &local(), YEAR).unwrap(),
    )
    .unwrap();
    let good = make_client(&ca, "alice", YEAR).unwrap();
    let (gc, gk) = write(d.path(), "alice", &good);
    let bad = make_client(&theirs, "mallory", YEAR).unwrap();
    let (bc, bk) = write(d.path(), "mallory", &bad);

    async fn attempt(server: &Identity, client: ClientTls) -> Result<Vec<u8>, String> {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config(ALPN_HTTP).unwrap());
        let connector = tokio_rustls::TlsConnector::from(client.config(ALPN_HTTP).unwrap());
        let srv = tokio::spawn(async move {
            let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
            s.write_all(b"hello").await.map_err(|e| e.to_string())?;
            s.shutdown().await.map_err(|e| e.to_string())
        });
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let cli = async {
            let mut c = connector
                .connect(name, b)
                .await
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(got)
        };
        let got = cli.await;
        let s = srv.await.unwrap();
        s.and(got)
    }

    let ok = attempt(
        &server,
        ClientTls::load(&ca_file, Some(&gc), Some(&gk)).unwrap(),
    )
    .await;
    assert_eq!(ok.unwrap(), b"hello");
    let none = attempt(&server, ClientTls::load(&ca_file, None, None).unwrap()).await;
    assert!(none.is_err(), "a client without a certificate got through");
    let foreign = attempt(
        &server,
        ClientTls::load(&theirs_file, Some(&bc), Some(&bk)).unwrap(),
    )
    .await;
    assert!(foreign.is_err(), "a client of another CA got through");
}
