//! Indirect calls that can only reach quiet functions, made direct calls of
//! a helper that Asyncify is told cannot unwind.
//!
//! Asyncify's own analysis (the default scope, `all`) knows nothing about
//! what a `call_indirect` can reach, so it assumes every one may unwind.
//! A loop that calls a small function through a pointer, such as `recurse`'s
//! iterative tree fold calling its combiners through a table, is then
//! instrumented around that call on every iteration: Asyncify checks its
//! state after the call, guards the code around it for rewinding, and keeps
//! the loop's values in stack slots. roam's call graph knows better
//! (`callgraph.rs`): tables never change at run time, and a `call_indirect`
//! traps unless the callee has its type, so it can only reach the functions
//! of that type in that table's element segments.
//!
//! When every such function is quiet (`quiet.rs`: it reaches no point and
//! no blocking import), the call cannot unwind. It is then replaced by a
//! direct call of a helper that makes the same indirect call, one helper per
//! table and type, and the helpers go to Asyncify's `asyncify-removelist`.
//! The call sites become calls Asyncify and roam's own passes (hoisting,
//! outlining) both see as quiet. Calls whose targets are unknown or loud are
//! left as they are.
//!
//! Once Asyncify has run, the helpers have done their job, and
//! [`inline_helpers`] puts the `call_indirect` back at every call site. The
//! optimiser does not do it by itself: at `-O2` Binaryen inlines only
//! functions of at most two instructions or with one caller, and a helper
//! has a `local.get` per operand. Left in place, the extra call cost
//! `recurse` more than Asyncify's guards it removed: its tree fold spent
//! 18 % of its time in the helper, most of it the indirect call's own loads
//! moved there (profile at size M).

use std::collections::BTreeMap;

use walrus::ir::{Call, CallIndirect, Instr};
use walrus::{FunctionBuilder, FunctionId, Module, TableId, TypeId};

use crate::callgraph::TableTargets;
use crate::outline::children;
use crate::quiet::Quiet;

/// Replace every indirect call whose possible callees are all quiet by a
/// call of a helper; returns the helpers.
pub(crate) fn route_quiet(module: &mut Module, quiet: &Quiet) -> Vec<FunctionId> {
    let tables = TableTargets::new(module);
    // (type, table) → whether every possible callee is quiet.
    let mut verdict: BTreeMap<(TypeId, TableId), bool> = BTreeMap::new();
    let mut wanted: Vec<(TypeId, TableId)> = Vec::new();
    let funcs: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    for id in &funcs {
        let walrus::FunctionKind::Local(func) = &module.funcs.get(*id).kind else {
            continue;
        };
        crate::outline::walk(func, func.entry_block(), &mut |i| {
            if let Instr::CallIndirect(CallIndirect { ty, table }) = i {
                let key = (*ty, *table);
                let ok = *verdict.entry(key).or_insert_with(|| {
                    tables
                        .targets(module, *table, *ty)
                        .is_some_and(|t| t.iter().all(|f| quiet.contains(*f)))
                });
                if ok && !wanted.contains(&key) {
                    wanted.push(key);
                }
            }
        });
    }
    wanted.sort();
    let helpers: BTreeMap<(TypeId, TableId), FunctionId> = wanted
        .iter()
        .enumerate()
        .map(|(n, key)| (*key, helper(module, *key, n)))
        .collect();
    // Only the functions that were there before the helpers: a helper's own
    // `call_indirect` must stay one.
    replace_each(module, &funcs, |instr| match instr {
        Instr::CallIndirect(CallIndirect { ty, table }) => helpers
            .get(&(*ty, *table))
            .map(|h| Instr::Call(Call { func: *h })),
        _ => None,
    });
    helpers.into_values().collect()
}

/// `roam_quiet_indirect_<n>`: the parameters of `ty` and the table index
/// in, the same `call_indirect` inside.
fn helper(module: &mut Module, (ty, table): (TypeId, TableId), n: usize) -> FunctionId {
    let t = module.types.get(ty).clone();
    let mut params = t.params().to_vec();
    params.push(walrus::ValType::I32);
    let args: Vec<_> = params.iter().map(|p| module.locals.add(*p)).collect();
    let mut fb = FunctionBuilder::new(&mut module.types, &params, t.results());
    fb.name(format!("roam_quiet_indirect_{n}"));
    let mut body = fb.func_body();
    for a in &args {
        body.local_get(*a);
    }
    body.instr(CallIndirect { ty, table });
    fb.finish(args, &mut module.funcs)
}

/// Replace every call of a function whose whole body is `local.get 0 …
/// local.get n; call_indirect` (a helper, or any function of that shape) by
/// that `call_indirect`; returns how many calls were replaced.
///
/// The operands of the call are already on the stack in the helper's
/// parameter order, which is the `call_indirect`'s, so the replacement is
/// exact for any function of that shape. It runs on Asyncify's output: the
/// helper was left without Asyncify's code, so its caller treated the call
/// as one that cannot unwind, and the `call_indirect` in its place is one.
/// The helpers themselves are left for the optimiser to drop.
pub(crate) fn inline_helpers(module: &mut Module) -> usize {
    let mut shape: BTreeMap<FunctionId, CallIndirect> = BTreeMap::new();
    for (id, func) in module.funcs.iter_local() {
        if let Some(call) = trampoline(module, func) {
            shape.insert(id, call);
        }
    }
    if shape.is_empty() {
        return 0;
    }
    let funcs: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    replace_each(module, &funcs, |instr| match instr {
        Instr::Call(Call { func }) => shape.get(func).cloned().map(Instr::CallIndirect),
        _ => None,
    })
}

/// Replace every instruction of the local functions `funcs` for which
/// `swap` gives a replacement; returns how many were replaced.
fn replace_each(
    module: &mut Module,
    funcs: &[FunctionId],
    mut swap: impl FnMut(&Instr) -> Option<Instr>,
) -> usize {
    let mut replaced = 0;
    for &id in funcs {
        let walrus::FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
            continue;
        };
        let mut seqs = vec![func.entry_block()];
        while let Some(seq) = seqs.pop() {
            for (instr, _) in func.block_mut(seq).instrs.iter_mut() {
                seqs.extend(children(instr));
                if let Some(new) = swap(instr) {
                    *instr = new;
                    replaced += 1;
                }
            }
        }
    }
    replaced
}

/// The `call_indirect` of `func` if its body is exactly its parameters in
/// order followed by that call, and its type is the call's type with the
/// table index added as a last `i32` parameter.
fn trampoline(module: &Module, func: &walrus::LocalFunction) -> Option<CallIndirect> {
    let instrs = &func.block(func.entry_block()).instrs;
    let (Instr::CallIndirect(call), _) = instrs.last()? else {
        return None;
    };
    let own = module.types.get(func.ty());
    let callee = module.types.get(call.ty);
    let mut want = callee.params().to_vec();
    want.push(walrus::ValType::I32);
    if own.params() != want.as_slice() || own.results() != callee.results() {
        return None;
    }
    // `func.args` are the parameters, so they match `want` one for one.
    if instrs.len() != want.len() + 1 {
        return None;
    }
    let in_order = instrs[..want.len()]
        .iter()
        .zip(&func.args)
        .all(|((i, _), arg)| matches!(i, Instr::LocalGet(g) if g.local == *arg));
    in_order.then(|| call.clone())
}

#[cfg(test)]
#[path = "indirect_tests.rs"]
pub(crate) mod tests;
