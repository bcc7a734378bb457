//! Threaded programs (wasi-threads): `workloads/threads/`, three Rust
//! programs built for `wasm32-wasip1-threads` (std threads with a mutex,
//! atomics and a channel; a rayon pool; an OpenMP-style stencil with
//! barriers) and two C programs on wasi-libc's pthreads (mutexes,
//! condition variables, barriers, thread-local storage and keys; zstd's
//! multi-threaded compressor, which no one here wrote). Their reference
//! output is their native build's, pinned in `workloads/threads/expected/`,
//! and is the same for any thread count.
//!
//! Each is run whole, then stopped at moments chosen at random (the seed
//! is printed; `ROAM_THREADS_SEED=<n>` repeats it) and restored, here and
//! across ISAs: the two halves' stdout together must equal the reference.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use super::common::*;

pub(crate) const PROGRAMS: [&str; 5] = [
    "threads-sum",
    "threads-rayon",
    "threads-omp",
    "threads-pthreads",
    "threads-zstd",
];

fn module(name: &str) -> PathBuf {
    workload(&format!("threads/{name}"))
}

pub(crate) fn expected(name: &str, size: &str) -> Vec<u8> {
    let p = repo_root().join(format!("workloads/threads/expected/{name}-{size}.txt"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub(crate) fn seed() -> u64 {
    let seed = match std::env::var("ROAM_THREADS_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("ROAM_THREADS_SEED={s:?} is not a number")),
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        }
    };
    eprintln!("threads: ROAM_THREADS_SEED={seed}");
    seed
}

pub(crate) fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn run(isa: Isa, args: &[&str], name: &str, program_args: &[&str]) -> Output {
    let mut cmd = roam(isa);
    cmd.arg("run").args(args).arg(module(name)).arg("--");
    cmd.args(program_args);
    run_bounded(cmd, Duration::from_secs(300))
}

/// How many threads a stop captured, from roam's report.
fn threads_stopped(stderr: &[u8]) -> Option<usize> {
    let err = text(stderr);
    let line = err.lines().find(|l| l.contains("the checkpoint held "))?;
    line.split("held ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[test]
fn every_threaded_program_prints_its_native_output_with_one_and_with_four_threads() {
    for name in PROGRAMS {
        for threads in ["1", "4"] {
            let out = run(Isa::X86_64, &[], name, &[threads, "S"]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{name} {threads}: {}",
                text(&out.stderr)
            );
            assert_eq!(
                text(&out.stdout),
                text(&expected(name, "S")),
                "{name} with {threads} threads"
            );
        }
    }
}

/// Stop `name` (4 threads, size M) on `from` after `delay`, restore on `to`:
/// returns how many threads the stop held, or `None` when the program
/// finished first (then its whole output must be the reference).
fn stop_and_restore(name: &str, delay: Duration, from: Isa, to: Isa) -> Option<usize> {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("t.roam");
    let after = format!("{:.3}", delay.as_secs_f64());
    let snap_arg = snap.to_str().unwrap();
    let first = run(
        from,
        &["--snapshot", snap_arg, "--checkpoint-after", &after],
        name,
        &["4", "M"],
    );
    let what = format!("{name} stopped after {after} s on {from:?}, restored on {to:?}");
    assert_eq!(
        first.status.code(),
        Some(0),
        "{what}: {}",
        text(&first.stderr)
    );
    if !snap.exists() {
        assert_eq!(text(&first.stdout), text(&expected(name, "M")), "{what}");
        return None;
    }
    let held = threads_stopped(&first.stderr).unwrap_or_else(|| panic!("{what}: no report"));
    let mut cmd = roam(to);
    cmd.arg("restore").arg(&snap);
    let second = run_bounded(cmd, Duration::from_secs(600));
    assert_eq!(
        second.status.code(),
        Some(0),
        "{what}: {}",
        text(&second.stderr)
    );
    let mut whole = first.stdout.clone();
    whole.extend_from_slice(&second.stdout);
    assert_eq!(text(&whole), text(&expected(name, "M")), "{what}");
    Some(held)
}

#[test]
fn threaded_programs_stopped_at_random_moments_restore_to_the_uninterrupted_output() {
    let mut x = seed();
    for name in PROGRAMS {
        let mut most = 0;
        // Three stops, and up to three more while none has caught the
        // workers running (on a loaded machine a program may still be in
        // its first, single-threaded phase): the test must exercise more
        // than one stack.
        for i in 0..6 {
            if i >= 3 && most > 1 {
                break;
            }
            // Early on, while the threads work: 20 to 400 ms.
            let ms = 20 + next(&mut x) % 380;
            let held = stop_and_restore(name, Duration::from_millis(ms), Isa::X86_64, Isa::X86_64);
            most = most.max(held.unwrap_or(0));
        }
        assert!(most > 1, "{name}: no stop held more than one thread");
    }
}

#[test]
fn threaded_programs_move_between_x86_64_and_aarch64() {
    let mut x = seed();
    for name in PROGRAMS {
        let ms = 50 + next(&mut x) % 250;
        let held = stop_and_restore(name, Duration::from_millis(ms), Isa::X86_64, Isa::Aarch64);
        eprintln!("{name}: x86-64 -> aarch64 after {ms} ms held {held:?} threads");
    }
    // And back: stopped under emulation, where the workers run for longer.
    let held = stop_and_restore(
        "threads-omp",
        Duration::from_secs(3),
        Isa::Aarch64,
        Isa::X86_64,
    );
    assert!(
        held.is_some_and(|n| n > 1),
        "threads-omp on aarch64: the stop held {held:?} threads"
    );
}

#[test]
fn checkpoints_that_let_threads_go_on_change_nothing_and_the_last_one_restores() {
    for name in PROGRAMS {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("c.roam");
        let snap_arg = snap.to_str().unwrap();
        let out = run(
            Isa::X86_64,
            &["--snapshot", snap_arg, "--checkpoint-every", "0.05"],
            name,
            &["4", "M"],
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {err}");
        let taken = err.matches("checkpoint (continue) written").count();
        assert!(taken >= 3, "{name}: only {taken} checkpoints in: {err}");
        let want = text(&expected(name, "M"));
        assert_eq!(text(&out.stdout), want, "{name} under checkpoints");
        // The last checkpoint goes on from where it was taken: what it
        // prints is the end of the reference.
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("restore").arg(&snap);
        let back = run_bounded(cmd, Duration::from_secs(300));
        assert_eq!(
            back.status.code(),
            Some(0),
            "{name}: {}",
            text(&back.stderr)
        );
        assert!(
            want.ends_with(&text(&back.stdout)),
            "{name}: the restored tail {:?} is not the end of the reference",
            text(&back.stdout)
        );
    }
}

/// Checkpoints that let the threads go on, then a stop soon after: the
/// threads released by one checkpoint meet the next request at once.
#[test]
fn a_stop_right_after_checkpoints_that_go_on_restores_right() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.roam");
    let snap_arg = snap.to_str().unwrap();
    let args = [
        "--snapshot",
        snap_arg,
        "--checkpoint-every",
        "0.03",
        "--checkpoint-after",
        "0.3",
    ];
    let first = run(Isa::X86_64, &args, "threads-rayon", &["8", "M"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(snap.exists(), "no stop was taken: {}", text(&first.stderr));
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("restore").arg(&snap);
    let second = run_bounded(cmd, Duration::from_secs(300));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let mut whole = first.stdout;
    whole.extend_from_slice(&second.stdout);
    assert_eq!(text(&whole), text(&expected("threads-rayon", "M")));
}

#[test]
fn a_threaded_program_is_refused_flags_it_cannot_honour_yet() {
    let out = run(
        Isa::X86_64,
        &["--checkpoint-on-block"],
        "threads-sum",
        &["2", "S"],
    );
    assert_ne!(out.status.code(), Some(0));
    let err = text(&out.stderr);
    assert!(
        err.contains("--checkpoint-on-block is not supported for threaded programs"),
        "{err}"
    );
}

#[test]
fn one_thread_ending_the_program_ends_all_of_them() {
    // exit(3) from a second thread while the first waits: status 3.
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--env", "THREADS_SUM_END=exit"])
        .arg(module("threads-sum"));
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "leaving from a second thread: exit\n");
    // An abort there traps, and the trap is the program's: roam's 134.
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--env", "THREADS_SUM_END=trap"])
        .arg(module("threads-sum"));
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(134), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("trapped: thread 1"), "{err}");
}

/// Every point policy gives a threaded program its own output; under the
/// policies with points in loops or at function entries, a stop and a
/// restore do too.
#[test]
fn every_point_policy_prepares_threaded_programs_that_run_right() {
    let mut x = seed();
    for policy in ["outer", "functions", "manual"] {
        for name in PROGRAMS {
            let dir = tempfile::tempdir().unwrap();
            let prepared = dir.path().join(format!("{name}.{policy}.wasm"));
            let mut cmd = roam(Isa::X86_64);
            cmd.args(["prepare", "--points", policy])
                .arg(module(name))
                .arg("-o")
                .arg(&prepared);
            let out = run_bounded(cmd, Duration::from_secs(300));
            assert!(
                out.status.success(),
                "{name} {policy}: {}",
                text(&out.stderr)
            );
            let run_it = |extra: &[&str]| {
                let mut cmd = roam(Isa::X86_64);
                cmd.arg("run")
                    .args(extra)
                    .arg(&prepared)
                    .args(["--", "4", "S"]);
                run_bounded(cmd, Duration::from_secs(300))
            };
            let whole = run_it(&[]);
            assert_eq!(
                whole.status.code(),
                Some(0),
                "{name} {policy}: {}",
                text(&whole.stderr)
            );
            assert_eq!(
                text(&whole.stdout),
                text(&expected(name, "S")),
                "{name} {policy}"
            );
            if policy == "manual" {
                continue;
            }
            let snap = dir.path().join("p.roam");
            let after = format!("0.{:03}", 5 + next(&mut x) % 60);
            let first = run_it(&[
                "--snapshot",
                snap.to_str().unwrap(),
                "--checkpoint-after",
                &after,
            ]);
            assert_eq!(
                first.status.code(),
                Some(0),
                "{name} {policy}: {}",
                text(&first.stderr)
            );
            let mut out = first.stdout;
            if snap.exists() {
                let mut cmd = roam(Isa::X86_64);
                cmd.arg("restore").arg(&snap);
                let second = run_bounded(cmd, Duration::from_secs(300));
                assert_eq!(
                    second.status.code(),
                    Some(0),
                    "{name} {policy}: {}",
                    text(&second.stderr)
                );
                out.extend_from_slice(&second.stdout);
            }
            assert_eq!(
                text(&out),
                text(&expected(name, "S")),
                "{name} {policy}, stopped after {after} s"
            );
        }
    }
}
