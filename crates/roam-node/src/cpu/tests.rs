//! The choice of mechanism, the paths and the files written, on fake
//! trees laid out like a cgroup v2 mount and a v1 `cpu` mount (a temp
//! directory stands for the mount; the kernel's own files are made by
//! hand), and the nice fallback on real threads.

use std::fs;
use std::path::Path;

use super::cgroup::{self, Version};
use super::*;

fn read(p: impl AsRef<Path>) -> String {
    fs::read_to_string(p.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", p.as_ref().display()))
        .trim()
        .to_string()
}

fn tid() -> String {
    rustix::thread::gettid().as_raw_pid().to_string()
}

/// A mountinfo line mounting `fstype` with `opts` at `point`.
fn mount_line(point: &Path, fstype: &str, opts: &str) -> String {
    format!(
        "41 31 0:38 / {} rw,relatime shared:1 - {fstype} cgroup {opts}\n",
        point.display()
    )
}

/// A cgroup v2 root whose `cgroup.controllers` lists `controllers`.
fn fake_v2(controllers: &str) -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("cgroup.controllers"), controllers).unwrap();
    fs::write(d.path().join("cgroup.subtree_control"), "").unwrap();
    let mi = mount_line(d.path(), "cgroup2", "rw,nsdelegate");
    (d, mi)
}

/// A cgroup v1 `cpu` root.
fn fake_v1() -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("cpu.shares"), "1024").unwrap();
    fs::write(d.path().join("tasks"), "").unwrap();
    let mi = mount_line(d.path(), "cgroup", "rw,cpu,cpuacct");
    (d, mi)
}

fn cpu(m: Mechanism, groups: Option<cgroup::Groups>) -> Cpu {
    Cpu {
        mechanism: m,
        groups,
        weight: 100,
        max_millicores: None,
        warned: AtomicBool::new(false),
    }
}

#[test]
fn the_nodes_cgroup_is_found_from_mountinfo_and_proc_cgroup() {
    // A hybrid host: v1 cpu, and a v2 hierarchy without it.
    let hybrid_mi = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                     41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    let hybrid_cg = "4:memory:/x\n1:cpu:/\n0::/\n";
    assert_eq!(
        cgroup::find(Version::V1, hybrid_mi, hybrid_cg).unwrap(),
        Path::new("/sys/fs/cgroup/cpu")
    );
    assert_eq!(
        cgroup::find(Version::V2, hybrid_mi, hybrid_cg).unwrap(),
        Path::new("/sys/fs/cgroup/unified")
    );
    // A v2 host, the node in a service's group.
    let v2_mi =
        "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    let v2_cg = "0::/system.slice/roam.service\n";
    assert_eq!(
        cgroup::find(Version::V2, v2_mi, v2_cg).unwrap(),
        Path::new("/sys/fs/cgroup/system.slice/roam.service")
    );
    assert_eq!(cgroup::find(Version::V1, v2_mi, v2_cg), None);
    // v1 with cpu and cpuacct on one mount, seen from a container whose
    // mount's root is its own group.
    let c_mi =
        "50 40 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n";
    assert_eq!(
        cgroup::find(Version::V1, c_mi, "3:cpu,cpuacct:/docker/abc/inner\n").unwrap(),
        Path::new("/sys/fs/cgroup/cpu,cpuacct/inner")
    );
    assert_eq!(
        cgroup::find(Version::V1, c_mi, "3:cpu,cpuacct:/docker/abc\n").unwrap(),
        Path::new("/sys/fs/cgroup/cpu,cpuacct")
    );
    // A group outside what the mount shows, or a prefix that is not a
    // whole component, or a path that climbs: none.
    assert_eq!(
        cgroup::find(Version::V1, c_mi, "3:cpu,cpuacct:/other\n"),
        None
    );
    assert_eq!(
        cgroup::find(Version::V1, c_mi, "3:cpu,cpuacct:/docker/abcd\n"),
        None
    );
    assert_eq!(cgroup::find(Version::V2, v2_mi, "0::/a/../../etc\n"), None);
    // `cpuacct` alone is not `cpu`; a mount point with a space.
    let acct = "33 31 0:30 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n";
    assert_eq!(cgroup::find(Version::V1, acct, "2:cpuacct:/\n"), None);
    let spaced = "29 23 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        cgroup::find(Version::V2, spaced, "0::/\n").unwrap(),
        Path::new("/mnt/cg two")
    );
    // Garbage.
    assert_eq!(cgroup::find(Version::V2, "nonsense", "0::/\n"), None);
    assert_eq!(cgroup::find(Version::V2, v2_mi, ""), None);
}

#[test]
fn ids_are_checked_before_they_become_paths() {
    assert_eq!(cgroup::cell_group_name("c-1").unwrap(), "cell-c-1");
    assert_eq!(cgroup::node_group_name("edge-a").unwrap(), "roam-edge-a");
    for bad in [
        "",
        "..",
        "../x",
        "a/b",
        "x..y",
        ".hidden",
        "a\0b",
        &"x".repeat(65),
    ] {
        assert!(cgroup::cell_group_name(bad).is_err(), "cell id {bad:?}");
    }
    for bad in ["", "../n", "n/m", "..", "a b"] {
        assert!(cgroup::node_group_name(bad).is_err(), "node name {bad:?}");
    }
}

#[test]
fn cgroup_v2_with_cpu_gets_a_threaded_group_per_cell() {
    let (d, mi) = fake_v2("cpuset cpu io memory pids");
    let (m, groups) = choose("n1", CpuControl::Auto, &mi, "0::/\n").unwrap();
    assert_eq!(m, Mechanism::CgroupV2);
    let node = d.path().join("roam-n1");
    assert_eq!(read(node.join("cgroup.type")), "threaded");
    assert_eq!(read(d.path().join("cgroup.subtree_control")), "+cpu");
    assert_eq!(read(node.join("cgroup.subtree_control")), "+cpu");
    assert_eq!(
        read(node.join("cpu.weight")),
        cgroup::CELLS_WEIGHT.to_string()
    );
    let c = cpu(m, groups);
    let limits = CpuLimits {
        weight: Some(200),
        max_millicores: Some(500),
    };
    let p = c.enter("c-1", limits);
    let dir = node.join("cell-c-1");
    assert_eq!(p.applied.mechanism, "cgroup-v2");
    assert_eq!(p.applied.group.as_deref(), Some(dir.to_str().unwrap()));
    assert!(p.applied.max_enforced);
    assert_eq!(read(dir.join("cgroup.type")), "threaded");
    assert_eq!(read(dir.join("cpu.weight")), "200");
    assert_eq!(read(dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(dir.join("cgroup.threads")), tid());
    drop(p);
    // Leaving moves the thread back to the node's own group (the kernel
    // would then let the group be removed; a plain directory does not).
    assert_eq!(read(d.path().join("cgroup.threads")), tid());
    // The node's defaults for a cell that sets nothing.
    let p = c.enter("c-2", CpuLimits::default());
    assert_eq!((p.applied.weight, p.applied.max_millicores), (100, None));
    assert_eq!(read(node.join("cell-c-2/cpu.max")), "max 100000");
}

#[test]
fn the_node_in_a_nested_v2_group_keeps_its_subtree_there() {
    let (d, mi) = fake_v2("cpu");
    let svc = d.path().join("system.slice/roam.service");
    fs::create_dir_all(&svc).unwrap();
    fs::write(svc.join("cgroup.controllers"), "cpu memory").unwrap();
    fs::write(svc.join("cgroup.subtree_control"), "+cpu").unwrap();
    let cg = "0::/system.slice/roam.service\n";
    let (m, g) = choose("n1", CpuControl::Auto, &mi, cg).unwrap();
    assert_eq!(m, Mechanism::CgroupV2);
    assert_eq!(g.unwrap().node_path(), svc.join("roam-n1"));
    assert_eq!(read(svc.join("roam-n1/cgroup.type")), "threaded");
    assert!(!d.path().join("roam-n1").exists());
}

#[test]
fn cgroup_v1_cpu_gets_shares_and_a_quota_per_cell() {
    let (d, mi) = fake_v1();
    let (m, groups) = choose("n1", CpuControl::Auto, &mi, "3:cpu,cpuacct:/\n").unwrap();
    assert_eq!(m, Mechanism::CgroupV1);
    let node = d.path().join("roam-n1");
    assert_eq!(read(node.join("cpu.shares")), "256");
    let c = cpu(m, groups);
    let p = c.enter(
        "c-1",
        CpuLimits {
            weight: Some(200),
            max_millicores: Some(1500),
        },
    );
    let dir = node.join("cell-c-1");
    assert_eq!(p.applied.mechanism, "cgroup-v1");
    assert_eq!(read(dir.join("cpu.shares")), "2048");
    assert_eq!(read(dir.join("cpu.cfs_period_us")), "100000");
    assert_eq!(read(dir.join("cpu.cfs_quota_us")), "150000");
    assert_eq!(read(dir.join("tasks")), tid());
    drop(p);
    assert_eq!(read(d.path().join("tasks")), tid());
    // No cap: the quota is unlimited.
    let _p = c.enter("c-2", CpuLimits::default());
    assert_eq!(read(node.join("cell-c-2/cpu.cfs_quota_us")), "-1");
    assert_eq!(read(node.join("cell-c-2/cpu.shares")), "1024");
}

#[test]
fn v2_is_preferred_and_a_v2_without_cpu_falls_to_v1_then_to_nice() {
    let (_v2, mi2) = fake_v2("cpu memory");
    let (_v1, mi1) = fake_v1();
    let both = format!("{mi1}{mi2}");
    let cg = "1:cpu:/\n0::/\n";
    assert_eq!(
        choose("n", CpuControl::Auto, &both, cg).unwrap().0,
        Mechanism::CgroupV2
    );
    let (_v2, mi2) = fake_v2("memory pids");
    let hybrid = format!("{mi1}{mi2}");
    assert_eq!(
        choose("n", CpuControl::Auto, &hybrid, cg).unwrap().0,
        Mechanism::CgroupV1
    );
    // Asked for v2 by name: refused, saying what is missing.
    let e = choose("n", CpuControl::Only(Mechanism::CgroupV2), &hybrid, cg).unwrap_err();
    assert!(e.to_string().contains("no cpu controller"), "{e}");
    // Nothing usable at all.
    let (m, g) = choose("n", CpuControl::Auto, &mi2, "0::/\n").unwrap();
    assert_eq!((m, g.is_none()), (Mechanism::Nice, true));
    let e = choose("n", CpuControl::Only(Mechanism::CgroupV1), &mi2, "0::/\n").unwrap_err();
    assert!(e.to_string().contains("no cgroup v1 cpu hierarchy"), "{e}");
    // Nice by name, though a cgroup is there.
    assert_eq!(
        choose("n", CpuControl::Only(Mechanism::Nice), &both, cg)
            .unwrap()
            .0,
        Mechanism::Nice
    );
}

#[test]
fn stale_empty_cell_groups_of_the_same_node_are_removed_at_start() {
    let (d, mi) = fake_v1();
    let node = d.path().join("roam-n1");
    fs::create_dir_all(node.join("cell-old")).unwrap();
    // A group that still holds something (a live cell's, on a real mount).
    fs::create_dir_all(node.join("cell-busy")).unwrap();
    fs::write(node.join("cell-busy/tasks"), "1").unwrap();
    // Not a cell's group, and a name that is no cell id.
    fs::create_dir_all(node.join("keep-me")).unwrap();
    fs::create_dir_all(node.join("cell-.x")).unwrap();
    // Another node's.
    fs::create_dir_all(d.path().join("roam-n2/cell-old")).unwrap();
    let (_, g) = choose("n1", CpuControl::Auto, &mi, "1:cpu:/\n").unwrap();
    assert!(g.is_some());
    assert!(!node.join("cell-old").exists());
    assert!(node.join("cell-busy").exists());
    assert!(node.join("keep-me").exists());
    assert!(node.join("cell-.x").exists());
    assert!(d.path().join("roam-n2/cell-old").exists());
}

#[test]
fn symbolic_links_are_never_followed() {
    let (d, mi) = fake_v1();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), d.path().join("roam-n1")).unwrap();
    let e = choose(
        "n1",
        CpuControl::Only(Mechanism::CgroupV1),
        &mi,
        "1:cpu:/\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("roam-n1"), "{e}");
    assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    // A control file that is a link: the cell falls back to nice and the
    // target stays as it was.
    let (d2, mi2) = fake_v1();
    let (_, g) = choose("n1", CpuControl::Auto, &mi2, "1:cpu:/\n").unwrap();
    let cell = d2.path().join("roam-n1/cell-c-1");
    fs::create_dir_all(&cell).unwrap();
    let victim = elsewhere.path().join("victim");
    fs::write(&victim, "untouched").unwrap();
    std::os::unix::fs::symlink(&victim, cell.join("cpu.shares")).unwrap();
    let c = cpu(Mechanism::CgroupV1, g);
    let applied = std::thread::spawn(move || c.enter("c-1", CpuLimits::default()).applied.clone())
        .join()
        .unwrap();
    assert_eq!(applied.mechanism, "nice");
    assert_eq!(read(&victim), "untouched");
    drop(d);
}

#[test]
fn an_invalid_id_makes_no_group_and_the_cell_runs_at_its_nice_value() {
    let (d, mi) = fake_v1();
    let (_, g) = choose("n1", CpuControl::Auto, &mi, "1:cpu:/\n").unwrap();
    let c = cpu(Mechanism::CgroupV1, g);
    let applied =
        std::thread::spawn(move || c.enter("../../x", CpuLimits::default()).applied.clone())
            .join()
            .unwrap();
    assert_eq!(applied.mechanism, "nice");
    assert!(!d.path().join("x").exists());
    let entries: Vec<_> = fs::read_dir(d.path().join("roam-n1"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("cell-"))
        .collect();
    assert!(entries.is_empty(), "{entries:?}");
}

#[test]
fn nice_values_follow_the_weight_and_stay_below_the_node() {
    assert_eq!(nice_for(100), CELL_NICE);
    assert_eq!(nice_for(200), 7);
    assert_eq!(nice_for(50), 13);
    assert_eq!(nice_for(400), 4);
    assert_eq!(nice_for(10_000), 1);
    assert_eq!(nice_for(1), 19);
    assert_eq!(nice_for(0), 19);
}

/// Linux nice is per thread: the cell's thread runs at its value, the
/// thread that started it keeps its own.
#[test]
fn without_a_cgroup_a_cell_thread_runs_at_its_nice_value_alone() {
    let here = rustix::process::getpriority_process(None).unwrap();
    let c = cpu(Mechanism::Nice, None);
    let (applied, there) = std::thread::spawn(move || {
        let p = c.enter(
            "c-1",
            CpuLimits {
                weight: Some(400),
                max_millicores: Some(500),
            },
        );
        (
            p.applied.clone(),
            rustix::process::getpriority_process(None).unwrap(),
        )
    })
    .join()
    .unwrap();
    assert_eq!(there, nice_for(400).max(here));
    assert_eq!(applied.nice, Some(there));
    assert_eq!(applied.mechanism, "nice");
    assert!(!applied.max_enforced, "nice enforces no cap");
    assert_eq!(rustix::process::getpriority_process(None).unwrap(), here);
}

#[test]
fn weights_and_caps_convert_to_v1_units() {
    assert_eq!(cgroup::v1_shares(100), 1024);
    assert_eq!(cgroup::v1_shares(1), 10);
    assert_eq!(cgroup::v1_shares(10_000), 102_400);
    assert_eq!(cgroup::quota_us(500), 50_000);
    assert_eq!(cgroup::quota_us(10), 1_000);
    assert_eq!(
        "cgroup-v1".parse::<CpuControl>().unwrap(),
        CpuControl::Only(Mechanism::CgroupV1)
    );
    assert!("cgroup".parse::<CpuControl>().is_err());
}
