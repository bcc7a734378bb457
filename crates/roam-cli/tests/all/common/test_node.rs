//! The node harness of the limits and big-state tests: a `roam node` on
//! free loopback ports that shares the run's module cache, launches any
//! workload with any flags, and exposes the host directory of a cell's
//! files. Simpler than [`Node`] (no restart, one log), with a longer bound
//! for the big cells these tests move.

use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::Duration;

use serde_json::Value;

use super::*;

/// Time allowed for anything that involves a [`TestNode`], under qemu
/// or moving a big cell.
pub const LIMITS_SLOW: Duration = Duration::from_secs(300);

/// A `roam node` process with its own state directory, killed on drop.
pub struct TestNode {
    pub addr: String,
    child: Child,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl TestNode {
    pub fn start(isa: Isa, extra: &[&str]) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut cmd = roam(isa);
        cmd.arg("node")
            .args(["--listen", "127.0.0.1:0", "--migrate-listen", "127.0.0.1:0"])
            .args(["--name", &format!("{}-limits", isa.name())])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(extra);
        let mut child = spawn_logged(&mut cmd, &log);
        let addr = wait_listening(&mut child, &log, LIMITS_SLOW);
        let node = TestNode {
            addr,
            child,
            dir,
            log,
        };
        wait_for("GET /v1/node", LIMITS_SLOW, || {
            (http_raw(&node.addr, "GET", "/v1/node", b"").0 == 200).then_some(())
        });
        node
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Host directory of the cell's first sandbox directory.
    pub fn cell_files(&self, id: &str) -> PathBuf {
        self.dir.path().join("state/cells").join(id).join("dirs/0")
    }

    pub fn get(&self, path: &str) -> Option<Value> {
        let (st, body) = http_raw(&self.addr, "GET", path, b"");
        match st {
            200 => Some(serde_json::from_slice(&body).unwrap()),
            404 => None,
            _ => panic!("GET {path}: {st} {}\n{}", text(&body), self.log()),
        }
    }

    pub fn cell(&self, id: &str) -> Option<Value> {
        self.get(&format!("/v1/cells/{id}"))
    }

    /// `roam launch`: the output (not checked).
    pub fn try_launch(&self, flags: &[&str], wl: &str, args: &[&str]) -> Output {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &self.addr])
            .args(flags)
            .arg(workload(wl))
            .arg("--")
            .args(args);
        run_bounded(cmd, LIMITS_SLOW)
    }

    /// `roam launch`, which must succeed: the cell id.
    pub fn launch(&self, flags: &[&str], wl: &str, args: &[&str]) -> String {
        let out = self.try_launch(flags, wl, args);
        launched(&out, || self.log())
    }

    /// Wait until the cell ended here; its state.
    pub fn wait_end(&self, id: &str, limit: Duration) -> Value {
        wait_for(&format!("cell {id} to end"), limit, || {
            let c = self.cell(id)?;
            (!matches!(c["state"].as_str(), Some("running" | "migrating"))).then_some(c)
        })
    }
}

impl Control for TestNode {
    const SLOW: Duration = LIMITS_SLOW;
    fn control(&self) -> &str {
        &self.addr
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of an uninterrupted `roam run` (host build), with `data` as /data.
pub fn reference_run(wl: &str, args: &[&str], data: Option<&Path>) -> Vec<u8> {
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run");
    if let Some(d) = data {
        cmd.arg("--dir").arg(format!("{}::/data", d.display()));
    }
    cmd.arg(workload(wl)).arg("--").args(args);
    let out = run_bounded(cmd, Duration::from_secs(300));
    assert!(out.status.success(), "roam run: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("checksum: "));
    assert!(!text(&out.stderr).contains("VERIFICATION FAILED"));
    out.stdout
}
