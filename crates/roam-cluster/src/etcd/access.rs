//! How the planner proves itself to etcd and checks that it talks to the
//! right etcd: TLS (a CA for etcd's server certificate, and optionally a
//! client certificate for etcd's `--client-cert-auth`), and a user to log
//! in as (etcd's `auth enable`).
//!
//! Why here and not in the command line: every program that opens an etcd
//! store must read the same files the same way, and a mistake in any of
//! them must be found before the first call to etcd, naming the flag that
//! points at the file. The PEM files are read and checked with
//! `roam-auth`, the project's one reader of certificates, and the
//! connection itself is `etcd-client`'s own TLS (rustls with ring).
//!
//! The password comes from a file, never from the command line (where
//! `ps` shows it to every user of the machine); a file that others can
//! read is reported by [`EtcdAccess::password_readable_by_others`].

use std::io::Read;
use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use roam_auth::{ClientTls, LoadError};

/// The longest password file read, in bytes.
pub const MAX_PASSWORD_BYTES: usize = 4096;

/// The longest user name, in bytes.
const MAX_USER_BYTES: usize = 256;

/// Where the TLS material and the login are, as the flags of `roam
/// planner` give them. Each is optional; [`EtcdAccessFiles::load`] checks
/// that they fit together.
#[derive(Debug, Clone, Default)]
pub struct EtcdAccessFiles {
    /// `--etcd-ca`: the CA that signed etcd's server certificate.
    pub ca: Option<PathBuf>,
    /// `--etcd-cert`: a client certificate to present to etcd.
    pub cert: Option<PathBuf>,
    /// `--etcd-key`: its private key.
    pub key: Option<PathBuf>,
    /// `--etcd-user`: the etcd user to log in as.
    pub user: Option<String>,
    /// `--etcd-password-file`: that user's password, alone in a file (one
    /// trailing newline is ignored).
    pub password_file: Option<PathBuf>,
}

/// Why the TLS material or the login could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EtcdAccessError {
    /// A client certificate without its key, or the reverse.
    #[error("--etcd-cert and --etcd-key go together: give both, or neither")]
    HalfIdentity,
    /// A client certificate without a CA to check etcd's with.
    #[error(
        "--etcd-cert needs --etcd-ca: give the CA that signed etcd's server certificate \
         (etcd's --cert-file)"
    )]
    IdentityWithoutCa,
    /// A user without a password, or the reverse.
    #[error("--etcd-user and --etcd-password-file go together: give both, or neither")]
    HalfLogin,
    /// The user name is empty, too long or holds control characters.
    #[error(
        "--etcd-user {0:?} is not a user name: give the name of an etcd user (`etcdctl user list`)"
    )]
    BadUser(String),
    /// One of the PEM files could not be read or holds nothing usable.
    #[error("{flag} is unusable")]
    Pem {
        /// The flag that named the file.
        flag: &'static str,
        /// Why.
        #[source]
        source: LoadError,
    },
    /// The certificate and the key do not make an identity (most often:
    /// the key is not the certificate's).
    #[error(
        "--etcd-cert {} and --etcd-key {} do not fit together: give the key made with that certificate",
        cert.display(), key.display()
    )]
    Identity {
        /// The certificate.
        cert: PathBuf,
        /// The key.
        key: PathBuf,
        /// Why.
        #[source]
        source: roam_auth::rustls::Error,
    },
    /// The password file could not be read.
    #[error("cannot read --etcd-password-file {}", path.display())]
    ReadPassword {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The password file is empty, too long or not text.
    #[error(
        "--etcd-password-file {}: {why}; write the password alone in it, \
         e.g. `printf %s PASSWORD > FILE && chmod 600 FILE`",
        path.display()
    )]
    BadPassword {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// The TLS material and login for etcd, loaded and checked. The default is
/// a plain, anonymous connection. Its `Debug` shows no secret.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    tls: Option<TlsOptions>,
    client_cert: bool,
    login: Option<(String, String)>,
    password_loose: bool,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls.is_some())
            .field("client_cert", &self.client_cert)
            .field("user", &self.user())
            .finish_non_exhaustive()
    }
}

impl EtcdAccessFiles {
    /// Read and check every file given. Nothing is sent anywhere: a bad
    /// file is found here, before the first call to etcd.
    pub fn load(&self) -> Result<EtcdAccess, EtcdAccessError> {
        let mut access = EtcdAccess::default();
        match (&self.ca, &self.cert, &self.key) {
            (_, Some(_), None) | (_, None, Some(_)) => return Err(EtcdAccessError::HalfIdentity),
            (None, Some(_), Some(_)) => return Err(EtcdAccessError::IdentityWithoutCa),
            (None, None, None) => {}
            (Some(ca), cert, key) => {
                access.tls = Some(tls(ca, cert.as_deref().zip(key.as_deref()))?);
                access.client_cert = cert.is_some();
            }
        }
        match (&self.user, &self.password_file) {
            (None, None) => {}
            (Some(user), Some(file)) => {
                check_user(user)?;
                access.login = Some((user.clone(), password(file)?));
                access.password_loose = roam_auth::readable_by_others(file);
            }
            _ => return Err(EtcdAccessError::HalfLogin),
        }
        Ok(access)
    }
}

impl EtcdAccess {
    /// Whether the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether a client certificate is presented.
    pub fn client_cert(&self) -> bool {
        self.client_cert
    }

    /// The user logged in as, if any.
    pub fn user(&self) -> Option<&str> {
        self.login.as_ref().map(|(user, _)| user.as_str())
    }

    /// Whether the password file can be read by other users of this
    /// machine (it should be mode 0600).
    pub fn password_readable_by_others(&self) -> bool {
        self.password_loose
    }

    /// `base` with this TLS and login.
    pub(crate) fn apply(&self, mut base: ConnectOptions) -> ConnectOptions {
        if let Some(tls) = &self.tls {
            base = base.with_tls(tls.clone());
        }
        if let Some((user, password)) = &self.login {
            // etcd's tokens run out (after five idle minutes by default):
            // a planner runs for months, so it logs in again when told.
            base = base
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        base
    }
}

/// What to do about `e`, an error from connecting with `access` and
/// reading under `prefix`, when it is etcd refusing the certificate or the
/// login (or a TLS mismatch); `None` for anything else. etcd says little
/// (a refused client certificate is a closed connection), so the advice
/// names the flags to check rather than claiming a single cause.
pub(crate) fn hint(access: &EtcdAccess, prefix: &str, e: &etcd_client::Error) -> Option<String> {
    let text = super::call::describe(e).to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    let login = || match access.user() {
        Some(user) => format!("etcd user {user:?}"),
        None => "an anonymous client".to_string(),
    };
    if has(&["authentication failed", "invalid user id or password"]) {
        return Some(format!(
            "etcd refused the login of {}: check --etcd-user and the password in --etcd-password-file",
            login()
        ));
    }
    if has(&["user name is empty", "user name not found"]) {
        return Some(
            "etcd requires a login (its authentication is on): give --etcd-user and --etcd-password-file"
                .into(),
        );
    }
    if has(&["authentication is not enabled"]) {
        return Some(
            "etcd's authentication is off: leave out --etcd-user, or turn it on (etcdctl auth enable)"
                .into(),
        );
    }
    if has(&["permission denied"]) {
        return Some(match access.user() {
            Some(_) => format!(
                "{} may not read keys under {prefix}: grant its role read and write on that prefix \
                 (etcdctl role grant-permission ROLE --prefix=true readwrite {prefix})",
                login()
            ),
            None if access.client_cert() => format!(
                "etcd requires a login: give --etcd-user and --etcd-password-file, or an \
                 --etcd-cert whose common name is an etcd user allowed to read and write {prefix}"
            ),
            None => "etcd requires a login: give --etcd-user and --etcd-password-file".into(),
        });
    }
    // Nobody listening, or no route: etcd is down or elsewhere, which the
    // error says already.
    if has(&[
        "connection refused",
        "tcp connect error",
        "no route to host",
    ]) {
        return None;
    }
    if !access.tls() {
        if has(&[
            "connection closed",
            "connection reset",
            "broken pipe",
            "stream closed",
            "frame",
            "http2",
            "h2 protocol",
        ]) {
            return Some(
                "if etcd serves TLS (its client URLs are https://), write the store as etcds:// \
                 and give --etcd-ca"
                    .into(),
            );
        }
        return None;
    }
    if has(&[
        "invalid peer certificate",
        "unknownissuer",
        "unknown issuer",
        "notvalidforname",
        "certificate not valid for name",
        "badsignature",
    ]) {
        return Some(
            "etcd's certificate was not accepted: give as --etcd-ca the CA that signed etcd's \
             --cert-file, and dial etcd by a name or address that certificate holds"
                .into(),
        );
    }
    if has(&[
        "connection closed",
        "connection reset",
        "broken pipe",
        "alert",
        "cancelled",
        "canceled",
    ]) {
        return Some(if access.client_cert() {
            "etcd broke off the connection, as it does when it refuses a client certificate: give as \
             --etcd-cert and --etcd-key a certificate signed by a CA in etcd's --trusted-ca-file"
                .into()
        } else {
            "etcd broke off the connection, as it does when it refuses a client without a certificate \
             (it runs with --client-cert-auth): give --etcd-cert and --etcd-key"
                .into()
        });
    }
    None
}

/// The TLS options for `ca` and an optional (certificate, key), each file
/// checked the way a node's are (`roam-auth`), so that a bad file is named
/// by its flag rather than found as a failed handshake.
fn tls(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<TlsOptions, EtcdAccessError> {
    let pem = |flag, source| EtcdAccessError::Pem { flag, source };
    // The CA alone first, so that its errors name --etcd-ca.
    ClientTls::load(ca, None, None).map_err(|e| pem("--etcd-ca", e))?;
    let ca_pem = std::fs::read(ca).map_err(|source| {
        pem(
            "--etcd-ca",
            LoadError::Read {
                what: "CA certificate",
                path: ca.to_path_buf(),
                source,
            },
        )
    })?;
    let mut options = TlsOptions::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some((cert, key)) = identity {
        let loaded = ClientTls::load(ca, Some(cert), Some(key)).map_err(|e| {
            let flag = match &e {
                LoadError::Read { path, .. } | LoadError::NoPem { path, .. } if path == key => {
                    "--etcd-key"
                }
                _ => "--etcd-cert",
            };
            pem(flag, e)
        })?;
        // Building a configuration checks that the key is the
        // certificate's.
        loaded
            .config(b"h2")
            .map_err(|source| EtcdAccessError::Identity {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                source,
            })?;
        let read = |flag, what, path: &Path| {
            std::fs::read(path).map_err(|source| {
                pem(
                    flag,
                    LoadError::Read {
                        what,
                        path: path.to_path_buf(),
                        source,
                    },
                )
            })
        };
        let cert_pem = read("--etcd-cert", "certificate", cert)?;
        let key_pem = read("--etcd-key", "private key", key)?;
        options = options.identity(Identity::from_pem(cert_pem, key_pem));
    }
    Ok(options)
}

fn check_user(user: &str) -> Result<(), EtcdAccessError> {
    if user.is_empty() || user.len() > MAX_USER_BYTES || user.chars().any(char::is_control) {
        return Err(EtcdAccessError::BadUser(user.chars().take(64).collect()));
    }
    Ok(())
}

/// The password in `path`: the whole file but one trailing newline (`\n`
/// or `\r\n`), at most [`MAX_PASSWORD_BYTES`], UTF-8, not empty.
fn password(path: &Path) -> Result<String, EtcdAccessError> {
    let read_err = |source| EtcdAccessError::ReadPassword {
        path: path.to_path_buf(),
        source,
    };
    let bad = |why: String| EtcdAccessError::BadPassword {
        path: path.to_path_buf(),
        why,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_PASSWORD_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() > MAX_PASSWORD_BYTES {
        return Err(bad(format!("it is longer than {MAX_PASSWORD_BYTES} bytes")));
    }
    let mut text = String::from_utf8(bytes).map_err(|_| bad("it is not UTF-8 text".into()))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(bad("it is empty".into()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
