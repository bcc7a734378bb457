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
//! fetch path in `nodes/fetch.rs`. The nodes, links and planners these
//! tests start are in `common`; the planner's own end-to-end tests are in
//! `cluster.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Output;
use std::time::{Duration, Instant};

use roam_link::{parse_rate, AfterCut, Direction, LinkConfig};
use serde_json::Value;

use super::common::*;

mod faults;
mod fetch;
mod planner;
mod services;
mod suite;
mod threads;

/// 32 MiB for 12 s: a transfer that takes seconds on a 20 Mbit/s link.
const BIG: [&str; 3] = ["32", "4", "12"];

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

/// A source node, and a destination reached through a `Link`.
fn linked(cfg: LinkConfig) -> (Node, Node, Link) {
    let (a, b, link) = linked_pair(Isa::X86_64, Isa::X86_64, cfg);
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
