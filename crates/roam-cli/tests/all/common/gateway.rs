//! A `roam gateway` process for the service tests: clients reach a
//! service cell through it while the cell moves between nodes, and its log
//! tells when a client arrived and whether the service was held.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use super::*;

/// The service's name.
pub const SERVICE: &str = "kv";

/// A `roam gateway` process for [`SERVICE`] on free loopback ports,
/// killed on drop.
pub struct Gateway {
    child: Child,
    /// Where clients connect.
    pub port: u16,
    /// Where nodes connect (`127.0.0.1:port`).
    pub control: String,
    /// Its `GET /metrics` (`127.0.0.1:port`).
    pub metrics: String,
    _dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl Gateway {
    pub fn start() -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("gateway.log");
        let (port, control) = (free_port(), format!("127.0.0.1:{}", free_port()));
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("gateway")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--service", SERVICE, "--resp", "--control", &control])
            .args(["--wait-timeout", "120", "--metrics", &metrics])
            // Client connections too: a test checks when one arrived.
            .env("ROAM_LOG", "info,roam_gateway::server::client=debug");
        let mut child = spawn_logged(&mut cmd, &log);
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_for("the gateway to listen", Duration::from_secs(30), || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "the gateway exited ({st}) before listening:\n{}",
                    read_log()
                );
            }
            TcpStream::connect(&control).ok()
        });
        Gateway {
            child,
            port,
            control,
            metrics,
            _dir: dir,
            log,
        }
    }

    /// How many times the gateway logged `what`.
    pub fn count(&self, what: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches(what)
            .count()
    }

    /// The client whose local port is `port` connected while the service
    /// was held: the last routing event logged before it is a hold. An
    /// earlier client may have had the same local port (the kernel reuses
    /// them), so the client is the last one logged from that port.
    pub fn assert_arrived_while_held(&self, port: u16) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let peer = format!("127.0.0.1:{port}\"");
        let at = lines
            .iter()
            .rposition(|l| l.contains("client connected") && l.contains(&peer))
            .unwrap_or_else(|| panic!("no client from {peer}\n{}", self.log()));
        let before = lines[..at]
            .iter()
            .rev()
            .find(|l| l.contains("service held") || l.contains("service served"));
        assert!(
            before.is_some_and(|l| l.contains("service held")),
            "the client from port {port} did not arrive while the service was held\n{}",
            self.log()
        );
    }

    /// Its `GET /metrics` text.
    fn metrics_text(&self) -> String {
        let (st, body) = http_get(&self.metrics, "/metrics").expect("GET /metrics");
        let text = String::from_utf8(body).expect("UTF-8 metrics");
        assert_eq!(st, 200, "{text}");
        text
    }

    /// The value of the `/metrics` line that starts with `series` (name
    /// and labels), if there is one.
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// How many `/metrics` lines start with `prefix`.
    pub fn metric_lines(&self, prefix: &str) -> usize {
        self.metrics_text()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    pub fn log(&self) -> String {
        format!(
            "--- gateway log ---\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
