//! The command-line contract: prepare, exit statuses, checkpoint on signals.

use std::process::Stdio;
use std::time::Duration;

use super::common::*;

fn wat(src: &str) -> Vec<u8> {
    wat::parse_str(src).expect("valid wat")
}

#[test]
fn prepare_is_deterministic_and_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.wasm"),
        dir.path().join("b.wasm"),
        dir.path().join("c.wasm"),
    );
    for out in [&a, &b] {
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("prepare")
            .arg(workload("kmeans"))
            .arg("-o")
            .arg(out);
        let o = output(cmd);
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("prepare").arg(&a).arg("-o").arg(&c);
    assert!(output(cmd).status.success());
    let (a, b, c) = (
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        std::fs::read(c).unwrap(),
    );
    assert_eq!(a, b, "two preparations differ");
    assert_eq!(a, c, "preparing a prepared module changed it");
}

#[test]
fn prepare_refuses_shared_memory_naming_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m.wasm");
    std::fs::write(
        &m,
        wat(r#"(module (memory 1 1 shared) (func (export "_start")))"#),
    )
    .unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("prepare")
        .arg(&m)
        .arg("-o")
        .arg(dir.path().join("o.wasm"));
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("shared"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn program_exit_status_is_roams_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("exit.wasm");
    std::fs::write(
        &m,
        wat(r#"(module
            (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
            (memory (export "memory") 1)
            (func (export "_start") (call $exit (i32.const 7))))"#),
    )
    .unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run").arg(&m);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
}

/// A call that ends the program, made by its caller's caller once the
/// functions before it have returned (`roam-prepare`'s `leave.rs`),
/// prints and ends the same wherever a checkpoint lands: at every point,
/// and when the run stops at each point in turn and is restored.
#[test]
fn an_exit_made_by_the_callers_caller_migrates_from_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("exit.wasm");
    std::fs::write(
        &m,
        wat(include_str!("../../../roam-prepare/src/leave_fixture.wat")),
    )
    .unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run").arg(&m);
    let reference = output(cmd);
    assert_eq!(
        reference.status.code(),
        Some(3),
        "{}",
        text(&reference.stderr)
    );
    assert_eq!(
        text(&reference.stdout),
        "5\nA\nB\nC\nD\nE\nF\nG\nH\nI\nJ\nK\nL\nM\n"
    );
    let snap = dir.path().join("s.roam");
    // `roam run --snapshot s.roam <checkpoint flags> exit.wasm`.
    let run_with = |flags: &[&str]| {
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("run")
            .arg("--snapshot")
            .arg(&snap)
            .args(flags)
            .arg(&m);
        output(cmd)
    };
    let every = run_with(&["--checkpoint-every-points", "1"]);
    assert_eq!(every.status.code(), Some(3), "{}", text(&every.stderr));
    assert_eq!(every.stdout, reference.stdout, "checkpoint at every point");
    let mut restored = 0;
    for k in 1..200 {
        let _ = std::fs::remove_file(&snap);
        let first = run_with(&["--checkpoint-at-point", &k.to_string()]);
        if !snap.exists() {
            // The run ended before its k-th point.
            assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
            assert_eq!(first.stdout, reference.stdout, "no stop at point {k}");
            break;
        }
        assert!(first.status.success(), "point {k}: {}", text(&first.stderr));
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("restore").arg(&snap);
        let second = output(cmd);
        assert_eq!(
            second.status.code(),
            Some(3),
            "point {k}: {}",
            text(&second.stderr)
        );
        let mut both = first.stdout.clone();
        both.extend_from_slice(&second.stdout);
        assert_eq!(text(&both), text(&reference.stdout), "stopped at point {k}");
        restored += 1;
    }
    // The work loops and `fail`'s loop: points before and after the exit
    // was moved.
    assert!(restored > 20, "only {restored} points");
}

#[test]
fn trap_exits_134_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("trap.wasm");
    std::fs::write(
        &m,
        wat(r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#),
    )
    .unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run").arg(&m);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(134));
    assert!(text(&out.stderr).contains("trap"), "{}", text(&out.stderr));
}

#[test]
fn missing_dir_is_a_precise_error() {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--dir", "/nonexistent/roam-test::/data"])
        .arg(workload("filework"))
        .args(["--", "S"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("/nonexistent/roam-test"));
}

/// SIGTERM stops the program with a snapshot; SIGUSR1 checkpoints and the
/// program goes on. Both restored outputs complete the reference output.
#[test]
fn signals_checkpoint_and_restore_completes_the_output() {
    let reference = {
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("run").arg(workload("matmul")).args(["--", "M"]);
        output(cmd)
    };
    assert_verified("matmul M: reference run", &reference, None);
    for (sig, stops) in [(libc_sig::SIGUSR1, false), (libc_sig::SIGTERM, true)] {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("s.roam");
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("run")
            .arg("--snapshot")
            .arg(&snap)
            .arg(workload("matmul"))
            .args(["--", "M"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(400));
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc_sig::kill(child.id() as i32, sig) };
        assert_eq!(rc, 0);
        let first = child.wait_with_output().unwrap();
        assert!(first.status.success(), "{}", text(&first.stderr));
        assert!(snap.exists(), "no snapshot after signal {sig}");
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("restore").arg(&snap);
        let second = output(cmd);
        assert_verified(
            &format!("matmul M: restored after signal {sig}"),
            &second,
            None,
        );
        if stops {
            let mut joined = first.stdout.clone();
            joined.extend_from_slice(&second.stdout);
            assert_eq!(text(&joined), text(&reference.stdout));
        } else {
            assert_eq!(text(&first.stdout), text(&reference.stdout));
            assert!(
                text(&reference.stdout).ends_with(&text(&second.stdout)),
                "restored output is not a suffix of the reference"
            );
            assert!(text(&second.stdout).contains("checksum: "));
        }
    }
}

/// The two signal numbers and kill(2), without a libc dependency.
mod libc_sig {
    pub const SIGUSR1: i32 = 10;
    pub const SIGTERM: i32 = 15;
    extern "C" {
        pub fn kill(pid: i32, sig: i32) -> i32;
    }
}

/// Echoes stdin to stdout after printing "ready"; its `fd_read` on stdin
/// blocks, which is where the checkpoint lands.
const ECHO_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "ready\n")
  (func (export "_start")
    (i32.store (i32.const 16) (i32.const 0))
    (i32.store (i32.const 20) (i32.const 6))
    (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 32)))
    (block $done
      (loop $l
        (i32.store (i32.const 16) (i32.const 64))
        (i32.store (i32.const 20) (i32.const 256))
        (br_if $done (call $read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 32)))
        (br_if $done (i32.eqz (i32.load (i32.const 32))))
        (i32.store (i32.const 20) (i32.load (i32.const 32)))
        (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 36)))
        (br $l)))))"#;

/// As [`ECHO_WAT`], but `fd_read` is called by a function that is reached
/// only through `call_indirect` (and a same-typed function in the table does
/// not read): `prepare` must keep both callers in Asyncify's scope. The
/// reader prints `.` after each read: left uninstrumented, it would print one
/// while the stack unwinds out of the blocked read.
const INDIRECT_ECHO_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (type $io (func (result i32)))
  (memory (export "memory") 1)
  (table 2 funcref)
  (elem (i32.const 0) $idle $read_stdin)
  (data (i32.const 0) "ready\n")
  (data (i32.const 8) ".")
  (func $idle (result i32) (i32.const 0))
  (func $read_stdin (result i32) (local $r i32)
    (local.set $r (call $read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 32)))
    (i32.store (i32.const 40) (i32.const 8))
    (i32.store (i32.const 44) (i32.const 1))
    (drop (call $write (i32.const 1) (i32.const 40) (i32.const 1) (i32.const 52)))
    (local.get $r))
  (func (export "_start")
    (i32.store (i32.const 16) (i32.const 0))
    (i32.store (i32.const 20) (i32.const 6))
    (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 32)))
    (block $done
      (loop $l
        (i32.store (i32.const 16) (i32.const 64))
        (i32.store (i32.const 20) (i32.const 256))
        (br_if $done (call_indirect (type $io) (i32.const 0)))
        (br_if $done (call_indirect (type $io) (i32.const 1)))
        (br_if $done (i32.eqz (i32.load (i32.const 32))))
        (i32.store (i32.const 20) (i32.load (i32.const 32)))
        (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 36)))
        (br $l)))))"#;

/// A program blocked reading stdin is checkpointed inside `fd_read`; the
/// restored program reads the input that arrives later, and no byte is lost.
#[test]
fn checkpoint_inside_a_blocked_stdin_read() {
    checkpoint_inside_blocked_read(ECHO_WAT, "hello after the move\n");
}

/// The same through an indirect call: the read's caller is instrumented.
#[test]
fn checkpoint_inside_a_blocked_read_reached_indirectly() {
    checkpoint_inside_blocked_read(INDIRECT_ECHO_WAT, ".hello after the move\n.");
}

fn checkpoint_inside_blocked_read(program: &str, after: &str) {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("echo.wasm");
    std::fs::write(&m, wat(program)).unwrap();
    let snap = dir.path().join("s.roam");

    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--checkpoint-on-block", "--snapshot"])
        .arg(&snap)
        .arg(&m)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let stdin = child.stdin.take().unwrap(); // open, but nothing written
    let first = child.wait_with_output().unwrap();
    drop(stdin);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert_eq!(text(&first.stdout), "ready\n");
    assert!(snap.exists());

    let mut cmd = roam(Isa::X86_64);
    cmd.arg("restore")
        .arg(&snap)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello after the move\n")
        .unwrap();
    let second = child.wait_with_output().unwrap();
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert_eq!(text(&second.stdout), after);
}

/// Checkpoint-and-continue at many migration points leaves the output
/// unchanged: every unwind and rewind is invisible to the program.
#[test]
fn repeated_checkpoint_and_continue_is_invisible() {
    for name in ["is", "recurse"] {
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("run").arg(workload(name)).args(["--", "S"]);
        let reference = output(cmd);
        assert_verified(&format!("{name}: reference run"), &reference, Some(name));
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = roam(Isa::X86_64);
        // Unrolled inner loops check at every other back-edge, so `is`
        // reaches about 700 000 points at size S: seven checkpoints.
        cmd.args(["run", "--checkpoint-every-points", "100000", "--snapshot"])
            .arg(dir.path().join("s.roam"))
            .arg(workload(name))
            .args(["--", "S"]);
        let out = output(cmd);
        assert_verified(&format!("{name}: checkpointed run"), &out, Some(name));
        let taken = text(&out.stderr).matches("checkpoint (continue)").count();
        assert!(taken >= 3, "{name}: only {taken} checkpoints were taken");
        assert_eq!(text(&out.stdout), text(&reference.stdout), "{name}");
    }
}

/// A program with no linear memory cannot be captured (the capture
/// borrows its memory): the checkpoint waits, the log says why, and the
/// program runs to its end instead of being lost.
#[test]
fn empty_memory_postpones_the_checkpoint_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("empty.wasm");
    std::fs::write(
        &m,
        wat(r#"(module (memory (export "memory") 0)
            (func (export "_start") (local i32)
              (loop
                (local.set 0 (i32.add (local.get 0) (i32.const 1)))
                (br_if 0 (i32.lt_u (local.get 0) (i32.const 1000))))))"#),
    )
    .unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--checkpoint-at-point", "1", "--snapshot"])
        .arg(dir.path().join("s.roam"))
        .arg(&m);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no linear memory yet"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("s.roam").exists());
}

/// Fills and overlapping copies of 1 MiB, then the region written to
/// stdout. Every fill and copy is longer than a chunk, so each runs in
/// chunks with a point between them (`bulk.rs` of roam-prepare).
const BULK_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 40)
  (func (export "_start") (local $at i32) (local $left i32)
    (memory.fill (i32.const 0x10000) (i32.const 0x61) (i32.const 300000))
    (memory.fill (i32.const 310000) (i32.const 0x62) (i32.const 400000))
    (memory.fill (i32.const 710000) (i32.const 0x63) (i32.const 400000))
    ;; Overlapping, the destination above the source, then below it.
    (memory.copy (i32.const 200000) (i32.const 0x10000) (i32.const 700000))
    (memory.copy (i32.const 0x10000) (i32.const 120000) (i32.const 600000))
    (local.set $at (i32.const 0x10000))
    (local.set $left (i32.const 0x100000))
    (loop $write
      (i32.store (i32.const 0x100) (local.get $at))
      (i32.store (i32.const 0x104) (local.get $left))
      (drop (call $fd_write (i32.const 1) (i32.const 0x100) (i32.const 1) (i32.const 0x200)))
      (local.set $at (i32.add (local.get $at) (i32.load (i32.const 0x200))))
      (br_if $write (local.tee $left (i32.sub (local.get $left) (i32.load (i32.const 0x200))))))))"#;

/// What `BULK_WAT` writes, computed here.
fn bulk_reference() -> Vec<u8> {
    let mut m = vec![0u8; 40 << 16];
    m[0x10000..0x10000 + 300000].fill(b'a');
    m[310000..710000].fill(b'b');
    m[710000..1110000].fill(b'c');
    m.copy_within(0x10000..0x10000 + 700000, 200000);
    m.copy_within(120000..720000, 0x10000);
    m[0x10000..0x110000].to_vec()
}

/// A checkpoint at every point of a long fill or copy, between any two of
/// its chunks, leaves the output unchanged; so does stopping between two
/// chunks on x86-64 and going on from there on aarch64.
#[test]
fn checkpoints_between_the_chunks_of_long_fills_and_copies() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("bulk.wasm");
    std::fs::write(&m, wat(BULK_WAT)).unwrap();
    let want = bulk_reference();
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--checkpoint-every-points", "1", "--snapshot"])
        .arg(dir.path().join("every.roam"))
        .arg(&m);
    let out = output(cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out.stdout == want,
        "output differs with a checkpoint at every point"
    );
    // 1 MiB of fills and 1.3 MB of copies: about 40 chunks.
    let taken = text(&out.stderr).matches("checkpoint (continue)").count();
    assert!(taken >= 30, "only {taken} checkpoints were taken");

    // Each run of n bytes checks its flag 1 + (n - 1) / 64 KiB times:
    // 5 and 7 for the first fills, so the 15th point falls in the third
    // fill, the 25th in the first copy (backwards) and the 35th in the
    // second (forwards).
    for at in ["15", "25", "35"] {
        let snap = dir.path().join(format!("at-{at}.roam"));
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["run", "--checkpoint-at-point", at, "--snapshot"])
            .arg(&snap)
            .arg(&m);
        let first = output(cmd);
        assert!(first.status.success(), "{}", text(&first.stderr));
        assert!(
            first.stdout.is_empty(),
            "wrote before the stop at point {at}"
        );
        let mut cmd = roam(Isa::Aarch64);
        cmd.arg("restore").arg(&snap);
        let second = output(cmd);
        assert!(second.status.success(), "{}", text(&second.stderr));
        assert!(
            second.stdout == want,
            "output differs after a stop at point {at}"
        );
    }
}

/// 16 MiB of memory that differs from the initial image, then 40 million
/// scattered read-modify-writes, then the 8-byte digest of what was read,
/// written to stdout.
const SCATTER_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 257)
  (func (export "_start") (local $i i32) (local $at i32) (local $acc i64)
    (memory.fill (i32.const 0x10000) (i32.const 0x5a) (i32.const 0x1000000))
    (loop $scatter
      (local.set $at (i32.add (i32.const 0x10000)
        (i32.and (i32.mul (local.get $i) (i32.const 0x9e3779b1)) (i32.const 0xfffff8))))
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 31))
        (i64.load (local.get $at))))
      (i64.store (local.get $at) (i64.add (i64.load (local.get $at)) (i64.extend_i32_u (local.get $i))))
      (br_if $scatter (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1)))
        (i32.const 40000000))))
    (i64.store (i32.const 0x100) (local.get $acc))
    (i32.store (i32.const 0x200) (i32.const 0x100))
    (i32.store (i32.const 0x204) (i32.const 8))
    (drop (call $fd_write (i32.const 1) (i32.const 0x200) (i32.const 1) (i32.const 0x300)))))"#;

/// `--checkpoint-every` counts its interval from the end of the last
/// checkpoint: however long a checkpoint takes, the program runs a whole
/// interval before the next. Counted from the start, a checkpoint longer
/// than the interval found the next request already waiting, and the
/// program barely ran between them.
#[test]
fn timed_checkpoints_leave_the_program_a_whole_interval_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("scatter.wasm");
    std::fs::write(&m, wat(SCATTER_WAT)).unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run").arg(&m);
    let reference = output(cmd);
    assert!(reference.status.success(), "{}", text(&reference.stderr));
    assert_eq!(reference.stdout.len(), 8);

    let mut cmd = roam(Isa::X86_64);
    // It runs for about a second. The stop after a minute only bounds the
    // failure this test is for, in which the program may never finish.
    cmd.args([
        "run",
        "--checkpoint-every",
        "0.005",
        "--checkpoint-after",
        "60",
    ])
    .arg("--snapshot")
    .arg(dir.path().join("s.roam"))
    .arg(&m);
    let out = output(cmd);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(out.stdout == reference.stdout, "output differs: {err}");
    // "... 12 ms, after 5.1 ms of running"
    let ran: Vec<f64> = err
        .lines()
        .filter(|l| l.contains("checkpoint (continue)"))
        .map(|l| {
            let (_, after) = l.rsplit_once("after ").expect("the time the program ran");
            let ms = after
                .strip_suffix(" ms of running")
                .expect("in milliseconds");
            ms.parse().expect("a number")
        })
        .collect();
    assert!(
        ran.len() >= 3,
        "only {} checkpoints were taken: {err}",
        ran.len()
    );
    // The first is timed from just before `ended` is first set.
    assert!(
        ran.iter().all(|&ms| ms >= 4.9),
        "the program ran less than the interval between checkpoints: {ran:?}"
    );
}

/// `roam cells | head -1`: the reader leaves before roam has printed, and
/// roam must end quietly (as `ls` would), not report a bug.
#[test]
fn a_listing_into_a_closed_pipe_ends_quietly() {
    let node = Node::start(Isa::X86_64);
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["cells", "--node", &node.addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("roam starts");
    // No reader from the start: its first write gets a broken pipe.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("roam ends");
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "roam panicked:\n{err}");
    assert!(!err.contains("this is a bug"), "{err}");
}
