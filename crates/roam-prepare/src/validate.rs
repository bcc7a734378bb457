//! Refuse modules whose state roam cannot capture, before touching them.
//!
//! Everything roam migrates must be plain data reachable from exports: one
//! linear memory, mutable globals, and tables that never change after
//! instantiation. Threads, exceptions, memory64, multi-memory and run-time
//! table mutation break that assumption (or Asyncify), so they are refused
//! here with an error that names the feature and, where it lives in code,
//! the function — the programmer can then rebuild without it.

use wasmparser::{
    BinaryReaderError, CompositeInnerType, Encoding, ExternalKind, Operator, Parser, Payload,
    TypeRef, Validator, WasmFeatures,
};

use crate::names::{describe_function, function_names};
use crate::ops::{classify, Refusal};
use crate::{POINT_FUNC, POINT_MODULE, WAIT32_FUNC, WAIT64_FUNC};

/// Features roam's toolchain (walrus and `wasm-opt` Asyncify) handles: the
/// WebAssembly 2.0 set that current clang and rustc emit by default.
pub(crate) const SUPPORTED_FEATURES: WasmFeatures =
    WasmFeatures::WASM2.union(WasmFeatures::THREADS);

/// How deep blocks, loops and `if`s may nest in one function. `prepare`
/// walks that structure recursively (walrus, and its own passes), so a
/// hostile module nested a few hundred thousand deep would overflow the
/// stack and abort the process: a node preparing an upload would go down.
/// Compilers nest one block per `switch` target, a few hundred deep at
/// most. `prepare` works on a thread whose stack holds this many levels
/// with room to spare (`pipeline.rs`), whatever its caller's stack.
pub const MAX_NESTING: u32 = 10_000;

/// Facts about a module that passed [`validate`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModuleInfo {
    /// Number of imported functions (they come first in the index space).
    pub imported_functions: u32,
    /// Number of functions defined in the module.
    pub defined_functions: u32,
    /// Initial size of the linear memory in 64 KiB pages.
    pub memory_initial_pages: u64,
    /// Maximum size of the linear memory in pages, if declared.
    pub memory_maximum_pages: Option<u64>,
    /// Indices of the mutable globals (imports included), in order.
    pub mutable_globals: Vec<u32>,
    /// Number of tables (imports included).
    pub tables: u32,
    /// Function index of an imported `roam.migration_point`, if any.
    pub migration_point_import: Option<u32>,
    /// Number of calls to the imported `roam.migration_point`.
    pub manual_points: u32,
    /// Whether the module carries DWARF (`.debug_*`) custom sections.
    pub has_debug_sections: bool,
    /// Whether the memory is shared (imported, as `wasm32-wasip1-threads`
    /// links it): the program may start threads.
    pub shared_memory: bool,
}

/// Why a module cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// Not a WebAssembly binary, or one that fails validation.
    #[error("not a valid WebAssembly module: {0}; check that the file is a complete .wasm binary (not text)")]
    Invalid(#[source] BinaryReaderError),
    /// A component rather than a core module.
    #[error("input is a WebAssembly component; roam runs core WASI preview 1 commands (build for wasm32-wasip1)")]
    Component,
    /// A function uses an instruction of a refused feature.
    #[error("{function} uses `{instr}` ({feature}); roam cannot migrate such programs, rebuild without this feature")]
    UnsupportedInFunction {
        /// Index and name of the function, e.g. ``function 12 `push_frame` ``.
        function: String,
        /// The instruction, e.g. `table.grow`.
        instr: String,
        /// The refused feature.
        feature: &'static str,
    },
    /// A module-level declaration of a refused feature.
    #[error("the module {what}; roam cannot migrate such programs, rebuild without this feature")]
    UnsupportedModule {
        /// What the module declares, e.g. "declares a shared memory (threads)".
        what: String,
    },
    /// A feature outside the supported set, found by the final validation.
    #[error("the module uses a WebAssembly feature roam does not support: {0}; rebuild targeting plain wasm32-wasip1")]
    UnsupportedFeature(#[source] BinaryReaderError),
    /// The linear memory is imported, so its contents are not the module's.
    #[error("the module imports its memory (`{module}.{name}`); roam needs a module that defines its own memory (link without --import-memory)")]
    ImportedMemory {
        /// Import module.
        module: String,
        /// Import name.
        name: String,
    },
    /// Structure nested deeper than [`MAX_NESTING`].
    #[error("{function} nests blocks, loops and ifs more than {limit} deep; roam refuses it, since preparing it would need an unbounded stack")]
    TooDeep {
        /// Index and name of the function.
        function: String,
        /// [`MAX_NESTING`].
        limit: u32,
    },
    /// No linear memory at all.
    #[error("the module has no linear memory; roam runs WASI commands, which always define one")]
    NoMemory,
    /// No `_start` export.
    #[error("the module does not export a `_start` function; roam runs WASI commands (build an executable, not a library or reactor)")]
    NoStart,
    /// `roam.migration_point` imported with the wrong signature.
    #[error("the module imports `roam.migration_point` as {found}; it must be a function of type [] -> []")]
    BadPointImport {
        /// What was found instead.
        found: String,
    },
    /// Imports something else from the `roam` module.
    #[error("the module imports `roam.{name}`, which roam does not provide; only `roam.migration_point`, `roam.wait32` and `roam.wait64` exist")]
    UnknownRoamImport {
        /// Import name.
        name: String,
    },
}

/// Check that `input` is a module roam can prepare and summarise it.
pub fn validate(input: &[u8]) -> Result<ModuleInfo, ValidateError> {
    validate_as(input, false)
}

/// [`validate`], for a module `--capture eh` made when `eh`: its own tag
/// and exception instructions are then allowed.
pub(crate) fn validate_as(input: &[u8], eh: bool) -> Result<ModuleInfo, ValidateError> {
    if input.len() >= 8 && input[..4] == *b"\0asm" && input[6..8] == [1, 0] {
        return Err(ValidateError::Component);
    }
    Validator::new_with_features(WasmFeatures::all())
        .validate_all(input)
        .map_err(ValidateError::Invalid)?;
    let scan = scan(input, eh)?;
    if let Some((index, refusal)) = scan.refusal {
        let names = function_names(input);
        return Err(ValidateError::UnsupportedInFunction {
            function: describe_function(index, names.get(&index).map(String::as_str)),
            instr: refusal.instr,
            feature: refusal.feature,
        });
    }
    if let Some(index) = scan.too_deep {
        let names = function_names(input);
        return Err(ValidateError::TooDeep {
            function: describe_function(index, names.get(&index).map(String::as_str)),
            limit: MAX_NESTING,
        });
    }
    if !scan.has_start {
        return Err(ValidateError::NoStart);
    }
    if scan.memories == 0 {
        return Err(ValidateError::NoMemory);
    }
    let features = if eh {
        crate::eh::OUTPUT_FEATURES
    } else {
        SUPPORTED_FEATURES
    };
    Validator::new_with_features(features)
        .validate_all(input)
        .map_err(ValidateError::UnsupportedFeature)?;
    Ok(scan.info)
}

#[derive(Default)]
struct Scan {
    info: ModuleInfo,
    memories: u32,
    has_start: bool,
    refusal: Option<(u32, Refusal)>,
    /// The first function nested deeper than [`MAX_NESTING`].
    too_deep: Option<u32>,
}

/// A block, loop or `if` that takes parameters from the stack (multi-value
/// blocks). Binaryen, which `prepare` runs, cannot read them; compilers do
/// not emit them (they do emit functions with several results, which
/// roam accepts).
fn block_params(op: &Operator, types: &[Option<(usize, usize)>]) -> Option<Refusal> {
    let (instr, ty) = match op {
        Operator::Block { blockty } => ("block", blockty),
        Operator::Loop { blockty } => ("loop", blockty),
        Operator::If { blockty } => ("if", blockty),
        _ => return None,
    };
    let wasmparser::BlockType::FuncType(t) = ty else {
        return None;
    };
    match types.get(*t as usize) {
        Some(Some((params, _))) if *params > 0 => Some(Refusal {
            instr: format!("{instr} with {params} parameter(s)"),
            feature: "multi-value blocks with parameters, which Binaryen cannot read",
        }),
        _ => None,
    }
}

/// A prepared module never waits by the instruction: `prepare` made every
/// wait a call of `roam.wait32/64` (`waits.rs`), which a checkpoint can
/// interrupt. A raw one would park a thread where no stop reaches it.
fn raw_wait(op: &Operator) -> Option<Refusal> {
    let instr = match op {
        Operator::MemoryAtomicWait32 { .. } => "memory.atomic.wait32",
        Operator::MemoryAtomicWait64 { .. } => "memory.atomic.wait64",
        _ => return None,
    };
    Some(Refusal {
        instr: instr.into(),
        feature: "a wait no checkpoint can interrupt, in a prepared module",
    })
}

fn unsupported(what: impl Into<String>) -> ValidateError {
    ValidateError::UnsupportedModule { what: what.into() }
}

fn check_memory(ty: &wasmparser::MemoryType, scan: &mut Scan) -> Result<(), ValidateError> {
    if ty.memory64 {
        return Err(unsupported("declares a 64-bit memory (memory64)"));
    }
    scan.memories += 1;
    if scan.memories > 1 {
        return Err(unsupported("has more than one memory (multi-memory)"));
    }
    scan.info.memory_initial_pages = ty.initial;
    scan.info.memory_maximum_pages = ty.maximum;
    Ok(())
}

fn scan(input: &[u8], eh: bool) -> Result<Scan, ValidateError> {
    let mut scan = Scan::default();
    // Per type index: Some((params, results)) for function types.
    let mut types: Vec<Option<(usize, usize)>> = Vec::new();
    let mut globals = 0u32;
    let mut code_index = 0u32;
    for payload in Parser::new(0).parse_all(input) {
        match payload.map_err(ValidateError::Invalid)? {
            Payload::Version { encoding, .. } if encoding != Encoding::Module => {
                return Err(ValidateError::Component)
            }
            Payload::TypeSection(reader) => {
                for group in reader {
                    for sub in group.map_err(ValidateError::Invalid)?.into_types() {
                        types.push(match &sub.composite_type.inner {
                            CompositeInnerType::Func(f) => {
                                Some((f.params().len(), f.results().len()))
                            }
                            _ => None,
                        });
                    }
                }
            }
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    let import = import.map_err(ValidateError::Invalid)?;
                    let is_wait = import.module == POINT_MODULE
                        && [WAIT32_FUNC, WAIT64_FUNC].contains(&import.name);
                    if import.module == POINT_MODULE && import.name != POINT_FUNC && !is_wait {
                        return Err(ValidateError::UnknownRoamImport {
                            name: import.name.into(),
                        });
                    }
                    let is_point = import.module == POINT_MODULE && !is_wait;
                    match import.ty {
                        TypeRef::Func(ty) | TypeRef::FuncExact(ty) => {
                            if is_point {
                                let sig = types.get(ty as usize).copied().flatten();
                                if sig != Some((0, 0)) {
                                    let found = match sig {
                                        Some((p, r)) => format!(
                                            "a function with {p} parameter(s) and {r} result(s)"
                                        ),
                                        None => "a non-function type".to_string(),
                                    };
                                    return Err(ValidateError::BadPointImport { found });
                                }
                                scan.info.migration_point_import =
                                    Some(scan.info.imported_functions);
                            }
                            scan.info.imported_functions += 1;
                        }
                        _ if is_point => {
                            return Err(ValidateError::BadPointImport {
                                found: "a non-function import".into(),
                            })
                        }
                        // Threads share one memory, which each instance
                        // imports (wasi-threads).
                        TypeRef::Memory(ty) if ty.shared => {
                            check_memory(&ty, &mut scan)?;
                            scan.info.shared_memory = true;
                        }
                        TypeRef::Memory(_) => {
                            return Err(ValidateError::ImportedMemory {
                                module: import.module.into(),
                                name: import.name.into(),
                            })
                        }
                        TypeRef::Global(g) => {
                            if g.mutable {
                                scan.info.mutable_globals.push(globals);
                            }
                            globals += 1;
                        }
                        TypeRef::Table(_) => scan.info.tables += 1,
                        TypeRef::Tag(_) => {
                            return Err(unsupported(
                                "imports an exception tag (exception handling)",
                            ))
                        }
                    }
                }
            }
            Payload::FunctionSection(reader) => scan.info.defined_functions = reader.count(),
            Payload::TableSection(reader) => scan.info.tables += reader.count(),
            Payload::MemorySection(reader) => {
                for ty in reader {
                    let ty = ty.map_err(ValidateError::Invalid)?;
                    if ty.shared {
                        return Err(unsupported(
                            "defines a shared memory of its own; threaded programs import theirs (build for wasm32-wasip1-threads)",
                        ));
                    }
                    check_memory(&ty, &mut scan)?;
                }
            }
            Payload::TagSection(_) if !eh => {
                return Err(unsupported("declares exception tags (exception handling)"))
            }
            Payload::GlobalSection(reader) => {
                for global in reader {
                    if global.map_err(ValidateError::Invalid)?.ty.mutable {
                        scan.info.mutable_globals.push(globals);
                    }
                    globals += 1;
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(ValidateError::Invalid)?;
                    if export.name == "_start" && export.kind == ExternalKind::Func {
                        scan.has_start = true;
                    }
                }
            }
            Payload::CodeSectionEntry(body) => {
                let index = scan.info.imported_functions + code_index;
                code_index += 1;
                let mut ops = body
                    .get_operators_reader()
                    .map_err(ValidateError::Invalid)?;
                let mut depth = 0u32;
                while !ops.eof() {
                    let op = ops.read().map_err(ValidateError::Invalid)?;
                    match op {
                        Operator::Block { .. }
                        | Operator::Loop { .. }
                        | Operator::If { .. }
                        | Operator::Try { .. }
                        | Operator::TryTable { .. } => {
                            depth += 1;
                            if depth > MAX_NESTING && scan.too_deep.is_none() {
                                scan.too_deep = Some(index);
                            }
                        }
                        // The function's own `end` closes no structure.
                        Operator::End => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    if let Operator::Call { function_index } = op {
                        if Some(function_index) == scan.info.migration_point_import {
                            scan.info.manual_points += 1;
                        }
                    }
                    if scan.refusal.is_none() {
                        // `eh/` passes a call's arguments into its
                        // `try_table` as parameters; its output never
                        // goes through Binaryen again.
                        let params = if eh { None } else { block_params(&op, &types) };
                        let refusal = params
                            .or_else(|| {
                                classify(&op)
                                    .filter(|r| !(eh && r.feature == crate::ops::EXCEPTIONS))
                            })
                            .or_else(|| eh.then(|| raw_wait(&op)).flatten());
                        if let Some(refusal) = refusal {
                            scan.refusal = Some((index, refusal));
                        }
                    }
                }
            }
            Payload::CustomSection(custom) if custom.name().starts_with(".debug") => {
                scan.info.has_debug_sections = true;
            }
            _ => {}
        }
    }
    Ok(scan)
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
