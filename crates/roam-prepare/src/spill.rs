//! Spilled points: no value of a function is live across its point's call.
//!
//! Why: a migration point is a call to a host import, and a host call
//! clobbers every caller-saved register (all vector registers on x86-64).
//! Every value the function still needs after the call must therefore sit
//! in a stack slot at the call. The call is cold (it runs only while the
//! flag is up), but Cranelift's register allocator does not split a value's
//! range around a cold call: a profile of `matmul`, hoisted point and all,
//! shows the loop-invariant `a[i][k]` and the instance pointer stored to and
//! reloaded from the stack on *every* iteration of the inner loop. With
//! this rewrite, that loop in a function of its own uses registers only;
//! over the suite it saves about 12 % (docs/prepare.md).
//!
//! How: after Asyncify, every `call $roam.migration_point` becomes
//!
//! ```wasm
//! local.get 0  global.set $roam.spill.0   ;; every local of the function,
//! local.get 1  global.set $roam.spill.1   ;; parameters included
//! ...
//! call $roam.migration_point
//! global.get $roam.spill.0  local.set 0   ;; and back, before Asyncify's
//! global.get $roam.spill.1  local.set 1   ;; own check after the call
//! ...
//! ```
//!
//! Every local is then defined anew after the call, so nothing the function
//! computed is live across it; the stores and loads run only on the cold
//! path. It runs after Asyncify so that the copies sit inside the stretch
//! Asyncify guards around the call: on a rewind they run too (after
//! Asyncify has reloaded the locals, before the re-entered call), and on an
//! unwind Asyncify saves the reloaded values, which are the same. The
//! optimiser runs afterwards and drops the loads of locals nobody reads.
//!
//! Being the one rewrite between Asyncify and the optimiser, this pass also
//! puts the helpers of quiet indirect calls back into their callers
//! (`indirect::inline_helpers`).
//!
//! The globals are scratch, shared by all functions (one per local of a
//! type, as many as the largest function needs): they hold a value only
//! from just before a point's call to just after it, never across a
//! snapshot, so the snapshot does not carry them. They are exported as
//! `roam.spill.<i>` so that [`crate::check_prepared`] can tell them from
//! program state that would be lost.

use std::collections::{BTreeSet, HashMap};

use walrus::ir::{Call, GlobalGet, GlobalSet, Instr, InstrSeqId, LocalGet, LocalSet, Value};
use walrus::{ConstExpr, FunctionId, GlobalId, LocalFunction, LocalId, ModuleConfig, ValType};

use crate::pipeline::PrepareError;
use crate::{POINT_FUNC, POINT_MODULE};

/// Export-name prefix of the scratch globals, followed by a number.
pub const SPILL_EXPORT_PREFIX: &str = "roam.spill.";

/// Functions with more locals than this keep plain point calls: each point
/// would copy every local twice, and the copies would dwarf the function
/// (and its compile time) for little gain in code that large.
pub(crate) const MAX_SPILLED_LOCALS: usize = 512;

/// Counts of what [`spill`] did, for tests and the docs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpillStats {
    /// Point calls rewritten.
    pub calls: usize,
    /// Scratch globals added.
    pub globals: usize,
}

/// Rewrite every call of the point import in `module` (Asyncify's output)
/// as described in the module docs. A module without the import is
/// returned as it was.
pub(crate) fn spill(
    module: &[u8],
    keep_names: bool,
) -> Result<(Vec<u8>, SpillStats), PrepareError> {
    let mut config = ModuleConfig::new();
    config
        .generate_dwarf(false)
        .generate_name_section(keep_names)
        .generate_producers_section(true);
    let mut module = config
        .parse(module)
        .map_err(|e| PrepareError::Rewrite(e.into()))?;
    // The one walrus pass between Asyncify and the optimiser, so the quiet
    // indirect calls' helpers go back into their callers here too.
    crate::indirect::inline_helpers(&mut module);
    let Some(point) = module
        .imports
        .find(POINT_MODULE, POINT_FUNC)
        .and_then(|id| match module.imports.get(id).kind {
            walrus::ImportKind::Function(f) => Some(f),
            _ => None,
        })
    else {
        return Ok((module.emit_wasm(), SpillStats::default()));
    };
    if let Some(e) = module
        .exports
        .iter()
        .find(|e| e.name.starts_with(SPILL_EXPORT_PREFIX))
    {
        return Err(PrepareError::ExportNameTaken {
            name: e.name.clone(),
        });
    }
    let mut pool = Pool::default();
    let mut stats = SpillStats::default();
    let ids: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    for id in ids {
        let func = module.funcs.get(id).kind.unwrap_local();
        let seqs = sequences_with_call(func, point);
        if seqs.is_empty() {
            continue;
        }
        let locals = locals_of(func, &module.locals);
        if locals.len() > MAX_SPILLED_LOCALS {
            continue;
        }
        let slots = pool.assign(&mut module.globals, &module.locals, &locals);
        let func = module.funcs.get_mut(id).kind.unwrap_local_mut();
        for seq in seqs {
            stats.calls += rewrite(func, seq, point, &locals, &slots);
        }
    }
    stats.globals = pool.all.len();
    for (i, global) in pool.all.iter().enumerate() {
        module
            .exports
            .add(&format!("{SPILL_EXPORT_PREFIX}{i}"), *global);
    }
    Ok((module.emit_wasm(), stats))
}

/// Every sequence of `func`, in a fixed order (depth first from the entry).
fn sequences(func: &LocalFunction) -> Vec<InstrSeqId> {
    let mut out = Vec::new();
    let mut stack = vec![func.entry_block()];
    while let Some(seq) = stack.pop() {
        out.push(seq);
        for (instr, _) in func.block(seq).instrs.iter().rev() {
            match instr {
                Instr::Block(b) => stack.push(b.seq),
                Instr::Loop(l) => stack.push(l.seq),
                Instr::IfElse(i) => {
                    stack.push(i.alternative);
                    stack.push(i.consequent);
                }
                _ => {}
            }
        }
    }
    out
}

/// The sequences that call `point` directly.
fn sequences_with_call(func: &LocalFunction, point: FunctionId) -> Vec<InstrSeqId> {
    sequences(func)
        .into_iter()
        .filter(|&seq| {
            func.block(seq)
                .instrs
                .iter()
                .any(|(i, _)| matches!(i, Instr::Call(Call { func }) if *func == point))
        })
        .collect()
}

/// The parameters and every local the body names, in index order, except
/// references: a reference-typed local is simply not copied, so it stays
/// live across the call as before (correct, only not spilled).
fn locals_of(func: &LocalFunction, arena: &walrus::ModuleLocals) -> Vec<LocalId> {
    let mut set: BTreeSet<LocalId> = func.args.iter().copied().collect();
    for seq in sequences(func) {
        for (instr, _) in &func.block(seq).instrs {
            match instr {
                Instr::LocalGet(g) => set.insert(g.local),
                Instr::LocalSet(s) => set.insert(s.local),
                Instr::LocalTee(t) => set.insert(t.local),
                _ => false,
            };
        }
    }
    set.into_iter()
        .filter(|&l| !matches!(arena.get(l).ty(), ValType::Ref(_)))
        .collect()
}

/// The scratch globals, by type; a function's `n`th local of a type uses
/// the `n`th global of that type.
#[derive(Default)]
struct Pool {
    by_type: HashMap<ValType, Vec<GlobalId>>,
    all: Vec<GlobalId>,
}

impl Pool {
    /// One global per local, in the order of `locals`.
    fn assign(
        &mut self,
        globals: &mut walrus::ModuleGlobals,
        arena: &walrus::ModuleLocals,
        locals: &[LocalId],
    ) -> Vec<GlobalId> {
        let mut used: HashMap<ValType, usize> = HashMap::new();
        let mut out = Vec::with_capacity(locals.len());
        for &local in locals {
            let ty = arena.get(local).ty();
            let n = used.entry(ty).or_default();
            let list = self.by_type.entry(ty).or_default();
            if *n == list.len() {
                let global = globals.add_local(ty, true, false, ConstExpr::Value(zero(ty)));
                list.push(global);
                self.all.push(global);
            }
            out.push(list[*n]);
            *n += 1;
        }
        out
    }
}

fn zero(ty: ValType) -> Value {
    match ty {
        ValType::I32 => Value::I32(0),
        ValType::I64 => Value::I64(0),
        ValType::F32 => Value::F32(0.0),
        ValType::F64 => Value::F64(0.0),
        ValType::V128 => Value::V128(0),
        ValType::Ref(_) => unreachable!("`locals_of` leaves references out"),
    }
}

/// Surround each call of `point` in `seq` with the copies; returns how
/// many calls were rewritten.
fn rewrite(
    func: &mut LocalFunction,
    seq: InstrSeqId,
    point: FunctionId,
    locals: &[LocalId],
    slots: &[GlobalId],
) -> usize {
    let old = std::mem::take(&mut func.block_mut(seq).instrs);
    let mut new = Vec::with_capacity(old.len() + 4 * locals.len());
    let mut calls = 0;
    for (instr, loc) in old {
        if !matches!(&instr, Instr::Call(Call { func }) if *func == point) {
            new.push((instr, loc));
            continue;
        }
        calls += 1;
        for (&local, &global) in locals.iter().zip(slots) {
            new.push((LocalGet { local }.into(), loc));
            new.push((GlobalSet { global }.into(), loc));
        }
        new.push((instr, loc));
        for (&local, &global) in locals.iter().zip(slots) {
            new.push((GlobalGet { global }.into(), loc));
            new.push((LocalSet { local }.into(), loc));
        }
    }
    func.block_mut(seq).instrs = new;
    calls
}

#[cfg(test)]
#[path = "spill_tests.rs"]
pub(crate) mod tests;
