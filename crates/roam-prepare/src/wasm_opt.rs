//! Run Binaryen's `wasm-opt` to apply Asyncify and optimise.
//!
//! Asyncify is the transformation that makes the call stack capturable:
//! every function that may (transitively) reach an unwinding import learns
//! to save its locals to linear memory and later resume from them. Binaryen
//! is the reference implementation, so roam drives the `wasm-opt` binary
//! rather than reimplementing it. Files go through a private temporary
//! directory that is removed on every path, success or failure.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::pipeline::PrepareError;
use crate::{OptLevel, PrepareOptions, ASYNC_IMPORTS};

/// Environment variable naming the `wasm-opt` binary to use.
pub(crate) const ENV_WASM_OPT: &str = "ROAM_WASM_OPT";

/// Features that current clang and rustc (wasm32-wasip1) emit by default.
/// `wasm-opt` 108 must be told about each explicitly.
pub const FEATURE_FLAGS: &[&str] = &[
    "--enable-bulk-memory",
    "--enable-sign-ext",
    "--enable-nontrapping-float-to-int",
    "--enable-mutable-globals",
    "--enable-reference-types",
    "--enable-multivalue",
    "--enable-simd",
];

/// The feature flag of threaded programs (shared memory and atomics),
/// passed only for them so that every other module's output stays the
/// same bytes (the flag adds `threads` to Binaryen's features section).
pub(crate) const THREADS_FLAG: &str = "--enable-threads";

/// A located `wasm-opt` and its version line.
#[derive(Debug, Clone)]
pub(crate) struct WasmOpt {
    path: PathBuf,
    /// e.g. `wasm-opt version 108`.
    pub version: String,
}

/// Find `wasm-opt`: the explicit path, else `$ROAM_WASM_OPT`, else `PATH`.
pub(crate) fn locate(explicit: Option<&Path>) -> Result<WasmOpt, PrepareError> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os(ENV_WASM_OPT) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from("wasm-opt"),
        },
    };
    let output = Command::new(&path)
        .arg("--version")
        .output()
        .map_err(|source| {
            if source.kind() == ErrorKind::NotFound {
                PrepareError::WasmOptMissing { path: path.clone() }
            } else {
                PrepareError::WasmOptSpawn {
                    path: path.clone(),
                    source,
                }
            }
        })?;
    if !output.status.success() {
        return Err(PrepareError::WasmOptFailed {
            path,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let version = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Ok(WasmOpt { path, version })
}

/// `asyncify-imports` argument: `module.name` pairs joined by commas.
/// The waits are left out: only threaded programs have them, and those are
/// never given to Asyncify (`PrepareError::ThreadsNeedRecords`).
pub(crate) fn asyncify_imports() -> String {
    let list: Vec<String> = ASYNC_IMPORTS
        .iter()
        .filter(|(_, n)| ![crate::WAIT32_FUNC, crate::WAIT64_FUNC].contains(n))
        .map(|(m, n)| format!("{m}.{n}"))
        .collect();
    format!("--pass-arg=asyncify-imports@{}", list.join(","))
}

/// Functions named for Asyncify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AsyncifyList {
    /// Instrument these and no others (`asyncify-onlylist`).
    Only(Vec<String>),
    /// Instrument what Asyncify's own analysis picks, except these, and
    /// take calls of these as never unwinding (`asyncify-removelist`).
    Remove(Vec<String>),
}

impl AsyncifyList {
    pub(crate) fn names(&self) -> &[String] {
        match self {
            AsyncifyList::Only(n) | AsyncifyList::Remove(n) => n,
        }
    }

    /// The `--pass-arg` naming the list in `file`. `@@file`: the list is
    /// read from the file (a response file), so a program with thousands of
    /// functions does not hit the limit on the length of a command line.
    /// Binaryen 108 splits it on commas only.
    pub(crate) fn pass_arg(&self, file: &Path) -> String {
        let which = match self {
            AsyncifyList::Only(_) => "onlylist",
            AsyncifyList::Remove(_) => "removelist",
        };
        format!("--pass-arg=asyncify-{which}@@{}", file.display())
    }
}

/// Arguments after the input file name, up to but excluding `-o <out>`,
/// for the run that applies Asyncify. `list` is the `--pass-arg` naming the
/// functions Asyncify instruments or leaves alone, if any. With `optimise`, the optimiser
/// runs in the same invocation; without, it runs later
/// ([`optimise_arguments`]) and this run only tells Asyncify the level, so
/// that Asyncify still simplifies its own code as it would.
pub(crate) fn asyncify_arguments(
    opts: &PrepareOptions,
    list: Option<String>,
    optimise: bool,
) -> Vec<String> {
    let mut args: Vec<String> = FEATURE_FLAGS.iter().map(|s| s.to_string()).collect();
    // walrus writes every `if` with an (often empty) `else` arm. Asyncify
    // runs before any optimisation and instruments that structure as it
    // finds it; the extra arms keep many more locals alive across its
    // save/restore code, which the optimiser afterwards cannot undo (the
    // main function of `matmul` ends with 86 locals instead of 57). Vacuum
    // removes the empty arms first, so Asyncify sees what the compiler
    // wrote.
    args.push("--vacuum".into());
    args.push("--asyncify".into());
    args.push(asyncify_imports());
    args.extend(list);
    if optimise {
        if let Some(flag) = opts.opt_level.flag() {
            args.push(flag.into());
        }
    } else {
        args.extend(levels(opts.opt_level));
    }
    if !opts.strip_names {
        args.push("--debuginfo".into());
    }
    args
}

/// Binaryen's `-O2` pipeline (version 108's, pass for pass) without its
/// last two passes, `generate-stack-ir` and `optimize-stack-ir`.
///
/// Why: Stack IR only changes how the code is written down (a `local.set`
/// and `local.get` pair becomes a value left on the stack), and Cranelift
/// builds the same SSA values from either form, so it changes nothing in
/// the machine code. Yet it took a quarter of the run on golua (3 of 11 s),
/// and the capture transform parses and writes the module again anyway.
/// The output differs from `-O2`'s by a few bytes of encoding.
const O2_PASSES: &[&str] = &[
    "duplicate-function-elimination",
    "memory-packing",
    "once-reduction",
    "dce",
    "remove-unused-names",
    "remove-unused-brs",
    "remove-unused-names",
    "optimize-instructions",
    "pick-load-signs",
    "precompute",
    "code-pushing",
    "simplify-locals-nostructure",
    "vacuum",
    "reorder-locals",
    "remove-unused-brs",
    "coalesce-locals",
    "simplify-locals",
    "vacuum",
    "reorder-locals",
    "coalesce-locals",
    "reorder-locals",
    "vacuum",
    "merge-blocks",
    "remove-unused-brs",
    "remove-unused-names",
    "merge-blocks",
    "precompute",
    "optimize-instructions",
    "rse",
    "vacuum",
    "dae-optimizing",
    "inlining-optimizing",
    "duplicate-function-elimination",
    "duplicate-import-elimination",
    "simplify-globals-optimizing",
    "remove-unused-module-elements",
    "directize",
];

/// `wasm-opt`'s optimise and shrink levels for `level`, without running
/// its pipeline: the passes given alongside use them.
fn levels(level: OptLevel) -> [String; 4] {
    let (opt, shrink) = level.levels();
    [
        "-ol".into(),
        opt.to_string(),
        "-s".into(),
        shrink.to_string(),
    ]
}

/// The passes of [`O2_PASSES`] that the capture by records leaves out of
/// its one run.
///
/// Why: the input's own compiler inlined what pays already (clang and
/// rustc at `-O2` and up), so what Binaryen inlines here is mostly
/// functions with one caller that the compiler judged cold, and every
/// function it inlines into goes through the whole function pipeline
/// again. On the Rust program of the real-program suite that was 4.6 s of
/// a 10 s prepare (`inlining-optimizing`), for no run time this machine
/// can measure (`docs/notes/2026-11-29-prepare-without-inlining.md`).
/// Without inlining, `dae-optimizing` (which drops arguments that every
/// caller passes the same) finds little more than the compiler did.
/// Asyncify's path, the fallback, keeps them: it was not measured
/// without.
const RECORDS_SKIP: &[&str] = &["dae-optimizing", "inlining-optimizing"];

/// Arguments for the run that only optimises (after `spill.rs`, or the
/// only run of the capture by records, `records`). At `O2`, the default,
/// the passes are spelled out ([`O2_PASSES`], less [`RECORDS_SKIP`] for
/// the capture by records); other levels are Binaryen's own.
pub(crate) fn optimise_arguments(opts: &PrepareOptions, records: bool) -> Vec<String> {
    let mut args: Vec<String> = FEATURE_FLAGS.iter().map(|s| s.to_string()).collect();
    match opts.opt_level {
        OptLevel::O2 => {
            args.extend(levels(opts.opt_level));
            args.extend(
                O2_PASSES
                    .iter()
                    .filter(|p| !(records && RECORDS_SKIP.contains(p)))
                    .map(|p| format!("--{p}")),
            );
        }
        level => args.extend(level.flag().map(String::from)),
    }
    if !opts.strip_names {
        args.push("--debuginfo".into());
    }
    args
}

/// Run `wasm-opt` on `module` with `args(list)`, where `list` is the
/// argument naming a file that holds `names` (comma-separated), if given.
pub(crate) fn run(
    tool: &WasmOpt,
    module: &[u8],
    args: impl FnOnce(Option<String>) -> Vec<String>,
    names: Option<&AsyncifyList>,
) -> Result<Vec<u8>, PrepareError> {
    let dir = tempfile::Builder::new()
        .prefix("roam-prepare-")
        .tempdir()
        .map_err(PrepareError::TempFile)?;
    let input = dir.path().join("in.wasm");
    let output = dir.path().join("out.wasm");
    std::fs::write(&input, module).map_err(PrepareError::TempFile)?;
    let list = match names {
        Some(list) => {
            let path = dir.path().join("asyncify-list.txt");
            std::fs::write(&path, list.names().join(",")).map_err(PrepareError::TempFile)?;
            Some(list.pass_arg(&path))
        }
        None => None,
    };
    let result = limited(
        Command::new(&tool.path)
            .arg(&input)
            .args(args(list))
            .arg("-o")
            .arg(&output),
        &tool.path,
        std::time::Duration::from_secs(limit_from_env(ENV_TIME_LIMIT, DEFAULT_TIME_LIMIT_S)),
        limit_from_env(ENV_MEMORY_LIMIT, DEFAULT_MEMORY_LIMIT),
    )?;
    if !result.status.success() {
        return Err(PrepareError::WasmOptFailed {
            path: tool.path.clone(),
            status: result.status.to_string(),
            stderr: String::from_utf8_lossy(&result.stderr).trim().to_string(),
        });
    }
    let bytes = std::fs::read(&output).map_err(PrepareError::TempFile)?;
    dir.close().map_err(PrepareError::TempFile)?;
    Ok(bytes)
}

/// Seconds a `wasm-opt` run may take ([`DEFAULT_TIME_LIMIT_S`]).
pub const ENV_TIME_LIMIT: &str = "ROAM_WASM_OPT_TIME_LIMIT";
/// Bytes of address space a `wasm-opt` run may map
/// ([`DEFAULT_MEMORY_LIMIT`]).
pub const ENV_MEMORY_LIMIT: &str = "ROAM_WASM_OPT_MEMORY_LIMIT";
/// Default of [`ENV_TIME_LIMIT`]: 10 minutes (the largest module of the
/// real-program suite takes about 12 s).
pub const DEFAULT_TIME_LIMIT_S: u64 = 600;
/// Default of [`ENV_MEMORY_LIMIT`]: 16 GiB of address space (`RLIMIT_AS`:
/// mapped, not resident; Binaryen's threads reserve stacks).
pub const DEFAULT_MEMORY_LIMIT: u64 = 16 << 30;

fn limit_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&v: &u64| v > 0)
        .unwrap_or(default)
}

/// Run `cmd` to its end within `time` and `memory` bytes of address
/// space: a module
/// from an untrusted upload must not keep a node's CPU or memory for ever
/// (a node prepares what it is sent). Its output is collected as
/// `Command::output` does.
fn limited(
    cmd: &mut Command,
    path: &Path,
    time: std::time::Duration,
    memory: u64,
) -> Result<std::process::Output, PrepareError> {
    use std::io::Read;
    use std::process::Stdio;
    let spawn = |source| PrepareError::WasmOptSpawn {
        path: path.to_path_buf(),
        source,
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    // Set from outside right after the spawn, without code between fork
    // and exec; the child has only begun to read its input by then.
    let pid = rustix::process::Pid::from_child(&child);
    let lim = rustix::process::Rlimit {
        current: Some(memory),
        maximum: Some(memory),
    };
    if let Err(e) = rustix::process::prlimit(Some(pid), rustix::process::Resource::As, lim) {
        tracing::warn!("cannot limit wasm-opt's memory: {e}");
    }
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut b);
            }
            b
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(spawn)? {
            break s;
        }
        if start.elapsed() > time {
            let _ = child.kill();
            let _ = child.wait();
            return Err(PrepareError::WasmOptLimit {
                path: path.to_path_buf(),
                what: format!("it ran longer than {} s", time.as_secs()),
                env: ENV_TIME_LIMIT,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    // Out of address space, Binaryen dies by an allocation failure.
    let text = String::from_utf8_lossy(&stderr);
    if !status.success() && (text.contains("bad_alloc") || text.contains("std::bad_alloc")) {
        return Err(PrepareError::WasmOptLimit {
            path: path.to_path_buf(),
            what: format!("it ran out of its {} of address space", roam_human(memory)),
            env: ENV_MEMORY_LIMIT,
        });
    }
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// Bytes in GiB or MiB, for messages.
fn roam_human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
    } else {
        format!("{} MiB", b >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OptLevel;

    #[test]
    fn a_run_past_its_time_is_stopped_and_its_address_space_is_limited() {
        let sh = Path::new("sh");
        let t = std::time::Instant::now();
        let e = limited(
            Command::new(sh).args(["-c", "sleep 30"]),
            sh,
            std::time::Duration::from_millis(300),
            DEFAULT_MEMORY_LIMIT,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                PrepareError::WasmOptLimit {
                    env: ENV_TIME_LIMIT,
                    ..
                }
            ),
            "{e}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(10));
        let out = limited(
            Command::new(sh).args(["-c", "sleep 0.2; ulimit -v"]),
            sh,
            std::time::Duration::from_secs(10),
            1 << 30,
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1048576");
    }

    #[test]
    fn asyncify_imports_lists_every_async_import() {
        assert_eq!(
            asyncify_imports(),
            "--pass-arg=asyncify-imports@roam.migration_point,\
             wasi_snapshot_preview1.poll_oneoff,wasi_snapshot_preview1.fd_read,\
             wasi_snapshot_preview1.sock_accept,wasi_snapshot_preview1.sock_recv"
        );
    }

    #[test]
    fn optimisation_runs_after_asyncify() {
        let args = asyncify_arguments(
            &PrepareOptions {
                opt_level: OptLevel::O2,
                ..Default::default()
            },
            None,
            true,
        );
        let asyncify = args.iter().position(|a| a == "--asyncify").unwrap();
        let opt = args.iter().position(|a| a == "-O2").unwrap();
        assert!(opt > asyncify, "{args:?}");
        let vacuum = args.iter().position(|a| a == "--vacuum").unwrap();
        assert!(vacuum < asyncify, "empty arms go before Asyncify: {args:?}");
        assert!(args.contains(&"--debuginfo".to_string()));
        let stripped = asyncify_arguments(
            &PrepareOptions {
                strip_names: true,
                ..Default::default()
            },
            None,
            true,
        );
        assert!(!stripped.contains(&"--debuginfo".to_string()));
    }

    #[test]
    fn spilled_preparation_optimises_in_a_second_run() {
        let opts = PrepareOptions {
            opt_level: OptLevel::Os,
            ..Default::default()
        };
        let first = asyncify_arguments(&opts, None, false);
        assert!(first.contains(&"--asyncify".to_string()), "{first:?}");
        assert!(!first.contains(&"-Os".to_string()), "{first:?}");
        let levels = first.iter().position(|a| a == "-ol").unwrap();
        assert_eq!(first[levels..levels + 4], ["-ol", "2", "-s", "1"]);
        let second = optimise_arguments(&opts, false);
        assert!(second.contains(&"-Os".to_string()), "{second:?}");
        assert!(!second.contains(&"--asyncify".to_string()), "{second:?}");
        assert!(second.contains(&"--enable-simd".to_string()), "{second:?}");
    }

    #[test]
    fn o2_runs_binaryens_passes_without_stack_ir() {
        let args = optimise_arguments(&PrepareOptions::default(), false);
        assert!(!args.iter().any(|a| a == "-O2"), "{args:?}");
        assert!(!args.iter().any(|a| a.contains("stack-ir")), "{args:?}");
        let levels = args.iter().position(|a| a == "-ol").unwrap();
        assert_eq!(args[levels..levels + 4], ["-ol", "2", "-s", "0"]);
        for pass in ["--inlining-optimizing", "--coalesce-locals", "--directize"] {
            assert!(args.iter().any(|a| a == pass), "{pass}: {args:?}");
        }
    }

    #[test]
    fn the_capture_by_records_runs_o2_without_inlining() {
        let all = optimise_arguments(&PrepareOptions::default(), false);
        let records = optimise_arguments(&PrepareOptions::default(), true);
        for pass in ["--inlining-optimizing", "--dae-optimizing"] {
            assert!(!records.iter().any(|a| a == pass), "{pass}: {records:?}");
        }
        let rest: Vec<_> = all
            .iter()
            .filter(|a| !["--inlining-optimizing", "--dae-optimizing"].contains(&a.as_str()))
            .collect();
        assert_eq!(rest, records.iter().collect::<Vec<_>>());
        // Other levels are Binaryen's own, for either run.
        let os = PrepareOptions {
            opt_level: OptLevel::Os,
            ..Default::default()
        };
        assert_eq!(
            optimise_arguments(&os, true),
            optimise_arguments(&os, false)
        );
    }

    #[test]
    fn onlylist_is_passed_as_a_response_file() {
        let list = AsyncifyList::Only(vec!["f".into()]);
        let args = asyncify_arguments(
            &PrepareOptions::default(),
            Some(list.pass_arg(Path::new("/tmp/x/asyncify-only.txt"))),
            true,
        );
        let remove = AsyncifyList::Remove(vec!["f".into()]);
        assert_eq!(
            remove.pass_arg(Path::new("/tmp/r")),
            "--pass-arg=asyncify-removelist@@/tmp/r"
        );
        assert!(
            args.contains(&"--pass-arg=asyncify-onlylist@@/tmp/x/asyncify-only.txt".to_string()),
            "{args:?}"
        );
        let asyncify = args.iter().position(|a| a == "--asyncify").unwrap();
        let only = args.iter().position(|a| a.contains("onlylist")).unwrap();
        assert!(only > asyncify);
    }

    #[test]
    fn missing_tool_says_how_to_install_it() {
        let err = locate(Some(Path::new("/nonexistent/wasm-opt"))).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, PrepareError::WasmOptMissing { .. }));
        assert!(msg.contains("apt-get install binaryen"), "{msg}");
        assert!(msg.contains(ENV_WASM_OPT), "{msg}");
    }

    #[test]
    fn failing_tool_reports_its_stderr() {
        // `false` exits non-zero without output; a shell script gives stderr.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("fake-wasm-opt");
        std::fs::write(&script, "#!/bin/sh\necho 'boom: bad input' >&2\nexit 3\n").unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&script, perms).unwrap();
        let err = locate(Some(&script)).unwrap_err();
        assert!(err.to_string().contains("boom: bad input"), "{err}");
    }
}
