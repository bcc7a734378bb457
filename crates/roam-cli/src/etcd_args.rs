//! The flags that secure the connection to etcd (`--etcd-ca`,
//! `--etcd-cert`, `--etcd-key`, `--etcd-user`, `--etcd-password-file`),
//! in one place so that every command that opens an etcd store takes the
//! same ones. Reading and checking the files is `roam-cluster`'s
//! ([`EtcdAccessFiles::load`]); this adds the warnings an operator should
//! see at start-up.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use roam_planner::roam_cluster::{EtcdAccess, EtcdAccessFiles, StoreSpec};

/// How to reach an etcd store securely.
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdArgs {
    /// With an `etcds://` store: the CA certificate (PEM) that signed
    /// etcd's server certificate (etcd's --cert-file). Only this CA is
    /// trusted, not the system's.
    #[arg(long, value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,
    /// A client certificate (PEM) to present to etcd, for an etcd started
    /// with --client-cert-auth; it must be signed by a CA in etcd's
    /// --trusted-ca-file.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// The private key (PEM) of --etcd-cert.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// Log in to etcd as this user (for an etcd with `auth enable`).
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// The file holding --etcd-user's password, alone (one trailing
    /// newline is ignored; mode 0600). Never given on the command line,
    /// where other users of the machine could read it.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdArgs {
    /// Load and check the files for `spec`, warning about a password file
    /// others can read and about a password sent without TLS.
    pub fn load(&self, spec: &StoreSpec) -> Result<EtcdAccess> {
        let access = EtcdAccessFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
        }
        .load()?;
        spec.check_access(&access)?;
        if access.password_readable_by_others() {
            tracing::warn!("the etcd password file can be read by other users: chmod 600 it");
        }
        if access.user().is_some() && !access.tls() {
            tracing::warn!(
                "the etcd password crosses the network unencrypted: use an etcds:// store with --etcd-ca"
            );
        }
        Ok(access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        etcd: EtcdArgs,
    }

    fn parse(args: &[&str]) -> Result<EtcdArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("roam").chain(args.iter().copied())).map(|c| c.etcd)
    }

    #[test]
    fn flags_that_go_together_are_required_together() {
        for args in [
            &["--etcd-cert", "c.pem"][..],
            &["--etcd-key", "k.pem"],
            &["--etcd-cert", "c.pem", "--etcd-key", "k.pem"],
            &["--etcd-user", "roam"],
            &["--etcd-password-file", "pw"],
        ] {
            assert!(parse(args).is_err(), "{args:?} parsed");
        }
        let a = parse(&[
            "--etcd-ca",
            "ca.pem",
            "--etcd-cert",
            "c.pem",
            "--etcd-key",
            "k.pem",
            "--etcd-user",
            "roam",
            "--etcd-password-file",
            "pw",
        ])
        .unwrap();
        assert_eq!(a.etcd_user.as_deref(), Some("roam"));
        assert_eq!(a.etcd_key, Some(PathBuf::from("k.pem")));
    }

    #[test]
    fn a_missing_file_is_named_with_its_flag() {
        let spec: StoreSpec = "etcds://127.0.0.1:2379".parse().unwrap();
        let a = parse(&["--etcd-ca", "/nonexistent/ca.pem"]).unwrap();
        let e = format!("{:#}", a.load(&spec).unwrap_err());
        assert!(
            e.contains("--etcd-ca") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let a = parse(&[
            "--etcd-user",
            "roam",
            "--etcd-password-file",
            "/nonexistent/pw",
        ])
        .unwrap();
        let plain: StoreSpec = "etcd://127.0.0.1:2379".parse().unwrap();
        let e = format!("{:#}", a.load(&plain).unwrap_err());
        assert!(e.contains("--etcd-password-file"), "{e}");
    }

    #[test]
    fn tls_flags_need_an_etcds_store() {
        let dir = tempfile::tempdir().unwrap();
        let ca = roam_node::roam_auth::cert::make_ca(
            "test",
            roam_node::roam_auth::cert::Validity { days: 1 },
        )
        .unwrap();
        let file = dir.path().join("ca.pem");
        std::fs::write(&file, ca.cert).unwrap();
        let a = EtcdArgs {
            etcd_ca: Some(file),
            ..EtcdArgs::default()
        };
        let plain: StoreSpec = "etcd://127.0.0.1:2379".parse().unwrap();
        let e = format!("{:#}", a.load(&plain).unwrap_err());
        assert!(e.contains("etcds://"), "{e}");
        let tls: StoreSpec = "etcds://127.0.0.1:2379".parse().unwrap();
        assert!(a.load(&tls).unwrap().tls());
        let e = format!("{:#}", EtcdArgs::default().load(&tls).unwrap_err());
        assert!(e.contains("--etcd-ca"), "{e}");
    }
}
