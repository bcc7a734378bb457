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
//!   cluster CA ──signs──► node certificate (name, DNS/IP SANs; server + client auth)
//!              └─signs──► client certificate (operator; client auth only, no DNS name)
//! ```
//!
//! A node presents its node certificate on its control API and on its
//! migration port, and as a client when it calls another node. Servers
//! require a client certificate chained to the CA; clients check the
//! server's against the CA. The migration port further requires that the
//! peer's certificate names the node its `Hello` claims to be
//! ([`cert_names_node`]), which an operator's certificate never does.
//!
//! Only the `ring` crypto provider is used: `aws-lc-rs` needs cmake and
//! clang, which the cross builds do not have.

#![deny(missing_docs)]

pub mod cert;
mod tls;
mod token;

pub use tls::{
    cert_names_node, ClientTls, Identity, LoadError, NameError, TlsFiles, ALPN_HTTP, ALPN_MIGRATE,
};
pub use token::{readable_by_others, Token, TokenError};

pub use rustls;
pub use tokio_rustls;
