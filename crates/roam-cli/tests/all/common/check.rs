//! What a workload run must have printed: the checksums pinned from the
//! native builds, and small readers of output and file trees that the
//! checks compare with.

use std::path::Path;
use std::process::Output;
use std::sync::OnceLock;

use super::repo_root;

/// The size-S checksum of every workload, pinned from their native builds
/// in `workloads/checksums-S.txt` (written by `workloads/pin-checksums.sh`).
pub fn pinned_checksums() -> &'static [(String, String)] {
    static PINNED: OnceLock<Vec<(String, String)>> = OnceLock::new();
    PINNED.get_or_init(|| {
        let path = repo_root().join("workloads/checksums-S.txt");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [name, sum] => (name.to_string(), sum.to_string()),
                _ => panic!("{}: malformed line {l:?}", path.display()),
            })
            .collect()
    })
}

/// The pinned size-S checksum of workload `name`.
pub fn pinned_checksum(name: &str) -> &'static str {
    pinned_checksums()
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, sum)| sum.as_str())
        .unwrap_or_else(|| {
            panic!("workloads/checksums-S.txt has no {name}: run workloads/pin-checksums.sh")
        })
}

/// The value of the last `checksum: ` line of a workload's stdout.
pub fn checksum_of(stdout: &[u8]) -> Option<String> {
    text(stdout)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("checksum: "))
        .map(|s| s.trim().to_string())
}

/// A workload run that must have passed its own checks: exit status 0, no
/// `VERIFICATION FAILED`, and, at size S (`pinned` is the workload name),
/// the checksum pinned from the native build.
pub fn assert_verified(what: &str, out: &Output, pinned: Option<&str>) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.code() == Some(0) && !stderr.contains("VERIFICATION FAILED"),
        "{what}: the run failed its own verification ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    if let Some(name) = pinned {
        let want = pinned_checksum(name);
        assert_eq!(
            checksum_of(&out.stdout).as_deref(),
            Some(want),
            "{what}: checksum differs from the one pinned from the native build \
             (workloads/checksums-S.txt)\n--- stdout\n{stdout}"
        );
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every regular file under `dir`, with its contents, sorted by path.
pub fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        let mut es: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        es.sort();
        for p in es {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                walk(root, &p, out);
            } else if m.is_file() {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out
}
