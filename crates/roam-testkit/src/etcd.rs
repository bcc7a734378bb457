//! A real etcd server for tests: Debian's `etcd`, one member, on two free
//! loopback ports, with its data in a temporary directory, killed when the
//! [`Etcd`] is dropped.
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

/// A running etcd server, killed on drop.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    client: SocketAddr,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// Start etcd, or, when it is not installed, `None` after
    /// [`missing`] (which fails the test under CI).
    #[track_caller]
    pub fn start_or_skip() -> Option<Etcd> {
        if !have("etcd") {
            missing(&ETCD, "`etcd --version` did not run");
            return None;
        }
        Some(Etcd::start().unwrap_or_else(|e| panic!("{e}")))
    }

    /// Start etcd and wait until it answers its health check.
    pub fn start() -> Result<Etcd, EtcdError> {
        // A port chosen free may be taken before etcd binds it: try again
        // with new ports a few times.
        let mut last = None;
        for _ in 0..3 {
            match Etcd::start_once() {
                Ok(etcd) => return Ok(etcd),
                Err(e @ EtcdError::NotReady { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("three attempts were made"))
    }

    fn start_once() -> Result<Etcd, EtcdError> {
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
        let client_url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let child = Command::new("etcd")
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
            if healthy(self.client) {
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

    /// Its client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.client)
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
