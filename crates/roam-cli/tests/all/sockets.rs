//! Servers as cells, standalone: `roam run --listen` serves real TCP clients
//! through the cell's virtual connections, and a server checkpointed while
//! blocked in accept or in recv is restored on aarch64 (qemu-user), where it
//! serves new clients; the connection it was reading is reported reset
//! (the standalone restore rule of `docs/os-layer.md`).
//!
//! The server is the `echo` service workload; every echo is compared with
//! what the client sent, and the server's own account of each client
//! (accepted, closed or reset, bytes echoed) with the client's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::common::*;

/// Bound on any single wait (qemu-user is slow; this only stops a hang).
const WAIT: Duration = Duration::from_secs(180);

/// Lines a child printed, shared with the threads that read them.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    cv: Condvar,
}

impl Lines {
    fn follow(self: &Arc<Self>, r: impl Read + Send + 'static) {
        let me = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                me.lines.lock().unwrap().push(line);
                me.cv.notify_all();
            }
        });
    }

    /// The first line containing `pat`, waiting for it.
    fn wait_for(&self, pat: &str, what: &str) -> String {
        let deadline = Instant::now() + WAIT;
        let mut g = self.lines.lock().unwrap();
        loop {
            if let Some(l) = g.iter().find(|l| l.contains(pat)) {
                return l.clone();
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "{what}: no line with {pat:?} after {WAIT:?}; got:\n{}",
                g.join("\n")
            );
            g = self.cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    fn all(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// A running `roam run`/`roam restore` with its output followed.
struct Server {
    child: Child,
    stdout: Arc<Lines>,
    stderr: Arc<Lines>,
    what: String,
}

impl Server {
    fn start(isa: Isa, args: &[&str], what: &str) -> Server {
        let mut cmd = roam(isa);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
        let stdout = Arc::new(Lines::default());
        let stderr = Arc::new(Lines::default());
        stdout.follow(child.stdout.take().unwrap());
        stderr.follow(child.stderr.take().unwrap());
        Server {
            child,
            stdout,
            stderr,
            what: what.to_string(),
        }
    }

    /// The address roam listens on (it prints it; the tests bind port 0).
    fn addr(&self) -> String {
        let l = self.stderr.wait_for("roam: listening on ", &self.what);
        l.split("listening on ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap()
            .to_string()
    }

    /// Wait for the exit, bounded; the exit status and both outputs.
    fn finish(mut self) -> (ExitStatus, Vec<String>, Vec<String>) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Let the readers drain the pipes.
                std::thread::sleep(Duration::from_millis(200));
                return (st, self.stdout.all(), self.stderr.all());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{}: still running after {WAIT:?}; stdout:\n{}\nstderr:\n{}",
                    self.what,
                    self.stdout.all().join("\n"),
                    self.stderr.all().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, sig: i32) {
        extern "C" {
            fn kill(pid: i32, sig: i32) -> i32;
        }
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "{}: kill failed", self.what);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    s.set_read_timeout(Some(WAIT)).unwrap();
    s
}

/// Deterministic bytes for client `c`, message `m`.
fn message(c: usize, m: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (c * 131 + m * 17 + i * 7) as u8).collect()
}

/// Send `data`, read back exactly as many bytes, compare.
fn echo_round(s: &mut TcpStream, data: &[u8], what: &str) {
    // A writer thread, so a payload larger than the windows cannot deadlock.
    let mut w = s.try_clone().unwrap();
    let out = data.to_vec();
    let t = std::thread::spawn(move || w.write_all(&out).unwrap());
    let mut back = vec![0u8; data.len()];
    s.read_exact(&mut back)
        .unwrap_or_else(|e| panic!("{what}: reading the echo of {} bytes: {e}", data.len()));
    t.join().unwrap();
    assert!(back == data, "{what}: the echo differs from what was sent");
}

/// Half-close, then the server must close its side too (EOF).
fn finish_client(mut s: TcpStream, what: &str) {
    s.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .unwrap_or_else(|e| panic!("{what}: waiting for the server's EOF: {e}"));
    assert!(rest.is_empty(), "{what}: {} unexpected bytes", rest.len());
}

/// The server's line for client `id` ends with "after N bytes".
fn account(lines: &[String], id: usize, how: &str) -> u64 {
    let pat = format!("echo: client {id} {how} after ");
    let l = lines
        .iter()
        .find(|l| l.starts_with(&pat))
        .unwrap_or_else(|| panic!("no {pat:?} line in:\n{}", lines.join("\n")));
    l[pat.len()..].trim_end_matches(" bytes").parse().unwrap()
}

#[test]
fn run_listen_serves_concurrent_clients() {
    const CLIENTS: usize = 6;
    let echo = workload("echo");
    let srv = Server::start(
        Isa::X86_64,
        &[
            "run",
            "--listen",
            "127.0.0.1:0",
            echo.to_str().unwrap(),
            "--",
            "poll",
            &CLIENTS.to_string(),
        ],
        "echo poll",
    );
    let addr = srv.addr();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let what = format!("client {c}");
                let mut s = connect(&addr);
                let mut sent = 0u64;
                for m in 0..40 {
                    let len = 1 + (m * 997 + c * 131) % 3000;
                    echo_round(&mut s, &message(c, m, len), &what);
                    sent += len as u64;
                }
                // Larger than the flow-control window in both directions,
                // and the client half-closes right after it: the server
                // must still send all of the echo back, then close.
                let big = message(c, 99, 700 * 1024 + c);
                let mut w = s.try_clone().unwrap();
                let out = big.clone();
                let t = std::thread::spawn(move || {
                    w.write_all(&out).unwrap();
                    w.shutdown(Shutdown::Write).unwrap();
                });
                let mut back = Vec::new();
                s.read_to_end(&mut back)
                    .unwrap_or_else(|e| panic!("{what}: reading the last echo: {e}"));
                t.join().unwrap();
                assert!(
                    back == big,
                    "{what}: the last echo differs ({} of {} bytes)",
                    back.len(),
                    big.len()
                );
                sent += big.len() as u64;
                sent
            })
        })
        .collect();
    let mut sent: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let (st, out, err) = srv.finish();
    assert!(st.success(), "echo exited {st}: {}", err.join("\n"));
    // The server's byte counts, per client, are the clients' (in some order).
    let mut served: Vec<u64> = (1..=CLIENTS).map(|i| account(&out, i, "closed")).collect();
    sent.sort_unstable();
    served.sort_unstable();
    assert_eq!(served, sent);
}

/// Checkpoint with `first`, restore on aarch64 with `--listen 127.0.0.1:0`.
fn restore_on_aarch64(snap: &Path, what: &str) -> Server {
    Server::start(
        Isa::Aarch64,
        &["restore", "--listen", "127.0.0.1:0", snap.to_str().unwrap()],
        what,
    )
}

#[test]
fn blocked_in_accept_moves_to_aarch64_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("accept.roam");
    let echo = workload("echo");
    let first = Server::start(
        Isa::X86_64,
        &[
            "run",
            "--listen",
            "127.0.0.1:0",
            "--checkpoint-on-block",
            "--embed-module",
            "--snapshot",
            snap.to_str().unwrap(),
            echo.to_str().unwrap(),
            "--",
            "serial",
            "2",
        ],
        "echo serial, checkpoint in accept",
    );
    let (st, out, err) = first.finish();
    assert!(st.success(), "{}", err.join("\n"));
    assert_eq!(out, vec!["echo: serving on fd 3 (serial)".to_string()]);
    assert!(snap.exists(), "no snapshot: {}", err.join("\n"));

    let second = restore_on_aarch64(&snap, "echo restored on aarch64");
    let addr = second.addr();
    let mut sent = Vec::new();
    for c in 0..2 {
        let what = format!("client {c} after the move");
        let mut s = connect(&addr);
        let data = message(c, 1, 5000 + c);
        echo_round(&mut s, &data, &what);
        finish_client(s, &what);
        sent.push(data.len() as u64);
    }
    let (st, out, err) = second.finish();
    assert!(st.success(), "{}", err.join("\n"));
    assert_eq!(account(&out, 1, "closed"), sent[0]);
    assert_eq!(account(&out, 2, "closed"), sent[1]);
}

/// `mode` "serial" blocks in recv, "poll" in poll_oneoff, with one client
/// connected; after the move that client is reset, a new one is served.
fn blocked_with_a_client_moves_to_aarch64(mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("recv.roam");
    let echo = workload("echo");
    let first = Server::start(
        Isa::X86_64,
        &[
            "run",
            "--listen",
            "127.0.0.1:0",
            "--embed-module",
            "--snapshot",
            snap.to_str().unwrap(),
            echo.to_str().unwrap(),
            "--",
            mode,
            "2",
        ],
        &format!("echo {mode}, checkpoint with a client"),
    );
    let addr = first.addr();
    let mut a = connect(&addr);
    echo_round(&mut a, b"ping", "client before the move");
    // The server is back in recv (or poll), waiting for more from this client.
    first
        .stdout
        .wait_for("echo: client 1 accepted", "first half");
    first.signal(15); // SIGTERM: checkpoint and stop
    let (st, out, err) = first.finish();
    assert!(st.success(), "{}", err.join("\n"));
    assert!(snap.exists(), "no snapshot: {}", err.join("\n"));
    assert!(
        !out.iter()
            .any(|l| l.contains("closed") || l.contains("reset")),
        "the first half saw the client go: {out:?}"
    );
    drop(a);
    // The snapshot records the connection: the 4 bytes were read, and their
    // echo is confirmed delivered, or (if the checkpoint came between the
    // write to the client's socket and its confirmation) still held.
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("inspect").arg(&snap);
    let inspected = text(&output(cmd).stdout);
    assert!(
        inspected.contains("connections:  1")
            && (inspected.contains("0 B unread at offset 4, 0 B undelivered at offset 4")
                || inspected.contains("0 B unread at offset 4, 4 B undelivered at offset 0")),
        "{inspected}"
    );

    let second = restore_on_aarch64(&snap, "echo restored on aarch64");
    let addr = second.addr();
    // The restored recv (or poll, then recv) reports the old connection
    // reset, with the byte count the program had when it was checkpointed.
    second
        .stdout
        .wait_for("echo: client 1 reset", "restored half");
    let mut b = connect(&addr);
    let data = message(2, 2, 70_000);
    echo_round(&mut b, &data, "client after the move");
    finish_client(b, "client after the move");
    let (st, out, err) = second.finish();
    assert!(st.success(), "{}", err.join("\n"));
    assert_eq!(account(&out, 1, "reset"), 4);
    assert_eq!(account(&out, 2, "closed"), data.len() as u64);
}

#[test]
fn blocked_in_recv_moves_to_aarch64_and_its_connection_is_reset() {
    blocked_with_a_client_moves_to_aarch64("serial");
}

#[test]
fn blocked_in_poll_moves_to_aarch64_and_its_connection_is_reset() {
    blocked_with_a_client_moves_to_aarch64("poll");
}

#[test]
fn restore_refuses_a_listener_count_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("accept.roam");
    let echo = workload("echo");
    let first = Server::start(
        Isa::X86_64,
        &[
            "run",
            "--listen",
            "127.0.0.1:0",
            "--checkpoint-on-block",
            "--snapshot",
            snap.to_str().unwrap(),
            echo.to_str().unwrap(),
        ],
        "echo, checkpoint in accept",
    );
    let (st, _, err) = first.finish();
    assert!(st.success(), "{}", err.join("\n"));
    for listen in [&[][..], &["127.0.0.1:0", "127.0.0.1:0"][..]] {
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("restore");
        for l in listen {
            cmd.args(["--listen", l]);
        }
        cmd.arg(&snap);
        let out = output(cmd);
        assert!(!out.status.success());
        let e = text(&out.stderr);
        assert!(
            e.contains("the snapshot has 1 listener(s)")
                && e.contains(&format!("--listen was given {} time(s)", listen.len())),
            "{e}"
        );
    }
}
