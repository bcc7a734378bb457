//! PEM files into rustls configurations: mutual TLS for the listeners of
//! nodes, gateways and the planner and for their clients, and the checks of
//! a peer's certificate (its node name, its role).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::role::{self, PeerId, Role, RoleError};

/// ALPN of the control API (HTTP/1.1).
pub const ALPN_HTTP: &[u8] = b"http/1.1";
/// ALPN of the migration port: a migration client cannot talk to a control
/// API by mistake, nor the reverse.
pub const ALPN_MIGRATE: &[u8] = b"roam-migrate/1";

/// Where a node's TLS material is.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The cluster CA certificate (`ca.pem`).
    pub ca: PathBuf,
    /// This node's certificate (`NAME.pem` from `roam cert node`).
    pub cert: PathBuf,
    /// Its private key (`NAME-key.pem`).
    pub key: PathBuf,
}

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read the {what} {}", path.display())]
    Read {
        /// Which file it is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A file holds no usable PEM object of the expected kind.
    #[error("{} holds no PEM {what}; make one with `roam cert`", path.display())]
    NoPem {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// The CA certificate is not usable as a trust anchor.
    #[error("{} is not a usable CA certificate", path.display())]
    BadCa {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// A client certificate was given without its key, or the reverse.
    #[error("a client certificate needs both --tls-cert and --tls-key")]
    HalfIdentity,
    /// The certificate carries no usable role (made by an older
    /// `roam cert`, or not by `roam cert` at all).
    #[error("{} cannot be used", path.display())]
    Role {
        /// The certificate file.
        path: PathBuf,
        /// Why.
        #[source]
        source: RoleError,
    },
    /// The certificate and key do not make a usable identity, or its
    /// certificate does not chain to the CA.
    #[error("{} cannot be used with {} and the CA {}: make the certificate with `roam cert` from that CA", files.cert.display(), files.key.display(), files.ca.display())]
    Identity {
        /// The three files.
        files: Box<TlsFiles>,
        /// Why.
        #[source]
        source: rustls::Error,
    },
}

/// A certificate does not name the node it is used for.
#[derive(Debug, thiserror::Error)]
#[error("the certificate is not a node certificate of this cluster for `{name}`")]
pub struct NameError {
    /// The node name that was checked.
    pub name: String,
    /// Why.
    #[source]
    pub source: NameCheck,
}

/// Which check of [`NameError`] failed.
#[derive(Debug, thiserror::Error)]
pub enum NameCheck {
    /// The TLS check: chain to the CA, validity, server-auth usage, the
    /// name as a DNS name.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// The role: not a node certificate, or one whose name (CN) is another
    /// node's, which an extra `--dns` name would otherwise allow.
    #[error(transparent)]
    Role(#[from] RoleError),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, LoadError> {
    let pem = read(what, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(LoadError::NoPem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, LoadError> {
    let pem = read("private key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| LoadError::NoPem {
        path: path.to_path_buf(),
        what: "private key",
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, LoadError> {
    let mut store = RootCertStore::empty();
    for c in certs("CA certificate", path)? {
        store.add(c).map_err(|source| LoadError::BadCa {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(Arc::new(store))
}

/// What a client of a node needs: the CA that servers' certificates must
/// chain to, and optionally its own certificate (nodes require one).
#[derive(Clone)]
pub struct ClientTls {
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl ClientTls {
    /// Load the CA, and the client certificate and key if given (both or
    /// neither).
    pub fn load(
        ca: &Path,
        cert: Option<&Path>,
        key_file: Option<&Path>,
    ) -> Result<Self, LoadError> {
        let roots = roots(ca)?;
        let identity = match (cert, key_file) {
            (Some(c), Some(k)) => Some((certs("certificate", c)?, Arc::new(key(k)?))),
            (None, None) => None,
            _ => return Err(LoadError::HalfIdentity),
        };
        Ok(ClientTls { roots, identity })
    }

    /// A client configuration offering `alpn`. Servers are checked against
    /// the CA only: no system roots.
    pub fn config(&self, alpn: &[u8]) -> Result<Arc<ClientConfig>, rustls::Error> {
        let b = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.roots.clone());
        self.finish(b, alpn)
    }

    /// [`ClientTls::config`], and the server's certificate must also carry
    /// `role`: a node linking to its gateway does not accept a node's or
    /// the planner's certificate that happens to name the same address.
    pub fn config_for(&self, alpn: &[u8], role: Role) -> Result<Arc<ClientConfig>, rustls::Error> {
        let inner = WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        let b = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RoleVerifier { inner, role }));
        self.finish(b, alpn)
    }

    fn finish(
        &self,
        b: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
        alpn: &[u8],
    ) -> Result<Arc<ClientConfig>, rustls::Error> {
        let mut cfg = match &self.identity {
            Some((chain, key)) => b.with_client_auth_cert(chain.clone(), key.clone_key())?,
            None => b.with_no_client_auth(),
        };
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// The CA's check of a server's certificate, then its role.
#[derive(Debug)]
struct RoleVerifier {
    inner: Arc<WebPkiServerVerifier>,
    role: Role,
}

impl ServerCertVerifier for RoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ok =
            self.inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        // `General`, not `CertificateError::Other`: rustls prints the
        // latter with `Debug`, and this message is for the operator.
        role::admit(end_entity, &[self.role]).map_err(|e| {
            rustls::Error::General(format!("the server's certificate is refused: {e}"))
        })?;
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A daemon's identity (a node's, the gateway's, the planner's): the
/// cluster CA, and its certificate and key, which it uses as a server and
/// as a client (calls to nodes and the planner; the gateway's only to the
/// planner, and only with a certificate that has the client usage).
#[derive(Clone)]
pub struct Identity {
    files: TlsFiles,
    client: ClientTls,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    peers: Arc<WebPkiServerVerifier>,
    own: PeerId,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Identity {
    /// Load the three files and check that they fit: the certificate
    /// carries a role, the key matches it, and it chains to the CA (as a
    /// server for a gateway, whose certificate from before the gateway
    /// asked the planner has no client usage; as a client for every other
    /// role).
    pub fn load(files: &TlsFiles) -> Result<Identity, LoadError> {
        let client = ClientTls::load(&files.ca, Some(&files.cert), Some(&files.key))?;
        let (chain, key) = client.identity.clone().expect("loaded with an identity");
        let bad = |source| LoadError::Identity {
            files: Box::new(files.clone()),
            source,
        };
        let peers = WebPkiServerVerifier::builder_with_provider(client.roots.clone(), provider())
            .build()
            .map_err(|e| bad(rustls::Error::General(e.to_string())))?;
        let own = role::peer_id(&chain[0]).map_err(|source| LoadError::Role {
            path: files.cert.clone(),
            source,
        })?;
        let id = Identity {
            files: files.clone(),
            client,
            chain,
            key,
            peers,
            own,
        };
        // Both configurations must build (the key matches the certificate).
        id.server_config(ALPN_HTTP).map_err(bad)?;
        id.client.config(ALPN_HTTP).map_err(bad)?;
        // The certificate must chain to the CA.
        if id.own.role == Role::Gateway {
            let name = ServerName::try_from(id.own.name.clone())
                .map_err(|e| bad(rustls::Error::General(format!("not a DNS name: {e}"))))?;
            id.peers
                .verify_server_cert(&id.chain[0], &id.chain[1..], &name, &[], UnixTime::now())
                .map_err(bad)?;
        } else {
            let verifier = id.client_verifier().map_err(bad)?;
            verifier
                .verify_client_cert(&id.chain[0], &id.chain[1..], UnixTime::now())
                .map_err(bad)?;
        }
        Ok(id)
    }

    /// Check that this identity's certificate may be used as a client
    /// (chains to the CA with the client-auth usage). A gateway certificate
    /// made before the gateway asked the planner has server auth only: the
    /// planner would refuse its handshake, so `roam gateway --planner`
    /// checks at start.
    pub fn check_client_usage(&self) -> Result<(), rustls::Error> {
        self.client_verifier()?
            .verify_client_cert(&self.chain[0], &self.chain[1..], UnixTime::now())
            .map(|_| ())
    }

    /// Who this identity's certificate says it is.
    pub fn id(&self) -> &PeerId {
        &self.own
    }

    /// Check that this identity's certificate carries `role`: a daemon
    /// started with another party's certificate (the gateway with a node's,
    /// say) fails at start.
    pub fn check_own_role(&self, role: Role) -> Result<(), RoleError> {
        role::admit(&self.chain[0], &[role]).map(|_| ())
    }

    /// The files this identity came from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn client_verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        WebPkiClientVerifier::builder_with_provider(self.client.roots.clone(), provider())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))
    }

    /// A server configuration for `alpn` that requires a client certificate
    /// chained to the CA: a client without one, or with one from another
    /// CA, fails the handshake before it can send a request.
    pub fn server_config(&self, alpn: &[u8]) -> Result<Arc<ServerConfig>, rustls::Error> {
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(self.client_verifier()?)
            .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        cfg.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The node as a client of other nodes.
    pub fn client(&self) -> &ClientTls {
        &self.client
    }

    /// Check that this node's own certificate names `name`: a node started
    /// with another node's certificate fails at start, not at its first
    /// migration.
    pub fn check_own_name(&self, name: &str) -> Result<(), NameError> {
        self.check_node(&self.chain[0], name)
    }

    /// Check that `cert` (a peer's, DER) is a node certificate of this
    /// cluster issued for `name`: chained to the CA, valid now, with the
    /// server-auth usage and `name` as a DNS name, the `node` role, and
    /// `name` as its common name. Operator, gateway and planner
    /// certificates are refused, and so is node A's certificate that also
    /// lists B as an extra DNS name.
    pub fn check_node(&self, cert: &[u8], name: &str) -> Result<(), NameError> {
        node_check(&self.peers, cert, name)
    }

    /// Read the role and name of a peer's certificate (DER) that the
    /// handshake already verified against this identity's CA, admitted only
    /// if its role is in `allowed`.
    pub fn admit(&self, cert: &[u8], allowed: &[Role]) -> Result<PeerId, RoleError> {
        role::admit(cert, allowed)
    }
}

fn node_check(peers: &WebPkiServerVerifier, cert: &[u8], name: &str) -> Result<(), NameError> {
    let err = |source: NameCheck| NameError {
        name: name.to_string(),
        source,
    };
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|e| err(rustls::Error::General(format!("not a DNS name: {e}")).into()))?;
    peers
        .verify_server_cert(
            &CertificateDer::from(cert.to_vec()),
            &[],
            &server_name,
            &[],
            UnixTime::now(),
        )
        .map_err(|e| err(e.into()))?;
    let peer = role::admit(cert, &[Role::Node]).map_err(|e| err(e.into()))?;
    if peer.name != name {
        return Err(err(NameCheck::Role(RoleError::NotAdmitted {
            allowed: format!("node `{name}`'s own certificate"),
            peer,
        })));
    }
    Ok(())
}

/// Check, without a loaded identity, that `cert` (DER) is a node
/// certificate for `name` from the CA in `ca` (DER). Used by tests and
/// tools; nodes use [`Identity::check_node`].
pub fn cert_names_node(ca: &[u8], cert: &[u8], name: &str) -> Result<(), NameError> {
    let err = |source: rustls::Error| NameError {
        name: name.to_string(),
        source: source.into(),
    };
    let mut store = RootCertStore::empty();
    store.add(CertificateDer::from(ca.to_vec())).map_err(err)?;
    let v = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider())
        .build()
        .map_err(|e| err(rustls::Error::General(e.to_string())))?;
    node_check(&v, cert, name)
}
