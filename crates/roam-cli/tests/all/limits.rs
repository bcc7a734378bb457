//! A node's and a cell's limits, end to end: memory, cell count, module
//! size, logs. Each test starts its own nodes on free loopback ports (see
//! [`TestNode`], shared with `bigstate`).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::common::*;
pub(super) use super::nodes::{run_bounded, wait_for};

/// Time allowed for anything that involves a node under qemu.
pub(super) const SLOW: Duration = Duration::from_secs(300);

/// One HTTP/1.0 request: status and body.
pub(super) fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let sa: SocketAddr = addr.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    // The server may answer (and close) before reading a refused body.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {}", text(&buf)));
    let head = text(&buf[..end]);
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, buf[end + 4..].to_vec())
}

/// A `roam node` process with its own state directory, killed on drop.
pub(super) struct TestNode {
    pub addr: String,
    child: Child,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl TestNode {
    pub(super) fn start(isa: Isa, extra: &[&str]) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("node.log");
        let mut cmd = roam(isa);
        cmd.arg("node")
            .args(["--listen", "127.0.0.1:0", "--migrate-listen", "127.0.0.1:0"])
            .args(["--name", &format!("{}-limits", isa.name())])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(extra)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        let addr = wait_for("the node to listen", SLOW, || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("the node exited ({st}) before listening:\n{}", read_log());
            }
            let l = read_log();
            let rest = l.split("control http://").nth(1)?;
            rest.split_whitespace().next().map(str::to_string)
        });
        let node = TestNode {
            addr,
            child,
            dir,
            log,
        };
        wait_for("GET /v1/node", SLOW, || {
            (http(&node.addr, "GET", "/v1/node", b"").0 == 200).then_some(())
        });
        node
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Host directory of the cell's first sandbox directory.
    pub(super) fn cell_files(&self, id: &str) -> PathBuf {
        self.dir.path().join("state/cells").join(id).join("dirs/0")
    }

    pub(super) fn get(&self, path: &str) -> Option<Value> {
        let (st, body) = http(&self.addr, "GET", path, b"");
        match st {
            200 => Some(serde_json::from_slice(&body).unwrap()),
            404 => None,
            _ => panic!("GET {path}: {st} {}\n{}", text(&body), self.log()),
        }
    }

    pub(super) fn cell(&self, id: &str) -> Option<Value> {
        self.get(&format!("/v1/cells/{id}"))
    }

    /// `roam launch`: the output (not checked).
    pub(super) fn try_launch(&self, flags: &[&str], wl: &str, args: &[&str]) -> Output {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &self.addr])
            .args(flags)
            .arg(workload(wl))
            .arg("--")
            .args(args);
        run_bounded(cmd, SLOW)
    }

    /// `roam launch`, which must succeed: the cell id.
    pub(super) fn launch(&self, flags: &[&str], wl: &str, args: &[&str]) -> String {
        let out = self.try_launch(flags, wl, args);
        assert!(
            out.status.success(),
            "roam launch: {}\n{}",
            text(&out.stderr),
            self.log()
        );
        let id = text(&out.stdout).trim().to_string();
        assert!(id.starts_with("c-"), "not a cell id: {id:?}");
        id
    }

    /// Wait until the cell ended here; its state.
    pub(super) fn wait_end(&self, id: &str, limit: Duration) -> Value {
        wait_for(&format!("cell {id} to end"), limit, || {
            let c = self.cell(id)?;
            (!matches!(c["state"].as_str(), Some("running" | "migrating"))).then_some(c)
        })
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of an uninterrupted `roam run` (host build), with `data` as /data.
pub(super) fn reference_run(wl: &str, args: &[&str], data: Option<&Path>) -> Vec<u8> {
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

/// `roam migrate --json`; the output and the final status it printed.
pub(super) fn migrate(id: &str, from: &TestNode, to: &TestNode, mode: &str) -> (Output, Value) {
    let mut cmd = roam(Isa::X86_64);
    cmd.args([
        "migrate", id, "--from", &from.addr, "--to", &to.addr, "--mode", mode, "--json",
    ]);
    let out = run_bounded(cmd, SLOW);
    let status = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, status)
}

/// `roam logs CELL --node NODE` (follows the cell to where it runs).
pub(super) fn logs(id: &str, node: &TestNode) -> Vec<u8> {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["logs", id, "--node", &node.addr]);
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "roam logs: {}", text(&out.stderr));
    out.stdout
}

// ---- the tests --------------------------------------------------------------

#[test]
fn launch_beyond_max_cells_is_refused_with_the_cap_named() {
    let a = TestNode::start(Isa::X86_64, &["--max-cells", "1"]);
    let first = a.launch(&[], "dirty", &["8", "4", "4"]);
    let out = a.try_launch(&[], "dirty", &["8", "4", "4"]);
    assert!(!out.status.success(), "a second cell was launched");
    let err = text(&out.stderr);
    assert!(err.contains("--max-cells"), "{err}");
    assert!(err.contains("1 cells run or arrive here"), "{err}");
    // Once the first cell ends, there is room again.
    a.wait_end(&first, Duration::from_secs(60));
    a.launch(&[], "dirty", &["8", "4", "1"]);
}

#[test]
fn a_cell_launched_with_less_memory_sees_malloc_fail_and_says_so() {
    let a = TestNode::start(Isa::X86_64, &[]);
    // 32 MiB of state does not fit in 16 MiB: malloc returns NULL, and the
    // program reports it and exits 1 by itself.
    let id = a.launch(&["--max-memory", "16MiB"], "dirty", &["32", "4", "2"]);
    let end = a.wait_end(&id, Duration::from_secs(60));
    assert_eq!(end["state"], "exited", "{end}\n{}", a.log());
    assert_eq!(end["code"], 1, "{end}");
    assert_eq!(end["max_memory"], 16 << 20, "{end}");
    let log = text(&logs(&id, &a));
    assert!(log.contains("dirty: out of memory for 32 MiB"), "{log}");
    assert!(a.log().contains("past its limit"), "{}", a.log());
    // Asking for more than the node allows per cell is a bad request.
    let out = a.try_launch(&["--max-memory", "5GiB"], "dirty", &["8", "4", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--max-cell-memory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_oversized_module_upload_gets_413() {
    let a = TestNode::start(Isa::X86_64, &["--max-module-size", "1MiB"]);
    let (st, body) = http(&a.addr, "POST", "/v1/modules", &vec![0u8; 3 << 20]);
    assert_eq!(st, 413, "{}", text(&body));
    let err = text(&body);
    assert!(
        err.contains("--max-module-size") && err.contains("1.0 MiB"),
        "{err}"
    );
    // A module under the cap is still accepted.
    let small = std::fs::read(workload("dirty")).unwrap();
    assert!(small.len() < 1 << 20, "dirty.wasm grew past the test's cap");
    let (st, body) = http(&a.addr, "POST", "/v1/modules", &small);
    assert_eq!(st, 200, "{}", text(&body));
}

#[test]
fn an_incoming_cell_over_the_memory_limit_is_refused_and_keeps_running() {
    let args = ["32", "4", "6"];
    let expected = reference_run("dirty", &args, None);
    let a = TestNode::start(Isa::X86_64, &[]);
    let b = TestNode::start(
        Isa::X86_64,
        &["--max-cell-memory", "16MiB", "--cell-memory", "16MiB"],
    );
    let id = a.launch(&[], "dirty", &args);
    wait_for("the cell to allocate its state", SLOW, || {
        let c = a.cell(&id).unwrap();
        (c["memory_bytes"].as_u64().unwrap() >= 32 << 20).then_some(())
    });
    let (out, _) = migrate(&id, &a, &b, "pre-copy");
    assert!(!out.status.success(), "the migration went through");
    let err = text(&out.stderr);
    assert!(err.contains("--max-cell-memory"), "{err}");
    assert!(err.contains("16.0 MiB"), "{err}");
    assert!(err.contains("keeps running"), "{err}");
    let end = a.wait_end(&id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}");
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(end["hops"], 0, "{end}");
    assert!(b.cell(&id).is_none(), "the destination knows the cell");
    assert_eq!(text(&logs(&id, &a)), text(&expected));
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_chatty_cell_keeps_the_node_bounded_and_the_tail_intact() {
    // 128 MiB of output through a 1 MiB log.
    let args = ["1", "2", "131072"];
    let data = tempfile::tempdir().unwrap();
    let expected = reference_run("bigfiles", &args, Some(data.path()));
    let a = TestNode::start(Isa::X86_64, &["--log-size", "1MiB"]);
    let id = a.launch(&["--dir", "/data"], "bigfiles", &args);
    let end = a.wait_end(&id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}\n{}", a.log());
    assert_eq!(end["code"], 0, "{end}");
    let dropped = expected.len() as u64 - (1 << 20);
    assert_eq!(end["log_dropped_bytes"], dropped, "{end}");
    let got = logs(&id, &a);
    let first = format!(
        "[roam: {:.1} MiB of earlier output dropped]\n",
        dropped as f64 / (1 << 20) as f64
    );
    assert!(got.starts_with(first.as_bytes()), "{}", text(&got[..200]));
    assert_eq!(
        &got[first.len()..],
        &expected[expected.len() - (1 << 20)..],
        "the tail of the log differs from the end of an uninterrupted run"
    );
    let peak = vm_hwm_kib(a.pid()) << 10;
    assert!(
        peak < 96 << 20,
        "the node's peak memory was {} MiB for a 1 MiB log",
        peak >> 20
    );
}
