//! The store over a secured etcd, as a production cluster runs it: TLS
//! with client certificates (`--client-cert-auth`), and etcd's own users
//! (`auth enable`) with a role that grants only the store's prefix. The
//! whole contract runs over each, and the refusals are checked: a client
//! without a certificate, a server signed by another CA, a wrong password,
//! no login at all.
//!
//! The certificates are made fresh for each test with `roam-auth`'s
//! helpers, the ones `roam cert` uses.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcd_client::{Client, Permission};
use roam_auth::cert::{make_ca, make_client, make_node_reach, Pem, Reach, Validity};
use roam_cluster::{ClusterStore, EtcdAccess, EtcdAccessFiles, EtcdStore, StoreError, StoreSpec};
use roam_testkit::etcd::{Etcd, EtcdConfig, EtcdTls};

use crate::contract::{cell, Fixture};

const PREFIX: &str = "/roam-test/";
const ROOT_PASSWORD: &str = "root-secret-0123";
const ROAM_PASSWORD: &str = "roam secret, with spaces";

/// A CA that signed etcd's server certificate and the planner's client
/// certificate, and a stranger's CA with a client certificate of its own,
/// as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let v = Validity { days: 1 };
        let write = |name: &str, pem: &Pem| {
            std::fs::write(dir.path().join(format!("{name}.pem")), &pem.cert).unwrap();
            std::fs::write(dir.path().join(format!("{name}-key.pem")), &pem.key).unwrap();
        };
        let ca = make_ca("etcd-test-ca", v).unwrap();
        write("ca", &ca);
        // etcd's certificate must name the address clients dial:
        // localhost and 127.0.0.1 (only added when asked for).
        let local = Reach {
            dns: Vec::new(),
            ips: Vec::new(),
            local: true,
        };
        write("etcd", &make_node_reach(&ca, "etcd", &local, v).unwrap());
        write("planner", &make_client(&ca, "roam-planner", v).unwrap());
        let stranger = make_ca("stranger-ca", v).unwrap();
        write("stranger-ca", &stranger);
        write("stranger", &make_client(&stranger, "intruder", v).unwrap());
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// How etcd is started: its certificate, requiring client
    /// certificates signed by the CA.
    fn server(&self) -> EtcdConfig {
        EtcdConfig {
            tls: Some(EtcdTls {
                ca: self.path("ca.pem"),
                cert: self.path("etcd.pem"),
                key: self.path("etcd-key.pem"),
                client_cert_auth: true,
            }),
            ..EtcdConfig::default()
        }
    }

    /// A client's access: trusting `ca`, presenting `who`'s certificate.
    fn access(&self, ca: &str, who: Option<&str>) -> EtcdAccess {
        EtcdAccessFiles {
            ca: Some(self.path(&format!("{ca}.pem"))),
            cert: who.map(|w| self.path(&format!("{w}.pem"))),
            key: who.map(|w| self.path(&format!("{w}-key.pem"))),
            ..EtcdAccessFiles::default()
        }
        .load()
        .unwrap()
    }
}

async fn connect(etcd: &Etcd, access: &EtcdAccess) -> Result<EtcdStore, StoreError> {
    EtcdStore::connect_with(&[etcd.endpoint()], PREFIX, access).await
}

fn backend_message(r: Result<EtcdStore, StoreError>) -> String {
    match r {
        Err(StoreError::Backend { backend, message }) => {
            assert_eq!(backend, "etcd");
            message
        }
        Err(other) => panic!("expected a backend error, got {other}"),
        Ok(store) => panic!("connected, but should have been refused: {store:?}"),
    }
}

async fn tls_fixture() -> Option<Fixture<EtcdStore>> {
    let pki = Pki::new();
    let etcd = Etcd::start_with_or_skip(&pki.server())?;
    let access = pki.access("ca", Some("planner"));
    let a = Arc::new(connect(&etcd, &access).await.unwrap());
    let b = Arc::new(connect(&etcd, &access).await.unwrap());
    Some(Fixture {
        a,
        b,
        _guard: Box::new((etcd, pki)),
    })
}

/// The whole contract over TLS with a client certificate.
mod over_tls {
    use super::tls_fixture;
    contract_tests!(tls_fixture);
}

/// The same etcd refuses a client that presents no certificate, or one
/// from another CA, and a client that does not trust etcd's CA refuses
/// etcd; each error says which flag to look at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refusals_name_the_flag_to_fix() {
    let pki = Pki::new();
    let Some(etcd) = Etcd::start_with_or_skip(&pki.server()) else {
        return;
    };
    // The right certificate works, through a spec as `roam planner` opens it.
    let spec: StoreSpec = format!("etcds://{}/spec-test", etcd.endpoint())
        .parse()
        .unwrap();
    let store = spec
        .open_with(&pki.access("ca", Some("planner")))
        .await
        .unwrap();
    store.create_cell(cell("c-1", "edge-a")).await.unwrap();
    assert_eq!(store.cells().await.unwrap().len(), 1);
    // TLS flags with a plain etcd:// spec (or a redb one) are a mistake
    // said as such, not a silently plain connection.
    for plain in [format!("etcd://{}", etcd.endpoint()), "redb:x.redb".into()] {
        let spec: StoreSpec = plain.parse().unwrap();
        match spec.open_with(&pki.access("ca", Some("planner"))).await {
            Err(StoreError::Invalid(m)) => assert!(m.contains("--etcd-"), "{m}"),
            Err(other) => panic!("{plain} with --etcd-ca: {other}"),
            Ok(_) => panic!("{plain} with --etcd-ca opened"),
        }
    }

    let m = backend_message(connect(&etcd, &pki.access("ca", None)).await);
    println!("no client certificate: {m}");
    assert!(m.contains(&etcd.endpoint()), "{m}");
    assert!(m.contains("--etcd-cert"), "{m}");

    let m = backend_message(connect(&etcd, &pki.access("ca", Some("stranger"))).await);
    println!("a stranger's client certificate: {m}");
    assert!(m.contains("--etcd-cert"), "{m}");

    let m = backend_message(connect(&etcd, &pki.access("stranger-ca", Some("planner"))).await);
    println!("etcd's certificate from another CA: {m}");
    assert!(m.contains("--etcd-ca"), "{m}");
    assert!(m.to_lowercase().contains("certificate"), "{m}");

    // A plain client gets nowhere either, and is told about etcds://.
    let m = backend_message(EtcdStore::connect(&[etcd.endpoint()], PREFIX).await);
    println!("a plain client: {m}");
    assert!(m.contains("etcds://"), "{m}");

    // A login to an etcd whose authentication is off is refused rather
    // than ignored: the operator believes it is on.
    let password = pki.path("password");
    std::fs::write(&password, ROOT_PASSWORD).unwrap();
    let with_user = EtcdAccessFiles {
        ca: Some(pki.path("ca.pem")),
        cert: Some(pki.path("planner.pem")),
        key: Some(pki.path("planner-key.pem")),
        user: Some("root".into()),
        password_file: Some(password),
    }
    .load()
    .unwrap();
    let m = backend_message(connect(&etcd, &with_user).await);
    println!("a login where authentication is off: {m}");
    assert!(m.contains("--etcd-user"), "{m}");

    // Nothing reached etcd from the refused clients.
    let raw = raw_client(&etcd, &pki).await;
    let all = raw
        .kv_client()
        .get(
            "/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(all.count(), 1, "only the spec test's cell is stored");

    // A dead etcd is a dead etcd, not a refused certificate.
    let mut etcd = etcd;
    etcd.kill();
    let m = backend_message(connect(&etcd, &pki.access("ca", Some("planner"))).await);
    println!("a dead etcd over TLS: {m}");
    assert!(!m.contains("--etcd-"), "{m}");
}

/// A client of etcd with the planner's own certificate, for checks
/// behind the store's back.
async fn raw_client(etcd: &Etcd, pki: &Pki) -> Client {
    let ca = std::fs::read(pki.path("ca.pem")).unwrap();
    let cert = std::fs::read(pki.path("planner.pem")).unwrap();
    let key = std::fs::read(pki.path("planner-key.pem")).unwrap();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(ca))
        .identity(etcd_client::Identity::from_pem(cert, key));
    let options = etcd_client::ConnectOptions::new().with_tls(tls);
    Client::connect([etcd.endpoint()], Some(options))
        .await
        .unwrap()
}

/// Turn on etcd's authentication with a `root` user and a `roam` user
/// whose role grants read and write under [`PREFIX`] only: the least a
/// planner needs, as `docs/control-plane.md` describes it.
async fn enable_auth(etcd: &Etcd) {
    enable_auth_with(Client::connect([etcd.url()], None).await.unwrap()).await;
}

async fn enable_auth_with(raw: Client) {
    let mut auth = raw.auth_client();
    auth.user_add("root", ROOT_PASSWORD, None).await.unwrap();
    auth.user_grant_role("root", "root").await.unwrap();
    auth.role_add("roam").await.unwrap();
    auth.role_grant_permission("roam", Permission::read_write(PREFIX).with_prefix())
        .await
        .unwrap();
    auth.user_add("roam", ROAM_PASSWORD, None).await.unwrap();
    auth.user_grant_role("roam", "roam").await.unwrap();
    auth.auth_enable().await.unwrap();
}

/// The login of `user` with `password`, through a password file as the
/// planner reads it (with the newline an editor leaves).
fn login(dir: &Path, user: &str, password: &str) -> EtcdAccess {
    let file = dir.join(format!("{user}.password"));
    std::fs::write(&file, format!("{password}\n")).unwrap();
    EtcdAccessFiles {
        user: Some(user.into()),
        password_file: Some(file),
        ..EtcdAccessFiles::default()
    }
    .load()
    .unwrap()
}

async fn auth_fixture() -> Option<Fixture<EtcdStore>> {
    let etcd = Etcd::start_or_skip()?;
    enable_auth(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let access = login(dir.path(), "roam", ROAM_PASSWORD);
    let a = Arc::new(connect(&etcd, &access).await.unwrap());
    let b = Arc::new(connect(&etcd, &access).await.unwrap());
    Some(Fixture {
        a,
        b,
        _guard: Box::new((etcd, dir)),
    })
}

/// The whole contract as an etcd user whose role grants only the prefix.
mod with_login {
    use super::auth_fixture;
    contract_tests!(auth_fixture);
}

/// With authentication on, a wrong password, an unknown user and no
/// login at all are refused, each saying what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_refusals_name_the_flag_to_fix() {
    let Some(etcd) = Etcd::start_or_skip() else {
        return;
    };
    enable_auth(&etcd).await;
    let dir = tempfile::tempdir().unwrap();

    let m = backend_message(connect(&etcd, &login(dir.path(), "roam", "not-the-password")).await);
    println!("a wrong password: {m}");
    assert!(m.contains("--etcd-password-file"), "{m}");
    assert!(m.contains(&etcd.endpoint()), "{m}");

    let m = backend_message(connect(&etcd, &login(dir.path(), "nobody", ROAM_PASSWORD)).await);
    println!("an unknown user: {m}");
    assert!(m.contains("--etcd-user"), "{m}");

    let m = backend_message(connect(&etcd, &EtcdAccess::default()).await);
    println!("no login: {m}");
    assert!(m.contains("--etcd-user"), "{m}");

    // A user whose role does not reach the prefix is refused at connect
    // time, not at the first write.
    let m = backend_message(
        EtcdStore::connect_with(
            &[etcd.endpoint()],
            "/elsewhere/",
            &login(dir.path(), "roam", ROAM_PASSWORD),
        )
        .await,
    );
    println!("outside the role's prefix: {m}");
    assert!(m.contains("/elsewhere/"), "{m}");

    // The right password works, and what it writes is there.
    let s = connect(&etcd, &login(dir.path(), "roam", ROAM_PASSWORD))
        .await
        .unwrap();
    s.create_cell(cell("c-1", "edge-a")).await.unwrap();
    assert_eq!(s.cell("c-1").await.unwrap().unwrap().value.owner, "edge-a");
}

/// etcd's login tokens run out when idle; a planner idle for longer logs
/// in again by itself instead of failing every call from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_login_is_renewed() {
    let config = EtcdConfig {
        auth_token_ttl: Some(1),
        ..EtcdConfig::default()
    };
    let Some(etcd) = Etcd::start_with_or_skip(&config) else {
        return;
    };
    enable_auth(&etcd).await;
    let dir = tempfile::tempdir().unwrap();
    let s = connect(&etcd, &login(dir.path(), "roam", ROAM_PASSWORD))
        .await
        .unwrap();
    s.create_cell(cell("c-1", "edge-a")).await.unwrap();
    // Past the token's TTL (etcd checks it about every second).
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert_eq!(s.cell("c-1").await.unwrap().unwrap().value.owner, "edge-a");
    s.create_cell(cell("c-2", "edge-a")).await.unwrap();
    assert_eq!(s.cells().await.unwrap().len(), 2);
}

/// With client certificates and users both on, etcd takes a client that
/// does not log in as the user its certificate's common name names (as
/// `docs/control-plane.md` warns): the certificate alone is a login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_alone_logs_in_as_its_common_name() {
    let pki = Pki::new();
    let v = Validity { days: 1 };
    let ca = Pem {
        cert: std::fs::read_to_string(pki.path("ca.pem")).unwrap(),
        key: std::fs::read_to_string(pki.path("ca-key.pem")).unwrap(),
    };
    let roam = make_client(&ca, "roam", v).unwrap();
    std::fs::write(pki.path("roam.pem"), &roam.cert).unwrap();
    std::fs::write(pki.path("roam-key.pem"), &roam.key).unwrap();
    let Some(etcd) = Etcd::start_with_or_skip(&pki.server()) else {
        return;
    };
    enable_auth_with(raw_client(&etcd, &pki).await).await;
    // CN "roam": the user whose role reaches the prefix.
    let s = connect(&etcd, &pki.access("ca", Some("roam")))
        .await
        .unwrap();
    s.create_cell(cell("c-1", "edge-a")).await.unwrap();
    // CN "roam-planner": no such user, so nothing.
    let m = backend_message(connect(&etcd, &pki.access("ca", Some("planner"))).await);
    println!("a certificate naming no user: {m}");
    assert!(m.contains("--etcd-user"), "{m}");
}
