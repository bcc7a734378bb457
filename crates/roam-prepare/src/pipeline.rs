//! The `prepare` pipeline: validate, instrument, Asyncify, check, stamp.
//!
//! Each step exists for one reason (see the crate docs); this module only
//! sequences them and checks the result, so that a module that leaves here
//! is either fully migratable or an error explains why not.

use std::path::PathBuf;

use wasmparser::{ExternalKind, Parser, Payload, Validator};

use crate::section::{append_section, read_section};
use crate::validate::SUPPORTED_FEATURES;
use crate::{
    check_prepared, instrument, spill, validate, wasm_opt, Capture, CheckError, PointCalls,
    PrepareOptions, RoamSection, SectionError, TurnCompares, ValidateError, ASYNCIFY_EXPORTS,
    FLAG_GLOBAL_EXPORT, MEMORY_EXPORT, SECTION_VERSION,
};

pub use crate::section::PointStats;

/// A prepared module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The prepared module, `roam` section included.
    pub bytes: Vec<u8>,
    /// The input was already prepared and is returned unchanged.
    pub already_prepared: bool,
    /// The module's `roam` section.
    pub section: RoamSection,
    /// Migration-point counts (same as `section.stats`).
    pub stats: PointStats,
    /// Loops moved into functions of their own; 0 for a module that was
    /// already prepared (not recorded in the section).
    pub outlined_loops: u32,
    /// Pure functions that give up and run again instead of unwinding
    /// (`pure.rs`); 0 for a module that was already prepared.
    pub rerun_functions: u32,
    /// Counted loops whose short runs take a copy without checks
    /// (`counted.rs`); 0 for a module that was already prepared.
    pub counted_loops: u32,
    /// `memory.fill` and `memory.copy` instructions that run in chunks when
    /// long (`bulk.rs`); 0 for a module that was already prepared.
    pub bulk_split: u32,
    /// Functions that return before a call that ends the program, which
    /// their callers make instead (`leave.rs`); 0 for a module that was
    /// already prepared.
    pub lifted_exits: usize,
    /// What `--capture eh` did (`eh/`); `None` otherwise.
    pub eh: Option<crate::EhStats>,
    /// Why capture by exceptions was asked for but the module was prepared
    /// with Asyncify instead ([`PrepareError::EhUnsupported`]).
    pub fallback: Option<String>,
}

/// Why `prepare` failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The input uses something roam cannot migrate, or is not wasm.
    #[error(transparent)]
    Validate(#[from] ValidateError),
    /// The input carries a `roam` section that cannot be read.
    #[error("the input looks prepared but its `roam` section is unreadable: {0}")]
    Section(#[from] SectionError),
    /// The input carries a `roam` section that does not match it.
    #[error(transparent)]
    NotPrepared(#[from] CheckError),
    /// The module could not be rewritten.
    #[error("rewriting the module failed: {0}; please report this with the input module")]
    Rewrite(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// An export name roam needs is already used by the program.
    #[error("the module already exports `{name}`, a name roam reserves; rename that export")]
    ExportNameTaken {
        /// The clashing export name.
        name: String,
    },
    /// No `wasm-opt` binary.
    #[error("`{}` not found; install Binaryen (`apt-get install binaryen`) or set ROAM_WASM_OPT to the wasm-opt binary", path.display())]
    WasmOptMissing {
        /// The path or name that was tried.
        path: PathBuf,
    },
    /// `wasm-opt` exists but could not be started.
    #[error("cannot run `{}`: {source}; check that it is executable or set ROAM_WASM_OPT", path.display())]
    WasmOptSpawn {
        /// The binary.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `wasm-opt` ran and failed.
    #[error("`{}` failed ({status}): {stderr}", path.display())]
    WasmOptFailed {
        /// The binary.
        path: PathBuf,
        /// Exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
    /// `wasm-opt` ran past its time or memory limit and was stopped.
    #[error(
        "`{}` was stopped: {what} (set {env} to allow more, if the module is trusted)",
        path.display()
    )]
    WasmOptLimit {
        /// The binary.
        path: PathBuf,
        /// Which limit, and its value.
        what: String,
        /// The environment variable that sets it.
        env: &'static str,
    },
    /// Temporary files for `wasm-opt` could not be written or read.
    #[error("temporary file for wasm-opt: {0}; check free space and permissions of the temp directory (TMPDIR)")]
    TempFile(#[source] std::io::Error),
    /// `wasm-opt` produced an invalid module.
    #[error(
        "wasm-opt produced an invalid module: {0}; try another Binaryen version via ROAM_WASM_OPT"
    )]
    OutputInvalid(#[source] wasmparser::BinaryReaderError),
    /// Capture by exceptions cannot handle the module (a reference live
    /// across a call that may unwind, a block with parameters around one,
    /// a blocking import in a table). [`prepare`] then falls back to
    /// Asyncify by itself, so callers only see this for `eh-points`.
    #[error(
        "capture by exceptions cannot handle this module: {0}; prepare it with --capture asyncify"
    )]
    EhUnsupported(String),
    /// A threaded program (shared memory) asked for Asyncify, or needs it
    /// because the capture by records cannot handle it. Each thread's
    /// stack is captured by records only.
    #[error(
        "this program uses threads (a shared memory), which roam captures by records only: {0}"
    )]
    ThreadsNeedRecords(String),
    /// The thread `prepare` works on could not be started.
    #[error("cannot start a thread to prepare the module on: {0}")]
    Thread(#[source] std::io::Error),
    /// An export the runtime relies on is missing from the output.
    #[error("the prepared module lacks the export `{name}`; the wasm-opt in use may not support Asyncify, try another via ROAM_WASM_OPT")]
    MissingExport {
        /// The missing export.
        name: String,
    },
}

/// Stack of the thread [`prepare`] works on. walrus and the passes here
/// walk a function's blocks recursively, a few hundred bytes per level, and
/// [`validate`] lets them nest [`crate::MAX_NESTING`] deep (more after
/// Asyncify's rewrite): more than a caller's thread may have (tokio gives
/// blocking work 2 MiB). Only the pages touched are ever used.
const PREPARE_STACK: usize = 64 << 20;

/// Prepare `input` for migration (see the crate docs for the steps).
///
/// Deterministic: the same input and options give the same bytes. An input
/// that already carries a `roam` section is returned unchanged if
/// [`check_prepared`] accepts it, and refused otherwise: a forged section is
/// never believed, and the module is not re-prepared around it either (its
/// author should prepare the original).
///
/// Runs on a thread of its own with a known stack ([`PREPARE_STACK`]), so
/// the caller's stack does not decide which modules can be prepared.
pub fn prepare(input: &[u8], opts: &PrepareOptions) -> Result<Prepared, PrepareError> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("roam-prepare".into())
            .stack_size(PREPARE_STACK)
            .spawn_scoped(scope, || prepare_here(input, opts))
            .map_err(PrepareError::Thread)?;
        worker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn prepare_here(input: &[u8], opts: &PrepareOptions) -> Result<Prepared, PrepareError> {
    if read_section(input)?.is_some() {
        let section = check_prepared(input)?;
        return Ok(Prepared {
            bytes: input.to_vec(),
            already_prepared: true,
            stats: section.stats,
            section,
            outlined_loops: 0,
            rerun_functions: 0,
            counted_loops: 0,
            bulk_split: 0,
            lifted_exits: 0,
            eh: None,
            fallback: None,
        });
    }
    let info = validate(input)?;
    if info.shared_memory && opts.capture != Capture::Returns {
        return Err(PrepareError::ThreadsNeedRecords(
            "prepare it with --capture returns (the default)".into(),
        ));
    }
    let tool = wasm_opt::locate(opts.wasm_opt.as_deref())?;
    let instrumented = instrument::instrument(input, &info, opts)?;
    let stats = instrumented.stats;
    let outlined_loops = instrumented.outlined;
    let rerun_functions = instrumented.rerun;
    let counted_loops = instrumented.counted;
    let bulk_split = instrumented.bulk;
    let lifted_exits = instrumented.lifted;
    let list = instrumented.list.as_ref();
    if opts.capture != Capture::Asyncify {
        return match prepare_eh(input, &info, opts, &tool, instrumented) {
            // Asyncify handles what exceptions cannot; the section says
            // which capture the module has.
            Err(PrepareError::EhUnsupported(why)) if info.shared_memory => {
                Err(PrepareError::ThreadsNeedRecords(why))
            }
            Err(PrepareError::EhUnsupported(why)) if opts.capture.by_records() => {
                let asyncify = PrepareOptions {
                    capture: Capture::Asyncify,
                    ..opts.clone()
                };
                let mut p = prepare_here(input, &asyncify)?;
                p.fallback = Some(why);
                Ok(p)
            }
            other => other,
        };
    }
    let mut bytes = match opts.point_calls {
        PointCalls::Plain => wasm_opt::run(
            &tool,
            &instrumented.bytes,
            |f| wasm_opt::asyncify_arguments(opts, f, true),
            list,
        )?,
        PointCalls::Spilled => {
            let asyncified = wasm_opt::run(
                &tool,
                &instrumented.bytes,
                |f| wasm_opt::asyncify_arguments(opts, f, false),
                list,
            )?;
            let (spilled, _) = spill::spill(&asyncified, !opts.strip_names)?;
            // `O0`: nothing to optimise, so no third run.
            match opts.opt_level.flag() {
                Some(_) => wasm_opt::run(
                    &tool,
                    &spilled,
                    |_| wasm_opt::optimise_arguments(opts, false),
                    None,
                )?,
                None => spilled,
            }
        }
    };
    if opts.turn_compares == TurnCompares::On {
        crate::compares::turn_compares(&mut bytes)?;
    }
    check_output(&bytes)?;
    let section = stamp(&mut bytes, input, opts, &info, stats, &tool);
    let stats = section.stats;
    Ok(Prepared {
        bytes,
        already_prepared: false,
        section,
        stats,
        outlined_loops,
        rerun_functions,
        counted_loops,
        bulk_split,
        lifted_exits,
        eh: None,
        fallback: None,
    })
}

/// `--capture eh`: the same points, optimised as the default's last run
/// optimises, then `eh/` instead of Asyncify (one `wasm-opt` run, not two).
/// The section records the option.
fn prepare_eh(
    input: &[u8],
    info: &crate::ModuleInfo,
    opts: &PrepareOptions,
    tool: &wasm_opt::WasmOpt,
    instrumented: instrument::Instrumented,
) -> Result<Prepared, PrepareError> {
    let mut bytes = match opts.opt_level.flag() {
        Some(_) => wasm_opt::run(
            tool,
            &instrumented.bytes,
            |_| {
                let mut args = wasm_opt::optimise_arguments(opts, opts.capture.by_records());
                if info.shared_memory {
                    args.push(wasm_opt::THREADS_FLAG.into());
                }
                args
            },
            None,
        )?,
        None => instrumented.bytes,
    };
    if opts.turn_compares == TurnCompares::On {
        crate::compares::turn_compares(&mut bytes)?;
    }
    let wrap = opts.capture.by_records();
    let returns = opts.capture == Capture::Returns;
    let (mut bytes, eh) = crate::eh::transform(&bytes, !opts.strip_names, wrap, returns)?;
    let section = stamp(&mut bytes, input, opts, info, instrumented.stats, tool);
    Ok(Prepared {
        bytes,
        already_prepared: false,
        stats: section.stats,
        section,
        outlined_loops: instrumented.outlined,
        rerun_functions: instrumented.rerun,
        counted_loops: instrumented.counted,
        bulk_split: instrumented.bulk,
        lifted_exits: instrumented.lifted,
        eh: Some(eh),
        fallback: None,
    })
}

/// Append the `roam` section to `bytes` and return it. `stats` counts the
/// points inserted; when the optimiser removed every one (they were all in
/// unreachable code) the module no longer imports `roam.migration_point`,
/// and the section says it has none.
fn stamp(
    bytes: &mut Vec<u8>,
    input: &[u8],
    opts: &PrepareOptions,
    info: &crate::ModuleInfo,
    mut stats: PointStats,
    tool: &wasm_opt::WasmOpt,
) -> RoamSection {
    let imports_point = wasmparser::Parser::new(0)
        .parse_all(bytes)
        .filter_map(Result::ok)
        .any(|p| match p {
            wasmparser::Payload::ImportSection(r) => r
                .into_imports()
                .filter_map(Result::ok)
                .any(|i| i.module == crate::POINT_MODULE && i.name == crate::POINT_FUNC),
            _ => false,
        });
    if !imports_point {
        stats.loop_points = 0;
        stats.function_points = 0;
        stats.manual_points = 0;
    }
    let section = RoamSection {
        version: SECTION_VERSION,
        source_hash: *blake3::hash(input).as_bytes(),
        points: opts.points,
        options: opts.canonical(),
        stats,
        wasm_opt_version: tool.version.clone(),
        mutable_globals: info.mutable_globals.clone(),
        tables: info.tables,
    };
    append_section(bytes, &section);
    section
}

/// The output must validate and carry the exports the runtime drives.
fn check_output(bytes: &[u8]) -> Result<(), PrepareError> {
    Validator::new_with_features(SUPPORTED_FEATURES)
        .validate_all(bytes)
        .map_err(PrepareError::OutputInvalid)?;
    let mut exports = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        if let Payload::ExportSection(reader) = payload.map_err(PrepareError::OutputInvalid)? {
            for export in reader {
                let export = export.map_err(PrepareError::OutputInvalid)?;
                exports.push((export.name.to_string(), export.kind));
            }
        }
    }
    let required = ASYNCIFY_EXPORTS
        .iter()
        .map(|n| (*n, ExternalKind::Func))
        .chain([
            (FLAG_GLOBAL_EXPORT, ExternalKind::Global),
            (MEMORY_EXPORT, ExternalKind::Memory),
        ]);
    for (name, kind) in required {
        if !exports.iter().any(|(n, k)| n == name && *k == kind) {
            return Err(PrepareError::MissingExport {
                name: name.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
pub(crate) mod tests;
