//! Cells whose state is mostly files or log: 64 MiB of sandbox files, and
//! a log at a cap larger than a frame, migrate in every mode and leave the
//! same files and output as an uninterrupted run. (Before the files and the
//! log were streamed in chunks, anything over one 16 MiB frame could not
//! move at all.)

use std::time::Duration;

use serde_json::Value;

use super::common::*;

/// 64 MiB of files, rewritten block by block for 8 s.
const FILES: [&str; 3] = ["64", "8", "1"];

fn move_files(to: Isa, mode: &str) -> Value {
    let data = tempfile::tempdir().unwrap();
    let expected = reference_run("bigfiles", &FILES, Some(data.path()));
    let want_tree = tree(data.path());
    let a = TestNode::start(Isa::X86_64, &[]);
    let b = TestNode::start(to, &[]);
    if mode == "post-copy" && !b.get("/v1/node").unwrap()["userfaultfd"].as_bool().unwrap() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "post-copy needs userfaultfd on the destination"
        );
        eprintln!("skipping: no userfaultfd here");
        return Value::Null;
    }
    let id = a.launch(&["--dir", "/data"], "bigfiles", &FILES);
    // Mid-run, once every file is written.
    let dir = a.cell_files(&id).join("bigfiles");
    wait_for("the cell to write its files", LIMITS_SLOW, || {
        let bytes: u64 = std::fs::read_dir(&dir)
            .ok()?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        (bytes >= 64 << 20).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (out, status) = migrate(&id, &a, &b, mode, &[]);
    let both = || format!("{}\n{}", a.log(), b.log());
    assert!(
        out.status.success(),
        "roam migrate failed: {}\n{}",
        text(&out.stderr),
        both()
    );
    let end = b.wait_end(&id, LIMITS_SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", both());
    assert_eq!(end["code"], 0, "{end}\n{}", both());
    assert_eq!(text(&logs(&id, &a)), text(&expected), "{}", both());
    let got_tree = tree(&b.cell_files(&id));
    assert_eq!(
        got_tree
            .iter()
            .map(|(p, d)| (p, d.len()))
            .collect::<Vec<_>>(),
        want_tree
            .iter()
            .map(|(p, d)| (p, d.len()))
            .collect::<Vec<_>>(),
    );
    assert!(
        got_tree == want_tree,
        "the files differ from an uninterrupted run"
    );
    let s = &status["summary"];
    let (before, paused) = (
        s["files_bytes_before_pause"].as_u64().unwrap(),
        s["files_bytes_paused"].as_u64().unwrap(),
    );
    eprintln!(
        "{mode} to {}: files {before} bytes before the pause, {paused} during; downtime {} ms",
        to.name(),
        s["downtime_ms"]
    );
    assert!(before + paused >= 60 << 20, "{status}");
    if mode == "pre-copy" {
        assert!(before >= 60 << 20, "{status}");
        assert!(paused < 16 << 20, "{status}");
    } else {
        assert_eq!(before, 0, "{status}");
    }
    status
}

#[test]
fn files_64mib_stop_and_copy() {
    move_files(Isa::X86_64, "stop-and-copy");
}

#[test]
fn files_64mib_pre_copy() {
    move_files(Isa::X86_64, "pre-copy");
}

#[test]
fn files_64mib_post_copy() {
    move_files(Isa::X86_64, "post-copy");
}

#[test]
fn files_64mib_pre_copy_to_aarch64() {
    move_files(Isa::Aarch64, "pre-copy");
}

#[test]
fn a_log_at_a_cap_over_a_frame_migrates() {
    // 24 MiB of output over 6 s into a 20 MiB log: the log is full when the
    // cell moves, and larger than one 16 MiB frame.
    let args = ["1", "6", "24576"];
    let data = tempfile::tempdir().unwrap();
    let expected = reference_run("bigfiles", &args, Some(data.path()));
    let cap = ["--log-size", "20MiB"];
    let (a, b) = (
        TestNode::start(Isa::X86_64, &cap),
        TestNode::start(Isa::X86_64, &cap),
    );
    let id = a.launch(&["--dir", "/data"], "bigfiles", &args);
    wait_for("the log to fill", LIMITS_SLOW, || {
        let c = a.cell(&id).unwrap();
        (c["log_dropped_bytes"].as_u64().unwrap() > 0).then_some(())
    });
    let (out, status) = migrate(&id, &a, &b, "pre-copy", &[]);
    assert!(
        out.status.success(),
        "roam migrate failed: {}\n{}\n{}",
        text(&out.stderr),
        a.log(),
        b.log()
    );
    assert!(
        status["summary"]["log_bytes"].as_u64().unwrap() == 20 << 20,
        "{status}"
    );
    let end = b.wait_end(&id, LIMITS_SLOW);
    assert_eq!(end["code"], 0, "{end}");
    let dropped = expected.len() as u64 - (20 << 20);
    assert_eq!(end["log_dropped_bytes"], dropped, "{end}");
    let got = logs(&id, &a);
    let first = format!(
        "[roam: {:.1} MiB of earlier output dropped]\n",
        dropped as f64 / (1 << 20) as f64
    );
    assert!(got.starts_with(first.as_bytes()), "{}", text(&got[..200]));
    assert!(
        got[first.len()..] == expected[expected.len() - (20 << 20)..],
        "the migrated log's tail differs from an uninterrupted run"
    );
}
