//! Finding and running the roam builds and workloads: every test starts
//! `roam` through [`roam`], so that the cross builds run under qemu-user and
//! all runs share one module cache.

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
    // Nodes here are killed outright, hundreds of them: with cgroups each
    // would leave an empty group in the host's tree until a node of its
    // name starts again. Only the tests of CPU groups (`cpu.rs`) use
    // them, asking with --cell-cpu-control and removing what they made.
    cmd.env("ROAM_CACHE_DIR", cache_dir())
        .env("ROAM_CELL_CPU_CONTROL", "nice")
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
