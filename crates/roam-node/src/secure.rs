//! Who may use a node: mutual TLS on both listeners, the certificate roles
//! each admits, the bearer token on the control API, and the rule that a
//! node without either listens only on loopback (`docs/trust.md`).
//!
//! Why here and not in the API or migration code: those only see
//! connections that were already admitted. Everything that decides whether
//! a connection gets that far is in this module, so it can be read (and
//! reviewed) in one place.

use std::net::SocketAddr;

use roam_auth::tokio_rustls::{TlsAcceptor, TlsConnector};
use roam_auth::{Identity, Role, Token, ALPN_HTTP, ALPN_MIGRATE};

use crate::client::ClientAuth;
use crate::config::NodeConfig;

pub(crate) use roam_api::serve::HANDSHAKE_TIMEOUT;

/// A node's credentials, ready to use.
pub(crate) struct NodeAuth {
    /// The node's identity (TLS), to check peers' node names.
    pub identity: Option<Identity>,
    /// Acceptor of the control API (ALPN `http/1.1`).
    pub control: Option<TlsAcceptor>,
    /// Acceptor of the migration port (ALPN `roam-migrate/1`).
    pub migrate: Option<TlsAcceptor>,
    /// Connector to other nodes' migration ports.
    pub connector: Option<TlsConnector>,
    /// How this node calls other nodes' control APIs.
    pub client: ClientAuth,
    /// The token the control API requires.
    pub token: Option<Token>,
}

/// Why a node refuses to start with the credentials it was given.
#[derive(Debug, thiserror::Error)]
pub enum ExposureError {
    /// An unauthenticated listener on a non-loopback address.
    #[error(
        "refusing to serve the {what} on {addr} without authentication: anyone who can reach \
         it could {could}. Give --tls-ca, --tls-cert and --tls-key (make them with `roam cert`){token}, \
         or listen on 127.0.0.1, or add --insecure if the network itself is trusted \
         (see docs/trust.md)"
    )]
    Unauthenticated {
        /// Which listener.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// What an attacker could do.
        could: &'static str,
        /// The token alternative, where it applies.
        token: &'static str,
    },
    /// The node's certificate is not a node certificate (a gateway's, the
    /// planner's, an operator's, or one made before roles existed).
    #[error(
        "the certificate {} is not a node certificate: make one with `roam cert node {name}` \
         (see docs/trust.md)",
        cert.display()
    )]
    WrongRole {
        /// The node name.
        name: String,
        /// The certificate file.
        cert: std::path::PathBuf,
        /// Why.
        #[source]
        source: roam_auth::RoleError,
    },
    /// The node's certificate does not name it.
    #[error(
        "the certificate {} is not for node `{name}`: make one with `roam cert node {name}`, \
         or start the node with --name set to the name in the certificate",
        cert.display()
    )]
    WrongName {
        /// The node name.
        name: String,
        /// The certificate file.
        cert: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<roam_auth::NameError>,
    },
    /// A TLS configuration could not be built.
    #[error("cannot build the TLS configuration")]
    Tls(#[from] roam_auth::rustls::Error),
}

impl NodeAuth {
    /// Check the configuration against the exposure rule and build the
    /// TLS acceptors and connector.
    pub(crate) fn new(cfg: &NodeConfig) -> Result<NodeAuth, ExposureError> {
        let tls = cfg.tls.is_some();
        if !cfg.insecure && !tls && cfg.token.is_none() && !cfg.listen.ip().is_loopback() {
            return Err(ExposureError::Unauthenticated {
                what: "control API",
                addr: cfg.listen,
                could: "launch, kill and move cells",
                token: ", or --token-file",
            });
        }
        if !cfg.insecure && !tls && !cfg.migrate_listen.ip().is_loopback() {
            return Err(ExposureError::Unauthenticated {
                what: "migration port",
                addr: cfg.migrate_listen,
                could: "push cells into this node",
                token: " (a token does not protect this port)",
            });
        }
        let Some(id) = &cfg.tls else {
            return Ok(NodeAuth {
                identity: None,
                control: None,
                migrate: None,
                connector: None,
                client: ClientAuth {
                    tls: None,
                    token: cfg.token.clone(),
                },
                token: cfg.token.clone(),
            });
        };
        id.check_own_role(Role::Node)
            .map_err(|source| ExposureError::WrongRole {
                name: cfg.name.clone(),
                cert: id.files().cert.clone(),
                source,
            })?;
        id.check_own_name(&cfg.name)
            .map_err(|source| ExposureError::WrongName {
                name: cfg.name.clone(),
                cert: id.files().cert.clone(),
                source: Box::new(source),
            })?;
        Ok(NodeAuth {
            identity: Some(id.clone()),
            control: Some(TlsAcceptor::from(id.server_config(ALPN_HTTP)?)),
            migrate: Some(TlsAcceptor::from(id.server_config(ALPN_MIGRATE)?)),
            // A source pushes a cell only into a node.
            connector: Some(TlsConnector::from(
                id.client().config_for(ALPN_MIGRATE, Role::Node)?,
            )),
            client: ClientAuth {
                tls: Some(id.client().clone()),
                token: cfg.token.clone(),
            },
            token: cfg.token.clone(),
        })
    }
}

/// Does the node serve TLS? Used for the scheme of addresses it gives out.
pub(crate) fn scheme(auth: &NodeAuth) -> &'static str {
    if auth.control.is_some() {
        "https"
    } else {
        "http"
    }
}
