//! Programs to compare: a module `wasm-smith` generates, made runnable by a
//! `_start` that calls its exported functions and exits with a checksum.
//!
//! Why a `_start` of our own: `wasm-smith` exports functions with arbitrary
//! signatures and no entry point, and `roam prepare` works on commands
//! (`_start`). The wrapper calls each export with arguments drawn from the
//! same random bytes, folds every result and, at the end, every mutable
//! global into an `i64`, and passes it to `proc_exit`. So one exit status,
//! a trap code and the final linear memory say everything the program did.

use arbitrary::Unstructured;
use walrus::ir::{BinaryOp, UnaryOp, Value};
use walrus::{
    ExportItem, FunctionBuilder, FunctionId, GlobalKind, InstrSeqBuilder, LocalId, ModuleConfig,
    ValType,
};

/// Exports of the wrapped module that the harness reads.
pub const MEMORY_EXPORT: &str = "memory";

/// Most exported functions `_start` calls (each once, in export order).
const MAX_CALLS: usize = 8;

/// The `wasm-smith` configuration: the features `roam prepare` accepts
/// (WebAssembly 2.0 without references, which capture by exceptions
/// refuses when live across a call), one small memory, no imports, and
/// NaNs canonicalised so that the unprepared and the prepared module may
/// be compared bit for bit.
pub fn config(u: &mut Unstructured) -> arbitrary::Result<wasm_smith::Config> {
    Ok(wasm_smith::Config {
        min_funcs: 1,
        max_funcs: u.int_in_range(1..=24)?,
        max_imports: 0,
        max_exports: 16,
        export_everything: true,
        allow_start_export: false,
        min_memories: 1,
        max_memories: 1,
        max_memory32_bytes: 16 << 16,
        memory64_enabled: false,
        max_tables: 1,
        max_table_elements: 64,
        max_globals: 8,
        max_instructions: u.int_in_range(20..=600)?,
        max_nesting_depth: 12,
        max_data_segments: 4,
        max_element_segments: 4,
        bulk_memory_enabled: true,
        reference_types_enabled: false,
        simd_enabled: u.arbitrary()?,
        relaxed_simd_enabled: false,
        multi_value_enabled: true,
        saturating_float_to_int_enabled: true,
        sign_extension_ops_enabled: true,
        exceptions_enabled: false,
        gc_enabled: false,
        tail_call_enabled: false,
        threads_enabled: false,
        custom_page_sizes_enabled: false,
        extended_const_enabled: false,
        wide_arithmetic_enabled: false,
        canonicalize_nans: true,
        ..wasm_smith::Config::default()
    })
}

/// A generated module, wrapped: `_start` and the memory exported as
/// [`MEMORY_EXPORT`].
pub fn program(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let config = config(u)?;
    let module = wasm_smith::Module::new(config, u)?;
    wrap(&module.to_bytes(), u).map_err(|_| arbitrary::Error::IncorrectFormat)
}

/// Add `_start` (and the memory export) to `bytes`.
pub fn wrap(bytes: &[u8], u: &mut Unstructured) -> Result<Vec<u8>, WrapError> {
    let mut m = ModuleConfig::new()
        .generate_producers_section(false)
        .parse(bytes)
        .map_err(|e| WrapError(e.to_string()))?;
    // Arbitrary export names may hold bytes Binaryen refuses (NUL); what
    // is exported is what matters here, not under which name.
    for (i, e) in m.exports.iter_mut().enumerate() {
        e.name = format!("e{i}");
    }
    let memory = m.memories.iter().next().map(|mem| mem.id());
    let Some(memory) = memory else {
        return Err(WrapError("no memory".into()));
    };
    if !m.exports.iter().any(|e| e.name == MEMORY_EXPORT) {
        m.exports.add(MEMORY_EXPORT, memory);
    }
    let exit_ty = m.types.add(&[ValType::I32], &[]);
    let (exit, _) = m.add_import_func("wasi_snapshot_preview1", "proc_exit", exit_ty);
    let callees: Vec<FunctionId> = m
        .exports
        .iter()
        .filter_map(|e| match e.item {
            ExportItem::Function(f) if f != exit => Some(f),
            _ => None,
        })
        .take(MAX_CALLS)
        .collect();
    let globals: Vec<(walrus::GlobalId, ValType)> = m
        .globals
        .iter()
        .filter(|g| g.mutable && matches!(g.kind, GlobalKind::Local(_)))
        .map(|g| (g.id(), g.ty))
        .collect();

    let mut f = FunctionBuilder::new(&mut m.types, &[], &[]);
    let acc = m.locals.add(ValType::I64);
    let mut temps = std::collections::HashMap::new();
    let mut body = f.func_body();
    for callee in callees {
        let ty = m.types.get(m.funcs.get(callee).ty()).clone();
        for p in ty.params() {
            push_const(&mut body, *p, u).map_err(|e| WrapError(e.to_string()))?;
        }
        body.call(callee);
        // Results come off the stack last first.
        for r in ty.results().iter().rev() {
            let t = *temps.entry(*r).or_insert_with(|| m.locals.add(*r));
            body.local_set(t);
            fold(&mut body, acc, t, *r)?;
        }
    }
    for (g, ty) in globals {
        let t = *temps.entry(ty).or_insert_with(|| m.locals.add(ty));
        body.global_get(g).local_set(t);
        fold(&mut body, acc, t, ty)?;
    }
    // exit((acc ^ acc >> 32) as i32)
    body.local_get(acc)
        .local_get(acc)
        .i64_const(32)
        .binop(BinaryOp::I64ShrU)
        .binop(BinaryOp::I64Xor)
        .unop(UnaryOp::I32WrapI64)
        .call(exit);
    let start = f.finish(vec![], &mut m.funcs);
    m.exports.add("_start", start);
    Ok(m.emit_wasm())
}

/// A constant of type `ty` from `u`.
fn push_const(
    body: &mut InstrSeqBuilder,
    ty: ValType,
    u: &mut Unstructured,
) -> arbitrary::Result<()> {
    let v = match ty {
        ValType::I32 => Value::I32(small(u)? as i32),
        ValType::I64 => Value::I64(small(u)?),
        ValType::F32 => Value::F32(small(u)? as f32),
        ValType::F64 => Value::F64(small(u)? as f64),
        ValType::V128 => Value::V128(u.arbitrary()?),
        ValType::Ref(_) => return Err(arbitrary::Error::IncorrectFormat),
    };
    body.const_(v);
    Ok(())
}

/// Mostly small numbers (loop bounds, addresses), sometimes any.
fn small(u: &mut Unstructured) -> arbitrary::Result<i64> {
    Ok(match u.int_in_range(0..=3)? {
        0 => u.arbitrary()?,
        _ => u.int_in_range(-4..=300)?,
    })
}

/// `acc = acc * 31 + bits(t)`.
fn fold(
    body: &mut InstrSeqBuilder,
    acc: LocalId,
    t: LocalId,
    ty: ValType,
) -> Result<(), WrapError> {
    body.local_get(acc).i64_const(31).binop(BinaryOp::I64Mul);
    body.local_get(t);
    match ty {
        ValType::I32 => {
            body.unop(UnaryOp::I64ExtendUI32);
        }
        ValType::I64 => {}
        ValType::F32 => {
            body.unop(UnaryOp::I32ReinterpretF32)
                .unop(UnaryOp::I64ExtendUI32);
        }
        ValType::F64 => {
            body.unop(UnaryOp::I64ReinterpretF64);
        }
        ValType::V128 => {
            body.unop(UnaryOp::I64x2ExtractLane { idx: 0 })
                .local_get(t)
                .unop(UnaryOp::I64x2ExtractLane { idx: 1 })
                .binop(BinaryOp::I64Xor);
        }
        ValType::Ref(_) => return Err(WrapError("a reference result".into())),
    }
    body.binop(BinaryOp::I64Add).local_set(acc);
    Ok(())
}

/// A generated module the wrapper cannot use.
#[derive(Debug, thiserror::Error)]
#[error("cannot wrap the generated module: {0}")]
pub struct WrapError(String);
