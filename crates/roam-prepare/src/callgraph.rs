//! The call graph of a module, indirect calls resolved by signature.
//!
//! Two decisions of `prepare` need to know who can call whom:
//!
//! - **Which functions Asyncify instruments.** Left alone, Asyncify assumes
//!   that every indirect call may unwind, which spreads save/restore code
//!   over nearly every function of a program that uses function pointers.
//!   roam knows better: `validate` refuses every instruction that changes a
//!   table at run time (`table.set/grow/fill/copy/init`), so an indirect call
//!   can only reach a function that an *active element segment* put into that
//!   table, and, because `call_indirect` traps on a signature mismatch, only
//!   one whose signature equals the call's type. Only the functions that can
//!   reach an unwinding import over those edges need instrumenting.
//! - **Which function entries need a migration point.** Without recursion
//!   the call depth is bounded, so only functions on a cycle of the graph
//!   (direct or indirect recursion) can run unboundedly long without passing
//!   a loop header.
//!
//! Anything the graph cannot see is treated as the worst case: an indirect
//! call into an imported table, or into a table whose elements come from a
//! `global.get`, may call anything and is counted as reaching every import
//! and as closing a cycle.

use std::collections::{HashMap, HashSet};

use walrus::ir::{Call, CallIndirect, Instr, InstrSeqId, ReturnCall, ReturnCallIndirect};
use walrus::{
    ConstExpr, ElementItems, ElementKind, FunctionId, FunctionKind, LocalFunction, Module, TableId,
    TypeId,
};

/// Call edges between the functions of one module.
pub(crate) struct CallGraph {
    /// Node index → function (imports included).
    ids: Vec<FunctionId>,
    /// Callees of each node, sorted and without duplicates.
    callees: Vec<Vec<usize>>,
    /// The node makes an indirect call whose targets are unknown.
    unknown: Vec<bool>,
    /// Function → node.
    index: HashMap<FunctionId, usize>,
}

impl CallGraph {
    /// Build the graph of `module` as it is now.
    pub(crate) fn new(module: &Module) -> Self {
        let ids: Vec<FunctionId> = module.funcs.iter().map(|f| f.id()).collect();
        let index: HashMap<FunctionId, usize> =
            ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let tables = TableTargets::new(module);
        let mut callees = vec![Vec::new(); ids.len()];
        let mut unknown = vec![false; ids.len()];
        for (id, func) in module.funcs.iter_local() {
            let node = index[&id];
            let mut calls = Calls::default();
            calls.visit(func, func.entry_block());
            let mut out: Vec<usize> = calls.direct.iter().map(|f| index[f]).collect();
            for (ty, table) in calls.indirect {
                match tables.targets(module, table, ty) {
                    Some(targets) => out.extend(targets.iter().map(|f| index[f])),
                    None => unknown[node] = true,
                }
            }
            out.sort_unstable();
            out.dedup();
            callees[node] = out;
        }
        CallGraph {
            ids,
            callees,
            unknown,
            index,
        }
    }

    /// The functions `f` may call (indirect calls resolved by signature), or
    /// `None` when it makes an indirect call whose targets are unknown.
    pub(crate) fn callees(&self, f: FunctionId) -> Option<Vec<FunctionId>> {
        let node = *self.index.get(&f)?;
        (!self.unknown[node]).then(|| self.callees[node].iter().map(|&n| self.ids[n]).collect())
    }

    /// The functions that can (transitively) call one for which `target`
    /// holds, or make an indirect call with unknown targets. The targets
    /// themselves are included.
    pub(crate) fn reaching(&self, target: impl Fn(FunctionId) -> bool) -> HashSet<FunctionId> {
        let mut callers = vec![Vec::new(); self.ids.len()];
        for (from, out) in self.callees.iter().enumerate() {
            for &to in out {
                callers[to].push(from);
            }
        }
        let mut seen = vec![false; self.ids.len()];
        let mut work: Vec<usize> = (0..self.ids.len())
            .filter(|&n| target(self.ids[n]) || self.unknown[n])
            .collect();
        for &n in &work {
            seen[n] = true;
        }
        while let Some(n) = work.pop() {
            for &caller in &callers[n] {
                if !seen[caller] {
                    seen[caller] = true;
                    work.push(caller);
                }
            }
        }
        (0..self.ids.len())
            .filter(|&n| seen[n])
            .map(|n| self.ids[n])
            .collect()
    }

    /// The functions on a cycle of the graph (calling themselves directly,
    /// or through other functions), plus those with an unknown indirect call.
    pub(crate) fn on_cycle(&self) -> HashSet<FunctionId> {
        let component = strongly_connected(&self.callees);
        let mut size = vec![0usize; self.ids.len()];
        for &c in &component {
            size[c] += 1;
        }
        (0..self.ids.len())
            .filter(|&n| size[component[n]] > 1 || self.callees[n].contains(&n) || self.unknown[n])
            .map(|n| self.ids[n])
            .collect()
    }
}

/// What each table can hold: the functions of its active element segments.
pub(crate) struct TableTargets {
    /// `None` for a table whose contents are not known (imported, or filled
    /// from a global).
    contents: HashMap<TableId, Option<Vec<FunctionId>>>,
}

impl TableTargets {
    pub(crate) fn new(module: &Module) -> Self {
        let mut contents: HashMap<TableId, Option<Vec<FunctionId>>> = module
            .tables
            .iter()
            .map(|t| (t.id(), t.import.is_none().then(Vec::new)))
            .collect();
        for element in module.elements.iter() {
            let ElementKind::Active { table, .. } = element.kind else {
                // Passive segments only reach a table through `table.init`,
                // which `validate` refuses; declared ones never do.
                continue;
            };
            let Some(Some(list)) = contents.get_mut(&table) else {
                continue;
            };
            match &element.items {
                ElementItems::Functions(funcs) => list.extend(funcs.iter().copied()),
                ElementItems::Expressions(_, exprs) => {
                    let mut known = true;
                    for expr in exprs {
                        match expr {
                            ConstExpr::RefFunc(f) => list.push(*f),
                            ConstExpr::RefNull(_) => {}
                            _ => known = false,
                        }
                    }
                    if !known {
                        contents.insert(table, None);
                    }
                }
            }
        }
        for list in contents.values_mut().flatten() {
            list.sort_unstable();
            list.dedup();
        }
        TableTargets { contents }
    }

    /// The functions in `table` whose signature is `ty`, or `None` when the
    /// table's contents are unknown.
    pub(crate) fn targets(
        &self,
        module: &Module,
        table: TableId,
        ty: TypeId,
    ) -> Option<Vec<FunctionId>> {
        let list = self.contents.get(&table)?.as_ref()?;
        let want = module.types.get(ty);
        Some(
            list.iter()
                .copied()
                .filter(|f| {
                    let have = module.types.get(module.funcs.get(*f).ty());
                    have.params() == want.params() && have.results() == want.results()
                })
                .collect(),
        )
    }
}

/// Direct callees and `(type, table)` of indirect calls in one function.
#[derive(Default)]
struct Calls {
    direct: Vec<FunctionId>,
    indirect: Vec<(TypeId, TableId)>,
}

impl Calls {
    fn visit(&mut self, func: &LocalFunction, seq: InstrSeqId) {
        for (instr, _) in &func.block(seq).instrs {
            match instr {
                Instr::Block(b) => self.visit(func, b.seq),
                Instr::Loop(l) => self.visit(func, l.seq),
                Instr::IfElse(i) => {
                    self.visit(func, i.consequent);
                    self.visit(func, i.alternative);
                }
                Instr::Call(Call { func: f }) | Instr::ReturnCall(ReturnCall { func: f }) => {
                    self.direct.push(*f)
                }
                Instr::CallIndirect(CallIndirect { ty, table })
                | Instr::ReturnCallIndirect(ReturnCallIndirect { ty, table }) => {
                    self.indirect.push((*ty, *table))
                }
                _ => {}
            }
        }
    }
}

/// Tarjan's algorithm without recursion (call graphs of real programs are
/// deep enough to overflow a thread's stack): the component of each node.
fn strongly_connected(edges: &[Vec<usize>]) -> Vec<usize> {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let mut order = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut component = vec![UNSEEN; n];
    let mut next = 0;
    let mut components = 0;
    for root in 0..n {
        if order[root] != UNSEEN {
            continue;
        }
        // (node, index of the next edge to follow)
        let mut frames = vec![(root, 0usize)];
        order[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (node, ref mut edge)) = frames.last_mut() {
            if let Some(&to) = edges[node].get(*edge) {
                *edge += 1;
                if order[to] == UNSEEN {
                    order[to] = next;
                    low[to] = next;
                    next += 1;
                    stack.push(to);
                    on_stack[to] = true;
                    frames.push((to, 0));
                } else if on_stack[to] {
                    low[node] = low[node].min(order[to]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component[member] = components;
                    if member == node {
                        break;
                    }
                }
                components += 1;
            }
        }
    }
    component
}

/// Whether `module`'s function `id` is defined in the module (not imported).
pub(crate) fn is_local(module: &Module, id: FunctionId) -> bool {
    matches!(module.funcs.get(id).kind, FunctionKind::Local(_))
}

#[cfg(test)]
#[path = "callgraph_tests.rs"]
mod tests;
