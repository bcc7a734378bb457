//! One rule for tests that need something roam does not build itself
//! (`wasm-opt`, `clang-16`, `gcc`, a Rust target, userfaultfd, qemu-user).
//!
//! On a developer's machine such a test may skip, printing why, so that the
//! rest of the suite stays useful without the whole toolchain. Under CI a
//! skip would be a green test that tested nothing, so there the same test
//! fails and names the tool and how to install it. "Under CI" means the `CI`
//! environment variable is set to anything but empty, `false` or `0`, as CI
//! services set it and as `scripts/test.sh` exports it.
//!
//! It also holds [`resp`], a RESP client and a `redis-benchmark` runner for
//! the tests and benchmarks of Redis-protocol cells, and [`etcd`], a real
//! etcd server started and stopped by the tests of the cluster store, and
//! [`real`], the manifest of the real-program suite, and [`WORKLOADS`],
//! the names of roam's own twelve.
//!
//! Used by tests and benchmarks only.

#![deny(missing_docs)]

use std::ffi::OsStr;
use std::fmt::Display;

pub mod etcd;
pub mod real;
pub mod resp;

/// roam's own workloads (`workloads/`, `docs/workloads.md`), in the order
/// tables and tests list them; `dirty` and `kvserver` are tools, not
/// workloads.
pub const WORKLOADS: [&str; 12] = [
    "ep",
    "is",
    "cg",
    "mg",
    "kmeans",
    "matmul",
    "pca",
    "linpack",
    "dhrystone",
    "filework",
    "recurse",
    "interp",
];

/// Something a test needs that may be missing, and how to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// What is missing, as a user would look for it.
    pub name: &'static str,
    /// How to install or enable it.
    pub install: &'static str,
}

/// Binaryen's optimiser, which runs the Asyncify pass.
pub const WASM_OPT: Tool = Tool {
    name: "wasm-opt (Binaryen)",
    install: "apt-get install binaryen (or run scripts/setup.sh)",
};

/// clang 16 with wasi-libc, for C programs built to WASI.
pub const CLANG_WASI: Tool = Tool {
    name: "clang-16 with wasi-libc",
    install: "apt-get install clang-16 lld-16 wasi-libc libclang-rt-16-dev-wasm32 (or run scripts/setup.sh)",
};

/// The host C compiler, for native reference builds.
pub const GCC: Tool = Tool {
    name: "gcc",
    install: "apt-get install build-essential (or run scripts/setup.sh)",
};

/// rustc's `wasm32-wasip1` target.
pub const RUST_WASM32: Tool = Tool {
    name: "the Rust target wasm32-wasip1",
    install: "rustup target add wasm32-wasip1 (or run scripts/setup.sh)",
};

/// userfaultfd, for post-copy and write-protect dirty tracking.
pub const USERFAULTFD: Tool = Tool {
    name: "userfaultfd",
    install: "run on Linux 5.7 or later (write-protect needs it) as root, with CAP_SYS_PTRACE, \
              or with sysctl vm.unprivileged_userfaultfd=1; it is absent under qemu-user and \
              often blocked by container seccomp profiles",
};

/// A cgroup `cpu` controller the node may write to, for cells' CPU
/// groups.
pub const CGROUP_CPU: Tool = Tool {
    name: "a writable cgroup cpu controller (cgroup v2 with cpu in cgroup.controllers, or a \
           v1 cpu hierarchy)",
    install: "run as root, or in a cgroup delegated to the user running the tests (systemd \
              Delegate=yes), on a host whose cgroup v2 has the cpu controller enabled or that \
              mounts the v1 cpu controller",
};

/// The native builds of the workloads made by `workloads/build.sh`.
pub const NATIVE_WORKLOADS: Tool = Tool {
    name: "the native x86-64 workload builds (target/workloads/native)",
    install: "install gcc and run workloads/build.sh (scripts/test.sh does)",
};

/// Debian's `redis-benchmark` and `redis-cli`, the Redis clients nobody
/// here wrote.
pub const REDIS_TOOLS: Tool = Tool {
    name: "redis-benchmark and redis-cli",
    install: "apt-get install redis-tools (or run scripts/setup.sh)",
};

/// Debian's `chromium`, the real browser the planner's dashboard is
/// tested in (headless).
pub const CHROMIUM: Tool = Tool {
    name: "chromium (the headless browser)",
    install: "apt-get install chromium (or run scripts/setup.sh)",
};

/// `len` deterministic bytes from a xorshift generator seeded with
/// `seed`: test data no operation produces by accident.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Whether the tests run under CI: `CI` is set, non-empty, and neither
/// `false` nor `0`.
pub fn in_ci() -> bool {
    ci_from(std::env::var_os("CI").as_deref())
}

fn ci_from(value: Option<&OsStr>) -> bool {
    match value.and_then(OsStr::to_str) {
        None => value.is_some_and(|v| !v.is_empty()),
        Some(v) => !matches!(v.trim(), "" | "0" | "false" | "FALSE" | "False"),
    }
}

/// `tool` is missing, for the reason `why`: under CI this panics (the test
/// fails, naming the tool and how to install it); elsewhere it prints that
/// the test is skipped, and the caller returns.
#[track_caller]
pub fn missing(tool: &Tool, why: impl Display) {
    if in_ci() {
        panic!(
            "{} is required when CI is set, but it is not available ({why}); install it: {}",
            tool.name, tool.install
        );
    }
    eprintln!(
        "skipping: {} is not available ({why}); install it: {} (with CI=true this fails)",
        tool.name, tool.install
    );
}

/// Whether `program --version` runs and succeeds.
pub fn have(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_is_any_value_but_empty_false_or_zero() {
        let ci = |v: &str| ci_from(Some(OsStr::new(v)));
        assert!(!ci_from(None));
        assert!(!ci(""));
        assert!(!ci("0"));
        assert!(!ci("false"));
        assert!(ci("true"));
        assert!(ci("1"));
        assert!(ci("yes"));
    }

    #[test]
    fn have_finds_a_program_and_not_a_missing_one() {
        assert!(!have("roam-testkit-no-such-program"));
    }
}
