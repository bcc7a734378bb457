//! Threaded programs on nodes: launched, moved live between nodes while
//! their threads work (stop-and-copy and pre-copy, host to host and
//! between x86-64 and aarch64), kept as checkpoints on another node and
//! restored there after their owner is killed, with the same output as
//! their native build. Post-copy is refused for them, with the reason,
//! and the cell runs on.
//!
//! Each move starts at a moment chosen at random after the cell's workers
//! started (the node reports its live threads; the seed is printed and
//! `ROAM_THREADS_SEED=<n>` repeats it), and the destination's log must
//! show that a move carried more than one thread at least once per
//! program (up to three more moves are made until one does: a move also
//! waits for the destination to compile the module, and the workers may
//! be done by then).

use super::super::threads::{expected, seed, PROGRAMS};
use super::planner::{http_post_bytes, post_ok};
use super::*;

fn launch(node: &Node, name: &str) -> Result<String, String> {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &node.addr])
        .arg(workload(&format!("threads/{name}")))
        .args(["--", "4", "M"]);
    let out = run_bounded(cmd, SLOW);
    if !out.status.success() {
        return Err(format!("roam launch {name}: {}", text(&out.stderr)));
    }
    Ok(text(&out.stdout).trim().to_string())
}

/// What a cell of `name` (4 threads, size M) leaves in its log: the line
/// it writes to stderr as it starts, then the reference output.
fn want(name: &str) -> Vec<u8> {
    let mut out = b"threads: 4\n".to_vec();
    out.extend(expected(name, "M"));
    out
}

/// How many threads the cells that arrived at a node had, from its log.
fn arrivals(node: &Node) -> Vec<usize> {
    thread_counts(node, "threaded cell arrives")
}

/// The `threads=` of every line of `node`'s log that says `what`.
fn thread_counts(node: &Node, what: &str) -> Vec<usize> {
    node.log()
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split("threads=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Wait (at most 20 s) until cell `id` on `node` runs more than one
/// thread, or no longer runs.
fn wait_for_workers(node: &Node, id: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < end {
        let Some(c) = node.cell(id) else { return };
        if c["state"] != "running" {
            return;
        }
        if c["threads"].as_u64().unwrap_or(0) > 1 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Launch `name` on `a`, move it to `b` in `mode` `delay` after its
/// workers started, let it end there and compare its output with the
/// reference. `Ok(false)` when it ended before the move could pause it
/// (then its output is checked).
fn move_once(a: &Node, b: &Node, name: &str, mode: &str, delay: Duration) -> Result<bool, String> {
    let id = launch(a, name)?;
    wait_for_workers(a, &id);
    std::thread::sleep(delay);
    let (out, status) = migrate(&id, a, b, mode, &[]);
    let want = want(name);
    if !out.status.success() {
        if a.state(&id) == "exited" {
            let got = logs(&id, a);
            return match got == want {
                true => Ok(false),
                false => Err(format!("{name}: ended on the source with other output")),
            };
        }
        return Err(format!("{name} ({mode}): {}", text(&out.stderr)));
    }
    if status["summary"]["mode"] != mode || status["summary"]["to_isa"] != b.isa.name() {
        return Err(format!("{name}: unexpected summary {status}"));
    }
    let end = b.wait_end(&id, Duration::from_secs(600));
    if end["state"] != "exited" || end["code"] != 0 || end["hops"] != 1 {
        return Err(format!("{name}: on the destination: {end}"));
    }
    let got = logs(&id, a);
    if got != want {
        return Err(format!(
            "{name} ({mode}): output differs from the reference:\n--- got\n{}\n--- expected\n{}",
            text(&got),
            text(&want)
        ));
    }
    Ok(true)
}

/// Move every threaded program from `from` to `to` in each of `modes`;
/// fail with every move that went wrong, or with a program whose moves
/// never carried more than one thread.
fn move_all(from: Isa, to: Isa, modes: &[&str], names: &[&str], delays_ms: (u64, u64)) {
    let node = |isa| Node::start_with(isa, &["--migrate-listen", "127.0.0.1:0"]);
    let (a, b) = (node(from), node(to));
    let mut x = seed();
    let mut failed = Vec::new();
    for name in names {
        let before = arrivals(&b).len();
        // Each mode once, then more moves (at most three) while none has
        // caught the workers running: a program between its phases has
        // one thread.
        let tries = modes.iter().chain(std::iter::repeat_n(&modes[0], 3));
        for (done, mode) in tries.enumerate() {
            let seen = &arrivals(&b)[before..];
            if done >= modes.len() && seen.iter().any(|&n| n > 1) {
                break;
            }
            let (lo, span) = delays_ms;
            let mut delay = Duration::from_millis(lo + super::super::threads::next(&mut x) % span);
            // A program that ended first is tried again, sooner.
            for _ in 0..3 {
                match move_once(&a, &b, name, mode, delay) {
                    Ok(true) => break,
                    Ok(false) => delay /= 3,
                    Err(e) => {
                        failed.push(e);
                        break;
                    }
                }
            }
        }
        let seen = arrivals(&b)[before..].to_vec();
        eprintln!("{name}: threads carried by each move: {seen:?}");
        if !seen.iter().any(|&n| n > 1) {
            failed.push(format!(
                "{name}: no move carried more than one thread ({seen:?})"
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{}\n{}",
        failed.join("\n"),
        both_logs(&a, &b)
    );
}

#[test]
fn threaded_programs_move_between_nodes_live() {
    move_all(
        Isa::X86_64,
        Isa::X86_64,
        &["stop-and-copy", "pre-copy"],
        &PROGRAMS,
        (0, 100),
    );
}

#[test]
fn threaded_programs_move_from_x86_64_to_aarch64_and_back() {
    move_all(
        Isa::X86_64,
        Isa::Aarch64,
        &["pre-copy"],
        &["threads-sum", "threads-pthreads"],
        (0, 100),
    );
    // Under emulation the workers run longer: a wider span of moments.
    move_all(
        Isa::Aarch64,
        Isa::X86_64,
        &["stop-and-copy"],
        &["threads-omp"],
        (0, 1000),
    );
}

#[test]
fn post_copy_of_a_threaded_cell_is_refused_and_it_runs_on() {
    let node = |isa| Node::start_with(isa, &["--migrate-listen", "127.0.0.1:0"]);
    let (a, b) = (node(Isa::X86_64), node(Isa::X86_64));
    let id = launch(&a, "threads-sum").unwrap();
    // Refused while its workers run; the node shows them in the cell's
    // thread count.
    wait_for_workers(&a, &id);
    let cell = a.cell(&id).unwrap();
    assert!(
        cell["threads"].as_u64().unwrap_or(0) > 1 || cell["state"] != "running",
        "the node does not count the workers: {cell}"
    );
    let (out, _) = migrate(&id, &a, &b, "post-copy", &[]);
    assert!(
        !out.status.success(),
        "post-copy of a threaded cell succeeded"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("threaded program") && err.contains("pre-copy"),
        "the refusal must say why and what works: {err}"
    );
    let end = a.wait_end(&id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}\n{}", a.log());
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(text(&logs(&id, &a)), text(&want("threads-sum")));
    assert!(b.cell(&id).is_none(), "the destination has the cell");
}

#[test]
fn a_threaded_cell_comes_back_from_its_kept_checkpoint() {
    keep_kill_restore(Isa::X86_64);
}

#[test]
fn a_threaded_cell_comes_back_from_its_kept_checkpoint_on_another_isa() {
    keep_kill_restore(Isa::Aarch64);
}

/// A threaded cell's checkpoint, kept on a node of `to` while the cell
/// runs on x86-64, brings it back there after its owner is killed.
fn keep_kill_restore(to: Isa) {
    let name = "threads-omp";
    let mut a = Node::start_with(
        Isa::X86_64,
        &["--migrate-listen", "127.0.0.1:0", "--name", "owner"],
    );
    let b = Node::start_with(to, &["--migrate-listen", "127.0.0.1:0", "--name", "holder"]);
    let module = std::fs::read(workload(&format!("threads/{name}"))).unwrap();
    let upload = |n: &Node| {
        let (st, m) = http_post_bytes(&n.addr, "/v1/modules", &module);
        assert_eq!(st, 200, "{}", text(&m));
        serde_json::from_slice::<Value>(&m).unwrap()["hash"].clone()
    };
    let hash = upload(&a);
    let argv = [name, "4", "M"];
    let launch = serde_json::json!({ "module": hash, "args": argv, "generation": 1 });
    let id = post_ok(&a.addr, "/v1/cells", &launch)["id"]
        .as_str()
        .unwrap()
        .to_string();
    std::thread::sleep(Duration::from_millis(400));
    let keep = serde_json::json!({ "holder": b.addr, "holder_name": "holder" });
    let kept = post_ok(&a.addr, &format!("/v1/cells/{id}/keep"), &keep);
    assert_eq!(
        a.state(&id),
        "running",
        "the cell stopped for its checkpoint"
    );
    a.kill9();
    upload(&b);
    let restore = serde_json::json!({
        "id": id, "module": hash, "args": argv, "generation": 2,
        "holder": b.addr, "snapshot": kept["snapshot"],
    });
    let restored = post_ok(&b.addr, "/v1/cells/restore", &restore);
    assert_eq!(restored["state"], "running", "{restored}");
    let end = b.wait_end(&id, Duration::from_secs(300));
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(
        text(&b.raw_logs(&id).unwrap()),
        text(&want(name)),
        "the restored cell's output differs from the reference\n{}",
        b.log()
    );
    let threads = thread_counts(&b, "threaded cell restored");
    assert!(
        threads.iter().any(|&n| n > 1),
        "the kept checkpoint held {threads:?} threads"
    );
}

/// A threaded cell's memory limit holds: wasmtime grows a shared memory
/// without the store's limiter, so the limit is the memory's own maximum.
/// threads-rayon needs about 17 MiB at 4 threads: under 8 MiB its memory
/// cannot grow (wasi-libc then fails to allocate a thread's stack, or the
/// program an allocation) and it ends in error; the same launch under
/// 64 MiB finishes with the reference output.
#[test]
fn a_threaded_cell_cannot_grow_past_its_memory_limit() {
    let a = Node::start_with(Isa::X86_64, &[]);
    let launch = |limit: &str| {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &a.addr, "--max-memory", limit])
            .arg(workload("threads/threads-rayon"))
            .args(["--", "4", "M"]);
        let out = run_bounded(cmd, SLOW);
        assert!(out.status.success(), "roam launch: {}", text(&out.stderr));
        let id = text(&out.stdout).trim().to_string();
        (
            a.wait_end(&id, Duration::from_secs(120)),
            text(&logs(&id, &a)),
        )
    };
    let (end, log) = launch("8MiB");
    assert_eq!(end["state"], "failed", "{end}\n{log}\n{}", a.log());
    assert!(
        log.contains("memory allocation of") || log.contains("Resource temporarily unavailable"),
        "the cell's log does not say memory ran out: {log}"
    );
    let (end, log) = launch("64MiB");
    assert_eq!(end["state"], "exited", "{end}\n{log}");
    assert_eq!(log, text(&want("threads-rayon")));
}
