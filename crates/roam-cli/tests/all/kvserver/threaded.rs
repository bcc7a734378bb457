//! `threads-kv`, a server with one thread per client (wasi-threads), under
//! `roam run --listen`: the same script and `redis-benchmark` as the
//! single-threaded server, checkpoints taken while clients hammer it, and a
//! stop on x86-64 restored on aarch64.
//!
//! Every client's thread sits in a blocking `recv` while the main thread
//! sits in `accept`. That only works because a blocked WASI call holds no
//! lock on the program's WASI state while it waits; before, the first
//! client's request waited for the next `accept` to return.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_testkit::resp::benchmark::redis_benchmark;
use roam_testkit::resp::Reply;

use super::{
    benchmark_runs_clean, free_addr, keeps_its_data_across_checkpoint_and_restore, kill,
    protocol_errors_close_only_that_client, run_script, Server,
};
use crate::common::{self, Isa};

fn threads_kv() -> PathBuf {
    common::workload("threads/threads-kv")
}

#[test]
fn threaded_server_answers_the_script_and_redis_benchmark() {
    let server = Server::cell(&threads_kv(), "threads-kv cell under roam run --listen");
    run_script(&server);
    protocol_errors_close_only_that_client(&server);
    benchmark_runs_clean(&server);
}

/// The largest thread count the cell's checkpoints reported on stderr.
fn most_threads_held(log: &str) -> usize {
    log.lines()
        .filter_map(|l| l.strip_prefix("roam: the checkpoint held "))
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// SIGUSR1 checkpoints while 16 clients run redis-benchmark: every thread
/// parks (those in `recv` included), the snapshot is written, all go on,
/// and the benchmark sees no error and loses no INCR.
#[test]
fn threaded_server_serves_through_checkpoints_under_load() {
    if !roam_testkit::have("redis-benchmark") {
        roam_testkit::missing(&roam_testkit::REDIS_TOOLS, "redis-benchmark is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("kv.roam");
    let log_path = dir.path().join("roam.log");
    let addr = free_addr();
    let mut cmd = common::roam(Isa::X86_64);
    cmd.arg("run")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--snapshot")
        .arg(&snap)
        .arg(threads_kv());
    let log = std::fs::File::create(&log_path).unwrap();
    let server = Server::start_with(cmd, addr, "threads-kv under load", Stdio::from(log));

    const N: usize = 20_000;
    let port = addr.port().to_string();
    let running = Arc::new(AtomicBool::new(true));
    let bench = {
        let running = running.clone();
        std::thread::spawn(move || {
            let n = N.to_string();
            let args = ["-h", "127.0.0.1", "-p", &port, "-c", "16", "-n", &n];
            let run = redis_benchmark(
                &[&args[..], &["-t", "set,get,incr,ping"]].concat(),
                Duration::from_secs(600),
            );
            running.store(false, Ordering::SeqCst);
            run
        })
    };
    // Checkpoints every 300 ms while the benchmark runs, at most 20.
    let mut sent = 0;
    while running.load(Ordering::SeqCst) && sent < 20 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on the pid of a child this test started and owns.
        assert_eq!(unsafe { kill(server.child.id() as i32, 10) }, 0);
        sent += 1;
    }
    let run = bench.join().unwrap().expect("redis-benchmark ran");
    assert!(
        run.ok(),
        "redis-benchmark failed: {:?} {:?}",
        run.status,
        run.errors
    );
    let mut c = server.client();
    assert_eq!(
        c.cmd_str(&["GET", "counter:__rand_int__"]).unwrap(),
        Reply::bulk(N.to_string()),
        "INCRs lost or repeated across the checkpoints"
    );
    // The checkpoints were written and found the clients' threads.
    let start = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        if most_threads_held(&text) > 1 || start.elapsed() > Duration::from_secs(30) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        sent > 0,
        "the benchmark ended before any checkpoint was asked for"
    );
    assert!(snap.exists(), "no checkpoint was written; the log:\n{text}");
    assert!(
        most_threads_held(&text) > 1,
        "no checkpoint held a client's thread ({sent} asked for); the log:\n{text}"
    );
}

/// Stopped with clients connected on x86-64, restored on aarch64: every
/// key, a TTL still counting, and the dropped connections' threads gone.
#[test]
fn threaded_server_keeps_its_data_from_x86_64_to_aarch64() {
    keeps_its_data_across_checkpoint_and_restore(&threads_kv(), Isa::Aarch64);
}
