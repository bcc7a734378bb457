//! A `roam node` process as the tests drive it: started on free loopback
//! ports with its own state directory, asked over its control API, killed
//! on drop; and the `roam` commands that act on nodes (launch, migrate,
//! logs), with the uninterrupted run every migrated cell is compared with.
//! Shared by the node, cluster, service, auth and stop tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

/// The workload every test migrates.
pub const WORKLOAD: &str = "dirty";
/// 8 MiB of state rewritten at 4 MiB/s for 6 s: long enough to be
/// migrated mid-run, short enough under qemu.
pub const SMALL: [&str; 3] = ["8", "4", "6"];
/// 8 MiB for 30 s: long enough for a move, a drain and a killed node.
pub const SMALL_LONG: [&str; 3] = ["8", "4", "30"];

/// Time allowed for anything that involves a node under qemu.
pub const SLOW: Duration = Duration::from_secs(180);

/// A `roam node` process with its own state directory, killed on drop.
pub struct Node {
    pub isa: Isa,
    /// Control API, `127.0.0.1:port`.
    pub addr: String,
    child: Child,
    extra: Vec<String>,
    pub dir: tempfile::TempDir,
    /// The log of its current run.
    pub log: PathBuf,
    starts: u32,
}

impl Node {
    /// A node on free ports.
    pub fn start(isa: Isa) -> Node {
        Node::start_with(isa, &["--migrate-listen", "127.0.0.1:0"])
    }

    pub fn start_with(isa: Isa, extra: &[&str]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let (child, addr, log) = Node::spawn(isa, extra, &dir, 0);
        Node {
            isa,
            addr,
            child,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir,
            log,
            starts: 1,
        }
    }

    fn spawn(
        isa: Isa,
        extra: &[impl AsRef<std::ffi::OsStr>],
        dir: &tempfile::TempDir,
        n: u32,
    ) -> (Child, String, PathBuf) {
        let log = dir.path().join(format!("node-{n}.log"));
        let mut cmd = roam(isa);
        cmd.arg("node").args(["--listen", "127.0.0.1:0"]);
        if !extra.iter().any(|a| a.as_ref() == "--name") {
            cmd.arg("--name").arg(format!("{}-test", isa.name()));
        }
        cmd.arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(extra)
            // Each host node has its own module cache, so a destination
            // lacks a migrating cell's module and fetches it from the
            // source. Nodes under qemu share the run's cache: compiling
            // there takes long.
            .env(
                "ROAM_CACHE_DIR",
                if isa == Isa::X86_64 {
                    dir.path().join("cache")
                } else {
                    cache_dir().to_path_buf()
                },
            );
        let mut child = spawn_logged(&mut cmd, &log);
        let addr = wait_listening(&mut child, &log, SLOW);
        wait_for("GET /v1/node", SLOW, || {
            http_get(&addr, "/v1/node")
                .ok()
                .filter(|(st, _)| *st == 200)
        });
        (child, addr, log)
    }

    /// Kill the node (SIGKILL) and start it again on the same state
    /// directory (on new ports).
    pub fn restart(&mut self) {
        self.kill9();
        let (child, addr, log) = Node::spawn(self.isa, &self.extra, &self.dir, self.starts);
        self.starts += 1;
        (self.child, self.addr, self.log) = (child, addr, log);
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = wait_child(&mut self.child, Duration::from_secs(10), "a killed node");
    }

    /// Everything this node logged (all its runs).
    pub fn log(&self) -> String {
        (0..self.starts)
            .map(|n| {
                let p = self.dir.path().join(format!("node-{n}.log"));
                format!(
                    "--- {} node log {n} ---\n{}",
                    self.isa.name(),
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    pub fn get_json(&self, path: &str) -> Option<Value> {
        let (st, body) = http_get(&self.addr, path)
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}\n{}", self.addr, self.log()));
        match st {
            200 => Some(serde_json::from_slice(&body).unwrap()),
            404 => None,
            _ => panic!("GET {path}: {st} {}\n{}", text(&body), self.log()),
        }
    }

    pub fn info(&self) -> Value {
        self.get_json("/v1/node").unwrap()
    }

    /// The cell as this node sees it, or `None` when it never saw it. A
    /// cell that is arriving by a migration (`409`) is `{"state":
    /// "arriving"}`.
    pub fn cell(&self, id: &str) -> Option<Value> {
        let path = format!("/v1/cells/{id}");
        let (st, body) = http_get(&self.addr, &path)
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}\n{}", self.addr, self.log()));
        match st {
            200 => Some(serde_json::from_slice(&body).unwrap()),
            404 => None,
            409 if text(&body).contains("arriving") => {
                Some(serde_json::json!({ "id": id, "state": "arriving" }))
            }
            _ => panic!("GET {path}: {st} {}\n{}", text(&body), self.log()),
        }
    }

    pub fn state(&self, id: &str) -> String {
        self.cell(id).map_or_else(
            || "unknown".into(),
            |c| c["state"].as_str().unwrap().to_string(),
        )
    }

    /// The cell's own log on this node (no redirect followed), or `None`.
    pub fn raw_logs(&self, id: &str) -> Option<Vec<u8>> {
        let (st, body) = http_get(&self.addr, &format!("/v1/cells/{id}/logs")).unwrap();
        (st == 200).then_some(body)
    }

    /// `roam cells --node ... --json`.
    pub fn cells(&self) -> Vec<Value> {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["cells", "--node", &self.addr, "--json"]);
        let out = run_bounded(cmd, Duration::from_secs(30));
        assert!(out.status.success(), "roam cells: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `roam launch` of the workload; the cell id. Returns once the program
    /// has allocated its state (so it is mid-run: its output is buffered
    /// until the end, so the log cannot tell).
    pub fn launch(&self, args: &[&str]) -> String {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &self.addr])
            .arg(workload(WORKLOAD))
            .arg("--")
            .args(args);
        let out = run_bounded(cmd, SLOW);
        let id = launched(&out, || self.log());
        let state_bytes = args[0].parse::<u64>().unwrap() << 20;
        wait_for("the cell to allocate its state", SLOW, || {
            let c = self.cell(&id).unwrap();
            assert_eq!(c["state"], "running", "{c}\n{}", self.log());
            (c["memory_bytes"].as_u64().unwrap() >= state_bytes).then_some(())
        });
        id
    }

    /// Wait until the cell ended here; its state.
    pub fn wait_end(&self, id: &str, limit: Duration) -> Value {
        let start = Instant::now();
        loop {
            let c = self.cell(id);
            let st = c
                .as_ref()
                .and_then(|c| c["state"].as_str())
                .unwrap_or("unknown");
            if !matches!(st, "running" | "migrating") {
                return c.unwrap_or(Value::Null);
            }
            assert!(
                start.elapsed() < limit,
                "cell {id} still {st} on {} after {} s\n{}",
                self.isa.name(),
                limit.as_secs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The control address a starting node prints in its `log`, once it
/// listens; panics with the log if it exits first or after `limit`.
pub fn wait_listening(child: &mut Child, log: &Path, limit: Duration) -> String {
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    wait_for("the node to listen", limit, || {
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the node exited ({st}) before listening:\n{}", read_log());
        }
        let l = read_log();
        let rest = l.split("control http://").nth(1)?;
        rest.split_whitespace().next().map(str::to_string)
    })
}

/// The id of the cell a `roam launch` printed, which must have succeeded;
/// `log` is the node's, for the failure message.
pub fn launched(out: &Output, log: impl FnOnce() -> String) -> String {
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        log()
    );
    let id = text(&out.stdout).trim().to_string();
    assert!(id.starts_with("c-"), "not a cell id: {id:?}");
    id
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of an uninterrupted `roam run` of the workload (host build),
/// computed once per argument list.
pub fn reference(args: &[&str]) -> Vec<u8> {
    static DONE: OnceLock<Mutex<HashMap<Vec<String>, Vec<u8>>>> = OnceLock::new();
    let key: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut done = DONE.get_or_init(Default::default).lock().unwrap();
    done.entry(key)
        .or_insert_with(|| {
            let mut cmd = roam(Isa::X86_64);
            cmd.arg("run").arg(workload(WORKLOAD)).arg("--").args(args);
            let out = run_bounded(cmd, Duration::from_secs(120));
            assert!(out.status.success(), "roam run: {}", text(&out.stderr));
            // The node's log interleaves stdout and stderr: the comparison
            // is exact only if the program wrote nothing to stderr.
            assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
            assert!(text(&out.stdout).contains("checksum: "));
            out.stdout
        })
        .clone()
}

/// A process with a control API that the `roam` commands can be pointed
/// at: a [`Node`], or the limits tests' [`TestNode`].
pub trait Control {
    /// Time allowed for a command on it.
    const SLOW: Duration;
    /// Its control API, `127.0.0.1:port`.
    fn control(&self) -> &str;
}

impl Control for Node {
    const SLOW: Duration = SLOW;
    fn control(&self) -> &str {
        &self.addr
    }
}

/// `roam migrate --json`; the output and the final status it printed.
pub fn migrate<N: Control>(
    id: &str,
    from: &N,
    to: &N,
    mode: &str,
    extra: &[&str],
) -> (Output, Value) {
    let mut cmd = roam(Isa::X86_64);
    cmd.args([
        "migrate",
        id,
        "--from",
        from.control(),
        "--to",
        to.control(),
        "--mode",
        mode,
        "--json",
    ])
    .args(extra);
    let out = run_bounded(cmd, N::SLOW);
    let status = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, status)
}

/// `roam logs CELL --node NODE` (follows the cell to where it runs).
pub fn logs(id: &str, node: &impl Control) -> Vec<u8> {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["logs", id, "--node", node.control()]);
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "roam logs: {}", text(&out.stderr));
    out.stdout
}

/// Both nodes' logs, for a failure message.
pub fn both_logs(a: &Node, b: &Node) -> String {
    format!("{}\n{}", a.log(), b.log())
}
