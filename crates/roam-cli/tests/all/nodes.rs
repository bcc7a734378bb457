//! Nodes and live migration, end to end, through the `roam` commands.
//!
//! Unit tests cover the migration protocol piece by piece; only real node
//! processes show that a cell survives a move between ISAs byte for byte,
//! and that a migration that fails half-way neither loses the cell nor runs
//! it twice. Each test starts its own nodes (the host build, or the aarch64
//! build under qemu-user) on free loopback ports, runs the `dirty` workload
//! (its length is set by its arguments and its output does not depend on
//! timing), and compares the output the cell left in the logs with an
//! uninterrupted `roam run`. The real workload suite in every mode is in
//! `nodes/suite.rs`, the failure matrix in `nodes/faults.rs`, the module
//! fetch path in `nodes/fetch.rs`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use roam_link::{parse_rate, AfterCut, Direction, LinkConfig, LinkProxy};
use serde_json::Value;

use super::common::*;

mod cluster;
mod faults;
mod fetch;
mod planner;
mod services;
mod suite;

/// The workload every test migrates.
pub(crate) const WORKLOAD: &str = "dirty";
/// 8 MiB of state rewritten at 4 MiB/s for 6 s: long enough to be
/// migrated mid-run, short enough under qemu.
pub(crate) const SMALL: [&str; 3] = ["8", "4", "6"];
/// 32 MiB for 12 s: a transfer that takes seconds on a 20 Mbit/s link.
const BIG: [&str; 3] = ["32", "4", "12"];
/// 8 MiB for 30 s: long enough for a move, a drain and a killed node.
pub(crate) const SMALL_LONG: [&str; 3] = ["8", "4", "30"];

/// Time allowed for anything that involves a node under qemu.
pub(crate) const SLOW: Duration = Duration::from_secs(180);

/// Poll `f` every 100 ms until it gives a value; panic after `limit`.
pub(crate) fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {} s waiting for {what}",
            limit.as_secs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Run `cmd` to completion, killing it after `limit`.
pub(crate) fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let (out, err) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
    cmd.stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let status = wait_child(&mut child, limit, &format!("{cmd:?}"));
    Output {
        status,
        stdout: read_all(out),
        stderr: read_all(err),
    }
}

fn wait_child(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut v = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

/// `GET path` over HTTP/1.0: status and body.
pub(crate) fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, buf[end + 4..].to_vec()))
}

/// `POST path` with a JSON body over HTTP/1.0: status and body.
fn http_post(addr: &str, path: &str, body: &Value) -> std::io::Result<(u16, Vec<u8>)> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, buf[end + 4..].to_vec()))
}

/// Under `CI=true` a missing capability fails the test; elsewhere it may
/// skip it with a message.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Pre-copy on a host with userfaultfd write-protect must have used it: a
/// silent fallback to hashing fails here. A machine without it may skip the
/// check, except under CI.
fn expect_write_protect(status: &Value, log: &str) {
    let used = &status["summary"]["tracking"];
    if used == "write-protect" {
        return;
    }
    assert!(
        !in_ci(),
        "pre-copy tracked dirty pages with {used}, not userfaultfd write-protect \
         (CI=true: userfaultfd write-protect is required)\n{status}\n{log}"
    );
    eprintln!(
        "skipping the write-protect check: pre-copy used {used} \
         (userfaultfd write-protect unavailable on this machine?)"
    );
}

/// A free loopback port (free when this returns; tests that need a port
/// known in advance accept the small race).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `roam node` process with its own state directory, killed on drop.
pub(crate) struct Node {
    isa: Isa,
    /// Control API, `127.0.0.1:port`.
    pub(crate) addr: String,
    child: Child,
    extra: Vec<String>,
    dir: tempfile::TempDir,
    log: PathBuf,
    starts: u32,
}

impl Node {
    /// A node on free ports.
    fn start(isa: Isa) -> Node {
        Node::start_with(isa, &["--migrate-listen", "127.0.0.1:0"])
    }

    pub(crate) fn start_with(isa: Isa, extra: &[&str]) -> Node {
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
            .env("NO_COLOR", "1")
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
            )
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
        wait_for("GET /v1/node", SLOW, || {
            http_get(&addr, "/v1/node")
                .ok()
                .filter(|(st, _)| *st == 200)
        });
        (child, addr, log)
    }

    /// Kill the node (SIGKILL) and start it again on the same state
    /// directory (on new ports).
    fn restart(&mut self) {
        self.kill9();
        let (child, addr, log) = Node::spawn(self.isa, &self.extra, &self.dir, self.starts);
        self.starts += 1;
        (self.child, self.addr, self.log) = (child, addr, log);
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = wait_child(&mut self.child, Duration::from_secs(10), "a killed node");
    }

    /// Everything this node logged (all its runs).
    pub(crate) fn log(&self) -> String {
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

    fn get_json(&self, path: &str) -> Option<Value> {
        let (st, body) = http_get(&self.addr, path)
            .unwrap_or_else(|e| panic!("GET {path} on {}: {e}\n{}", self.addr, self.log()));
        match st {
            200 => Some(serde_json::from_slice(&body).unwrap()),
            404 => None,
            _ => panic!("GET {path}: {st} {}\n{}", text(&body), self.log()),
        }
    }

    fn info(&self) -> Value {
        self.get_json("/v1/node").unwrap()
    }

    /// The cell as this node sees it, or `None` when it never saw it. A
    /// cell that is arriving by a migration (`409`) is `{"state":
    /// "arriving"}`.
    pub(crate) fn cell(&self, id: &str) -> Option<Value> {
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

    fn state(&self, id: &str) -> String {
        self.cell(id).map_or_else(
            || "unknown".into(),
            |c| c["state"].as_str().unwrap().to_string(),
        )
    }

    /// The cell's own log on this node (no redirect followed), or `None`.
    fn raw_logs(&self, id: &str) -> Option<Vec<u8>> {
        let (st, body) = http_get(&self.addr, &format!("/v1/cells/{id}/logs")).unwrap();
        (st == 200).then_some(body)
    }

    /// `roam cells --node ... --json`.
    fn cells(&self) -> Vec<Value> {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["cells", "--node", &self.addr, "--json"]);
        let out = run_bounded(cmd, Duration::from_secs(30));
        assert!(out.status.success(), "roam cells: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `roam launch` of the workload; the cell id. Returns once the program
    /// has allocated its state (so it is mid-run: its output is buffered
    /// until the end, so the log cannot tell).
    fn launch(&self, args: &[&str]) -> String {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &self.addr])
            .arg(workload(WORKLOAD))
            .arg("--")
            .args(args);
        let out = run_bounded(cmd, SLOW);
        assert!(
            out.status.success(),
            "roam launch: {}\n{}",
            text(&out.stderr),
            self.log()
        );
        let id = text(&out.stdout).trim().to_string();
        assert!(id.starts_with("c-"), "not a cell id: {id:?}");
        let state_bytes = args[0].parse::<u64>().unwrap() << 20;
        wait_for("the cell to allocate its state", SLOW, || {
            let c = self.cell(&id).unwrap();
            assert_eq!(c["state"], "running", "{c}\n{}", self.log());
            (c["memory_bytes"].as_u64().unwrap() >= state_bytes).then_some(())
        });
        id
    }

    /// Wait until the cell ended here; its state.
    pub(crate) fn wait_end(&self, id: &str, limit: Duration) -> Value {
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

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// stdout of an uninterrupted `roam run` of the workload (host build),
/// computed once per argument list.
pub(crate) fn reference(args: &[&str]) -> Vec<u8> {
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

/// `roam migrate --json`; the output and the final status it printed.
fn migrate(id: &str, from: &Node, to: &Node, mode: &str, extra: &[&str]) -> (Output, Value) {
    let mut cmd = roam(Isa::X86_64);
    cmd.args([
        "migrate", id, "--from", &from.addr, "--to", &to.addr, "--mode", mode, "--json",
    ])
    .args(extra);
    let out = run_bounded(cmd, SLOW);
    let status = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, status)
}

/// `roam logs CELL --node NODE` (follows the cell to where it runs).
fn logs(id: &str, node: &Node) -> Vec<u8> {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["logs", id, "--node", &node.addr]);
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "roam logs: {}", text(&out.stderr));
    out.stdout
}

fn both_logs(a: &Node, b: &Node) -> String {
    format!("{}\n{}", a.log(), b.log())
}

/// Launch on a `from` node, migrate to a `to` node, let the cell finish
/// there, and check its log against an uninterrupted run. The migration's
/// final status.
fn move_and_compare(from: Isa, to: Isa, mode: &str, extra: &[&str]) -> Value {
    let expected = reference(&SMALL);
    let (a, b) = (Node::start(from), Node::start(to));
    let id = a.launch(&SMALL);
    let (out, status) = migrate(&id, &a, &b, mode, extra);
    assert!(
        out.status.success(),
        "roam migrate failed: {}\n{}",
        text(&out.stderr),
        both_logs(&a, &b)
    );
    let summary = &status["summary"];
    assert_eq!(summary["mode"], mode, "{status}");
    assert_eq!(summary["from_isa"], from.name(), "{status}");
    assert_eq!(summary["to_isa"], to.name(), "{status}");
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["code"], 0, "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["hops"], 1, "{end}");
    let src = a.cell(&id).unwrap();
    assert_eq!(src["state"], "moved", "{src}");
    let got = logs(&id, &a);
    assert_eq!(
        text(&got),
        text(&expected),
        "the migrated cell's output differs from an uninterrupted run\n{}",
        both_logs(&a, &b)
    );
    status
}

/// After a failed migration: the cell finished on the source with the
/// reference output, and the destination neither runs it nor ran it.
fn check_stayed_on_source(id: &str, a: &Node, b: &Node, args: &[&str]) {
    let end = a.wait_end(id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(a, b));
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(end["hops"], 0, "{end}");
    let on_b = b.cell(id);
    assert!(
        on_b.as_ref().is_none_or(|c| !matches!(
            c["state"].as_str(),
            Some("running" | "migrating" | "exited")
        )),
        "the destination has the cell: {on_b:?}\n{}",
        both_logs(a, b)
    );
    assert!(
        !b.cells()
            .iter()
            .any(|c| c["id"] == id && c["state"] == "running"),
        "roam cells shows the cell running on the destination"
    );
    let src_log = a.raw_logs(id).expect("the source keeps the cell's log");
    let dst_log = b.raw_logs(id).unwrap_or_default();
    let finals =
        text(&src_log).matches("checksum: ").count() + text(&dst_log).matches("checksum: ").count();
    assert_eq!(
        finals, 1,
        "the final output appears {finals} times across both nodes"
    );
    assert_eq!(
        text(&logs(id, a)),
        text(&reference(args)),
        "{}",
        both_logs(a, b)
    );
}

// ---- cross-ISA moves ------------------------------------------------------

#[test]
fn x86_to_aarch64_stop_and_copy() {
    move_and_compare(Isa::X86_64, Isa::Aarch64, "stop-and-copy", &[]);
}

#[test]
fn x86_to_aarch64_pre_copy() {
    move_and_compare(Isa::X86_64, Isa::Aarch64, "pre-copy", &[]);
}

#[test]
fn aarch64_to_x86_stop_and_copy() {
    move_and_compare(Isa::Aarch64, Isa::X86_64, "stop-and-copy", &[]);
}

#[test]
fn aarch64_to_x86_pre_copy() {
    // Under qemu on a loaded machine `dirty` can outpace its own copy, and
    // rounds go on until the program ends; a bound on rounds makes the move
    // happen while it runs.
    move_and_compare(
        Isa::Aarch64,
        Isa::X86_64,
        "pre-copy",
        &["--max-rounds", "4"],
    );
}

#[test]
fn aarch64_to_x86_post_copy() {
    let st = move_and_compare(Isa::Aarch64, Isa::X86_64, "post-copy", &[]);
    assert!(st["summary"]["post_copy"].is_object(), "{st}");
}

/// Post-copy from the host to the aarch64 node (qemu-user has no
/// userfaultfd): the output of `roam migrate`, its final status, the nodes
/// and the cell.
fn post_copy_to_aarch64() -> (Output, Value, Node, Node, String) {
    let (a, b) = (Node::start(Isa::X86_64), Node::start(Isa::Aarch64));
    assert_eq!(b.info()["userfaultfd"], false, "{}", b.info());
    let id = a.launch(&SMALL);
    let (out, status) = migrate(&id, &a, &b, "post-copy", &[]);
    (out, status, a, b, id)
}

/// The aarch64 node refuses post-copy before the cell pauses, and the cell
/// finishes where it is.
#[test]
fn x86_to_aarch64_post_copy_is_refused_and_the_cell_stays() {
    let (out, status, a, b, id) = post_copy_to_aarch64();
    assert!(
        !out.status.success(),
        "post-copy to a node without userfaultfd succeeded: {status}"
    );
    let err = text(&out.stderr);
    assert!(err.contains("userfaultfd"), "{err}");
    assert_eq!(status["phase"], "failed", "{status}");
    assert!(
        !a.log().contains("phase=paus"),
        "the cell paused for a refused migration\n{}",
        a.log()
    );
    assert_eq!(a.state(&id), "running", "{}", a.log());
    check_stayed_on_source(&id, &a, &b, &SMALL);
}

/// docs/migration.md: every failure before the commit, a refusal included,
/// is reported with "the cell keeps running on this node".
#[test]
fn refused_post_copy_says_the_cell_keeps_running() {
    let (out, _, a, b, id) = post_copy_to_aarch64();
    let err = text(&out.stderr);
    assert!(err.contains("userfaultfd"), "{err}");
    assert!(err.contains("keeps running"), "{err}");
    check_stayed_on_source(&id, &a, &b, &SMALL);
}

// ---- host to host ---------------------------------------------------------

#[test]
fn host_post_copy() {
    let st = move_and_compare(Isa::X86_64, Isa::X86_64, "post-copy", &[]);
    assert!(st["summary"]["post_copy"].is_object(), "{st}");
}

/// With userfaultfd on the host, pre-copy tracks dirty pages by write
/// protection, and the summary says what was used (not what was asked).
#[test]
fn host_pre_copy_uses_write_protect_tracking() {
    let st = move_and_compare(Isa::X86_64, Isa::X86_64, "pre-copy", &[]);
    expect_write_protect(&st, "");
}

#[test]
fn host_pre_copy_hash_tracking() {
    let st = move_and_compare(
        Isa::X86_64,
        Isa::X86_64,
        "pre-copy",
        &["--tracking", "hash"],
    );
    assert_eq!(st["summary"]["tracking"], "hash", "{st}");
}

// ---- failures: the cell is neither lost nor duplicated --------------------

/// The migration failed with an error naming `what`, and said the cell
/// stays.
fn assert_failed(out: &Output, what: &str, a: &Node, b: &Node) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "the migration succeeded\n{}",
        both_logs(a, b)
    );
    assert!(
        err.contains(what),
        "expected `{what}` in: {err}\n{}",
        both_logs(a, b)
    );
    assert!(err.contains("keeps running"), "{err}");
}

#[test]
fn destination_killed_mid_transfer() {
    let (a, mut b) = (Node::start(Isa::X86_64), Node::start(Isa::X86_64));
    let id = a.launch(&BIG);
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["migrate", &id, "--from", &a.addr, "--to", &b.addr])
        .args(["--mode", "stop-and-copy", "--bandwidth", "20mbit", "--json"]);
    let (out, err) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
    cmd.stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let mut child = cmd.spawn().unwrap();
    // Kill the destination once pages flow (the cell is paused then).
    wait_for(
        "the cell to pause for the transfer",
        Duration::from_secs(60),
        || a.log().contains("phase=paused").then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    b.kill9();
    let status = wait_child(&mut child, Duration::from_secs(120), "roam migrate");
    let out = Output {
        status,
        stdout: read_all(out),
        stderr: read_all(err),
    };
    let st: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let wire = st["wire_bytes"].as_u64().unwrap_or(0);
    assert!(
        wire > 1 << 20,
        "killed before the transfer: {wire} bytes sent\n{st}"
    );
    assert!(!out.status.success(), "the migration succeeded: {st}");
    assert!(
        text(&out.stderr).contains("keeps running"),
        "{}",
        text(&out.stderr)
    );
    // A restarted destination must not bring the cell back.
    b.restart();
    check_stayed_on_source(&id, &a, &b, &BIG);
}

/// A proxy on its own tokio runtime, between a source and a destination's
/// migration port; the destination advertises the proxy.
pub(crate) struct Link {
    rt: tokio::runtime::Runtime,
    proxy: Option<LinkProxy>,
}

impl Link {
    /// Start a proxy to `127.0.0.1:target`.
    pub(crate) fn start(target: u16, cfg: LinkConfig) -> Link {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let target: SocketAddr = format!("127.0.0.1:{target}").parse().unwrap();
        let proxy = rt
            .block_on(LinkProxy::start(
                "127.0.0.1:0".parse().unwrap(),
                target,
                cfg,
            ))
            .unwrap();
        Link {
            rt,
            proxy: Some(proxy),
        }
    }

    pub(crate) fn proxy(&self) -> &LinkProxy {
        self.proxy.as_ref().unwrap()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(p) = self.proxy.take() {
            self.rt.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(5), p.shutdown()).await;
            });
        }
    }
}

/// A source node, and a destination reached through a `Link`.
fn linked(cfg: LinkConfig) -> (Node, Node, Link) {
    let port = free_port();
    let link = Link::start(port, cfg);
    let a = Node::start(Isa::X86_64);
    let b = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-migrate",
            &link.proxy().local_addr().to_string(),
        ],
    );
    assert_eq!(
        b.info()["migrate_addr"],
        link.proxy().local_addr().to_string(),
        "the destination does not advertise the proxy"
    );
    (a, b, link)
}

#[test]
fn link_cut_mid_transfer() {
    let rate = parse_rate("20mbit").unwrap();
    let (a, b, link) = linked(LinkConfig::symmetric(rate, Duration::ZERO));
    let id = a.launch(&BIG);
    let handle = link.proxy().handle();
    let cutter = std::thread::spawn(move || {
        let start = Instant::now();
        while handle.bytes_forwarded(Direction::ClientToServer) < 2 << 20 {
            if start.elapsed() > Duration::from_secs(60) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        handle.cut(AfterCut::Refuse);
        true
    });
    let (out, _) = migrate(&id, &a, &b, "stop-and-copy", &[]);
    assert!(cutter.join().unwrap(), "the transfer never reached 2 MiB");
    assert_failed(&out, "", &a, &b);
    check_stayed_on_source(&id, &a, &b, &BIG);
}

/// Migrate through a link that flips one byte 1 MiB into the stream: the
/// output of `roam migrate`, with the nodes and the cell.
fn migrate_through_corruption() -> (Output, Node, Node, String) {
    let (a, b, link) = linked(LinkConfig::transparent());
    link.proxy()
        .handle()
        .corrupt_after(Direction::ClientToServer, 1 << 20);
    let id = a.launch(&BIG);
    let (out, _) = migrate(&id, &a, &b, "stop-and-copy", &[]);
    assert_eq!(
        link.proxy()
            .handle()
            .bytes_corrupted(Direction::ClientToServer),
        1,
        "no byte was corrupted"
    );
    (out, a, b, id)
}

#[test]
fn corrupted_byte_fails_the_migration_and_the_cell_stays() {
    let (out, a, b, id) = migrate_through_corruption();
    assert_failed(&out, "", &a, &b);
    // The destination caught it by the frame checksum.
    assert!(
        b.log().contains("checksum mismatch"),
        "{}",
        both_logs(&a, &b)
    );
    check_stayed_on_source(&id, &a, &b, &BIG);
}

/// The destination sends the source an `Abort` naming the checksum
/// mismatch, but the source reports the broken stream it saw first.
#[test]
fn corrupted_byte_is_reported_as_a_checksum_error() {
    let (out, a, b, id) = migrate_through_corruption();
    assert_failed(&out, "checksum", &a, &b);
    check_stayed_on_source(&id, &a, &b, &BIG);
}

// ---- dedup across migrations ---------------------------------------------

/// A cell that goes A → B → A sends little on the way back: A kept the pages
/// it sent, advertises them in its store summary, and B refers to them.
/// The round trip must still end with the uninterrupted run's output.
#[test]
fn a_cell_coming_back_sends_only_what_changed() {
    let args = ["32", "2", "12"];
    let expected = reference(&args);
    let (a, b) = (Node::start(Isa::X86_64), Node::start(Isa::X86_64));
    let id = a.launch(&args);
    // Let it finish filling its state: from then on it rewrites 2 MiB/s.
    std::thread::sleep(Duration::from_secs(3));
    let (out, there) = migrate(&id, &a, &b, "stop-and-copy", &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        both_logs(&a, &b)
    );
    let (out, back) = migrate(&id, &b, &a, "stop-and-copy", &[]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        both_logs(&a, &b)
    );
    let first = there["summary"]["wire_bytes"].as_u64().unwrap();
    let second = back["summary"]["wire_bytes"].as_u64().unwrap();
    let stored = back["summary"]["pipeline"]["store_pages"].as_u64().unwrap();
    assert!(stored > 0, "no page came from the store: {back}");
    assert!(
        second * 2 < first,
        "the way back sent {second} bytes, the way there {first}: {back}"
    );
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both_logs(&a, &b));
    assert_eq!(end["hops"], 2, "{end}");
    assert_eq!(
        text(&logs(&id, &b)),
        text(&expected),
        "{}",
        both_logs(&a, &b)
    );
}
