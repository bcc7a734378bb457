//! Roles: every certificate carries its one role and reads it back; old
//! certificates without one, and certificates used outside their role,
//! are refused with the reason.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::*;
use crate::role::{admit, peer_id, RoleError};

/// The DNS and IP names of a certificate, as strings.
fn sans(pem: &str) -> Vec<String> {
    let d = der(pem);
    let (_, c) = X509Certificate::from_der(&d).unwrap();
    let Some(san) = c.subject_alternative_name().unwrap() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::DNSName(d) => Some(d.to_string()),
            GeneralName::IPAddress(b) if b.len() == 4 => {
                Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string())
            }
            GeneralName::IPAddress(b) if b.len() == 16 => {
                Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).unwrap()).to_string())
            }
            _ => None,
        })
        .collect()
}

/// A certificate as `roam cert node` made it before roles: the node's
/// name, server and client auth, no role URI.
fn roleless(ca: &Pem, name: &str, extra_uris: &[&str]) -> Pem {
    let mut p = params(name, YEAR).unwrap();
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.subject_alt_names
        .push(SanType::DnsName(name.try_into().unwrap()));
    for u in extra_uris {
        p.subject_alt_names
            .push(SanType::URI((*u).try_into().unwrap()));
    }
    sign(ca, p).unwrap()
}

#[test]
fn every_certificate_reads_back_its_one_role_and_name() {
    let ca = make_ca("ours", YEAR).unwrap();
    let reach = Reach::default();
    let made = [
        (
            make_node_reach(&ca, "edge-a", &reach, YEAR).unwrap(),
            Role::Node,
            "edge-a",
        ),
        (
            make_gateway(&ca, "gw", &reach, YEAR).unwrap(),
            Role::Gateway,
            "gw",
        ),
        (
            make_planner(&ca, "plan", &reach, YEAR).unwrap(),
            Role::Planner,
            "plan",
        ),
        (
            make_client(&ca, "alice", YEAR).unwrap(),
            Role::Client,
            "alice",
        ),
    ];
    for (pem, role, name) in &made {
        let id = peer_id(&der(&pem.cert)).unwrap();
        assert_eq!((id.role, id.name.as_str()), (*role, *name));
        admit(&der(&pem.cert), &[*role]).unwrap();
        let others: Vec<Role> = Role::ALL.into_iter().filter(|r| r != role).collect();
        let e = admit(&der(&pem.cert), &others).unwrap_err();
        assert!(
            matches!(&e, RoleError::NotAdmitted { peer, .. } if peer.role == *role),
            "{e}"
        );
    }
}

#[test]
fn loopback_names_only_when_asked_for() {
    let ca = make_ca("ours", YEAR).unwrap();
    let ip: IpAddr = "10.0.0.5".parse().unwrap();
    let plain = make_node(&ca, "edge-a", &[], &[ip], YEAR).unwrap();
    assert_eq!(sans(&plain.cert), ["edge-a", "10.0.0.5"]);
    let gw = make_gateway(&ca, "gw", &Reach::default(), YEAR).unwrap();
    assert_eq!(sans(&gw.cert), ["gw"]);
    let local = make_node_reach(
        &ca,
        "edge-a",
        &Reach {
            ips: vec![ip],
            local: true,
            ..Reach::default()
        },
        YEAR,
    )
    .unwrap();
    assert_eq!(
        sans(&local.cert),
        ["edge-a", "localhost", "127.0.0.1", "::1", "10.0.0.5"]
    );
}

#[test]
fn a_certificate_without_a_role_is_refused_and_says_to_reissue_it() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let old = roleless(&ca, "edge-a", &[]);
    // It chains to the CA and names edge-a: only its missing role fails.
    let e = identity(d.path(), &ca_file, "edge-a", &old).unwrap_err();
    assert!(matches!(e, crate::LoadError::Role { .. }), "{e}");
    let why = std::error::Error::source(&e).unwrap().to_string();
    assert!(
        why.contains("older `roam cert`") && why.contains("re-issue"),
        "{why}"
    );
    assert!(matches!(
        peer_id(&der(&old.cert)),
        Err(RoleError::NoRole { .. })
    ));
    let e = cert_names_node(&der(&ca.cert), &der(&old.cert), "edge-a").unwrap_err();
    assert!(
        matches!(e.source, crate::NameCheck::Role(RoleError::NoRole { .. })),
        "{e}"
    );
    // Other URIs are not roles; two roles, or an unknown one, are refused.
    let other = roleless(&ca, "edge-a", &["https://example.com/x"]);
    assert!(matches!(
        peer_id(&der(&other.cert)),
        Err(RoleError::NoRole { .. })
    ));
    let two = roleless(&ca, "edge-a", &["roam:role:node", "roam:role:client"]);
    assert!(matches!(
        peer_id(&der(&two.cert)),
        Err(RoleError::Several(_))
    ));
    let odd = roleless(&ca, "edge-a", &["roam:role:admin"]);
    assert!(matches!(peer_id(&der(&odd.cert)), Err(RoleError::Unknown(r)) if r == "admin"));
    assert!(matches!(
        peer_id(b"not a certificate"),
        Err(RoleError::Parse(_))
    ));
}

#[test]
fn only_a_nodes_own_certificate_passes_as_that_node() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let id = identity(
        d.path(),
        &ca_file,
        "edge-a",
        &make_node(&ca, "edge-a", &[], &[], YEAR).unwrap(),
    )
    .unwrap();
    // Node edge-b's certificate that also lists edge-c as a DNS name
    // passes as edge-b, never as edge-c.
    let b = make_node(&ca, "edge-b", &["edge-c".into()], &[], YEAR).unwrap();
    id.check_node(&der(&b.cert), "edge-b").unwrap();
    assert!(id.check_node(&der(&b.cert), "edge-c").is_err());
    // Certificates of the other roles, named like the node, do not pass.
    let reach = Reach::default();
    for pem in [
        make_gateway(&ca, "edge-d", &reach, YEAR).unwrap(),
        make_planner(&ca, "edge-d", &reach, YEAR).unwrap(),
        make_client(&ca, "edge-d", YEAR).unwrap(),
    ] {
        assert!(id.check_node(&der(&pem.cert), "edge-d").is_err());
    }
}

#[test]
fn each_daemon_loads_its_own_role_and_no_other() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let reach = Reach::default();
    for (pem, role, name) in [
        (
            make_gateway(&ca, "gw", &reach, YEAR).unwrap(),
            Role::Gateway,
            "gw",
        ),
        (
            make_planner(&ca, "plan", &reach, YEAR).unwrap(),
            Role::Planner,
            "plan",
        ),
        (
            make_node(&ca, "edge-a", &[], &[], YEAR).unwrap(),
            Role::Node,
            "edge-a",
        ),
    ] {
        let id = identity(d.path(), &ca_file, name, &pem).unwrap();
        assert_eq!(id.id().role, role);
        id.check_own_role(role).unwrap();
        for other in Role::ALL.into_iter().filter(|r| *r != role) {
            assert!(id.check_own_role(other).is_err(), "{role} as {other}");
        }
    }
}

/// A real handshake over an in-memory pipe: `client` connects to `server`
/// as `host`, checking that the server holds a certificate of `expect`.
async fn handshake(
    server: &Identity,
    client: &ClientTls,
    host: &str,
    expect: Option<Role>,
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config(ALPN_HTTP).unwrap());
    let cfg = match expect {
        Some(r) => client.config_for(ALPN_HTTP, r).unwrap(),
        None => client.config(ALPN_HTTP).unwrap(),
    };
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let srv = tokio::spawn(async move {
        let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
        s.write_all(b"ok").await.map_err(|e| e.to_string())?;
        s.shutdown().await.map_err(|e| e.to_string())
    });
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
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
    got.and(s)
}

#[tokio::test]
async fn clients_check_the_servers_role_and_a_gateway_is_a_client_only_by_its_role() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("ours", YEAR).unwrap();
    let (ca_file, _) = write(d.path(), "ca", &ca);
    let reach = Reach::default();
    let gw_pem = make_gateway(&ca, "gw", &reach, YEAR).unwrap();
    let gw = identity(d.path(), &ca_file, "gw", &gw_pem).unwrap();
    let node_pem = make_node(&ca, "edge-a", &[], &[], YEAR).unwrap();
    let node = identity(d.path(), &ca_file, "edge-a", &node_pem).unwrap();
    let (nc, nk) = write(d.path(), "edge-a", &node_pem);
    let as_node = ClientTls::load(&ca_file, Some(&nc), Some(&nk)).unwrap();

    // A node linking to its gateway accepts the gateway's certificate...
    handshake(&gw, &as_node, "gw", Some(Role::Gateway))
        .await
        .unwrap();
    // ...but not a node's answering in its place.
    let e = handshake(&node, &as_node, "edge-a", Some(Role::Gateway))
        .await
        .unwrap_err();
    assert!(e.contains("not admitted"), "{e}");

    // The gateway's certificate has the client usage (it asks the planner
    // who may serve a service), so it completes a handshake; what it may
    // do is its role's, and no port of a node admits the gateway role.
    gw.check_client_usage().unwrap();
    let (gc, gk) = write(d.path(), "gw", &gw_pem);
    let as_gw = ClientTls::load(&ca_file, Some(&gc), Some(&gk)).unwrap();
    handshake(&node, &as_gw, "edge-a", Some(Role::Node))
        .await
        .unwrap();
    let e = admit(
        &der(&gw_pem.cert),
        &[Role::Node, Role::Planner, Role::Client],
    )
    .unwrap_err();
    assert!(e.to_string().contains("not admitted"), "{e}");
    handshake(&node, &as_node, "edge-a", Some(Role::Node))
        .await
        .unwrap();
}
