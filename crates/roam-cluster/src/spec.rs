//! Where the cluster state lives, as a user writes it (`roam planner
//! --store ...`), parsed in one place so that every command that opens a
//! store accepts the same forms:
//!
//! - `redb:PATH`: the embedded store in the file `PATH`;
//! - `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]`: etcd at those endpoints,
//!   keys under `/PREFIX/` (default `/roam/`).

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::{ClusterStore, EtcdStore, RedbStore, StoreResult};

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
    },
}

/// Why a `--store` value is not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreSpecError {
    /// Neither `redb:` nor `etcd://`.
    #[error("{0:?} is not a store; write redb:PATH or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]")]
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
        let Some(rest) = s.strip_prefix("etcd://") else {
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
        Ok(StoreSpec::Etcd { endpoints, prefix })
    }
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Redb(path) => write!(f, "redb:{}", path.display()),
            StoreSpec::Etcd { endpoints, prefix } => {
                write!(
                    f,
                    "etcd://{}{}",
                    endpoints.join(","),
                    prefix.trim_end_matches('/')
                )
            }
        }
    }
}

impl StoreSpec {
    /// Open (or connect to) the store. Opening a redb file is blocking
    /// and may take a while after a crash (redb repairs the file), so it
    /// runs on the blocking pool.
    pub async fn open(&self) -> StoreResult<Arc<dyn ClusterStore>> {
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
            StoreSpec::Etcd { endpoints, prefix } => {
                Ok(Arc::new(EtcdStore::connect(endpoints, prefix).await?))
            }
        }
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
                },
            ),
            (
                "etcd://a:2379,b:2379/prod/roam",
                StoreSpec::Etcd {
                    endpoints: vec!["a:2379".into(), "b:2379".into()],
                    prefix: "/prod/roam/".into(),
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
        ] {
            assert_eq!(text.parse::<StoreSpec>().unwrap_err(), want, "{text}");
        }
        let e = "x".parse::<StoreSpec>().unwrap_err().to_string();
        assert!(e.contains("redb:PATH"), "{e}");
    }
}
