//! `plain-wasmtime`: the "plain wasmtime" baseline of the benchmarks.
//!
//! Why it exists: roam's overhead must be measured against the engine it is
//! built on, configured the way an ordinary embedder would configure it. This
//! runs an *unprepared* module on wasmtime with the stock `wasmtime-wasi`
//! preview-1 implementation, Cranelift at `OptLevel::Speed` (as roam uses),
//! and no epoch interruption (roam needs it; a plain embedder does not). The
//! compiled code is cached on disk, keyed by blake3 of the module bytes and
//! the engine's compatibility hash, so compile time is out of the measurement
//! after the first run, exactly as with roam's own compile cache.
//!
//! Usage: `plain-wasmtime [--dir HOST::GUEST]... MODULE [ARGS...]`. MODULE may
//! also be a prepared module (its migration point is a no-op here), including
//! one prepared with `--capture eh-proto` (exceptions are on, as they are by
//! default in wasmtime 48 built with GC support).
//! The exit status is the program's. `PLAIN_WASMTIME_FUNCTION_ALIGN=N`
//! compiles with every function aligned to 2^N bytes, to measure a module
//! under several code layouts. `PLAIN_WASMTIME_PERFMAP=1` writes a perf map
//! so that `perf record` names the module's functions.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use wasmtime::{Config, Engine, Linker, Module, OptLevel, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

struct Args {
    dirs: Vec<(PathBuf, String)>,
    module: PathBuf,
    argv: Vec<String>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> anyhow::Result<Args> {
    let mut dirs = Vec::new();
    loop {
        let Some(a) = it.next() else {
            bail!("usage: plain-wasmtime [--dir HOST::GUEST]... MODULE [ARGS...]");
        };
        if a == "--dir" {
            let d = it.next().context("--dir needs HOST::GUEST")?;
            let (h, g) = d
                .split_once("::")
                .with_context(|| format!("--dir {d}: expected HOST::GUEST"))?;
            dirs.push((PathBuf::from(h), g.to_string()));
        } else {
            let module = PathBuf::from(a);
            let name = module
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let argv = std::iter::once(name).chain(it).collect();
            return Ok(Args { dirs, module, argv });
        }
    }
}

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PLAIN_WASMTIME_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("roam-bench-plain")
}

/// Load the module from the on-disk cache, or compile and cache it.
fn load(engine: &Engine, path: &Path) -> anyhow::Result<Module> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let key = format!("{}-{:016x}", blake3::hash(&bytes).to_hex(), h.finish());
    let dir = cache_dir();
    let file = dir.join(format!("{key}.cwasm"));
    if file.exists() {
        // SAFETY: the file was written by `Module::serialize` below for an
        // engine with the same compatibility hash (part of the key), in a
        // cache directory only this tool writes; wasmtime additionally checks
        // the header and refuses incompatible code.
        match unsafe { Module::deserialize_file(engine, &file) } {
            Ok(m) => return Ok(m),
            Err(e) => eprintln!("plain-wasmtime: recompiling ({e})"),
        }
    }
    let module = Module::new(engine, &bytes)?;
    std::fs::create_dir_all(&dir).ok();
    let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, module.serialize()?).is_ok() {
        std::fs::rename(&tmp, &file).ok();
    }
    Ok(module)
}

fn run(a: Args) -> anyhow::Result<i32> {
    let mut config = Config::new();
    config.cranelift_opt_level(OptLevel::Speed);
    // wasmtime 48's default (with its `gc` feature), stated for the reader.
    config.wasm_exceptions(true);
    // A prepared module's frames are larger (Asyncify's locals); deep
    // recursion in one run here for profiling needs the stack roam gives.
    if let Some(bytes) = std::env::var("PLAIN_WASMTIME_MAX_STACK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        config.max_wasm_stack(bytes);
        config.async_stack_size(bytes + (1 << 20));
    }
    // Where a hot loop falls within its cache lines moves a tight kernel's
    // time by up to 15 % (docs/prepare.md); Cranelift does not align loops.
    // Running the same module at several function alignments (log2 of the
    // bytes: 4, 5, 6) measures across code layouts instead of at one.
    if let Ok(log2) = std::env::var("PLAIN_WASMTIME_FUNCTION_ALIGN") {
        match log2.parse::<u8>() {
            // SAFETY: a Cranelift setting that only pads the start of each
            // function; the engine's compatibility hash includes it, so
            // cached code compiled under another value is not reused.
            Ok(n) if n <= 12 => unsafe {
                config.cranelift_flag_set("log2_min_function_alignment", &n.to_string());
            },
            _ => bail!(
                "PLAIN_WASMTIME_FUNCTION_ALIGN={log2}: expected log2 of a byte count, 0 to 12"
            ),
        }
    }
    // `perf record` then names the compiled functions (wasmtime writes
    // /tmp/perf-<pid>.map), to see where a prepared module spends its time.
    if std::env::var_os("PLAIN_WASMTIME_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = Engine::new(&config)?;
    let module = load(&engine, &a.module)?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |c| c)?;
    // A prepared module imports this; with its flag never raised it is never
    // called. Defining it lets a prepared module run here too, which splits
    // what `roam prepare` costs from what roam's runtime costs.
    linker.func_wrap("roam", "migration_point", || {})?;
    let mut b = WasiCtxBuilder::new();
    b.inherit_stdio().args(&a.argv);
    for (host, guest) in &a.dirs {
        b.preopened_dir(host, guest, FsPerms::ReadWrite)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("cannot preopen {}", host.display()))?;
    }
    let mut store = Store::new(&engine, b.build_p1());
    let instance = linker.instantiate(&mut store, &module)?;
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
    match start.call(&mut store, ()) {
        Ok(()) => Ok(0),
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(exit) => Ok(exit.0),
            None => Err(e.into()),
        },
    }
}

fn main() {
    let code = match parse_args(std::env::args().skip(1)).and_then(run) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("plain-wasmtime: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> anyhow::Result<Args> {
        parse_args(v.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_dirs_module_and_guest_argv() {
        let a = args(&["--dir", "/tmp/x::/data", "dir/ep.wasm", "L", "y"]).unwrap();
        assert_eq!(a.dirs, vec![(PathBuf::from("/tmp/x"), "/data".to_string())]);
        assert_eq!(a.module, PathBuf::from("dir/ep.wasm"));
        assert_eq!(a.argv, vec!["ep.wasm", "L", "y"]);
    }

    #[test]
    fn rejects_missing_module_and_bad_dir() {
        assert!(args(&[]).is_err());
        assert!(args(&["--dir", "nocolons", "m.wasm"]).is_err());
        assert!(args(&["--dir"]).is_err());
    }

    #[test]
    fn runs_a_module_and_reports_its_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        let wasm = wat::parse_str(
            r#"(module
                (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
                (memory (export "memory") 1)
                (func (export "_start") (call $exit (i32.const 7))))"#,
        )
        .unwrap();
        let path = dir.path().join("m.wasm");
        std::fs::write(&path, wasm).unwrap();
        std::env::set_var("PLAIN_WASMTIME_CACHE", dir.path().join("cache"));
        let a = Args {
            dirs: vec![],
            module: path.clone(),
            argv: vec!["m".into()],
        };
        assert_eq!(run(a).unwrap(), 7);
        // Second run comes from the cache and behaves the same.
        let a = Args {
            dirs: vec![],
            module: path,
            argv: vec!["m".into()],
        };
        assert_eq!(run(a).unwrap(), 7);
        assert_eq!(
            std::fs::read_dir(dir.path().join("cache")).unwrap().count(),
            1
        );
    }
}
