//! A guest that loops for ever takes down neither its node nor the other
//! cells: each cell's thread runs in a CPU group of its own with its
//! weight (or at a nice value by its weight, without a cgroup), and the
//! node's control API answers while cells spin.
//!
//! The cells run `stop.rs`'s spinning module, which never reaches a
//! migration point. These tests check where the threads are and what was
//! written, not how the CPU was split: timings on a shared machine are
//! noise, and the split between weights is a benchmark's business.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::*;
use super::stop::{launch_spin, spin_module};

/// The thread ids of process `pid` whose name is the cell's thread's
/// (`cell-ID`, cut to the kernel's 15 bytes).
fn cell_threads(pid: u32, id: &str) -> Vec<String> {
    let comm: String = format!("cell-{id}").chars().take(15).collect();
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_string_lossy().into_owned();
            let c = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            (c.trim() == comm).then_some(tid)
        })
        .collect()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

/// Removes the node's cgroup subtree when the test ends, after the node
/// (declared before it, so dropped after it).
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(dir) = &self.0 else { return };
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with("cell-") {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

/// Two spinning cells with different weights (and one with a cap) each
/// run in their own group with what was asked written; the control API
/// answers while they spin; a killed cell's group is gone; the group of a
/// cell whose node was killed is removed when the node starts again.
#[test]
fn spinning_cells_run_in_their_own_cpu_groups_and_the_node_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());
    let name = format!("cpu-{}", std::process::id());
    let mut cleanup = Cleanup(None);
    let mut n = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--name",
            &name,
            "--cell-cpu-control",
            "auto",
        ],
    );
    let cpu = n.info()["cpu"].clone();
    let mechanism = cpu["mechanism"].as_str().unwrap_or("none").to_string();
    if !mechanism.starts_with("cgroup") {
        roam_testkit::missing(
            &roam_testkit::CGROUP_CPU,
            format_args!("the node chose {mechanism}: {cpu}\n{}", n.log()),
        );
        return;
    }
    let v1 = mechanism == "cgroup-v1";
    let node_group = PathBuf::from(cpu["group"].as_str().expect("the node's group"));
    cleanup.0 = Some(node_group.clone());
    assert!(node_group.ends_with(format!("roam-{name}")), "{cpu}");
    let light = launch_spin(&n, &module, &["--cpu-weight", "50"]);
    let heavy = launch_spin(&n, &module, &["--cpu-weight", "400", "--cpu-max", "0.5"]);

    let group_of = |id: &str| -> (PathBuf, Value) {
        let c = n.cell(id).expect("the cell");
        let g = PathBuf::from(c["cpu"]["group"].as_str().unwrap_or_else(|| panic!("{c}")));
        assert_eq!(c["cpu"]["mechanism"], mechanism.as_str(), "{c}");
        assert_eq!(g, node_group.join(format!("cell-{id}")), "{c}");
        (g, c)
    };
    let threads_file = if v1 { "tasks" } else { "cgroup.threads" };
    for (id, weight) in [(&light, 50u64), (&heavy, 400)] {
        let (g, c) = group_of(id);
        assert_eq!(c["cpu"]["weight"], weight, "{c}");
        // (a) The cell's thread, and only it, is in its group.
        let listed: Vec<String> = read(&g.join(threads_file))
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(listed, cell_threads(n.pid(), id), "{}", g.display());
        assert_eq!(listed.len(), 1, "{listed:?}");
        if v1 {
            assert_eq!(
                read(&g.join("cpu.shares")),
                (weight * 1024 / 100).to_string()
            );
        } else {
            assert_eq!(read(&g.join("cpu.weight")), weight.to_string());
        }
    }
    let (hg, _) = group_of(&heavy);
    let (lg, _) = group_of(&light);
    if v1 {
        assert_eq!(read(&hg.join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&lg.join("cpu.cfs_quota_us")), "-1");
    } else {
        assert_eq!(read(&hg.join("cpu.max")), "50000 100000");
    }
    // `roam cells` shows each cell's mechanism and weight.
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["cells", "--node", &n.addr]);
    let out = text(&run_bounded(cmd, SLOW).stdout);
    assert!(out.contains(&format!("{mechanism}:50 ")), "{out}");
    assert!(out.contains(&format!("{mechanism}:400/0.50")), "{out}");

    // The weights are in the node's metrics.
    let (_, metrics) = http_get(&n.addr, "/metrics").unwrap();
    let metrics = text(&metrics);
    let sample =
        format!(r#"roam_node_cell_cpu_weight{{cell="{heavy}",mechanism="{mechanism}"}} 400"#);
    assert!(metrics.contains(&sample), "{sample} in\n{metrics}");

    // (c) The control API answers while both cells spin. The bound is
    // loose: what it catches is a node that does not answer at all.
    for _ in 0..20 {
        let t = Instant::now();
        let (st, _) = http_get(&n.addr, "/v1/node").unwrap();
        assert_eq!(st, 200);
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "GET /v1/node took {:?} with two cells spinning",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // (b) A killed cell's group is gone.
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["kill", "--node", &n.addr, &light]);
    let out = run_bounded(cmd, SLOW);
    assert!(out.status.success(), "roam kill: {}", text(&out.stderr));
    wait_for(
        "the killed cell's group to go",
        Duration::from_secs(10),
        || (!lg.exists()).then_some(()),
    );
    assert!(hg.exists(), "the other cell's group stays");

    // A node killed outright leaves its cells' groups, empty; the next
    // start of the same node removes them.
    n.restart();
    assert!(!hg.exists(), "{} survived the restart", hg.display());
    assert!(node_group.exists());
}

/// Told to use nice values, a node runs each cell's thread at the nice
/// value of its weight, and says the cap is not enforced.
#[test]
fn a_node_without_cgroups_runs_each_cell_at_the_nice_value_of_its_weight() {
    let dir = tempfile::tempdir().unwrap();
    let module = spin_module(dir.path());
    let n = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--cell-cpu-control",
            "nice",
        ],
    );
    assert_eq!(n.info()["cpu"]["mechanism"], "nice");
    let id = launch_spin(&n, &module, &["--cpu-weight", "400", "--cpu-max", "0.5"]);
    let c = n.cell(&id).expect("the cell");
    assert_eq!(c["cpu"]["mechanism"], "nice", "{c}");
    assert_eq!(c["cpu"]["max_enforced"], false, "{c}");
    // The node's own main thread keeps its value (the test's, inherited).
    let nice_of = |path: String| -> i64 {
        let stat = read(Path::new(&path));
        // After the command name: state is the first field, nice the 17th.
        let f: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .collect();
        f[16].parse().unwrap()
    };
    let node_nice = nice_of(format!("/proc/{}/stat", n.pid()));
    assert_eq!(node_nice, nice_of("/proc/self/stat".into()));
    let tids = cell_threads(n.pid(), &id);
    assert_eq!(tids.len(), 1, "{tids:?}");
    let cell_nice = nice_of(format!("/proc/{}/task/{}/stat", n.pid(), tids[0]));
    assert_eq!(cell_nice, node_nice.max(4));
    assert_eq!(c["cpu"]["nice"], cell_nice, "{c}");
}

/// A cell keeps its CPU weight and cap when it moves: they travel in its
/// spec, and the destination makes its group with them; the source's
/// group is gone.
#[test]
fn a_migrated_cell_keeps_its_cpu_settings() {
    let names = [
        format!("cpu-a-{}", std::process::id()),
        format!("cpu-b-{}", std::process::id()),
    ];
    let mut cleanup = [Cleanup(None), Cleanup(None)];
    let start = |name: &str| {
        Node::start_with(
            Isa::X86_64,
            &[
                "--migrate-listen",
                "127.0.0.1:0",
                "--name",
                name,
                "--cell-cpu-control",
                "auto",
            ],
        )
    };
    let (a, b) = (start(&names[0]), start(&names[1]));
    for (c, n) in cleanup.iter_mut().zip([&a, &b]) {
        c.0 = n.info()["cpu"]["group"].as_str().map(PathBuf::from);
    }
    let mut cmd = roam(Isa::X86_64);
    cmd.args([
        "launch",
        "--node",
        &a.addr,
        "--cpu-weight",
        "300",
        "--cpu-max",
        "250m",
    ])
    .arg(workload(WORKLOAD))
    .arg("--")
    .args(SMALL_LONG);
    let id = launched(&run_bounded(cmd, SLOW), || a.log());
    wait_for("the cell to run", SLOW, || {
        a.cell(&id).filter(|c| c["cpu"].is_object())
    });
    let before = a.cell(&id).unwrap()["cpu"].clone();
    let (out, status) = migrate(&id, &a, &b, "stop-and-copy", &[]);
    assert!(
        out.status.success(),
        "{}\n{status}\n{}",
        text(&out.stderr),
        both_logs(&a, &b)
    );
    let after = wait_for("the cell to run on b", SLOW, || {
        b.cell(&id).filter(|c| c["cpu"].is_object())
    })["cpu"]
        .clone();
    assert_eq!(after["weight"], 300, "{after}");
    assert_eq!(after["max_millicores"], 250, "{after}");
    assert_eq!(after["mechanism"], before["mechanism"], "{after}");
    if let (Some(ga), Some(gb)) = (before["group"].as_str(), after["group"].as_str()) {
        assert!(gb.contains(&format!("roam-{}/cell-{id}", names[1])), "{gb}");
        assert_eq!(
            read(&Path::new(gb).join(if after["mechanism"] == "cgroup-v1" {
                "cpu.shares"
            } else {
                "cpu.weight"
            })),
            if after["mechanism"] == "cgroup-v1" {
                "3072"
            } else {
                "300"
            }
        );
        wait_for("the source's group to go", Duration::from_secs(10), || {
            (!Path::new(ga).exists()).then_some(())
        });
    }
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["kill", "--node", &b.addr, &id]);
    run_bounded(cmd, SLOW);
    drop((a, b));
}
