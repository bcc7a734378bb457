//! Finding and running the roam builds and workloads.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// A build of roam for one ISA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    X86_64,
    Aarch64,
    Riscv64,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::X86_64 => "x86_64",
            Isa::Aarch64 => "aarch64",
            Isa::Riscv64 => "riscv64",
        }
    }
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crate lives at crates/roam-cli")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                repo_root().join(p)
            }
        })
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The workload module, built by `workloads/build.sh`.
pub fn workload(name: &str) -> PathBuf {
    let p = repo_root()
        .join("target/workloads")
        .join(format!("{name}.wasm"));
    assert!(
        p.exists(),
        "{} is missing: run workloads/build.sh (or scripts/test.sh)",
        p.display()
    );
    p
}

/// A cache directory shared by every test of this run, so each module is
/// compiled once per ISA.
pub fn cache_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = target_dir().join("test-cache");
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// A command that runs roam on `isa` (natively, or under qemu-user).
pub fn roam(isa: Isa) -> Command {
    let mut cmd = match isa {
        Isa::X86_64 => Command::new(env!("CARGO_BIN_EXE_roam")),
        Isa::Aarch64 | Isa::Riscv64 => {
            let (triple, qemu, sysroot) = match isa {
                Isa::Aarch64 => (
                    "aarch64-unknown-linux-gnu",
                    "qemu-aarch64",
                    "/usr/aarch64-linux-gnu",
                ),
                _ => (
                    "riscv64gc-unknown-linux-gnu",
                    "qemu-riscv64",
                    "/usr/riscv64-linux-gnu",
                ),
            };
            let bin = target_dir().join(triple).join("release/roam");
            assert!(
                bin.exists(),
                "{} is missing: run scripts/build-all.sh (or scripts/test.sh)",
                bin.display()
            );
            let mut c = Command::new(qemu);
            c.arg("-L").arg(sysroot).arg(bin);
            c
        }
    };
    cmd.env("ROAM_CACHE_DIR", cache_dir())
        .env_remove("ROAM_LOG");
    cmd.stdin(Stdio::null());
    cmd
}

/// Run and capture, with a readable failure (naming the package when the
/// program itself is missing, e.g. qemu-user).
pub fn output(mut cmd: Command) -> Output {
    cmd.output().unwrap_or_else(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "; install it (scripts/setup.sh installs qemu-user and the cross toolchains)"
        } else {
            ""
        };
        panic!("cannot run {cmd:?}: {e}{hint}")
    })
}

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
