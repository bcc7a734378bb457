//! Stopping always works: SIGTERM to `roam run`, `roam kill` and a node's
//! fence end a program that never reaches a migration point, within a
//! second, and report it killed rather than checkpointed.
//!
//! Why these tests use their own module: every workload reaches points, so
//! a stop is always answered by a checkpoint there. `SPIN_WAT` prints one
//! line and then spins in a loop with no call and no memory access,
//! prepared with `--points manual`: no migration point, ever. Only the
//! forced kill (wasmtime's epoch deadline) can end it; without it, each
//! test here hangs until its own limit and fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::common::*;

/// The bound every stop must meet.
const BOUND: Duration = Duration::from_secs(1);

const SPIN_WAT: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "spinning\n")
  (func $_start (export "_start")
    (local $i i32)
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 9))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (loop $spin
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $spin)))
)
"#;

/// `SPIN_WAT` prepared with `--points manual`, in `dir`.
pub(super) fn spin_module(dir: &Path) -> PathBuf {
    let raw = dir.join("spin.wasm");
    std::fs::write(&raw, wat::parse_str(SPIN_WAT).unwrap()).unwrap();
    let prepared = dir.join("spin.roam.wasm");
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("prepare")
        .arg(&raw)
        .arg("-o")
        .arg(&prepared)
        .args(["--points", "manual"]);
    let out = run_bounded(cmd, SLOW);
    assert!(out.status.success(), "roam prepare: {}", text(&out.stderr));
    prepared
}

/// Wait for `child` to exit, up to `limit`; SIGKILL and `None` after it.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// CPU seconds process `pid` has used (user + system, all threads).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is the
    // first, utime the 12th, stime the 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz
}

/// The spinning cell's thread no longer runs: `pid` uses next to no CPU
/// for a second (a spinning thread would use most of one).
fn assert_idle(pid: u32, log: impl FnOnce() -> String) {
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_seconds(pid) - before;
    assert!(used < 0.3, "still {used:.2} s of CPU in 1 s\n{}", log());
}

fn run_spin(
    dir: &Path,
    module: &Path,
    epoch: bool,
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run")
        .arg("--snapshot")
        .arg(dir.join("s.roam"))
        .arg(module)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !epoch {
        cmd.env("ROAM_EPOCH_INTERRUPT", "0");
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line != "spinning\n" {
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        panic!("roam run did not start: {line:?}\n{}", text(&o.stderr));
    }
    (child, out)
}

/// SIGTERM ends `roam run` of a module with no migration point within a
/// second, with exit status 143 and a message that says it was killed; no
/// snapshot is written. With the epoch checks off (the control), the same
/// SIGTERM does not end it: the module really reaches no point.
#[test]
fn sigterm_kills_a_run_that_reaches_no_migration_point_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());

    let (mut child, _out) = run_spin(dir.path(), &module, false);
    signal(child.id(), libc::SIGTERM);
    let ended = wait_exit(&mut child, 3 * BOUND);
    assert!(ended.is_none(), "without epoch checks it ended: {ended:?}");

    let (mut child, _out) = run_spin(dir.path(), &module, true);
    let at = Instant::now();
    signal(child.id(), libc::SIGTERM);
    let st = wait_exit(&mut child, SLOW).expect("roam run never ended");
    let took = at.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(took < BOUND, "SIGTERM took {took:?} to end it\n{err}");
    assert_eq!(st.code(), Some(143), "{err}");
    assert!(err.contains("roam: killed:"), "{err}");
    assert!(err.contains("without a checkpoint"), "{err}");
    assert!(!dir.path().join("s.roam").exists());
    eprintln!("SIGTERM ended roam run in {took:?}");
}

/// A second SIGTERM kills at once, without waiting out the grace period.
#[test]
fn a_second_sigterm_kills_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());
    let (mut child, _out) = run_spin(dir.path(), &module, true);
    let at = Instant::now();
    signal(child.id(), libc::SIGTERM);
    signal(child.id(), libc::SIGTERM);
    let st = wait_exit(&mut child, SLOW).expect("roam run never ended");
    assert_eq!(st.code(), Some(143));
    assert!(at.elapsed() < BOUND, "{:?}", at.elapsed());
}

/// `roam launch` of `module` on `n` with `flags`; the cell id, once it
/// printed.
pub(super) fn launch_spin(n: &Node, module: &Path, flags: &[&str]) -> String {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &n.addr])
        .args(flags)
        .arg(module);
    let out = run_bounded(cmd, SLOW);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        n.log()
    );
    let id = text(&out.stdout).trim().to_string();
    wait_spinning(n, &id);
    id
}

/// Wait until the cell on `n` printed its line (it spins from then on).
pub(super) fn wait_spinning(n: &Node, id: &str) {
    wait_for("the cell to spin", SLOW, || {
        let (st, body) = http_get(&n.addr, &format!("/v1/cells/{id}/logs")).ok()?;
        (st == 200 && text(&body).contains("spinning")).then_some(())
    });
}

/// `roam kill` ends a cell that reaches no migration point within a second;
/// the node reports it killed, and its thread stops using the CPU.
#[test]
fn roam_kill_ends_a_cell_that_reaches_no_migration_point() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());
    let n = Node::start_with(Isa::X86_64, &["--migrate-listen", "127.0.0.1:0"]);
    let id = launch_spin(&n, &module, &[]);
    assert_eq!(n.cell(&id).unwrap()["state"], "running");

    let mut cmd = roam(Isa::X86_64);
    cmd.args(["kill", "--node", &n.addr, &id]);
    let at = Instant::now();
    let out = run_bounded(cmd, SLOW);
    let took = at.elapsed();
    assert!(
        out.status.success(),
        "roam kill: {}\n{}",
        text(&out.stderr),
        n.log()
    );
    assert!(took < BOUND, "roam kill took {took:?}\n{}", n.log());
    assert_eq!(n.cell(&id).unwrap()["state"], "killed", "{}", n.log());
    assert_idle(n.pid(), || n.log());
    eprintln!("roam kill took {took:?}");
}

/// A node cut off from its planner fences its cells; one that reaches no
/// migration point cannot be paused and held, so the fence kills it,
/// within a second, instead of letting it run on.
#[test]
fn the_fence_kills_a_cell_that_reaches_no_migration_point() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());
    let p = Planner::start(None, &["--checkpoint-interval", "0", "--lease", "4"]);
    let port: u16 = p.url.rsplit(':').next().unwrap().parse().unwrap();
    let link = Link::start(port, roam_link::LinkConfig::transparent());
    let via = format!("http://{}", link.proxy().local_addr());
    let a = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            &via,
            "--name",
            "a",
        ],
    );
    wait_alive(&p, 1);
    let out = p.roam(&["launch", "--on", "a", module.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "roam launch: {}\n{}",
        text(&out.stderr),
        p.log()
    );
    let id = text(&out.stdout).trim().to_string();
    wait_spinning(&a, &id);

    link.proxy().handle().cut(roam_link::AfterCut::Refuse);
    let fenced = Instant::now();
    wait_for("node a to fence", SLOW, || {
        a.log()
            .contains("pausing this node's planner cells")
            .then_some(())
    });
    let seen = fenced.elapsed();
    let at = Instant::now();
    loop {
        let c = a.cell(&id).unwrap();
        if c["state"] == "killed" {
            break;
        }
        assert_eq!(c["state"], "running", "{c}\n{}", a.log());
        assert!(at.elapsed() < 2 * BOUND, "not killed\n{}", a.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = at.elapsed();
    assert!(
        took < BOUND,
        "the fence took {took:?} to end it\n{}",
        a.log()
    );
    // The fence logs why once the cell's thread has ended.
    wait_for("the fence to say why", Duration::from_secs(5), || {
        a.log().contains("so the fence killed it").then_some(())
    });
    assert_idle(a.pid(), || a.log());
    eprintln!("fence up {seen:?} after the cut; cell killed {took:?} after that was seen");
}
