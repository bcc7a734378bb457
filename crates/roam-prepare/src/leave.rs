//! Calls that end the program, made after their caller has returned.
//!
//! Real programs check for errors everywhere and end on them: an
//! interpreter's dispatch loop calls `die("calling a non-function")` at
//! every opcode that can go wrong, and `die` prints with `fprintf` and
//! calls `exit`. `fprintf` has loops, so it has points, so every one of
//! those calls may unwind, and Asyncify guards every stretch of the
//! dispatch loop between them: `interp`'s dispatch function had 358 checks
//! of Asyncify's state. With `die` reduced to a trap by hand, it had 62,
//! and the program ran 1.10× plain instead of 1.4×. In `interp` as clang
//! builds it, though, `die` is inlined into the dispatch function, so this
//! pass moves the `exit` there and the `fprintf` before it stays: 260
//! checks (docs/prepare.md).
//!
//! A call of a function that never returns (every path ends in
//! `unreachable`, `proc_exit` or another such call) leaves its caller's
//! frame dead: nothing after the call runs. So the call can as well be
//! made from the caller's caller, once the caller has returned. That is
//! what this pass does, with the functions it can see every call of:
//!
//! - **in a function that leaves** (one only direct calls reach, that
//!   returns, and that calls such a function, or another function that
//!   leaves): the call's arguments go into the scratch globals
//!   `roam.exit.<n>`, the number of the function to call into `roam.exit`,
//!   and the function returns zeros;
//! - **after every call of a function that leaves**: if `roam.exit` is set,
//!   a caller that leaves itself returns zeros too; any other caller clears
//!   `roam.exit` and makes the call with the arguments from the globals
//!   (through one function, `roam_exit_dispatch`, so that each check is a
//!   call instruction and not a copy of every possible call).
//!
//! The call still runs, with the same arguments and the same memory: the
//! frames it skips only returned, without running their epilogues, so the
//! shadow stack pointer still covers anything the arguments point to. Its
//! points are all still there, so the bound on the time to the next point
//! is unchanged; only where the call is made moves, and with it the call
//! sites Asyncify must instrument. `roam.exit` is set only between the
//! return and the call, where there is no point, so no snapshot ever holds
//! anything in these globals (`verify.rs` accepts them like the copies of
//! spilled point calls).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use walrus::ir::{
    BinaryOp, Call, Const, GlobalGet, GlobalSet, IfElse, Instr, InstrLocId, InstrSeqId, Return,
    Unreachable, Value,
};
use walrus::{
    ConstExpr, ExportItem, FunctionBuilder, FunctionId, FunctionKind, GlobalId, ImportKind,
    LocalFunction, Module, ValType,
};

use crate::outline::{branch_targets, children, walk};
use crate::pipeline::PrepareError;
use crate::pure::{escaped, zero};
use crate::quiet::Quiet;

/// Export name of the global that says which call is pending (0: none).
pub const EXIT_GLOBAL_EXPORT: &str = "roam.exit";

/// Export-name prefix of the globals that carry a pending call's arguments.
pub const EXIT_ARG_EXPORT_PREFIX: &str = "roam.exit.";

/// Move the calls of functions that never return and may unwind out of
/// every function that can leave before them. Returns how many functions
/// leave.
pub(crate) fn lift_exits(module: &mut Module, quiet: &Quiet) -> Result<usize, PrepareError> {
    let never = never_return(module);
    let calls = direct_calls(module);
    // The calls to move: functions that never return and may unwind.
    let ends: BTreeSet<FunctionId> = never
        .iter()
        .copied()
        .filter(|f| !quiet.contains(*f) && params_zeroable(module, *f))
        .collect();
    let escaped = escaped(module);
    let eligible =
        |f: FunctionId| !escaped.contains(&f) && !never.contains(&f) && results_zeroable(module, f);
    // Functions that leave: they call an end, or a function that leaves.
    let mut leaving: BTreeSet<FunctionId> = BTreeSet::new();
    loop {
        let before = leaving.len();
        for (f, callees) in &calls {
            if eligible(*f)
                && callees
                    .iter()
                    .any(|g| ends.contains(g) || leaving.contains(g))
            {
                leaving.insert(*f);
            }
        }
        if leaving.len() == before {
            break;
        }
    }
    if leaving.is_empty() {
        return Ok(0);
    }
    // Only the ends a leaving function calls need globals.
    let lifted: Vec<FunctionId> = ends
        .iter()
        .copied()
        .filter(|e| leaving.iter().any(|f| calls[f].contains(e)))
        .collect();
    let globals = Globals::add(module, &lifted)?;
    let ids: Vec<FunctionId> = module.funcs.iter_local().map(|(id, _)| id).collect();
    let dispatch = dispatcher(module, &globals);
    for id in ids {
        let results = result_zeros(module, id);
        let FunctionKind::Local(func) = &mut module.funcs.get_mut(id).kind else {
            continue;
        };
        if leaving.contains(&id) {
            stash_ends(func, &globals, &results);
        }
        let then = match leaving.contains(&id) {
            true => zeros_and_return(&results),
            false => vec![at(Call { func: dispatch }), at(Unreachable {})],
        };
        check_after_calls(func, &leaving, globals.which, &then);
    }
    Ok(leaving.len())
}

/// Functions that never return: imported `proc_exit`, and local functions
/// without a `return` or a branch to their body's end whose body, at its
/// top level, reaches `unreachable` or a call of such a function.
fn never_return(module: &Module) -> HashSet<FunctionId> {
    let mut never: HashSet<FunctionId> = module
        .imports
        .iter()
        .filter(|i| i.module == "wasi_snapshot_preview1" && i.name == "proc_exit")
        .filter_map(|i| match i.kind {
            ImportKind::Function(f) => Some(f),
            _ => None,
        })
        .collect();
    loop {
        let before = never.len();
        for (id, func) in module.funcs.iter_local() {
            if !never.contains(&id) && ends_every_path(func, &never) {
                never.insert(id);
            }
        }
        if never.len() == before {
            return never;
        }
    }
}

fn ends_every_path(func: &LocalFunction, never: &HashSet<FunctionId>) -> bool {
    let body = func.entry_block();
    let mut returns = false;
    walk(func, body, &mut |i| {
        returns |= matches!(
            i,
            Instr::Return(_)
                | Instr::ReturnCall(_)
                | Instr::ReturnCallIndirect(_)
                | Instr::ReturnCallRef(_)
        ) || branch_targets(i).contains(&body);
    });
    !returns
        && func.block(body).instrs.iter().any(|(i, _)| match i {
            Instr::Unreachable(_) => true,
            Instr::Call(Call { func }) => never.contains(func),
            _ => false,
        })
}

/// The functions each local function calls directly.
fn direct_calls(module: &Module) -> BTreeMap<FunctionId, BTreeSet<FunctionId>> {
    module
        .funcs
        .iter_local()
        .map(|(id, func)| {
            let mut callees = BTreeSet::new();
            walk(func, func.entry_block(), &mut |i| {
                if let Instr::Call(Call { func }) = i {
                    callees.insert(*func);
                }
            });
            (id, callees)
        })
        .collect()
}

fn params_zeroable(module: &Module, f: FunctionId) -> bool {
    let ty = module.types.get(module.funcs.get(f).ty());
    ty.params().iter().all(|t| zero(*t).is_some())
}

fn results_zeroable(module: &Module, f: FunctionId) -> bool {
    let ty = module.types.get(module.funcs.get(f).ty());
    ty.results().iter().all(|t| zero(*t).is_some())
}

/// The zeros `f` returns when it leaves (empty if it has a result without
/// one; such a function never leaves).
fn result_zeros(module: &Module, f: FunctionId) -> Vec<Value> {
    let ty = module.types.get(module.funcs.get(f).ty());
    ty.results().iter().filter_map(|t| zero(*t)).collect()
}

/// `roam.exit` and, per lifted function, the globals of its arguments.
struct Globals {
    which: GlobalId,
    /// Lifted function, its number in `which` (from 1), its argument
    /// globals in parameter order.
    ends: Vec<(FunctionId, i32, Vec<GlobalId>)>,
}

impl Globals {
    fn add(module: &mut Module, lifted: &[FunctionId]) -> Result<Self, PrepareError> {
        let export = |module: &mut Module, name: String, ty: ValType| {
            if module.exports.iter().any(|e| e.name == name) {
                return Err(PrepareError::ExportNameTaken { name });
            }
            let init = ConstExpr::Value(zero(ty).expect("only zeroable types"));
            let g = module.globals.add_local(ty, true, false, init);
            module.exports.add(&name, ExportItem::Global(g));
            Ok(g)
        };
        let which = export(module, EXIT_GLOBAL_EXPORT.to_string(), ValType::I32)?;
        let mut n = 0;
        let mut ends = Vec::new();
        for (k, f) in lifted.iter().enumerate() {
            let params = module
                .types
                .get(module.funcs.get(*f).ty())
                .params()
                .to_vec();
            let mut args = Vec::new();
            for ty in params {
                args.push(export(module, format!("{EXIT_ARG_EXPORT_PREFIX}{n}"), ty)?);
                n += 1;
            }
            ends.push((*f, k as i32 + 1, args));
        }
        Ok(Globals { which, ends })
    }
}

fn at(i: impl Into<Instr>) -> (Instr, InstrLocId) {
    (i.into(), InstrLocId::default())
}

fn zeros_and_return(results: &[Value]) -> Vec<(Instr, InstrLocId)> {
    let mut out: Vec<_> = results.iter().map(|v| at(Const { value: *v })).collect();
    out.push(at(Return {}));
    out
}

/// In a function that leaves: every call of a lifted function stores its
/// arguments and number and returns zeros instead.
fn stash_ends(func: &mut LocalFunction, globals: &Globals, results: &[Value]) {
    each_call_backwards(func, |func, seq, k, callee| {
        let Some((_, number, args)) = globals.ends.iter().find(|(f, ..)| *f == callee) else {
            return;
        };
        let mut with: Vec<_> = args
            .iter()
            .rev()
            .map(|g| at(GlobalSet { global: *g }))
            .collect();
        with.push(at(Const {
            value: Value::I32(*number),
        }));
        with.push(at(GlobalSet {
            global: globals.which,
        }));
        with.extend(zeros_and_return(results));
        func.block_mut(seq).instrs.splice(k..=k, with);
    });
}

/// Visit every direct call of `func` as `(func, sequence, index, callee)`,
/// each sequence from its end, so that a visit may replace the call or
/// insert after it without moving the calls still to come.
fn each_call_backwards(
    func: &mut LocalFunction,
    mut visit: impl FnMut(&mut LocalFunction, InstrSeqId, usize, FunctionId),
) {
    for seq in sequences(func) {
        let mut k = func.block(seq).instrs.len();
        while k > 0 {
            k -= 1;
            if let Instr::Call(Call { func: callee }) = func.block(seq).instrs[k].0 {
                visit(func, seq, k, callee);
            }
        }
    }
}

/// After every call of a function that leaves: if a call is pending, run
/// `then` (return zeros too, or make the call).
fn check_after_calls(
    func: &mut LocalFunction,
    leaving: &BTreeSet<FunctionId>,
    which: GlobalId,
    then: &[(Instr, InstrLocId)],
) {
    each_call_backwards(func, |func, seq, k, callee| {
        if !leaving.contains(&callee) {
            return;
        }
        let builder = func.builder_mut();
        let consequent = builder.dangling_instr_seq(None).id();
        let alternative = builder.dangling_instr_seq(None).id();
        func.block_mut(consequent).instrs = then.to_vec();
        let check = [
            at(GlobalGet { global: which }),
            at(IfElse {
                consequent,
                alternative,
            }),
        ];
        func.block_mut(seq).instrs.splice(k + 1..k + 1, check);
    });
}

/// `roam_exit_dispatch`: clear `roam.exit` and make the call it names,
/// with the arguments from their globals; never returns. One function, so
/// each check after a call costs a call instruction, not a copy of this.
fn dispatcher(module: &mut Module, globals: &Globals) -> FunctionId {
    let mut fb = FunctionBuilder::new(&mut module.types, &[], &[]);
    fb.name("roam_exit_dispatch".to_string());
    let mut body = fb.func_body();
    for (f, number, args) in &globals.ends {
        body.global_get(globals.which)
            .i32_const(*number)
            .binop(BinaryOp::I32Eq)
            .if_else(
                None,
                |then| {
                    for g in args {
                        then.global_get(*g);
                    }
                    then.i32_const(0)
                        .global_set(globals.which)
                        .call(*f)
                        .unreachable();
                },
                |_| {},
            );
    }
    body.unreachable();
    fb.finish(Vec::new(), &mut module.funcs)
}

/// Every instruction sequence of `func`, before any is changed.
fn sequences(func: &LocalFunction) -> Vec<InstrSeqId> {
    let mut out = vec![func.entry_block()];
    let mut k = 0;
    while k < out.len() {
        for (i, _) in &func.block(out[k]).instrs {
            out.extend(children(i));
        }
        k += 1;
    }
    out
}

#[cfg(test)]
#[path = "leave_tests.rs"]
pub(crate) mod tests;
