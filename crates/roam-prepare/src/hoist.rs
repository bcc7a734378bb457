//! Hoisted loop points: a migration point for a loop that makes no call
//! that may unwind, whose own call sits *outside* the loop. (A call of a
//! function that can reach no point and no blocking import cannot unwind:
//! `quiet.rs`.)
//!
//! Why: Asyncify instruments whole structures. A loop that contains a call
//! that may unwind is instrumented inside: every stretch of its body is
//! wrapped in a check of Asyncify's state so that a rewind can skip it, and
//! every local live across the call is kept where the unwind code can save
//! it. An inline point (`if flag { call point }` at the top of the body) is
//! such a call, so a hot inner loop that calls nothing pays for Asyncify on
//! every iteration. A loop that contains no such call is one stretch for
//! Asyncify, guarded once from outside, and runs at the compiler's speed.
//!
//! How: the loop `L` is wrapped in a new loop `R` of the same type, whose
//! body calls the point when the flag is up and then enters `L`:
//!
//! ```wasm
//! loop $R                      ;; same block type as $L
//!   global.get $flag
//!   if  call $point  end       ;; the only call: outside $L
//!   loop $L
//!     ...                      ;; every back-edge `br $L` becomes
//!     global.get $flag         ;;   global.get $flag
//!     br_if $R                 ;;   br_if $R
//!     br $L                    ;;   br $L
//!   end
//! end
//! ```
//!
//! A back-edge taken while the flag is up goes round through `R` instead:
//! it calls the point, then enters `L` at its top, which is exactly where
//! the back-edge was going, with every local as it was. So the time between
//! checks is one iteration, as with an inline point, and the point is called
//! as often (on entry and at every back-edge while the flag is up, which is
//! what counting modes rely on). On a rewind, Asyncify re-enters `R`'s call
//! and resumes from it into `L`.
//!
//! Only loops without calls, without parameters and without `br_table`
//! entries that target them are hoisted; the others keep the inline point,
//! unless `--hoist-calls` (below) hoists a loop that calls.
//!
//! With `--hoist-calls on` (the default), loops that *do* make a call that
//! may unwind are hoisted too ([`hoistable_with_calls`]). Asyncify then
//! guards their body anyway, for the call, but the point's call no longer
//! sits at the loop's head, where its path merged with every back-edge and
//! where Asyncify turned the point's `if` into a choice between the flag
//! and a saved value, made on every trip. An interpreter's dispatch loop
//! ran about a fifth slower that way than with the call outside (1.74×
//! against 1.43× the unprepared time at size L; docs/prepare.md, "Hoisted
//! calling loops"). The sequence of the point's
//! calls is the same as with the inline form: on entry, and at every
//! back-edge taken while the flag is up.

use walrus::ir::{
    Block, Br, BrIf, BrTable, GlobalGet, IfElse, Instr, InstrLocId, InstrSeqId, InstrSeqType, Loop,
};
use walrus::{FunctionId, GlobalId, LocalFunction};

use crate::outline::children;
use crate::quiet::Quiet;

/// Whether loop `seq` can be hoisted: no call that may unwind anywhere
/// inside it (calls of [`Quiet`] functions are fine), no parameters, and
/// no `br_table` that may branch to it.
pub(crate) fn hoistable(func: &LocalFunction, seq: InstrSeqId, quiet: &Quiet) -> bool {
    let simple = matches!(func.block(seq).ty, InstrSeqType::Simple(_));
    simple && clean(func, seq, seq, Some(quiet))
}

/// Whether loop `seq` can be hoisted when calls that may unwind are
/// allowed inside it: no parameters, and no `br_table` that may branch to
/// it (only `br` and `br_if` back-edges can be routed through the flag).
pub(crate) fn hoistable_with_calls(func: &LocalFunction, seq: InstrSeqId) -> bool {
    let simple = matches!(func.block(seq).ty, InstrSeqType::Simple(_));
    simple && clean(func, seq, seq, None)
}

/// No `br_table` naming `target` inside `seq`, and with `quiet`, no call
/// that may unwind.
fn clean(func: &LocalFunction, seq: InstrSeqId, target: InstrSeqId, quiet: Option<&Quiet>) -> bool {
    func.block(seq).instrs.iter().all(|(instr, _)| match instr {
        i if quiet.is_some_and(|q| q.may_unwind(i)) => false,
        Instr::BrTable(BrTable { blocks, default }) => {
            *default != target && !blocks.contains(&target)
        }
        Instr::Block(b) => clean(func, b.seq, target, quiet),
        Instr::Loop(l) => clean(func, l.seq, target, quiet),
        Instr::IfElse(i) => {
            clean(func, i.consequent, target, quiet) && clean(func, i.alternative, target, quiet)
        }
        _ => true,
    })
}

/// Hoist the point of loop `looped`, found at `parent.instrs[index]`.
pub(crate) fn hoist(
    func: &mut LocalFunction,
    parent: InstrSeqId,
    index: usize,
    looped: InstrSeqId,
    point: FunctionId,
    flag: GlobalId,
    unroll: bool,
) {
    let ty = func.block(looped).ty;
    let outer = {
        let mut b = func.builder_mut().dangling_instr_seq(ty);
        b.instr(Loop { seq: looped });
        b.id()
    };
    crate::instrument::insert_point(func, outer, point, flag);
    install(
        func,
        (parent, index),
        looped,
        Loop { seq: outer }.into(),
        (flag, outer),
        unroll,
    );
}

/// Hoist the point of loop `looped`, found at `parent.instrs[index]`, for
/// it and for the loops of `owned` inside it, which leave to it when the
/// flag is up (`rerun.rs`). After the point, the iteration runs once in a
/// slow copy of the body with an inline point in every owned loop, so a
/// half-done iteration is run again at most once:
///
/// ```wasm
/// block $done                  ;; same block type as $L
///   loop $R
///     global.get $flag
///     if
///       call $point
///       block                  ;; slow: $L's body once; `br $L` is `br $R`
///         ...                  ;;   every owned loop starts with its point
///       end
///       br $done
///     end
///     loop $L                  ;; fast: back-edges of $L and of the owned
///       ...                    ;;   loops go `global.get $flag  br_if $R`
///     end
///   end
/// end
/// ```
pub(crate) fn hoist_rerun(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    looped: InstrSeqId,
    owned: &[InstrSeqId],
    point: FunctionId,
    flag: GlobalId,
    unroll: bool,
) {
    let ty = func.block(looped).ty;
    let mut renamed = Vec::new();
    let slow = duplicate(func, looped, &mut renamed);
    for inner in owned {
        let copy = renamed
            .iter()
            .find(|(from, _)| from == inner)
            .map(|(_, copy)| *copy)
            .expect("an owned loop is inside its owner");
        crate::instrument::insert_point(func, copy, point, flag);
    }
    let done = func.builder_mut().dangling_instr_seq(ty).id();
    let rerun = func.builder_mut().dangling_instr_seq(ty).id();
    retarget(func, slow, slow, rerun);
    {
        let mut b = func.builder_mut().instr_seq(rerun);
        b.global_get(flag);
        b.if_else(
            None,
            |taken| {
                taken.call(point);
                taken.instr(Block { seq: slow });
                taken.instr(Br { block: done });
            },
            |_| {},
        );
        b.instr(Loop { seq: looped });
    }
    func.builder_mut()
        .instr_seq(done)
        .instr(Loop { seq: rerun });
    install(
        func,
        (parent, index),
        looped,
        Block { seq: done }.into(),
        (flag, rerun),
        unroll,
    );
    for inner in owned {
        if unroll {
            crate::unroll::unroll(func, *inner);
        }
        back_edges(func, looped, *inner, rerun, flag);
    }
}

/// The sequences the instructions of `seq` open.
fn nested(func: &LocalFunction, seq: InstrSeqId) -> Vec<InstrSeqId> {
    let instrs = &func.block(seq).instrs;
    instrs.iter().flat_map(|(i, _)| children(i)).collect()
}

/// Make every branch to `from` found in `seq` (and the structures inside
/// it) a branch to `to`.
fn retarget(func: &mut LocalFunction, seq: InstrSeqId, from: InstrSeqId, to: InstrSeqId) {
    for child in nested(func, seq) {
        retarget(func, child, from, to);
    }
    for (instr, _) in &mut func.block_mut(seq).instrs {
        match instr {
            Instr::Br(Br { block }) | Instr::BrIf(BrIf { block }) if *block == from => {
                *block = to;
            }
            _ => {}
        }
    }
}

/// Put `with` where loop `looped` was, at `parent.instrs[index]`, and route
/// the loop's back-edges through a check of the flag that branches to
/// `exit` when it is up; with `unroll`, at every other back-edge of a
/// short innermost loop (`unroll.rs`).
fn install(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    looped: InstrSeqId,
    with: Instr,
    (flag, exit): (GlobalId, InstrSeqId),
    unroll: bool,
) {
    replace_loop(func, (parent, index), looped, with);
    if unroll {
        crate::unroll::unroll(func, looped);
    }
    back_edges(func, looped, looped, exit, flag);
}

/// Put `with` where loop `looped` was, at `parent.instrs[index]`.
pub(crate) fn replace_loop(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    looped: InstrSeqId,
    with: Instr,
) {
    let slot = &mut func.block_mut(parent).instrs[index].0;
    debug_assert!(matches!(slot, Instr::Loop(Loop { seq }) if *seq == looped));
    *slot = with;
}

/// Route every back-edge to `target` found in `seq` (and the structures
/// inside it) through a check of the flag that branches to `outer`.
fn back_edges(
    func: &mut LocalFunction,
    seq: InstrSeqId,
    target: InstrSeqId,
    outer: InstrSeqId,
    flag: GlobalId,
) {
    for child in nested(func, seq) {
        back_edges(func, child, target, outer, flag);
    }
    let edges = func.block(seq).instrs.iter().any(|(instr, _)| {
        matches!(instr, Instr::Br(Br { block }) | Instr::BrIf(BrIf { block }) if *block == target)
    });
    if !edges {
        return;
    }
    let old = std::mem::take(&mut func.block_mut(seq).instrs);
    let mut new = Vec::with_capacity(old.len() + 4);
    for (instr, loc) in old {
        match instr {
            Instr::Br(Br { block }) if block == target => {
                new.push((GlobalGet { global: flag }.into(), loc));
                new.push((BrIf { block: outer }.into(), loc));
                new.push((instr, loc));
            }
            Instr::BrIf(BrIf { block }) if block == target => {
                // `cond; br_if $L` becomes `cond; if { flag; br_if $R; br $L }`.
                let taken = {
                    let mut b = func.builder_mut().dangling_instr_seq(None);
                    b.global_get(flag);
                    b.instr(BrIf { block: outer });
                    b.instr(Br { block: target });
                    b.id()
                };
                let empty = func.builder_mut().dangling_instr_seq(None).id();
                new.push((
                    IfElse {
                        consequent: taken,
                        alternative: empty,
                    }
                    .into(),
                    loc,
                ));
            }
            other => new.push((other, loc)),
        }
    }
    func.block_mut(seq).instrs = new;
}

/// Version the loop `looped`, found at `parent.instrs[index]`: a fast copy
/// that only checks the flag, and a slow copy with an inline point that
/// the fast one hands over to when the flag is up:
///
/// ```wasm
/// block $done                  ;; same block type as $L
///   block $slow
///     global.get $flag
///     br_if $slow              ;; the point on entry
///     loop $L                  ;; fast: every back-edge `br $L` becomes
///       ...                    ;;   global.get $flag  br_if $slow  br $L
///     end
///     br $done
///   end
///   loop $S                    ;; slow: a copy of $L's body
///     global.get $flag
///     if  call $point  end
///     ...
///   end
/// end
/// ```
///
/// A back-edge taken while the flag is up leaves the fast loop for the top
/// of the slow one, which is where it was going, with every local as it
/// was; the slow copy runs the rest of that run of the loop. Unlike
/// [`hoist`], the fast loop is not inside a loop that calls: nothing around
/// it merges with the point's call.
pub(crate) fn version(
    func: &mut LocalFunction,
    parent: InstrSeqId,
    index: usize,
    looped: InstrSeqId,
    point: FunctionId,
    flag: GlobalId,
) {
    let ty = func.block(looped).ty;
    let slow = duplicate(func, looped, &mut vec![]);
    crate::instrument::insert_point(func, slow, point, flag);
    let done = func.builder_mut().dangling_instr_seq(ty).id();
    let handover = func.builder_mut().dangling_instr_seq(None).id();
    {
        let mut b = func.builder_mut().instr_seq(handover);
        b.global_get(flag);
        b.instr(BrIf { block: handover });
        b.instr(Loop { seq: looped });
        b.instr(Br { block: done });
    }
    {
        let mut b = func.builder_mut().instr_seq(done);
        b.instr(Block { seq: handover });
        b.instr(Loop { seq: slow });
    }
    install(
        func,
        (parent, index),
        looped,
        Block { seq: done }.into(),
        (flag, handover),
        false,
    );
}

/// A copy of `seq` and everything in it, with labels inside it renamed
/// (`renamed` holds source → copy for the labels opened so far).
pub(crate) fn duplicate(
    func: &mut LocalFunction,
    seq: InstrSeqId,
    renamed: &mut Vec<(InstrSeqId, InstrSeqId)>,
) -> InstrSeqId {
    let ty = func.block(seq).ty;
    let to = func.builder_mut().dangling_instr_seq(ty).id();
    renamed.push((seq, to));
    let instrs = func.block(seq).instrs.clone();
    let out = copy_instrs(func, instrs, renamed);
    func.block_mut(to).instrs = out;
    to
}

/// Copies of `instrs`, whose structures are duplicated as by [`duplicate`]
/// and whose branches follow `renamed`.
pub(crate) fn copy_instrs(
    func: &mut LocalFunction,
    instrs: Vec<(Instr, InstrLocId)>,
    renamed: &mut Vec<(InstrSeqId, InstrSeqId)>,
) -> Vec<(Instr, InstrLocId)> {
    let label = |renamed: &[(InstrSeqId, InstrSeqId)], l: InstrSeqId| {
        renamed
            .iter()
            .find(|(from, _)| *from == l)
            .map_or(l, |(_, copy)| *copy)
    };
    let mut out = Vec::with_capacity(instrs.len());
    for (instr, loc) in instrs {
        let instr = match instr {
            Instr::Block(b) => Instr::Block(Block {
                seq: duplicate(func, b.seq, renamed),
            }),
            Instr::Loop(l) => Instr::Loop(Loop {
                seq: duplicate(func, l.seq, renamed),
            }),
            Instr::IfElse(i) => Instr::IfElse(IfElse {
                consequent: duplicate(func, i.consequent, renamed),
                alternative: duplicate(func, i.alternative, renamed),
            }),
            Instr::Br(b) => Instr::Br(Br {
                block: label(renamed, b.block),
            }),
            Instr::BrIf(b) => Instr::BrIf(BrIf {
                block: label(renamed, b.block),
            }),
            Instr::BrTable(t) => Instr::BrTable(BrTable {
                blocks: t.blocks.iter().map(|b| label(renamed, *b)).collect(),
                default: label(renamed, t.default),
            }),
            other => other,
        };
        out.push((instr, loc));
    }
    out
}

#[cfg(test)]
#[path = "hoist_tests.rs"]
pub(crate) mod tests;
