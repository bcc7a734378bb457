//! Atomic waits become calls the host can interrupt.
//!
//! Why: a thread parked by `memory.atomic.wait32` (wasi-libc's futex, Rust's
//! `Mutex` and `Condvar`, rayon's idle workers) sits in the engine, where no
//! migration point is reached and nothing can unwind it. A checkpoint needs
//! every thread at a point or in a blocking call, so each wait becomes a
//! call of the import `roam.wait32` or `roam.wait64`. The runtime waits on
//! the same shared memory, in slices, and treats the call as a blocking
//! import: when a checkpoint is asked for it returns without effect and the
//! frame is captured with the call's arguments, so a restore waits again.
//! A wake that the program never sees is allowed by the wait's contract
//! (callers re-check their condition), so waiting again is sound.
//!
//! The import takes the instruction's arguments and then its static
//! offset, `(address, expected, timeout_ns, offset) -> result`, with the
//! instruction's results: 0 woken, 1 not equal, 2 timed out. The host adds
//! the offset without wrapping and checks bounds and alignment as the
//! instruction would.

use walrus::ir::{Call, Const, Instr, InstrLocId, InstrSeqId, Value};
use walrus::{FunctionId, ImportKind, Module, ValType};

use crate::outline::children;
use crate::POINT_MODULE;

/// Import name of the interruptible `memory.atomic.wait32`.
pub const WAIT32_FUNC: &str = "wait32";
/// Import name of the interruptible `memory.atomic.wait64`.
pub const WAIT64_FUNC: &str = "wait64";

/// Replace every `memory.atomic.wait32/64` of the module's functions by a
/// call of its import (added when first needed). Returns how many changed.
pub(crate) fn route_waits(module: &mut Module) -> u32 {
    let funcs: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    let mut imports: [Option<FunctionId>; 2] = [None, None];
    let mut changed = 0;
    for id in funcs {
        let walrus::FunctionKind::Local(func) = &module.funcs.get(id).kind else {
            continue;
        };
        let sites = sites(func);
        if sites.is_empty() {
            continue;
        }
        for (_, _, wide, _) in &sites {
            let slot = &mut imports[usize::from(*wide)];
            if slot.is_none() {
                *slot = Some(wait_import(module, *wide));
            }
        }
        let walrus::FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
            continue;
        };
        // From the last site of each sequence back, so earlier indices hold.
        for (seq, index, wide, offset) in sites.into_iter().rev() {
            let callee = imports[usize::from(wide)].expect("made above");
            let loc = InstrLocId::default();
            let with = [
                (
                    Const {
                        value: Value::I32(offset as i32),
                    }
                    .into(),
                    loc,
                ),
                (Call { func: callee }.into(), loc),
            ];
            func.block_mut(seq).instrs.splice(index..=index, with);
            changed += 1;
        }
    }
    changed
}

/// The waits of `func`: sequence, index, 64-bit, static offset.
fn sites(func: &walrus::LocalFunction) -> Vec<(InstrSeqId, usize, bool, u32)> {
    let mut out = Vec::new();
    let mut seqs = vec![func.entry_block()];
    while let Some(seq) = seqs.pop() {
        for (i, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
            seqs.extend(children(instr));
            if let Instr::AtomicWait(w) = instr {
                // Offsets of a 32-bit memory fit in 32 bits.
                out.push((seq, i, w.sixty_four, w.arg.offset as u32));
            }
        }
    }
    out.sort_by_key(|(seq, i, _, _)| (*seq, *i));
    out
}

/// The import for a 32- or 64-bit wait: the program's own if it has one
/// of the right type, else a new one.
fn wait_import(module: &mut Module, wide: bool) -> FunctionId {
    let name = if wide { WAIT64_FUNC } else { WAIT32_FUNC };
    if let Some(id) = module.imports.find(POINT_MODULE, name) {
        if let ImportKind::Function(func) = module.imports.get(id).kind {
            return func;
        }
    }
    let expected = if wide { ValType::I64 } else { ValType::I32 };
    let ty = module.types.add(
        &[ValType::I32, expected, ValType::I64, ValType::I32],
        &[ValType::I32],
    );
    module.add_import_func(POINT_MODULE, name, ty).0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(wat: &str) -> Module {
        let bytes = wat::parse_str(wat).unwrap();
        Module::from_buffer(&bytes).unwrap()
    }

    #[test]
    fn every_wait_becomes_a_call_with_its_offset() {
        let mut m = module(
            r#"(module (memory 1 1 shared)
                (func (export "f") (param i32) (result i32)
                  (memory.atomic.wait32 offset=8 (local.get 0) (i32.const 0) (i64.const -1))
                  (if (result i32) (local.get 0)
                    (then (memory.atomic.wait64 (local.get 0) (i64.const 1) (i64.const 5)))
                    (else (i32.const 0)))
                  i32.add))"#,
        );
        assert_eq!(route_waits(&mut m), 2);
        let bytes = m.emit_wasm();
        let mut features = wasmparser::WasmFeatures::WASM2;
        features.insert(wasmparser::WasmFeatures::THREADS);
        wasmparser::Validator::new_with_features(features)
            .validate_all(&bytes)
            .unwrap();
        let mut waits = 0;
        let mut offsets = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(&bytes) {
            if let wasmparser::Payload::CodeSectionEntry(body) = payload.unwrap() {
                let mut ops = body.get_operators_reader().unwrap();
                while !ops.eof() {
                    match ops.read().unwrap() {
                        wasmparser::Operator::MemoryAtomicWait32 { .. }
                        | wasmparser::Operator::MemoryAtomicWait64 { .. } => waits += 1,
                        wasmparser::Operator::I32Const { value } => offsets.push(value),
                        _ => {}
                    }
                }
            }
        }
        assert_eq!(waits, 0);
        assert!(offsets.contains(&8), "{offsets:?}");
        assert!(m.imports.find(POINT_MODULE, WAIT32_FUNC).is_some());
        assert!(m.imports.find(POINT_MODULE, WAIT64_FUNC).is_some());
    }

    #[test]
    fn a_module_without_waits_is_left_alone() {
        let mut m = module(r#"(module (memory 1) (func (export "f")))"#);
        assert_eq!(route_waits(&mut m), 0);
        assert!(m.imports.find(POINT_MODULE, WAIT32_FUNC).is_none());
    }
}
