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
//! entries that target them are hoisted; the others keep the inline point.

use walrus::ir::{Br, BrIf, BrTable, GlobalGet, IfElse, Instr, InstrSeqId, InstrSeqType, Loop};
use walrus::{FunctionId, GlobalId, LocalFunction};

use crate::quiet::Quiet;

/// Whether loop `seq` can be hoisted: no call that may unwind anywhere
/// inside it (calls of [`Quiet`] functions are fine), no parameters, and
/// no `br_table` that may branch to it.
pub(crate) fn hoistable(func: &LocalFunction, seq: InstrSeqId, quiet: &Quiet) -> bool {
    let simple = matches!(func.block(seq).ty, InstrSeqType::Simple(_));
    simple && clean(func, seq, seq, quiet)
}

/// No call that may unwind inside `seq`, and no `br_table` naming `target`.
fn clean(func: &LocalFunction, seq: InstrSeqId, target: InstrSeqId, quiet: &Quiet) -> bool {
    func.block(seq).instrs.iter().all(|(instr, _)| match instr {
        i if quiet.may_unwind(i) => false,
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
) {
    let ty = func.block(looped).ty;
    let outer = {
        let mut b = func.builder_mut().dangling_instr_seq(ty);
        b.global_get(flag);
        b.if_else(
            None,
            |then| {
                then.call(point);
            },
            |_| {},
        );
        b.instr(Loop { seq: looped });
        b.id()
    };
    let slot = &mut func.block_mut(parent).instrs[index].0;
    debug_assert!(matches!(slot, Instr::Loop(Loop { seq }) if *seq == looped));
    *slot = Instr::Loop(Loop { seq: outer });
    back_edges(func, looped, looped, outer, flag);
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
    let children: Vec<InstrSeqId> = func
        .block(seq)
        .instrs
        .iter()
        .flat_map(|(instr, _)| match instr {
            Instr::Block(b) => vec![b.seq],
            Instr::Loop(l) => vec![l.seq],
            Instr::IfElse(i) => vec![i.consequent, i.alternative],
            _ => Vec::new(),
        })
        .collect();
    for child in children {
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

#[cfg(test)]
#[path = "hoist_tests.rs"]
mod tests;
