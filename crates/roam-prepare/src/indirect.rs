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
//! outlining) both see as quiet; the optimiser may inline the helper back
//! once Asyncify is done. Calls whose targets are unknown or loud are left
//! as they are.

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
    for id in funcs {
        let walrus::FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
            continue;
        };
        let mut seqs = vec![func.entry_block()];
        while let Some(seq) = seqs.pop() {
            for (instr, _) in func.block_mut(seq).instrs.iter_mut() {
                seqs.extend(children(instr));
                if let Instr::CallIndirect(CallIndirect { ty, table }) = instr {
                    if let Some(h) = helpers.get(&(*ty, *table)) {
                        *instr = Instr::Call(Call { func: *h });
                    }
                }
            }
        }
    }
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

#[cfg(test)]
#[path = "indirect_tests.rs"]
pub(crate) mod tests;
