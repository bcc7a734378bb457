//! Where the cluster state lives, as a user writes it (`roam planner
//! --store ...`), parsed in one place so that every command that opens a
//! store accepts the same forms:
//!
//! - `redb:PATH`: the embedded store in the file `PATH`;
//! - `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`: etcd at those endpoints,
//!   keys under `/PREFIX/` (default `/roam/`), over plain HTTP/2;
//! - `etcds://...`: the same over TLS, which needs the CA that signed
//!   etcd's certificate (`--etcd-ca`, in [`EtcdAccess`]).
//!
//! Whether the connection is encrypted is part of the spec, not only of
//! the flags beside it, so that the spec a planner prints says it, and a
//! CA given for a plain `etcd://` (or none for `etcds://`) is an error
//! rather than a silent guess.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::{ClusterStore, EtcdAccess, EtcdStore, RedbStore, StoreError, StoreResult};

/// The key prefix when an etcd spec names none.
pub const DEFAULT_ETCD_PREFIX: &str = "/roam/";

/// A parsed `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// The embedded store in this file.
    Redb(PathBuf),
    /// etcd.
    Etcd {
        /// `host:port` of each member.
        endpoints: Vec<String>,
        /// Every key lives under it; ends with `/`.
        prefix: String,
        /// Over TLS (`etcds://`).
        tls: bool,
    },
}

/// Why a `--store` value is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreSpecError {
    /// Neither `redb:` nor `etcd://` nor `etcds://`.
    #[error(
        "{0:?} is not a store; write redb:PATH or etcd://HOST:PORT[,HOST:PORT...][/PREFIX] \
         (etcds:// for etcd over TLS)"
    )]
    Scheme(String),
    /// `redb:` with nothing after it.
    #[error("redb: needs a file, e.g. redb:/var/lib/roam/cluster.redb")]
    NoPath,
    /// An etcd endpoint that is not `host:port`.
    #[error("etcd endpoint {0:?} is not HOST:PORT (e.g. 10.0.0.5:2379)")]
    Endpoint(String),
}

impl FromStr for StoreSpec {
    type Err = StoreSpecError;

    fn from_str(s: &str) -> Result<StoreSpec, StoreSpecError> {
        if let Some(path) = s.strip_prefix("redb:") {
            if path.is_empty() {
                return Err(StoreSpecError::NoPath);
            }
            return Ok(StoreSpec::Redb(PathBuf::from(path)));
        }
        let (rest, tls) = if let Some(rest) = s.strip_prefix("etcd://") {
            (rest, false)
        } else if let Some(rest) = s.strip_prefix("etcds://") {
            (rest, true)
        } else {
            return Err(StoreSpecError::Scheme(s.chars().take(200).collect()));
        };
        let (hosts, prefix) = match rest.split_once('/') {
            Some((hosts, p)) if !p.trim_matches('/').is_empty() => {
                (hosts, format!("/{}/", p.trim_matches('/')))
            }
            Some((hosts, _)) => (hosts, DEFAULT_ETCD_PREFIX.to_string()),
            None => (rest, DEFAULT_ETCD_PREFIX.to_string()),
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok || host.bytes().any(|b| b.is_ascii_whitespace() || b == b'@') {
                return Err(StoreSpecError::Endpoint(host.chars().take(200).collect()));
            }
            endpoints.push(host.to_string());
        }
        Ok(StoreSpec::Etcd {
            endpoints,
            prefix,
            tls,
        })
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Redb(path) => write!(f, "redb:{}", path.display()),
            StoreSpec::Etcd {
                endpoints,
                prefix,
                tls,
            } => {
                write!(
                    f,
                    "{}://{}{}",
                    if *tls { "etcds" } else { "etcd" },
                    endpoints.join(","),
                    prefix.trim_end_matches('/')
                )
            }
        }
    }
}

impl StoreSpec {
    /// Open (or connect to) the store, connecting to etcd plainly and
    /// anonymously. Opening a redb file is blocking and may take a while
    /// after a crash (redb repairs the file), so it runs on the blocking
    /// pool.
    pub async fn open(&self) -> StoreResult<Arc<dyn ClusterStore>> {
        self.open_with(&EtcdAccess::default()).await
    }

    /// [`StoreSpec::open`], reaching etcd with `access` (TLS, login). An
    /// `etcds://` spec needs TLS in `access`, an `etcd://` one refuses it,
    /// and a redb store refuses any `access` at all: each mismatch is
    /// [`StoreError::Invalid`], naming the flags.
    pub async fn open_with(&self, access: &EtcdAccess) -> StoreResult<Arc<dyn ClusterStore>> {
        self.check_access(access)?;
        match self {
            StoreSpec::Redb(path) => {
                let path = path.clone();
                let store = tokio::task::spawn_blocking(move || RedbStore::open(path))
                    .await
                    .map_err(|e| crate::StoreError::Backend {
                        backend: "redb",
                        message: format!("opening the store did not finish: {e}"),
                    })??;
                Ok(Arc::new(store))
            }
            StoreSpec::Etcd {
                endpoints, prefix, ..
            } => Ok(Arc::new(
                EtcdStore::connect_with(endpoints, prefix, access).await?,
            )),
        }
    }

    /// Whether `access` fits this spec (see [`StoreSpec::open_with`]).
    pub fn check_access(&self, access: &EtcdAccess) -> StoreResult<()> {
        let why = match self {
            StoreSpec::Redb(_) if access.tls() || access.user().is_some() => {
                "the --etcd-* flags are for an etcd store; this store is a redb file"
            }
            StoreSpec::Etcd { tls: true, .. } if !access.tls() => {
                "etcds:// is etcd over TLS: give --etcd-ca, the CA that signed etcd's certificate"
            }
            StoreSpec::Etcd { tls: false, .. } if access.tls() => {
                "--etcd-ca (and --etcd-cert) are for TLS: write the store as etcds://HOST:PORT..."
            }
            _ => return Ok(()),
        };
        Err(StoreError::Invalid(format!("{self}: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        let cases = [
            (
                "redb:/var/lib/roam/cluster.redb",
                StoreSpec::Redb("/var/lib/roam/cluster.redb".into()),
            ),
            ("redb:cluster.redb", StoreSpec::Redb("cluster.redb".into())),
            (
                "etcd://10.0.0.5:2379",
                StoreSpec::Etcd {
                    endpoints: vec!["10.0.0.5:2379".into()],
                    prefix: "/roam/".into(),
                    tls: false,
                },
            ),
            (
                "etcds://10.0.0.5:2379/secure",
                StoreSpec::Etcd {
                    endpoints: vec!["10.0.0.5:2379".into()],
                    prefix: "/secure/".into(),
                    tls: true,
                },
            ),
            (
                "etcd://a:2379,b:2379/prod/roam",
                StoreSpec::Etcd {
                    endpoints: vec!["a:2379".into(), "b:2379".into()],
                    prefix: "/prod/roam/".into(),
                    tls: false,
                },
            ),
        ];
        for (text, want) in cases {
            let got: StoreSpec = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<StoreSpec>().unwrap(), want);
        }
        assert_eq!(
            "etcd://a:2379/".parse::<StoreSpec>().unwrap().to_string(),
            "etcd://a:2379/roam"
        );
    }

    #[test]
    fn bad_specs_say_what_to_write() {
        for (text, want) in [
            ("redb:", StoreSpecError::NoPath),
            ("/tmp/x.redb", StoreSpecError::Scheme("/tmp/x.redb".into())),
            ("etcd://", StoreSpecError::Endpoint(String::new())),
            ("etcd://host", StoreSpecError::Endpoint("host".into())),
            ("etcd://a:1,:2", StoreSpecError::Endpoint(":2".into())),
            ("etcd://a:99999", StoreSpecError::Endpoint("a:99999".into())),
            ("etcd://u@a:1", StoreSpecError::Endpoint("u@a:1".into())),
            ("etcds://", StoreSpecError::Endpoint(String::new())),
            (
                "https://a:2379",
                StoreSpecError::Scheme("https://a:2379".into()),
            ),
        ] {
            assert_eq!(text.parse::<StoreSpec>().unwrap_err(), want, "{text}");
        }
        let e = "x".parse::<StoreSpec>().unwrap_err().to_string();
        assert!(e.contains("redb:PATH"), "{e}");
        assert!(e.contains("etcds://"), "{e}");
    }

    #[test]
    fn tls_flags_must_match_the_scheme() {
        let plain = EtcdAccess::default();
        let redb: StoreSpec = "redb:c.redb".parse().unwrap();
        let etcd: StoreSpec = "etcd://a:2379".parse().unwrap();
        let etcds: StoreSpec = "etcds://a:2379".parse().unwrap();
        redb.check_access(&plain).unwrap();
        etcd.check_access(&plain).unwrap();
        match etcds.check_access(&plain) {
            Err(StoreError::Invalid(m)) => assert!(m.contains("--etcd-ca"), "{m}"),
            other => panic!("etcds:// without a CA: {other:?}"),
        }
    }
}
