//! Checkpoint on one ISA, restore on another, for every workload, at three
//! moments: the first migration point, half-way through, and inside a
//! blocking call. Stdout of the two halves, concatenated, and the files left
//! in `/data` must equal an uninterrupted run's byte for byte.
//!
//! Snapshots carry the sandbox files (`--with-files`) and the restore runs in
//! a fresh, empty directory, as it would on another machine.
//!
//! The uninterrupted run is itself checked: it must pass the workload's own
//! verification and print the checksum pinned from the native build
//! (`workloads/checksums-S.txt`), so a bug that changed both runs alike
//! would not go unnoticed.

use std::collections::HashMap;
use std::process::Output;
use std::sync::{Arc, Mutex, OnceLock};

use super::common::*;

/// An uninterrupted run on x86-64.
struct Reference {
    stdout: Vec<u8>,
    status: i32,
    files: Vec<(String, Vec<u8>)>,
    /// Migration points the run reaches (deterministic on every ISA).
    points: u64,
}

fn run_args(cmd: &mut std::process::Command, data: &std::path::Path, name: &str) {
    cmd.arg("--dir")
        .arg(format!("{}::/data", data.display()))
        .arg(workload(name))
        .arg("--")
        .arg("S");
}

fn reference(name: &str) -> Arc<Reference> {
    static REFS: OnceLock<Mutex<HashMap<String, Arc<Reference>>>> = OnceLock::new();
    let refs = REFS.get_or_init(Default::default);
    if let Some(r) = refs.lock().unwrap().get(name) {
        return r.clone();
    }
    let data = tempfile::tempdir().unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run");
    run_args(&mut cmd, data.path(), name);
    let out = output(cmd);
    assert_verified(&format!("{name}: reference run"), &out, Some(name));
    let files = tree(data.path());

    // Count the migration points: ask for a checkpoint at a point the program
    // never reaches; roam reports how many it did reach.
    let data2 = tempfile::tempdir().unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--checkpoint-at-point", &u64::MAX.to_string()]);
    run_args(&mut cmd, data2.path(), name);
    let counted = output(cmd);
    assert_eq!(
        counted.stdout, out.stdout,
        "{name}: counting run changed the output"
    );
    let err = text(&counted.stderr);
    let points = err
        .split("reached only ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no point count in: {err}"));
    let r = Arc::new(Reference {
        stdout: out.stdout,
        status: out.status.code().unwrap(),
        files,
        points,
    });
    refs.lock().unwrap().insert(name.to_string(), r.clone());
    r
}

#[derive(Debug, Clone, Copy)]
enum Moment {
    Early,
    Mid,
    Blocking,
}

fn check_ok(what: &str, out: &Output) {
    assert!(
        out.status.code().is_some(),
        "{what}: killed by a signal\nstderr:\n{}",
        text(&out.stderr)
    );
}

fn migrate(name: &str, from: Isa, to: Isa, moment: Moment, capture: &str) {
    let r = reference(name);
    let what = format!(
        "{name} {:?} {} -> {} ({capture})",
        moment,
        from.name(),
        to.name()
    );
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.roam");
    let data1 = dir.path().join("data1");
    let data2 = dir.path().join("data2");
    std::fs::create_dir_all(&data1).unwrap();
    std::fs::create_dir_all(&data2).unwrap();

    let mut cmd = roam(from);
    // How the module is prepared on the fly (the restore finds it by hash).
    cmd.env("ROAM_CAPTURE", capture);
    cmd.arg("run")
        .arg("--with-files")
        .arg("--snapshot")
        .arg(&snap);
    match moment {
        Moment::Early => cmd.args(["--checkpoint-at-point", "1"]),
        Moment::Mid => cmd.args(["--checkpoint-at-point", &(r.points / 2).max(1).to_string()]),
        Moment::Blocking => cmd.arg("--checkpoint-on-block"),
    };
    run_args(&mut cmd, &data1, name);
    let first = output(cmd);
    check_ok(&what, &first);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{what}: checkpoint run failed\n{}",
        text(&first.stderr)
    );
    assert!(
        snap.exists(),
        "{what}: no checkpoint was taken (the program ended first)\n{}",
        text(&first.stderr)
    );

    let mut cmd = roam(Isa::X86_64);
    cmd.arg("inspect").arg(&snap);
    let inspected = text(&output(cmd).stdout);
    assert!(
        inspected.contains(from.name()),
        "{what}: snapshot does not name its ISA {}:\n{inspected}",
        from.name()
    );

    let mut cmd = roam(to);
    cmd.arg("restore")
        .arg(&snap)
        .arg("--dir")
        .arg(format!("{}::/data", data2.display()));
    let second = output(cmd);
    check_ok(&what, &second);
    assert_eq!(
        second.status.code(),
        Some(r.status),
        "{what}: restored run exit status\n{}",
        text(&second.stderr)
    );
    assert_verified(&format!("{what}: restored run"), &second, Some(name));
    let mut joined = first.stdout.clone();
    joined.extend_from_slice(&second.stdout);
    assert!(
        joined == r.stdout,
        "{what}: output differs from the uninterrupted run\n--- before checkpoint\n{}\n--- after restore\n{}\n--- expected\n{}\n--- restore stderr\n{}",
        text(&first.stdout),
        text(&second.stdout),
        text(&r.stdout),
        text(&second.stderr)
    );
    assert!(
        tree(&data2) == r.files,
        "{what}: files in /data differ from the uninterrupted run"
    );
}

fn all_moments(name: &str, from: Isa, to: Isa) {
    all_moments_with(name, from, to, "asyncify");
}

fn all_moments_with(name: &str, from: Isa, to: Isa, capture: &str) {
    for m in [Moment::Early, Moment::Mid, Moment::Blocking] {
        migrate(name, from, to, m, capture);
    }
}

macro_rules! workload_tests {
    ($($w:ident),* $(,)?) => {$(
        mod $w {
            use super::*;
            #[test]
            fn x86_64_to_aarch64() { all_moments(stringify!($w), Isa::X86_64, Isa::Aarch64) }
            #[test]
            fn x86_64_to_riscv64() { all_moments(stringify!($w), Isa::X86_64, Isa::Riscv64) }
            #[test]
            fn aarch64_to_x86_64() { all_moments(stringify!($w), Isa::Aarch64, Isa::X86_64) }
            #[test]
            fn riscv64_to_x86_64() { all_moments(stringify!($w), Isa::Riscv64, Isa::X86_64) }
            // Capture by exceptions, one direction each way.
            #[test]
            fn x86_64_to_aarch64_eh() {
                all_moments_with(stringify!($w), Isa::X86_64, Isa::Aarch64, "eh")
            }
            #[test]
            fn riscv64_to_x86_64_eh() {
                all_moments_with(stringify!($w), Isa::Riscv64, Isa::X86_64, "eh")
            }
            // The same records, frames that leave by returning.
            #[test]
            fn x86_64_to_riscv64_returns() {
                all_moments_with(stringify!($w), Isa::X86_64, Isa::Riscv64, "returns")
            }
            #[test]
            fn aarch64_to_x86_64_returns() {
                all_moments_with(stringify!($w), Isa::Aarch64, Isa::X86_64, "returns")
            }
        }
    )*};
}

workload_tests!(ep, is, cg, mg, kmeans, matmul, pca, linpack, dhrystone, filework, recurse, interp);

/// Three hops, each on another ISA, each a checkpoint-and-stop.
#[test]
fn three_hops_x86_64_aarch64_riscv64_x86_64() {
    for name in ["recurse", "filework"] {
        let r = reference(name);
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("s.roam");
        let mut joined = Vec::new();
        let hops = [Isa::X86_64, Isa::Aarch64, Isa::Riscv64, Isa::X86_64];
        let step = (r.points / 4).max(1).to_string();
        for (i, isa) in hops.iter().enumerate() {
            let data = dir.path().join(format!("data{i}"));
            std::fs::create_dir_all(&data).unwrap();
            let mut cmd = roam(*isa);
            if i == 0 {
                cmd.args(["run", "--with-files", "--checkpoint-at-point", &step]);
                cmd.arg("--snapshot").arg(&snap);
                run_args(&mut cmd, &data, name);
            } else {
                cmd.arg("restore").arg(&snap).arg("--with-files");
                if i < hops.len() - 1 {
                    cmd.args(["--checkpoint-at-point", &step]);
                }
                cmd.arg("--dir").arg(format!("{}::/data", data.display()));
            }
            let out = output(cmd);
            check_ok(name, &out);
            assert!(
                out.status.success() || i == hops.len() - 1,
                "{name} hop {i} on {}: {}",
                isa.name(),
                text(&out.stderr)
            );
            joined.extend_from_slice(&out.stdout);
            if i == hops.len() - 1 {
                assert_eq!(out.status.code(), Some(r.status));
                assert_verified(&format!("{name}: last hop"), &out, Some(name));
                assert!(
                    tree(&data) == r.files,
                    "{name}: files differ after three hops"
                );
            }
        }
        assert!(
            joined == r.stdout,
            "{name}: three-hop output differs:\n{}\n--- expected\n{}",
            text(&joined),
            text(&r.stdout)
        );
    }
}

/// The pinned checksums are what the native builds print now, so the file
/// cannot go stale: a workload whose output changes must be re-pinned
/// (`workloads/pin-checksums.sh`) in the same change.
#[test]
fn native_builds_print_the_pinned_checksums() {
    let dir = repo_root()
        .join("target/workloads/native")
        .join(std::env::consts::ARCH);
    if !dir.is_dir() {
        roam_testkit::missing(
            &roam_testkit::NATIVE_WORKLOADS,
            format_args!("{} does not exist", dir.display()),
        );
        return;
    }
    for (name, _) in pinned_checksums() {
        let bin = dir.join(name);
        assert!(
            bin.exists(),
            "{} is missing: run workloads/build.sh",
            bin.display()
        );
        let data = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(&bin);
        cmd.arg("S").arg(data.path());
        let out = output(cmd);
        assert_verified(&format!("{name}: native build"), &out, Some(name));
    }
}
