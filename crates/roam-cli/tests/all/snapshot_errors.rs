//! Bad snapshots and wrong modules are refused with a precise error, and
//! nothing is lost: the snapshot file is left as it was.

use super::common::*;

/// Take an early checkpoint of `recurse` and return (dir, snapshot path).
fn snapshot() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.roam");
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--checkpoint-at-point", "1", "--snapshot"])
        .arg(&snap)
        .arg(workload("recurse"))
        .args(["--", "S"]);
    let out = output(cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(snap.exists());
    (dir, snap)
}

fn restore(snap: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("restore").arg(snap).args(extra);
    output(cmd)
}

#[test]
fn corrupt_snapshot_is_refused_and_left_untouched() {
    let (_d, snap) = snapshot();
    let mut bytes = std::fs::read(&snap).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&snap, &bytes).unwrap();
    // By default a damaged page chunk is found when it is read, while the
    // program runs; `--eager` finds it before the program runs.
    for extra in [&[][..], &["--eager"][..]] {
        let out = restore(&snap, extra);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        let err = text(&out.stderr).to_lowercase();
        assert!(err.contains("checksum"), "{extra:?}: {err}");
        if !extra.is_empty() {
            assert!(out.stdout.is_empty(), "the program ran");
        }
        assert_eq!(
            std::fs::read(&snap).unwrap(),
            bytes,
            "snapshot was modified"
        );
    }
}

#[test]
fn truncated_snapshot_is_refused() {
    let (_d, snap) = snapshot();
    let bytes = std::fs::read(&snap).unwrap();
    for cut in [0, 7, 20, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&snap, &bytes[..cut]).unwrap();
        let out = restore(&snap, &[]);
        assert_eq!(
            out.status.code(),
            Some(125),
            "cut {cut}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "cut {cut}: the program ran");
    }
}

#[test]
fn not_a_snapshot_is_refused_by_magic() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.roam");
    std::fs::write(&p, b"\0asm\x01\0\0\0 definitely not a snapshot").unwrap();
    let out = restore(&p, &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).to_lowercase().contains("magic"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn wrong_module_is_refused_by_hash() {
    let (_d, snap) = snapshot();
    let out = restore(&snap, &["--module", workload("ep").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("module mismatch"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn module_missing_from_cache_says_what_to_do() {
    let (_d, snap) = snapshot();
    let empty = tempfile::tempdir().unwrap();
    let out = restore(&snap, &["--cache-dir", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(
        err.contains("--module") && err.contains("--embed-module"),
        "{err}"
    );
}

#[test]
fn embedded_module_restores_without_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.roam");
    let mut cmd = roam(Isa::X86_64);
    cmd.args([
        "run",
        "--embed-module",
        "--checkpoint-at-point",
        "1",
        "--snapshot",
    ])
    .arg(&snap)
    .arg(workload("recurse"))
    .args(["--", "S"]);
    assert!(output(cmd).status.success());
    let empty = tempfile::tempdir().unwrap();
    let out = restore(&snap, &["--cache-dir", empty.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("checksum: "));
}

/// A snapshot whose file tree plants a symlink to a directory outside the
/// sandbox and then a file "inside" it (`l -> /etc`, `l/cron.d/x`) is
/// refused before anything is written: the outside directory stays empty,
/// and so does the restore directory.
#[test]
fn snapshot_file_tree_cannot_write_outside_its_directory() {
    use roam_snapshot::{FileEntry, FileKind, Snapshot};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let snap = dir.path().join("s.roam");
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["run", "--with-files", "--checkpoint-at-point", "1"])
        .arg("--dir")
        .arg(format!("{}::/data", data.display()))
        .arg("--snapshot")
        .arg(&snap)
        .arg(workload("recurse"))
        .args(["--", "S"]);
    let out = output(cmd);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let outside = tempfile::tempdir().unwrap();
    let mut s = Snapshot::read_file(&snap).unwrap();
    let entry = |path: &str, kind| FileEntry {
        preopen: "/data".into(),
        path: path.into(),
        kind,
        mode: 0o755,
        mtime_ns: 0,
    };
    let files = s.files.as_mut().expect("--with-files carries a tree");
    files.entries.extend([
        entry(
            "l",
            FileKind::Symlink {
                target: outside.path().to_string_lossy().into_owned(),
            },
        ),
        entry("l/cron.d", FileKind::Dir),
        entry(
            "l/cron.d/x",
            FileKind::File {
                data: b"* * * * * root evil\n".to_vec(),
            },
        ),
    ]);
    s.write_file(&snap).unwrap();
    let crafted = std::fs::read(&snap).unwrap();

    let restored = dir.path().join("restored");
    std::fs::create_dir(&restored).unwrap();
    let dir_arg = format!("{}::/data", restored.display());
    let out = restore(&snap, &["--dir", &dir_arg]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("snapshot file entry `l/cron.d` of guest directory /data is refused")
            && err.contains("beneath symlink entry `l`")
            && err.contains("no file was written"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "the program ran");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&restored).unwrap().count(), 0);
    assert_eq!(std::fs::read(&snap).unwrap(), crafted, "snapshot modified");
}
