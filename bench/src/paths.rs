//! Where the benchmarks find their inputs and put their scratch files.
//!
//! Why it exists: the workloads and native baselines are built into the
//! workspace's `target/` by `workloads/build.sh`, the `roam` and
//! `plain-wasmtime` executables sit next to `roam-bench` itself, and
//! prepared modules, compile caches and sandbox directories go to
//! `target/bench/` so that benchmark runs never touch a user's own cache.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Input and scratch locations.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `target/workloads` (wasm modules and `native/<arch>/` baselines).
    pub workloads: PathBuf,
    /// Directory holding `roam` and `plain-wasmtime`.
    pub bin_dir: PathBuf,
    /// `target/bench`: prepared modules, caches, sandbox directories.
    pub scratch: PathBuf,
}

impl Paths {
    /// Locate everything relative to the running executable
    /// (`<target>/release/roam-bench`).
    pub fn discover() -> anyhow::Result<Paths> {
        let exe = std::env::current_exe().context("cannot locate roam-bench itself")?;
        let bin_dir = exe
            .parent()
            .context("executable has no directory")?
            .to_path_buf();
        let target = bin_dir
            .parent()
            .context("executable is not in a target dir")?;
        let workloads = std::env::var_os("ROAM_BENCH_WORKLOADS")
            .map(PathBuf::from)
            .unwrap_or_else(|| target.join("workloads"));
        Ok(Paths {
            workloads,
            scratch: target.join("bench"),
            bin_dir,
        })
    }

    /// The wasm module of a workload, which must exist.
    pub fn wasm(&self, name: &str) -> anyhow::Result<PathBuf> {
        let p = self.workloads.join(format!("{name}.wasm"));
        if !p.exists() {
            bail!("{} is missing: run workloads/build.sh first", p.display());
        }
        Ok(p)
    }

    /// The native baseline of a workload for `arch`, if built.
    pub fn native(&self, arch: &str, name: &str) -> Option<PathBuf> {
        Some(self.workloads.join("native").join(arch).join(name)).filter(|p| p.exists())
    }

    /// A sibling executable (`roam`, `plain-wasmtime`), which must exist.
    pub fn tool(&self, name: &str) -> anyhow::Result<PathBuf> {
        let p = self.bin_dir.join(name);
        if !p.exists() {
            let how = if name == "roam" {
                "cargo build --release -p roam-cli"
            } else {
                "cargo build --release --manifest-path bench/plain-wasmtime/Cargo.toml"
            };
            bail!("{} is missing: build it with `{how}`", p.display());
        }
        Ok(p)
    }

    /// roam built for `triple` (`aarch64-unknown-linux-gnu`), beside this
    /// build's target directory, which must exist.
    pub fn cross_roam(&self, triple: &str) -> anyhow::Result<PathBuf> {
        let p = self
            .bin_dir
            .parent()
            .context("executable is not in a target dir")?
            .join(triple)
            .join("release")
            .join("roam");
        if !p.exists() {
            bail!(
                "{} is missing: build it with `cargo build --release -p roam-cli --target {triple}`",
                p.display()
            );
        }
        Ok(p)
    }

    /// A fresh, empty directory under the scratch area.
    pub fn fresh_dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let d = self.scratch.join(name);
        if d.exists() {
            std::fs::remove_dir_all(&d).with_context(|| format!("cannot clear {}", d.display()))?;
        }
        std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        Ok(d)
    }
}

/// True when `out` exists and is newer than `input`.
pub fn newer(out: &Path, input: &Path) -> bool {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((m(out), m(input)), (Some(o), Some(i)) if o > i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(root: &Path) -> Paths {
        Paths {
            workloads: root.join("w"),
            bin_dir: root.join("bin"),
            scratch: root.join("s"),
        }
    }

    #[test]
    fn missing_inputs_are_errors_that_say_how_to_build_them() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        assert!(p.wasm("ep").unwrap_err().to_string().contains("build.sh"));
        assert!(p.tool("roam").unwrap_err().to_string().contains("roam-cli"));
        let e = p.tool("plain-wasmtime").unwrap_err().to_string();
        assert!(e.contains("bench/plain-wasmtime/Cargo.toml"), "{e}");
        assert_eq!(p.native("x86_64", "ep"), None);
        std::fs::create_dir_all(d.path().join("w/native/x86_64")).unwrap();
        std::fs::write(d.path().join("w/native/x86_64/ep"), b"").unwrap();
        std::fs::write(d.path().join("w/ep.wasm"), b"").unwrap();
        assert!(p.native("x86_64", "ep").is_some());
        assert!(p.wasm("ep").is_ok());
    }

    #[test]
    fn fresh_dir_is_empty_and_newer_compares_mtimes() {
        let d = tempfile::tempdir().unwrap();
        let p = paths(d.path());
        let a = p.fresh_dir("x").unwrap();
        std::fs::write(a.join("f"), b"1").unwrap();
        let a = p.fresh_dir("x").unwrap();
        assert_eq!(std::fs::read_dir(&a).unwrap().count(), 0);
        assert!(!newer(&a.join("missing"), &a));
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(a.join("g"), b"1").unwrap();
        assert!(newer(&a.join("g"), &p.scratch));
    }
}
