//! Roles: what a certificate of the cluster may be used for.
//!
//! Why roles: chaining to the cluster CA only says "one of ours". The
//! gateway faces the internet; if its certificate could also act as a node
//! or an operator, taking over the gateway would let an attacker push cells
//! into nodes or move cells' ownership. So every certificate `roam cert`
//! makes names exactly one role, and every port admits only the roles it
//! serves (`docs/trust.md`).
//!
//! The role is a URI subject alternative name, `roam:role:<role>`, signed
//! by the CA with the rest of the certificate. A URI SAN is read back by
//! any X.509 parser, is ignored by TLS host-name checks (which look only at
//! DNS and IP names), and cannot be confused with a name. The certificate's
//! name is its subject common name; a node certificate also carries it as
//! a DNS name, which is what TLS clients check.
//!
//! [`peer_id`] only *reads* a certificate. It does not check the chain: it
//! is meant for certificates a TLS handshake with the cluster CA already
//! verified (`Identity::check_node` does both).

use std::fmt;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The prefix of a role URI in a certificate.
pub const ROLE_URI_PREFIX: &str = "roam:role:";

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A node: serves its control API and migration port, calls other
    /// nodes, links to gateways, registers with the planner as itself.
    Node,
    /// A gateway: serves its control port to nodes; calls only the
    /// planner's `GET /v1/services/{name}`.
    Gateway,
    /// The planner: serves its API, calls nodes' control APIs.
    Planner,
    /// An operator (`roam cert client`): calls control APIs.
    Client,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 4] = [Role::Node, Role::Gateway, Role::Planner, Role::Client];

    /// The role's name, as in `roam cert <name>` and the role URI.
    pub fn name(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Gateway => "gateway",
            Role::Planner => "planner",
            Role::Client => "client",
        }
    }

    /// The URI SAN that marks a certificate with this role.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.name())
    }

    fn from_name(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who a certificate says its holder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerId {
    /// The one role it carries.
    pub role: Role,
    /// Its name (subject common name): a node's `--name`, an operator's
    /// name.
    pub name: String,
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.role, self.name)
    }
}

/// Why a certificate's role could not be read, or is not admitted.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// Not a DER X.509 certificate.
    #[error("the certificate cannot be parsed: {0}")]
    Parse(String),
    /// No role URI: a certificate made before roles existed.
    #[error(
        "the certificate `{name}` carries no roam role: it was made by an older `roam cert`; \
         re-issue it from the cluster CA with `roam cert node|gateway|planner|client NAME`"
    )]
    NoRole {
        /// Its common name.
        name: String,
    },
    /// More than one role URI.
    #[error(
        "the certificate carries several roam roles ({0}); a roam certificate has exactly one"
    )]
    Several(String),
    /// A role URI this version does not know.
    #[error("the certificate carries the unknown role `{0}`")]
    Unknown(String),
    /// No common name, or several.
    #[error("the certificate does not have exactly one common name (its holder's name)")]
    NoName,
    /// A node certificate whose name is not among its DNS names.
    #[error("the node certificate `{0}` does not carry its name as a DNS name")]
    NodeNotDns(String),
    /// The role is not one this port serves.
    #[error("a {peer} certificate is not admitted here: only {allowed}")]
    NotAdmitted {
        /// Who the certificate says it is.
        peer: PeerId,
        /// The roles that are.
        allowed: String,
    },
}

/// Read the role and name of `der`, a certificate whose chain the caller
/// has already verified (see the module docs).
pub fn peer_id(der: &[u8]) -> Result<PeerId, RoleError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| RoleError::Parse(e.to_string()))?;
    let mut names = cert.subject().iter_common_name();
    let name = match (names.next(), names.next()) {
        (Some(cn), None) => cn.as_str().map_err(|_| RoleError::NoName)?.to_string(),
        _ => return Err(RoleError::NoName),
    };
    let san = cert
        .subject_alternative_name()
        .map_err(|e| RoleError::Parse(e.to_string()))?;
    let general = san.map(|s| s.value.general_names.as_slice()).unwrap_or(&[]);
    let roles: Vec<&str> = general
        .iter()
        .filter_map(|g| match g {
            GeneralName::URI(u) => u.strip_prefix(ROLE_URI_PREFIX),
            _ => None,
        })
        .collect();
    let role = match roles.as_slice() {
        [] => return Err(RoleError::NoRole { name }),
        [one] => Role::from_name(one).ok_or_else(|| RoleError::Unknown(one.to_string()))?,
        many => return Err(RoleError::Several(many.join(", "))),
    };
    if role == Role::Node
        && !general
            .iter()
            .any(|g| matches!(g, GeneralName::DNSName(d) if *d == name))
    {
        return Err(RoleError::NodeNotDns(name));
    }
    Ok(PeerId { role, name })
}

/// [`peer_id`], admitted only if its role is in `allowed`.
pub fn admit(der: &[u8], allowed: &[Role]) -> Result<PeerId, RoleError> {
    let peer = peer_id(der)?;
    if allowed.contains(&peer.role) {
        return Ok(peer);
    }
    let names: Vec<&str> = allowed.iter().map(|r| r.name()).collect();
    Err(RoleError::NotAdmitted {
        peer,
        allowed: if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        },
    })
}
