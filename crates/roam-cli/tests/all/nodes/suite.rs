//! The real workload suite, migrated mid-run in every mode.
//!
//! The synthetic `dirty` cell alone hid a post-copy deadlock that six of ten
//! real programs hit (their low memory, which the rewind borrows, held
//! data). Here every workload is launched on a node, migrated while it runs,
//! and its output (and, for `filework`, its files) compared byte for byte
//! with an uninterrupted `roam run`.
//!
//! Size `M`, not `S`: `S` ends within milliseconds, before a migration can
//! reach it. Each migration starts after a fraction of the workload's
//! measured run time; a workload that ended before the pause is launched
//! again with a shorter delay, and if it ends again, at size `L`: on a busy
//! machine the first pre-copy round of `is` (131 MiB to a node under qemu)
//! took 1.9 s, as long as the whole run at `M`. One node pair per mode and
//! direction runs the workloads one after the other.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::*;

/// Every workload of the suite (`docs/workloads.md`), `dirty` and `kv` aside.
const SUITE: [&str; 12] = roam_testkit::WORKLOADS;

/// Those that ran into the post-copy deadlock, and one that did not: the
/// cross-ISA share of the suite (each runs under qemu on one side).
const CROSS: [&str; 3] = ["is", "matmul", "recurse"];

const SIZE: &str = "M";

/// The size of the last try, for a workload that ended before the pause
/// twice at [`SIZE`].
const LONGER: &str = "L";

/// An uninterrupted run: stdout, the files left in `/data`, the run time.
struct Reference {
    stdout: Vec<u8>,
    files: Vec<(String, Vec<u8>)>,
    took: Duration,
}

fn needs_dir(name: &str) -> bool {
    name == "filework"
}

/// The uninterrupted run of `name` (host build) at `size`, once per test
/// binary.
fn reference_of(name: &str, size: &str) -> &'static Reference {
    static DONE: OnceLock<Mutex<HashMap<String, &'static Reference>>> = OnceLock::new();
    let mut done = DONE.get_or_init(Default::default).lock().unwrap();
    done.entry(format!("{name} {size}")).or_insert_with(|| {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = roam(Isa::X86_64);
        cmd.arg("run");
        if needs_dir(name) {
            cmd.arg("--dir")
                .arg(format!("{}::/data", data.path().display()));
        }
        cmd.arg(workload(name)).arg("--").arg(size);
        let began = Instant::now();
        let out = run_bounded(cmd, Duration::from_secs(300));
        let took = began.elapsed();
        assert!(
            out.status.success(),
            "roam run {name} {size}: {}",
            text(&out.stderr)
        );
        assert!(
            !text(&out.stderr).contains("VERIFICATION FAILED") && out.stderr.is_empty(),
            "{name}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).contains("checksum: "), "{name}");
        Box::leak(Box::new(Reference {
            stdout: out.stdout,
            files: tree(data.path()),
            took,
        }))
    })
}

/// `roam launch` of a suite workload at `size`; the cell id.
fn launch_workload(node: &Node, name: &str, size: &str) -> Result<String, String> {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &node.addr]);
    if needs_dir(name) {
        cmd.args(["--dir", "/data"]);
    }
    cmd.arg(workload(name)).arg("--").arg(size);
    let out = run_bounded(cmd, SLOW);
    if !out.status.success() {
        return Err(format!("roam launch {name}: {}", text(&out.stderr)));
    }
    Ok(text(&out.stdout).trim().to_string())
}

/// Launch `name` on `a`, migrate it to `b` in `mode` mid-run, let it end
/// there and compare. `Err` says what went wrong.
fn migrate_workload(a: &Node, b: &Node, name: &str, mode: &str) -> Result<(), String> {
    // Under qemu a program runs several times slower than the reference.
    let slow = if a.isa == Isa::X86_64 { 1 } else { 4 };
    let delay_for = |r: &Reference| {
        (r.took * slow / 4).clamp(Duration::from_millis(50), Duration::from_secs(2))
    };
    let mut size = SIZE;
    let mut r = reference_of(name, size);
    let mut delay = delay_for(r);
    for attempt in 0..3 {
        let id = launch_workload(a, name, size)?;
        std::thread::sleep(delay);
        let (out, status) = migrate(&id, a, b, mode, &[]);
        if !out.status.success() {
            let ended = matches!(a.state(&id).as_str(), "exited");
            if ended && attempt == 0 {
                // It ended before the pause: try again, sooner.
                delay /= 3;
                continue;
            }
            if ended && attempt == 1 {
                // Again: the migration takes longer than the whole run
                // here (a busy machine); the last try runs longer.
                eprintln!("{mode}: {name} ended before the pause twice at {SIZE}: trying {LONGER}");
                size = LONGER;
                r = reference_of(name, size);
                delay = delay_for(r);
                continue;
            }
            return Err(format!(
                "{name}: roam migrate failed: {}",
                text(&out.stderr)
            ));
        }
        let summary = &status["summary"];
        if summary["mode"] != mode || summary["to_isa"] != b.isa.name() {
            return Err(format!("{name}: unexpected summary {status}"));
        }
        if mode == "pre-copy" && a.isa == Isa::X86_64 {
            expect_write_protect(&status, &a.log());
        }
        let end = b.wait_end(&id, Duration::from_secs(600));
        if end["state"] != "exited" || end["code"] != 0 || end["hops"] != 1 {
            return Err(format!("{name}: on the destination: {end}"));
        }
        if a.state(&id) != "moved" {
            return Err(format!("{name}: on the source: {}", a.state(&id)));
        }
        let got = logs(&id, a);
        if got != r.stdout {
            return Err(format!(
                "{name}: output differs from an uninterrupted run:\n--- got\n{}\n--- expected\n{}",
                text(&got),
                text(&r.stdout)
            ));
        }
        if needs_dir(name) {
            let dir = b.dir.path().join("state/cells").join(&id).join("dirs/0");
            if tree(&dir) != r.files {
                return Err(format!(
                    "{name}: files in /data differ from an uninterrupted run"
                ));
            }
        }
        return Ok(());
    }
    unreachable!("the loop returns")
}

/// Migrate every workload of `names` from a `from` node to a `to` node in
/// `mode`; fail with every workload that went wrong.
fn suite(from: Isa, to: Isa, mode: &str, names: &[&str]) {
    suite_with(from, to, mode, names, "asyncify");
}

/// [`suite`] with nodes that prepare uploads with `--capture capture`.
fn suite_with(from: Isa, to: Isa, mode: &str, names: &[&str], capture: &str) {
    let node = |isa| {
        Node::start_with(
            isa,
            &["--migrate-listen", "127.0.0.1:0", "--capture", capture],
        )
    };
    let (a, b) = (node(from), node(to));
    let began = Instant::now();
    let failed: Vec<String> = names
        .iter()
        .filter_map(|name| {
            let t = Instant::now();
            let r = migrate_workload(&a, &b, name, mode);
            eprintln!(
                "{mode} ({capture}) {} -> {}: {name}: {} in {:.1} s",
                from.name(),
                to.name(),
                if r.is_ok() { "ok" } else { "FAILED" },
                t.elapsed().as_secs_f64()
            );
            r.err()
        })
        .collect();
    eprintln!(
        "{mode} {} -> {}: {} workloads in {:.1} s",
        from.name(),
        to.name(),
        names.len(),
        began.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {} workloads failed:\n{}\n{}",
        failed.len(),
        names.len(),
        failed.join("\n"),
        both_logs(&a, &b)
    );
}

#[test]
fn host_suite_stop_and_copy() {
    suite(Isa::X86_64, Isa::X86_64, "stop-and-copy", &SUITE);
}

#[test]
fn host_suite_post_copy() {
    suite(Isa::X86_64, Isa::X86_64, "post-copy", &SUITE);
}

#[test]
fn x86_to_aarch64_suite_stop_and_copy() {
    suite(Isa::X86_64, Isa::Aarch64, "stop-and-copy", &CROSS);
}

#[test]
fn x86_to_aarch64_suite_pre_copy() {
    suite(Isa::X86_64, Isa::Aarch64, "pre-copy", &CROSS);
}

#[test]
fn aarch64_to_x86_suite_post_copy() {
    suite(Isa::Aarch64, Isa::X86_64, "post-copy", &CROSS);
}

// Capture by exceptions (`--capture eh`), host to host and across ISAs.
//
// The Asyncify suites above and the exception suites here run stop-and-copy
// and post-copy only. Pre-copy moves the same pages as stop-and-copy, in
// more rounds; the capture meets the memory transfer where its unwound
// stack and rewind borrow memory the destination does not have yet, which
// is post-copy. Pre-copy runs over the whole suite with the default
// capture (returns) below, and across ISAs with Asyncify above.

#[test]
fn host_suite_stop_and_copy_eh() {
    suite_with(Isa::X86_64, Isa::X86_64, "stop-and-copy", &SUITE, "eh");
}

#[test]
fn host_suite_post_copy_eh() {
    suite_with(Isa::X86_64, Isa::X86_64, "post-copy", &SUITE, "eh");
}

#[test]
fn x86_to_aarch64_suite_stop_and_copy_eh() {
    suite_with(Isa::X86_64, Isa::Aarch64, "stop-and-copy", &CROSS, "eh");
}

// Frames that leave by returning (`--capture returns`, the default), in
// every mode, host to host and across ISAs.

#[test]
fn host_suite_stop_and_copy_returns() {
    suite_with(Isa::X86_64, Isa::X86_64, "stop-and-copy", &SUITE, "returns");
}

#[test]
fn host_suite_pre_copy_returns() {
    suite_with(Isa::X86_64, Isa::X86_64, "pre-copy", &SUITE, "returns");
}

#[test]
fn host_suite_post_copy_returns() {
    suite_with(Isa::X86_64, Isa::X86_64, "post-copy", &SUITE, "returns");
}

#[test]
fn aarch64_to_x86_suite_post_copy_returns() {
    suite_with(Isa::Aarch64, Isa::X86_64, "post-copy", &CROSS, "returns");
}
