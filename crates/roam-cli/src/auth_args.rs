//! The flags that say how roam proves who it is and whom it admits
//! (`--tls-ca`, `--tls-cert`, `--tls-key`, `--token-file`, `--insecure`),
//! declared once for every command that takes them.
//!
//! They come in two forms, because a server and a client use them
//! differently:
//! - a server (`roam node`, `roam planner`, `roam gateway`) needs all three
//!   TLS files or none, and reads them only from the command line;
//! - a client (`roam launch`, `cells`, `migrate`, `logs`, `kill`, `nodes`,
//!   `drain`, `undrain`) needs the CA to check the server and a certificate
//!   only for mutual TLS, and takes each from the environment too.
//!
//! Loading the files is `roam-auth`'s; this turns the flags into what the
//! servers' and clients' configurations take.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use roam_node::roam_auth::{ClientTls, Identity, TlsFiles, Token};
use roam_node::ClientAuth;

/// A server's TLS files, and `--insecure` for when it has none.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerTlsArgs {
    /// Cluster CA certificate (PEM, `roam cert ca`). With --tls-cert and
    /// --tls-key, the cluster's own ports (a node's control API and
    /// migration port, the planner's API, the gateway's control port) and
    /// this server's calls to them use mutual TLS: only peers with
    /// certificates from this CA are admitted.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This server's certificate: `roam cert node NAME` (NAME = the node's
    /// --name), `roam cert planner NAME --ip ...` or `roam cert gateway
    /// NAME --ip ...`.
    #[arg(long, requires_all = ["tls_ca", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires_all = ["tls_ca", "tls_cert"])]
    pub tls_key: Option<PathBuf>,
    /// Allow the cluster ports that --tls-ca would secure to listen plain
    /// and unauthenticated on a non-loopback address. Anyone who reaches
    /// them can then run code on the nodes (through a node's or the
    /// planner's API) or pose as a node to a gateway and take over its
    /// clients: only on a network that is itself trusted. (A plain port on
    /// loopback trusts every process of this machine.)
    #[arg(long)]
    pub insecure: bool,
}

impl ServerTlsArgs {
    /// The server's identity, when it was given its TLS files (clap has
    /// checked that they come together).
    pub fn identity(&self) -> Result<Option<Identity>> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Ok(Some(Identity::load(&TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            })?)),
            _ => Ok(None),
        }
    }
}

/// A server's TLS files and bearer token (`roam node`, `roam planner`; the
/// gateway's nodes authenticate by certificate alone).
#[derive(Args, Debug, Clone, Default)]
pub struct ServerAuthArgs {
    /// Require `Authorization: Bearer TOKEN` on this server's API, TOKEN
    /// being this file's content (keep it mode 0600). The server sends it
    /// with its own calls to the nodes' and the planner's APIs too.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    // Last, so that --insecure follows the flags it does without.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
}

impl ServerAuthArgs {
    /// The token, when one was given.
    pub fn token(&self) -> Result<Option<Token>> {
        Ok(self.token_file.as_deref().map(Token::load).transpose()?)
    }
}

/// How a client command authenticates to a node or the planner.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientAuthArgs {
    /// Cluster CA to check the server's certificate against; selects https
    /// for a `host:port` address.
    #[arg(long, env = "ROAM_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (`roam cert client NAME`).
    #[arg(long, env = "ROAM_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, env = "ROAM_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// File holding the server's bearer token [or the token itself in
    /// $ROAM_TOKEN].
    #[arg(long, env = "ROAM_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl ClientAuthArgs {
    /// The credentials the command was given.
    pub fn load(&self) -> Result<ClientAuth> {
        let tls = match &self.tls_ca {
            Some(ca) => Some(ClientTls::load(
                ca,
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
            )?),
            None if self.tls_cert.is_some() => {
                bail!(
                    "--tls-cert needs --tls-ca (or ROAM_TLS_CA): the CA to check the node against"
                )
            }
            None => None,
        };
        let token = match (&self.token_file, std::env::var("ROAM_TOKEN")) {
            (Some(f), _) => Some(Token::load(f)?),
            (None, Ok(t)) => Some(Token::new(&t, "in $ROAM_TOKEN")?),
            (None, Err(_)) => None,
        };
        Ok(ClientAuth { tls, token })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::error::ErrorKind;
    use clap::Parser;

    use crate::args::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("roam").chain(args.iter().copied())).map(|c| c.command)
    }

    const TLS: [&str; 6] = [
        "--tls-ca",
        "ca.pem",
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "k.pem",
    ];

    fn assert_tls(tls: &super::ServerTlsArgs) {
        assert_eq!(tls.tls_ca.as_deref(), Some(Path::new("ca.pem")));
        assert_eq!(tls.tls_cert.as_deref(), Some(Path::new("c.pem")));
        assert_eq!(tls.tls_key.as_deref(), Some(Path::new("k.pem")));
    }

    /// The server flags of a `roam node` or `roam planner` command line.
    fn server_auth(cmd: Command) -> super::ServerAuthArgs {
        match cmd {
            Command::Node(a) => a.auth,
            Command::Planner(a) => a.auth,
            other => panic!("not a node or planner: {other:?}"),
        }
    }

    #[test]
    fn a_node_and_a_planner_take_tls_files_token_and_insecure() {
        for cmd in ["node", "planner"] {
            let mut args = vec![cmd, "--listen", "127.0.0.1:1", "--token-file", "t"];
            args.extend(TLS);
            args.push("--insecure");
            let auth = server_auth(parse(&args).unwrap());
            assert_tls(&auth.tls);
            assert!(auth.tls.insecure);
            assert_eq!(auth.token_file.as_deref(), Some(Path::new("t")));
            let auth = server_auth(parse(&[cmd]).unwrap());
            assert!(auth.tls.tls_ca.is_none() && auth.token_file.is_none());
            assert!(!auth.tls.insecure);
        }
    }

    #[test]
    fn a_gateway_takes_its_tls_files_and_insecure_and_a_token_only_for_its_planner() {
        let mut args = vec!["gateway", "--insecure"];
        args.extend(TLS);
        let Command::Gateway(a) = parse(&args).unwrap() else {
            panic!("not a gateway")
        };
        assert_tls(&a.tls);
        assert!(a.tls.insecure);
        // A token only for its planner (its nodes authenticate by
        // certificate alone).
        let e = parse(&["gateway", "--token-file", "t"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument, "{e}");
        let Command::Gateway(a) = parse(&[
            "gateway",
            "--planner",
            "https://p:7600",
            "--token-file",
            "t",
        ])
        .unwrap() else {
            panic!("not a gateway")
        };
        assert_eq!(a.planner.as_deref(), Some("https://p:7600"));
        assert_eq!(a.token_file.as_deref(), Some(Path::new("t")));
    }

    #[test]
    fn a_server_needs_all_three_tls_files() {
        let pairs: Vec<&[&str]> = TLS.chunks(2).collect();
        // Every non-empty subset of the three flags but the whole set.
        for subset in 1..0b111 {
            for cmd in ["node", "planner", "gateway"] {
                let mut args = vec![cmd];
                for (i, pair) in pairs.iter().enumerate() {
                    if subset & (1 << i) != 0 {
                        args.extend(*pair);
                    }
                }
                let e = parse(&args).unwrap_err();
                assert_eq!(
                    e.kind(),
                    ErrorKind::MissingRequiredArgument,
                    "{:?}: {e}",
                    args
                );
            }
        }
    }

    #[test]
    fn a_client_takes_its_credentials_and_needs_cert_and_key_together() {
        let mut args = vec!["cells", "--node", "127.0.0.1:7700", "--token-file", "t"];
        args.extend(TLS);
        let Command::Cells(a) = parse(&args).unwrap() else {
            panic!("not cells")
        };
        assert_eq!(a.auth.tls_ca.as_deref(), Some(Path::new("ca.pem")));
        assert_eq!(a.auth.tls_cert.as_deref(), Some(Path::new("c.pem")));
        assert_eq!(a.auth.tls_key.as_deref(), Some(Path::new("k.pem")));
        assert_eq!(a.auth.token_file.as_deref(), Some(Path::new("t")));
        assert_eq!(a.node.as_deref(), Some("127.0.0.1:7700"));
        // The CA alone only checks the server.
        let Command::Migrate(m) = parse(&["migrate", "c1", "--tls-ca", "ca.pem"]).unwrap() else {
            panic!("not migrate")
        };
        assert_eq!(m.auth.tls_ca.as_deref(), Some(Path::new("ca.pem")));
        for half in [["--tls-cert", "c.pem"], ["--tls-key", "k.pem"]] {
            let mut args = vec!["kill", "c1"];
            args.extend(half);
            let e = parse(&args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument, "{e}");
        }
        // A client has no --insecure: that is a server's choice.
        let e = parse(&["nodes", "--insecure"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownArgument, "{e}");
    }
}
