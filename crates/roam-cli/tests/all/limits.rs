//! A node's and a cell's limits, end to end: memory, cell count, module
//! size, logs. Each test starts its own nodes on free loopback ports (see
//! `TestNode` in `common`, shared with `bigstate`).

use std::time::Duration;

use super::common::*;

#[test]
fn launch_beyond_max_cells_is_refused_with_the_cap_named() {
    let a = TestNode::start(Isa::X86_64, &["--max-cells", "1"]);
    let first = a.launch(&[], "dirty", &["8", "4", "4"]);
    let out = a.try_launch(&[], "dirty", &["8", "4", "4"]);
    assert!(!out.status.success(), "a second cell was launched");
    let err = text(&out.stderr);
    assert!(err.contains("--max-cells"), "{err}");
    assert!(err.contains("1 cells run or arrive here"), "{err}");
    // Once the first cell ends, there is room again.
    a.wait_end(&first, Duration::from_secs(60));
    a.launch(&[], "dirty", &["8", "4", "1"]);
}

#[test]
fn a_cell_launched_with_less_memory_sees_malloc_fail_and_says_so() {
    let a = TestNode::start(Isa::X86_64, &[]);
    // 32 MiB of state does not fit in 16 MiB: malloc returns NULL, and the
    // program reports it and exits 1 by itself.
    let id = a.launch(&["--max-memory", "16MiB"], "dirty", &["32", "4", "2"]);
    let end = a.wait_end(&id, Duration::from_secs(60));
    assert_eq!(end["state"], "exited", "{end}\n{}", a.log());
    assert_eq!(end["code"], 1, "{end}");
    assert_eq!(end["max_memory"], 16 << 20, "{end}");
    let log = text(&logs(&id, &a));
    assert!(log.contains("dirty: out of memory for 32 MiB"), "{log}");
    assert!(a.log().contains("past its limit"), "{}", a.log());
    // Asking for more than the node allows per cell is a bad request.
    let out = a.try_launch(&["--max-memory", "5GiB"], "dirty", &["8", "4", "1"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--max-cell-memory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_oversized_module_upload_gets_413() {
    let a = TestNode::start(Isa::X86_64, &["--max-module-size", "1MiB"]);
    let (st, body) = http_raw(&a.addr, "POST", "/v1/modules", &vec![0u8; 3 << 20]);
    assert_eq!(st, 413, "{}", text(&body));
    let err = text(&body);
    assert!(
        err.contains("--max-module-size") && err.contains("1.0 MiB"),
        "{err}"
    );
    // A module under the cap is still accepted.
    let small = std::fs::read(workload("dirty")).unwrap();
    assert!(small.len() < 1 << 20, "dirty.wasm grew past the test's cap");
    let (st, body) = http_raw(&a.addr, "POST", "/v1/modules", &small);
    assert_eq!(st, 200, "{}", text(&body));
}

#[test]
fn an_incoming_cell_over_the_memory_limit_is_refused_and_keeps_running() {
    let args = ["32", "4", "6"];
    let expected = reference_run("dirty", &args, None);
    let a = TestNode::start(Isa::X86_64, &[]);
    let b = TestNode::start(
        Isa::X86_64,
        &["--max-cell-memory", "16MiB", "--cell-memory", "16MiB"],
    );
    let id = a.launch(&[], "dirty", &args);
    wait_for("the cell to allocate its state", LIMITS_SLOW, || {
        let c = a.cell(&id).unwrap();
        (c["memory_bytes"].as_u64().unwrap() >= 32 << 20).then_some(())
    });
    let (out, _) = migrate(&id, &a, &b, "pre-copy", &[]);
    assert!(!out.status.success(), "the migration went through");
    let err = text(&out.stderr);
    assert!(err.contains("--max-cell-memory"), "{err}");
    assert!(err.contains("16.0 MiB"), "{err}");
    assert!(err.contains("keeps running"), "{err}");
    let end = a.wait_end(&id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}");
    assert_eq!(end["code"], 0, "{end}");
    assert_eq!(end["hops"], 0, "{end}");
    assert!(b.cell(&id).is_none(), "the destination knows the cell");
    assert_eq!(text(&logs(&id, &a)), text(&expected));
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_chatty_cell_keeps_the_node_bounded_and_the_tail_intact() {
    // 128 MiB of output through a 1 MiB log.
    let args = ["1", "2", "131072"];
    let data = tempfile::tempdir().unwrap();
    let expected = reference_run("bigfiles", &args, Some(data.path()));
    let a = TestNode::start(Isa::X86_64, &["--log-size", "1MiB"]);
    let id = a.launch(&["--dir", "/data"], "bigfiles", &args);
    let end = a.wait_end(&id, Duration::from_secs(120));
    assert_eq!(end["state"], "exited", "{end}\n{}", a.log());
    assert_eq!(end["code"], 0, "{end}");
    let dropped = expected.len() as u64 - (1 << 20);
    assert_eq!(end["log_dropped_bytes"], dropped, "{end}");
    let got = logs(&id, &a);
    let first = format!(
        "[roam: {:.1} MiB of earlier output dropped]\n",
        dropped as f64 / (1 << 20) as f64
    );
    assert!(got.starts_with(first.as_bytes()), "{}", text(&got[..200]));
    assert_eq!(
        &got[first.len()..],
        &expected[expected.len() - (1 << 20)..],
        "the tail of the log differs from the end of an uninterrupted run"
    );
    let peak = vm_hwm_kib(a.pid()) << 10;
    assert!(
        peak < 96 << 20,
        "the node's peak memory was {} MiB for a 1 MiB log",
        peak >> 20
    );
}
