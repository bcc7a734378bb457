//! Who may talk to a roam node: the cluster's certificates, the mutual TLS
//! configurations built from them, and bearer tokens.
//!
//! Why a crate of its own: the node (both listeners, and its calls to other
//! nodes), the `roam` command's clients and `roam cert` all need the same
//! rules: what a certificate must say, which CA it must chain to, how a
//! token is compared. Keeping them in one place means one reading of the
//! trust model (`docs/trust.md`) and one set of tests for it.
//!
//! ```text
//!   cluster CA ──signs──► node certificate    (roam:role:node; name as CN + DNS; server + client auth)
//!              ├─signs──► gateway certificate (roam:role:gateway; server + client auth)
//!              ├─signs──► planner certificate (roam:role:planner; server + client auth)
//!              └─signs──► client certificate  (roam:role:client; operator; client auth only)
//! ```
//!
//! Every certificate carries exactly one role ([`role`]), and every port
//! admits only the roles it serves: a node's control API admits nodes, the
//! planner and operators; its migration port and a gateway's control port
//! only a node whose certificate names the node its `Hello` claims
//! ([`Identity::check_node`]); the planner ties each route to nodes (each
//! speaking only for itself) or to operators. Servers require a client
//! certificate chained to the CA; clients check the server's against the CA
//! and, with [`ClientTls::config_for`], its role. A certificate without a
//! role (from an older `roam cert`) is refused everywhere, with a message
//! that says to re-issue it.
//!
//! Only the `ring` crypto provider is used: `aws-lc-rs` needs cmake and
//! clang, which the cross builds do not have.

#![deny(missing_docs)]

pub mod cert;
pub mod role;
mod tls;
mod token;

pub use role::{PeerId, Role, RoleError};
pub use tls::{
    cert_names_node, ClientTls, Identity, LoadError, NameCheck, NameError, TlsFiles, ALPN_HTTP,
    ALPN_MIGRATE,
};
pub use token::{readable_by_others, Token, TokenError};

pub use rustls;
pub use tokio_rustls;
