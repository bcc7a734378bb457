//! The node control API's listener over real mutual TLS: node, planner and
//! operator certificates are served; a gateway's is not, and a role the
//! listener does not admit gets `403` with the reason before any handler.

use std::net::IpAddr;
use std::path::Path;

use axum::routing::get;
use axum::Router;
use roam_auth::cert::{make_ca, make_client, make_gateway, make_node, make_planner, Pem};
use roam_auth::cert::{Reach, Validity};
use roam_auth::tokio_rustls::TlsAcceptor;
use roam_auth::{ClientTls, Identity, Role, TlsFiles, ALPN_HTTP};

use super::{only, Peer, TlsListener};

const YEAR: Validity = Validity { days: 365 };

fn write(dir: &Path, name: &str, pem: &Pem) -> (std::path::PathBuf, std::path::PathBuf) {
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&c, &pem.cert).unwrap();
    std::fs::write(&k, &pem.key).unwrap();
    (c, k)
}

/// Serve a route that answers the caller's role and name, behind
/// `roles`; the URL.
async fn serve(dir: &Path, ca: &Pem, roles: Option<&'static [Role]>) -> String {
    let lo: IpAddr = [127, 0, 0, 1].into();
    let node = make_node(ca, "edge-a", &[], &[lo], YEAR).unwrap();
    let (cert, key) = write(dir, "edge-a", &node);
    let id = Identity::load(&TlsFiles {
        ca: dir.join("ca.pem"),
        cert,
        key,
    })
    .unwrap();
    let acceptor = TlsAcceptor::from(id.server_config(ALPN_HTTP).unwrap());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let l = match roles {
        None => TlsListener::new(l, acceptor).unwrap(),
        Some(r) => TlsListener::admitting(l, acceptor, r).unwrap(),
    };
    let app = Router::new()
        .route(
            "/who",
            get(
                |axum::extract::ConnectInfo(p): axum::extract::ConnectInfo<Peer>| async move {
                    p.id.map(|i| i.to_string()).unwrap_or_default()
                },
            ),
        )
        .merge(only(
            Router::new().route("/ops", get(|| async { "ops" })),
            &[Role::Planner, Role::Client],
        ))
        .into_make_service_with_connect_info::<Peer>();
    tokio::spawn(async move { axum::serve(l, app).await });
    format!("https://127.0.0.1:{port}/who")
}

fn client(dir: &Path, name: &str, pem: &Pem) -> reqwest::Client {
    let (c, k) = write(dir, name, pem);
    let tls = ClientTls::load(&dir.join("ca.pem"), Some(&c), Some(&k)).unwrap();
    let cfg = tls.config_for(ALPN_HTTP, Role::Node).unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls((*cfg).clone())
        .build()
        .unwrap()
}

async fn call(c: &reqwest::Client, url: &str) -> Result<(u16, String), reqwest::Error> {
    let r = c.get(url).send().await?;
    let st = r.status().as_u16();
    Ok((st, r.text().await.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_control_api_serves_nodes_the_planner_and_operators_only() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("test CA", YEAR).unwrap();
    std::fs::write(d.path().join("ca.pem"), &ca.cert).unwrap();
    let url = serve(d.path(), &ca, None).await;
    let reach = Reach::default();
    for (name, pem, who) in [
        (
            "edge-b",
            make_node(&ca, "edge-b", &[], &[], YEAR).unwrap(),
            "node `edge-b`",
        ),
        (
            "plan",
            make_planner(&ca, "plan", &reach, YEAR).unwrap(),
            "planner `plan`",
        ),
        (
            "alice",
            make_client(&ca, "alice", YEAR).unwrap(),
            "client `alice`",
        ),
    ] {
        let (st, body) = call(&client(d.path(), name, &pem), &url).await.unwrap();
        assert_eq!((st, body.as_str()), (200, who));
    }
    // The gateway's certificate completes the handshake (it has the client
    // usage, for its one question to the planner), but a listener that
    // does not admit its role answers 403 before any route.
    let gw = make_gateway(&ca, "gw", &reach, YEAR).unwrap();
    let (st, body) = call(&client(d.path(), "gw", &gw), &url).await.unwrap();
    assert_eq!(st, 403, "{body}");
    assert!(
        body.contains("gateway `gw` certificate is not admitted"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_the_listener_does_not_admit_gets_403_and_the_reason() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("test CA", YEAR).unwrap();
    std::fs::write(d.path().join("ca.pem"), &ca.cert).unwrap();
    let url = serve(d.path(), &ca, Some(&[Role::Client])).await;
    let node = make_node(&ca, "edge-b", &[], &[], YEAR).unwrap();
    let (st, body) = call(&client(d.path(), "edge-b", &node), &url)
        .await
        .unwrap();
    assert_eq!(st, 403, "{body}");
    assert!(
        body.contains("node `edge-b` certificate is not admitted here: only client"),
        "{body}"
    );
    let alice = make_client(&ca, "alice", YEAR).unwrap();
    let (st, _) = call(&client(d.path(), "alice", &alice), &url)
        .await
        .unwrap();
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_for_other_roles_gets_403_and_who_may_call_it() {
    let d = tempfile::tempdir().unwrap();
    let ca = make_ca("test CA", YEAR).unwrap();
    std::fs::write(d.path().join("ca.pem"), &ca.cert).unwrap();
    let who = serve(d.path(), &ca, None).await;
    let ops = who.replace("/who", "/ops");
    let node = client(
        d.path(),
        "edge-b",
        &make_node(&ca, "edge-b", &[], &[], YEAR).unwrap(),
    );
    // Admitted by the listener, so the open route serves it...
    assert_eq!(call(&node, &who).await.unwrap().0, 200);
    // ...but not the operators' route.
    let (st, body) = call(&node, &ops).await.unwrap();
    assert_eq!(st, 403, "{body}");
    assert!(
        body.contains(
            "node `edge-b` may not call GET /ops; only a planner or client certificate may"
        ),
        "{body}"
    );
    let alice = client(d.path(), "alice", &make_client(&ca, "alice", YEAR).unwrap());
    assert_eq!(call(&alice, &ops).await.unwrap(), (200, "ops".to_string()));
}
