//! A real etcd server for tests: Debian's `etcd`, one member, on free
//! loopback ports, with its data in a temporary directory, killed when the
//! [`Etcd`] is dropped. It speaks plain HTTP, or TLS with certificates the
//! test made ([`EtcdTls`]), optionally requiring a client certificate.
//!
//! Why a real one: what the cluster store relies on (leases that run out,
//! transactions that compare revisions, elections) is etcd's behaviour, and
//! a mock would only repeat our own idea of it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{have, missing, Tool};

/// Debian's etcd server.
pub const ETCD: Tool = Tool {
    name: "etcd",
    install: "apt-get install etcd-server (or run scripts/setup.sh)",
};

/// How long etcd may take to answer its health check after starting.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Why etcd could not be started.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The temporary directory or the log file could not be made.
    #[error("etcd: cannot prepare {path}: {source}")]
    Prepare {
        /// What could not be made.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The process did not start.
    #[error("etcd: cannot start it: {0}; is etcd-server installed?")]
    Spawn(std::io::Error),
    /// It started but never became healthy.
    #[error("etcd did not become healthy on {endpoint} ({why}); its log:\n{log}")]
    NotReady {
        /// Its client endpoint.
        endpoint: String,
        /// What happened.
        why: String,
        /// The tail of its log.
        log: String,
    },
}

/// The TLS an etcd server is started with: its clients reach it over
/// `https://` only.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA etcd trusts for client certificates (`--trusted-ca-file`).
    pub ca: PathBuf,
    /// Etcd's server certificate (`--cert-file`); it must name
    /// `127.0.0.1`.
    pub cert: PathBuf,
    /// Its private key (`--key-file`).
    pub key: PathBuf,
    /// Refuse clients without a certificate chained to `ca`
    /// (`--client-cert-auth`).
    pub client_cert_auth: bool,
}

/// How a test's etcd is started; the default is plain, with etcd's own
/// defaults.
#[derive(Debug, Clone, Default)]
pub struct EtcdConfig {
    /// Serve clients over TLS only.
    pub tls: Option<EtcdTls>,
    /// Seconds an idle authentication token lasts (`--auth-token-ttl`;
    /// etcd's default is 300), for tests of clients that must log in again.
    pub auth_token_ttl: Option<u32>,
}

/// A running etcd server, killed on drop.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    client: SocketAddr,
    /// Where `/health` answers over plain HTTP (the client port, or a
    /// metrics port when the client port speaks TLS).
    health: SocketAddr,
    tls: bool,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Start etcd, or, when it is not installed, `None` after
    /// [`missing`] (which fails the test under CI).
    #[track_caller]
    pub fn start_or_skip() -> Option<Etcd> {
        Etcd::start_with_or_skip(&EtcdConfig::default())
    }

    /// [`Etcd::start_or_skip`], configured.
    #[track_caller]
    pub fn start_with_or_skip(config: &EtcdConfig) -> Option<Etcd> {
        if !have("etcd") {
            missing(&ETCD, "`etcd --version` did not run");
            return None;
        }
        Some(Etcd::start_with(config).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Start etcd and wait until it answers its health check.
    pub fn start() -> Result<Etcd, EtcdError> {
        Etcd::start_with(&EtcdConfig::default())
    }

    /// Start etcd as `config` says and wait until it answers its health
    /// check.
    pub fn start_with(config: &EtcdConfig) -> Result<Etcd, EtcdError> {
        // A port chosen free may be taken before etcd binds it: try again
        // with new ports a few times.
        let mut last = None;
        for _ in 0..3 {
            match Etcd::start_once(config) {
                Ok(etcd) => return Ok(etcd),
                Err(e @ EtcdError::NotReady { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("three attempts were made"))
    }

    fn start_once(config: &EtcdConfig) -> Result<Etcd, EtcdError> {
        let tls = config.tls.as_ref();
        let dir = tempfile::Builder::new()
            .prefix("roam-etcd")
            .tempdir()
            .map_err(|source| EtcdError::Prepare {
                path: std::env::temp_dir(),
                source,
            })?;
        let client = free_port();
        let peer = free_port();
        let log_path = dir.path().join("etcd.log");
        let log = std::fs::File::create(&log_path).map_err(|source| EtcdError::Prepare {
            path: log_path.clone(),
            source,
        })?;
        let log2 = log.try_clone().map_err(|source| EtcdError::Prepare {
            path: log_path.clone(),
            source,
        })?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://{client}");
        let peer_url = format!("http://{peer}");
        let mut cmd = Command::new("etcd");
        // Over TLS, the health check goes to a plain metrics port.
        let health = match tls {
            None => client,
            Some(tls) => {
                let metrics = free_port();
                cmd.arg(format!("--cert-file={}", tls.cert.display()))
                    .arg(format!("--key-file={}", tls.key.display()))
                    .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                    .arg(format!("--client-cert-auth={}", tls.client_cert_auth))
                    .arg(format!("--listen-metrics-urls=http://{metrics}"));
                metrics
            }
        };
        if let Some(ttl) = config.auth_token_ttl {
            cmd.arg(format!("--auth-token-ttl={ttl}"));
        }
        let child = cmd
            .arg("--name=roam-test")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=roam-test={peer_url}"))
            .arg("--initial-cluster-state=new")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(EtcdError::Spawn)?;
        let mut etcd = Etcd {
            child: Some(child),
            client,
            health,
            tls: tls.is_some(),
            dir,
        };
        etcd.wait_ready()?;
        Ok(etcd)
    }

    fn wait_ready(&mut self) -> Result<(), EtcdError> {
        let started = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(self.not_ready(format!("it exited with {status}")));
                }
            }
            if healthy(self.health) {
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                return Err(self.not_ready(format!(
                    "no healthy answer within {} s",
                    READY_WITHIN.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn not_ready(&mut self, why: String) -> EtcdError {
        self.kill();
        EtcdError::NotReady {
            endpoint: self.endpoint(),
            why,
            log: self.log_tail(),
        }
    }

    /// Its client endpoint, `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        self.client.to_string()
    }

    /// Its client URL, `http://127.0.0.1:PORT` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// Its data directory's parent (it holds `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last 4 KiB of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read(self.dir.path().join("etcd.log")).unwrap_or_default();
        let from = log.len().saturating_sub(4096);
        String::from_utf8_lossy(&log[from..]).into_owned()
    }

    /// Kill it now (SIGKILL) and reap it; a test of what clients see when
    /// etcd dies. Dropping does the same.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback address with a port that was free a moment ago.
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a loopback port works")
}

/// Whether etcd at `addr` answers `GET /health` with `"health":"true"`.
fn healthy(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = s.take(64 << 10).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.contains("\"health\":\"true\"") || answer.contains("\"health\": \"true\"")
}
