//! Under mutual TLS a holder hands a cell's kept checkpoints only to the
//! nodes it was told of: the owner may store, the node the cell is
//! restored on may read the one version named. Any other certificate of
//! the cluster is refused when it stores, asks which pages the holder has,
//! or reads, and the restore still ends with an uninterrupted run's output.

mod common;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use roam_api::{ClientError, Refusal};
use roam_auth::cert::{make_ca, make_client, make_node_reach, Pem, Reach, Validity};
use roam_auth::{ClientTls, Identity, TlsFiles};
use roam_node::types::{KeepRequest, KeptAccess, KeptGrant};
use roam_node::{Client, ClientAuth};

const ARGS: [&str; 3] = ["8", "4", "4"];
const LIMIT: Duration = Duration::from_secs(120);
const YEAR: Validity = Validity { days: 365 };

/// A cluster CA and the certificates it signs, as files.
struct Pki {
    dir: tempfile::TempDir,
    ca: Pem,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = make_ca("test CA", YEAR).unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca.cert).unwrap();
        Pki { dir, ca }
    }

    fn write(&self, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
        let c = self.dir.path().join(format!("{name}.pem"));
        let k = self.dir.path().join(format!("{name}-key.pem"));
        std::fs::write(&c, &pem.cert).unwrap();
        std::fs::write(&k, &pem.key).unwrap();
        (c, k)
    }

    fn auth(&self, name: &str, pem: &Pem) -> ClientAuth {
        let (c, k) = self.write(name, pem);
        let ca = self.dir.path().join("ca.pem");
        ClientAuth {
            tls: Some(ClientTls::load(&ca, Some(&c), Some(&k)).unwrap()),
            token: None,
        }
    }

    fn node_cert(&self, name: &str) -> Pem {
        let lo: IpAddr = [127, 0, 0, 1].into();
        let reach = Reach {
            ips: vec![lo],
            ..Reach::default()
        };
        make_node_reach(&self.ca, name, &reach, YEAR).unwrap()
    }

    /// A node's identity, and the credentials of the operator that drives
    /// it in this test.
    fn node_setup(&self, name: &str) -> Setup {
        let (cert, key) = self.write(name, &self.node_cert(name));
        let id = Identity::load(&TlsFiles {
            ca: self.dir.path().join("ca.pem"),
            cert,
            key,
        })
        .unwrap();
        let alice = make_client(&self.ca, "alice", YEAR).unwrap();
        Setup {
            tls: Some((id, self.auth("alice", &alice))),
            ..Default::default()
        }
    }
}

/// `r` failed for want of a grant; `direct` when the holder itself
/// answered (a `403`), else another node passed its refusal on.
fn denied(what: &str, r: Result<impl std::fmt::Debug, ClientError>, direct: bool) {
    match r {
        Ok(v) => panic!("{what} was allowed: {v:?}"),
        Err(e) => {
            assert!(
                e.to_string().contains("has not granted it"),
                "{what} failed, but not for want of a grant: {e}"
            );
            let want = if direct {
                Refusal::Forbidden
            } else {
                Refusal::Upstream
            };
            assert_eq!(e.refusal(), Some(want), "{what}: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_gives_a_kept_checkpoint_only_to_the_nodes_granted() {
    let pki = Pki::new();
    let owner = TestNode::start("owner", pki.node_setup("owner")).await;
    let holder = TestNode::start("holder", pki.node_setup("holder")).await;
    let spare = TestNode::start("spare", pki.node_setup("spare")).await;
    // A node of the same cluster that the planner asked nothing of.
    let rogue = Client::with_auth(&holder.url, &pki.auth("rogue", &pki.node_cert("rogue")))
        .expect("a TLS client");

    let module = owner.upload("dirty").await;
    spare.upload("dirty").await;
    owner.launch(&module, "reference", &ARGS).await;
    owner.launch(&module, "kept", &ARGS).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let req = KeepRequest {
        holder: holder.url.clone(),
        holder_name: holder.name.clone(),
    };

    // Not granted yet: the holder refuses even the owner.
    let e = owner.client.keep("kept", &req).await;
    denied("a keep before any grant", e, false);

    let store = |node: &str| KeptGrant {
        node: node.into(),
        access: KeptAccess::Store,
        snapshot: None,
    };
    holder
        .client
        .grant_kept("kept", &store("owner"))
        .await
        .expect("an operator grants");
    let snapshot = owner
        .client
        .keep("kept", &req)
        .await
        .expect("the granted owner keeps a checkpoint")
        .snapshot;

    // The rogue node: no page list, no store, no read.
    let hashes = vec!["ab".repeat(32)];
    denied(
        "the rogue's page query",
        rogue.kept_missing("kept", &hashes).await,
        true,
    );
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(Ok(bytes::Bytes::from_static(b"not a checkpoint")))
        .await
        .unwrap();
    drop(tx);
    denied("the rogue's store", rogue.put_kept("kept", rx).await, true);
    let mut sink = Vec::new();
    denied(
        "the rogue's read",
        rogue.get_kept("kept", &snapshot, &mut sink, 1 << 30).await,
        true,
    );
    assert!(sink.is_empty(), "the rogue got {} bytes", sink.len());
    // A grant to store opens no read, even for the owner.
    let owner_reads = Client::with_auth(&holder.url, &pki.auth("owner", &pki.node_cert("owner")))
        .expect("a TLS client");
    denied(
        "the owner's read",
        owner_reads
            .get_kept("kept", &snapshot, &mut sink, 1 << 30)
            .await,
        true,
    );

    owner
        .client
        .kill("kept")
        .await
        .expect("the owner's copy stops");
    let restore = restore_request("kept", &module, &ARGS, &holder, &snapshot);
    // The spare may not read it until granted that version.
    let e = spare.client.restore(&restore).await;
    denied("a restore before its grant", e, false);
    let read = KeptGrant {
        node: "spare".into(),
        access: KeptAccess::Read,
        snapshot: Some(snapshot.clone()),
    };
    holder
        .client
        .grant_kept("kept", &read)
        .await
        .expect("an operator grants");
    let restored = spare.client.restore(&restore).await;
    assert!(restored.is_ok(), "{restored:?}");
    // The rogue still reads nothing.
    denied(
        "the rogue's read after the spare's grant",
        rogue.get_kept("kept", &snapshot, &mut sink, 1 << 30).await,
        true,
    );

    assert_same_output(&spare, "kept", &owner, "reference", LIMIT).await;
}

/// A grant names a node and, for a read, a version: a bad one is refused
/// with the reason, and a store grant naming a version too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_grant_is_refused() {
    let holder = TestNode::start("holder", Setup::default()).await;
    for (g, why) in [
        (
            KeptGrant {
                node: "../etc".into(),
                access: KeptAccess::Store,
                snapshot: None,
            },
            "node name",
        ),
        (
            KeptGrant {
                node: "spare".into(),
                access: KeptAccess::Read,
                snapshot: Some("not-a-hash".into()),
            },
            "is not a BLAKE3 hash",
        ),
        (
            KeptGrant {
                node: "owner".into(),
                access: KeptAccess::Store,
                snapshot: Some("ab".repeat(32)),
            },
            "names no snapshot",
        ),
    ] {
        let e = holder
            .client
            .grant_kept("kept", &g)
            .await
            .expect_err("a bad grant is refused");
        assert!(e.to_string().contains(why), "{e}");
    }
}
