//! Pure recursion that leaves to its caller's point.
//!
//! A recursive function needs a migration point on every trip round its
//! cycle, and Asyncify must then instrument it: after every recursive call
//! it checks whether the stack is unwinding, and around the code between
//! calls it adds guards for rewinding. For a small function such as
//! Ackermann's, whose plain body is a few instructions and a call, that
//! doubles the cost of every call (`recurse` ran 2.5× slower in
//! `ackermann` than unprepared).
//!
//! Many such functions are *pure*: they read memory and globals, but write
//! nothing except their own locals, and call only functions of the same
//! kind. A run of one can be abandoned at any moment and started again from
//! its arguments with the same result, because nothing it read has changed.
//! So their frames never need to be captured. Such a function (the *fast*
//! form) gets no Asyncify code at all. Where it would have a migration
//! point, it checks the flag and, when the flag is up, sets `roam.abort` and
//! returns at once; after each call of another fast function, it returns at
//! once when `roam.abort` is set. The whole recursion falls back to its
//! caller in as many returns as it is deep, with no state saved.
//!
//! Callers outside the pure set call a *wrapper* instead. It calls the fast
//! form; if that was abandoned, it clears `roam.abort`, calls the migration
//! point (which takes the checkpoint, or returns at once if the request is
//! gone), and then runs the call again in the *slow* form: a copy of the
//! function, and of every pure function it calls, with ordinary migration
//! points under Asyncify. The slow form is never abandoned, so the program
//! makes progress even when every point is asked to stop (as
//! `--checkpoint-every-points` does). Only that one call runs slowly; the
//! next call from outside is fast again.
//!
//! The bound on the time to the next point is unchanged: the fast form
//! checks the flag exactly where the ordinary form has a point, and giving
//! up costs one return per frame. A migration costs at most one outer call
//! done twice (once abandoned, once slowly).
//!
//! What makes a function pure here is checked conservatively on the
//! instructions: no store, no `global.set`, no memory or table change, no
//! import call, no call through a table whose contents are unknown, and
//! every callee pure. A function that the host or a table can reach
//! directly (the start function, an export, an element segment,
//! `ref.func`) keeps its ordinary form, since a wrapper can only be put in
//! front of calls roam sees; so do roam's own moved loops, which their
//! hoisted form already keeps out of Asyncify's way.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use walrus::ir::{Call, Const, GlobalSet, Instr, InstrSeqId, Return, ReturnCall, Value};
use walrus::{
    ConstExpr, ElementItems, ExportItem, FunctionBuilder, FunctionId, FunctionKind, LocalFunction,
    Module, ValType,
};

use crate::callgraph::CallGraph;
use crate::outline::{children, walk};
use crate::quiet::Quiet;

/// Export name of the global the fast forms set when they give up. It is 0
/// at every migration point, so it holds nothing a snapshot must keep.
pub const ABORT_GLOBAL_EXPORT: &str = "roam.abort";
/// Export name of the fast forms' budget: checks left before the running
/// call gives up and runs in the slow form. Set by the wrapper before every
/// fast call, so its value at a point is never used again.
pub const BUDGET_GLOBAL_EXPORT: &str = "roam.budget";

/// Checks (function entries and loop iterations where the ordinary form has
/// a point) a fast call may pass before it gives up and runs again in the
/// slow form: 2^24, some tens of milliseconds. It bounds what a migration
/// can throw away, and keeps a long pure computation (a deep recursion that
/// runs for minutes) from being run twice.
pub const FAST_BUDGET: i32 = 1 << 24;

#[cfg(test)]
thread_local! {
    /// A smaller budget for the tests on this thread.
    pub(crate) static TEST_BUDGET: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// [`FAST_BUDGET`], or the tests' own.
fn budget() -> i32 {
    #[cfg(test)]
    if let Some(b) = TEST_BUDGET.with(|b| b.get()) {
        return b;
    }
    FAST_BUDGET
}

/// The globals the fast forms and wrappers share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Globals {
    /// `roam.abort`: raised by a fast form that gives up.
    pub abort: walrus::GlobalId,
    /// `roam.budget`: checks left for the running fast call.
    pub budget: walrus::GlobalId,
}

/// The functions whose fast form gives up instead of unwinding: pure,
/// reaching a point, not reachable from outside the module's own direct
/// calls, and calling no function that may unwind other than each other.
pub(crate) fn abortable(module: &Module, graph: &CallGraph, quiet: &Quiet) -> BTreeSet<FunctionId> {
    let escaped = escaped(module);
    let callees: BTreeMap<FunctionId, Vec<FunctionId>> = module
        .funcs
        .iter_local()
        .filter(|(_, f)| writes_nothing(f))
        .filter_map(|(id, _)| Some((id, graph.callees(id)?)))
        .collect();
    let pure = shrink(&callees, callees.keys().copied().collect(), |_| false);
    let fast = pure
        .iter()
        .copied()
        .filter(|f| !quiet.contains(*f) && !escaped.contains(f) && zeroable(module, *f))
        .collect();
    shrink(&callees, fast, |g| quiet.contains(g))
}

/// The largest subset of `set` whose every member calls only members or
/// functions `outside_ok` accepts (`callees` lists the calls of every
/// member). A worklist: when a function leaves, only its callers are looked
/// at again, so a long chain costs its length, not its square.
fn shrink(
    callees: &BTreeMap<FunctionId, Vec<FunctionId>>,
    mut set: BTreeSet<FunctionId>,
    outside_ok: impl Fn(FunctionId) -> bool,
) -> BTreeSet<FunctionId> {
    let mut callers: BTreeMap<FunctionId, Vec<FunctionId>> = BTreeMap::new();
    for f in &set {
        for g in &callees[f] {
            callers.entry(*g).or_default().push(*f);
        }
    }
    let mut work: Vec<FunctionId> = set.iter().copied().collect();
    while let Some(f) = work.pop() {
        let keep = set.contains(&f)
            && callees[&f]
                .iter()
                .all(|g| set.contains(g) || outside_ok(*g));
        if !keep && set.remove(&f) {
            work.extend(callers.get(&f).into_iter().flatten().copied());
        }
    }
    set
}

/// Functions that keep their ordinary form: those something other than a
/// direct call may start (the start function, exports, table elements and
/// `ref.func` targets), and roam's own outlined loops (`outline.rs`,
/// exported to keep `wasm-opt` from inlining them). A moved loop already
/// runs without Asyncify in its hoisted form, which checks only the flag;
/// a fast form would count its budget down on every iteration, and throw
/// away a whole budget's work on every run of a nest that is longer than
/// that (`matmul` ran 15 % slower with its two pure nests as fast forms).
pub(crate) fn escaped(module: &Module) -> HashSet<FunctionId> {
    let mut out: HashSet<FunctionId> = module.start.into_iter().collect();
    for e in module.exports.iter() {
        if let ExportItem::Function(f) = e.item {
            out.insert(f);
        }
    }
    for e in module.elements.iter() {
        match &e.items {
            ElementItems::Functions(fs) => out.extend(fs.iter().copied()),
            ElementItems::Expressions(_, exprs) => {
                out.extend(exprs.iter().filter_map(|x| match x {
                    ConstExpr::RefFunc(f) => Some(*f),
                    _ => None,
                }))
            }
        }
    }
    for g in module.globals.iter() {
        if let walrus::GlobalKind::Local(ConstExpr::RefFunc(f)) = g.kind {
            out.insert(f);
        }
    }
    for (_, func) in module.funcs.iter_local() {
        walk(func, func.entry_block(), &mut |i| {
            if let Instr::RefFunc(r) = i {
                out.insert(r.func);
            }
        });
    }
    out
}

/// Whether every result of `f` has a zero value a fast form can return.
fn zeroable(module: &Module, f: FunctionId) -> bool {
    let ty = module.types.get(module.funcs.get(f).ty());
    ty.results().iter().all(|t| zero(*t).is_some())
}

pub(crate) fn zero(ty: ValType) -> Option<Value> {
    match ty {
        ValType::I32 => Some(Value::I32(0)),
        ValType::I64 => Some(Value::I64(0)),
        ValType::F32 => Some(Value::F32(0.0)),
        ValType::F64 => Some(Value::F64(0.0)),
        ValType::V128 => Some(Value::V128(0)),
        ValType::Ref(_) => None,
    }
}

/// Whether `func` writes nothing but its own locals: a whitelist, so an
/// instruction not named here (a store, `global.set`, `memory.grow`, a
/// table or atomic operation, a tail call) makes it impure.
fn writes_nothing(func: &LocalFunction) -> bool {
    let mut ok = true;
    walk(func, func.entry_block(), &mut |i| {
        ok &= matches!(i, Instr::Call(_) | Instr::CallIndirect(_)) || crate::rerun::computes(i);
    });
    ok
}

/// The module after [`split`]: which functions are fast, their slow copies
/// and wrappers, and the globals they share.
pub(crate) struct Split {
    /// The fast functions (the original ids, so every call among them
    /// stays as it was).
    pub fast: BTreeSet<FunctionId>,
    /// The slow copies, run after a fast form gave up.
    pub slow: BTreeSet<FunctionId>,
    /// The wrappers in front of calls from outside.
    pub wrappers: BTreeSet<FunctionId>,
    /// `roam.abort` and `roam.budget`.
    pub globals: Globals,
}

/// Give every function of `fast` a slow copy, put a wrapper in front of
/// every call from outside the set, and add `roam.abort` and
/// `roam.budget`. The fast forms
/// themselves get their checks from [`give_up_checks`] once the other
/// functions have their points.
pub(crate) fn split(
    module: &mut Module,
    fast: BTreeSet<FunctionId>,
    point: FunctionId,
) -> Result<Split, crate::pipeline::PrepareError> {
    let mut global = |name: &str| {
        let g =
            module
                .globals
                .add_local(ValType::I32, true, false, ConstExpr::Value(Value::I32(0)));
        crate::instrument::add_export(module, name, g.into()).map(|_| g)
    };
    let globals = Globals {
        abort: global(ABORT_GLOBAL_EXPORT)?,
        budget: global(BUDGET_GLOBAL_EXPORT)?,
    };
    let slow: BTreeMap<FunctionId, FunctionId> = fast
        .iter()
        .map(|f| (*f, copy_function(module, *f)))
        .collect();
    let copies: BTreeSet<FunctionId> = slow.values().copied().collect();
    for s in &copies {
        retarget(module, *s, &slow);
    }
    let outside: Vec<FunctionId> = module
        .funcs
        .iter_local()
        .map(|(id, _)| id)
        .filter(|id| !fast.contains(id) && !copies.contains(id))
        .collect();
    let called: BTreeSet<FunctionId> = outside
        .iter()
        .flat_map(|id| direct_callees(module, *id))
        .filter(|g| fast.contains(g))
        .collect();
    let wrappers: BTreeMap<FunctionId, FunctionId> = called
        .iter()
        .map(|f| (*f, wrapper(module, *f, slow[f], globals, point)))
        .collect();
    for id in outside {
        retarget(module, id, &wrappers);
    }
    Ok(Split {
        fast,
        slow: copies,
        wrappers: wrappers.into_values().collect(),
        globals,
    })
}

/// The functions `id` calls directly.
fn direct_callees(module: &Module, id: FunctionId) -> Vec<FunctionId> {
    let FunctionKind::Local(func) = &module.funcs.get(id).kind else {
        return Vec::new();
    };
    let mut out = Vec::new();
    walk(func, func.entry_block(), &mut |i| match i {
        Instr::Call(Call { func }) | Instr::ReturnCall(ReturnCall { func }) => out.push(*func),
        _ => {}
    });
    out
}

/// Point the direct calls of `id` at `to[callee]` where there is one.
fn retarget(module: &mut Module, id: FunctionId, to: &BTreeMap<FunctionId, FunctionId>) {
    let FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
        return;
    };
    let mut seqs = vec![func.entry_block()];
    while let Some(seq) = seqs.pop() {
        for (instr, _) in func.block_mut(seq).instrs.iter_mut() {
            match instr {
                Instr::Call(Call { func }) | Instr::ReturnCall(ReturnCall { func }) => {
                    if let Some(t) = to.get(func) {
                        *func = *t;
                    }
                }
                other => seqs.extend(children(other)),
            }
        }
    }
}

/// A copy of `f` under the name `<name>.roam_slow`, sharing its locals
/// (walrus numbers locals per function when it writes the module).
fn copy_function(module: &mut Module, f: FunctionId) -> FunctionId {
    let ty = module.types.get(module.funcs.get(f).ty()).clone();
    let name = module.funcs.get(f).name.clone();
    let FunctionKind::Local(src) = &module.funcs.get(f).kind else {
        unreachable!("fast functions are local");
    };
    let args = src.args.clone();
    let mut fb = FunctionBuilder::new(&mut module.types, ty.params(), ty.results());
    if let Some(n) = name {
        fb.name(format!("{n}.roam_slow"));
    }
    let body = fb.func_body_id();
    crate::outline::copy_body(src, &mut fb, body);
    fb.finish(args, &mut module.funcs)
}

/// `f`'s wrapper: give the fast form its budget and call it; if it gave up,
/// clear `abort`, call the point (which returns at once if nothing was
/// asked, as when the budget ran out) and run the call again in the slow
/// form.
fn wrapper(
    module: &mut Module,
    f: FunctionId,
    slow: FunctionId,
    Globals { abort, budget }: Globals,
    point: FunctionId,
) -> FunctionId {
    let ty = module.types.get(module.funcs.get(f).ty()).clone();
    let name = module.funcs.get(f).name.clone();
    let args: Vec<_> = ty.params().iter().map(|t| module.locals.add(*t)).collect();
    let results: Vec<_> = ty.results().iter().map(|t| module.locals.add(*t)).collect();
    let mut fb = FunctionBuilder::new(&mut module.types, ty.params(), ty.results());
    if let Some(n) = name {
        fb.name(format!("{n}.roam_rerun"));
    }
    let mut b = fb.func_body();
    let run = |b: &mut walrus::InstrSeqBuilder<'_>, callee: FunctionId| {
        for a in &args {
            b.local_get(*a);
        }
        b.call(callee);
        for r in results.iter().rev() {
            b.local_set(*r);
        }
    };
    b.i32_const(self::budget())
        .instr(GlobalSet { global: budget });
    run(&mut b, f);
    b.global_get(abort);
    b.if_else(
        None,
        |then| {
            then.i32_const(0)
                .instr(GlobalSet { global: abort })
                .call(point);
            run(then, slow);
        },
        |_| {},
    );
    for r in &results {
        b.local_get(*r);
    }
    fb.finish(args.clone(), &mut module.funcs)
}

/// Turn the fast form `func` (results `results`) into one that gives up:
/// each of `points` (the sequences where the ordinary form would have a
/// point) starts with `budget -= 1; if flag | budget == 0 { abort = 1;
/// return zeros }`, and each call of a function in `fast` is followed by
/// `if abort { return zeros }`.
pub(crate) fn give_up_checks(
    func: &mut LocalFunction,
    points: &[InstrSeqId],
    results: &[ValType],
    fast: &BTreeSet<FunctionId>,
    flag: walrus::GlobalId,
    Globals { abort, budget }: Globals,
) {
    let zeros: Vec<Value> = results
        .iter()
        .map(|t| zero(*t).expect("fast functions have zeroable results"))
        .collect();
    let give_up = |then: &mut walrus::InstrSeqBuilder<'_>| {
        for z in &zeros {
            then.instr(Const { value: *z });
        }
        then.instr(Return {});
    };
    // After calls first: the checks added at the points contain no call.
    let mut seqs = vec![func.entry_block()];
    while let Some(seq) = seqs.pop() {
        let instrs = std::mem::take(&mut func.block_mut(seq).instrs);
        let mut out = Vec::with_capacity(instrs.len());
        for (instr, loc) in instrs {
            seqs.extend(children(&instr));
            let calls_fast = matches!(&instr, Instr::Call(Call { func }) if fast.contains(func));
            out.push((instr, loc));
            if calls_fast {
                let then = {
                    let mut b = func.builder_mut().dangling_instr_seq(None);
                    give_up(&mut b);
                    b.id()
                };
                let alternative = func.builder_mut().dangling_instr_seq(None).id();
                out.push((walrus::ir::GlobalGet { global: abort }.into(), loc));
                out.push((
                    walrus::ir::IfElse {
                        consequent: then,
                        alternative,
                    }
                    .into(),
                    loc,
                ));
            }
        }
        func.block_mut(seq).instrs = out;
    }
    for seq in points {
        let then = {
            let mut b = func.builder_mut().dangling_instr_seq(None);
            b.i32_const(1).instr(GlobalSet { global: abort });
            give_up(&mut b);
            b.id()
        };
        let alternative = func.builder_mut().dangling_instr_seq(None).id();
        let check: Vec<Instr> = vec![
            walrus::ir::GlobalGet { global: budget }.into(),
            Const {
                value: Value::I32(1),
            }
            .into(),
            walrus::ir::Binop {
                op: walrus::ir::BinaryOp::I32Sub,
            }
            .into(),
            GlobalSet { global: budget }.into(),
            walrus::ir::GlobalGet { global: budget }.into(),
            walrus::ir::Unop {
                op: walrus::ir::UnaryOp::I32Eqz,
            }
            .into(),
            walrus::ir::GlobalGet { global: flag }.into(),
            walrus::ir::Binop {
                op: walrus::ir::BinaryOp::I32Or,
            }
            .into(),
            walrus::ir::IfElse {
                consequent: then,
                alternative,
            }
            .into(),
        ];
        let instrs = &mut func.block_mut(*seq).instrs;
        instrs.splice(0..0, check.into_iter().map(|i| (i, Default::default())));
    }
}

#[cfg(test)]
#[path = "pure_tests.rs"]
pub(crate) mod tests;
