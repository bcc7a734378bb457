//! Processes and time: polling with a deadline, running a command with a
//! bound, signals and free ports. Every node, planner and gateway test
//! waits for something; these keep the waits bounded and their failures
//! readable.

use std::fs::File;
use std::io::{Read, Seek};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Poll `f` every 100 ms until it gives a value; panic after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
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

/// [`wait_for`], printing `logs()` if it times out.
pub fn wait_for_or<T>(
    what: &str,
    limit: Duration,
    logs: impl FnOnce() -> String,
    f: impl FnMut() -> Option<T>,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_for(what, limit, f))) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{}", logs());
            std::panic::resume_unwind(e)
        }
    }
}

/// Run `cmd` to completion, killing it after `limit`.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
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

/// Start `cmd` as a daemon: stdout discarded, stderr (without colours)
/// written to `log`, the file a failure shows.
pub fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    cmd.env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(File::create(log).unwrap());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Wait for `child` to exit; kill it and panic after `limit`.
pub fn wait_child(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
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

/// Everything written to `f` (a temporary file a child wrote to).
pub fn read_all(mut f: File) -> Vec<u8> {
    let mut v = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut v).unwrap();
    v
}

/// Send `sig` to process `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child of this test that has not been reaped.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// A free loopback port (free when this returns; tests that need a port
/// known in advance accept the small race).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Under `CI=true` a missing capability fails the test; elsewhere it may
/// skip it with a message.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}
