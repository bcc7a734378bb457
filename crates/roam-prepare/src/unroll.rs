//! Unrolled checks: a short innermost loop runs its body twice per trip
//! and checks the flag once, at the second back-edge.
//!
//! Why: once a loop's point is hoisted (`hoist.rs`) and the loop has moved
//! into a function of its own (`outline.rs`), what is left of a hot inner
//! loop's cost is the flag check at its back-edge: a load, a test and a
//! second taken branch per iteration, in a loop of a dozen instructions.
//! In `pca` (a row update `y[j] += a * x[j]`) that check made the whole
//! program a fifth slower; checking every other back-edge took all of it
//! back (docs/prepare.md).
//!
//! How: the loop `L` keeps its body `B`, whose back-edges get the flag
//! check as before, and runs a copy of `B` first, whose back-edges fall
//! into `B` instead of checking:
//!
//! ```wasm
//! loop $L
//!   block $end
//!     block $first           ;; a copy of B: every `br $L` is `br $first`
//!       ...
//!       br $end              ;; falling out of the body leaves the loop
//!     end
//!     ...                    ;; B: `br $L` still checks the flag
//!   end
//! end
//! ```
//!
//! Every local is as it was at each back-edge, so the copy is the same
//! iteration. The time between checks becomes two iterations of a body of
//! at most [`MAX_BODY`] instructions that calls nothing that may unwind,
//! and a point held up (the counting modes) is called at every other
//! back-edge of such a loop instead of every one. Only loops without
//! inner loops and without block types are unrolled: the copy's
//! back-edges become branches to a block's end, which carry no values.

use walrus::ir::{Block, Br, Instr, InstrLocId, InstrSeqId, InstrSeqType};
use walrus::LocalFunction;

use crate::hoist::duplicate;
use crate::outline::walk;

/// The largest loop body (in instructions, nested ones included) that is
/// unrolled: the copy grows the loop by as much.
pub(crate) const MAX_BODY: usize = 100;

/// Whether loop `seq` is short, innermost and `[] -> []`.
fn eligible(func: &LocalFunction, seq: InstrSeqId) -> bool {
    if func.block(seq).ty != InstrSeqType::Simple(None) {
        return false;
    }
    let (mut count, mut inner) = (0usize, false);
    walk(func, seq, &mut |instr| {
        count += 1;
        inner |= matches!(instr, Instr::Loop(_));
    });
    !inner && count <= MAX_BODY
}

/// Copies of the body that run before it on each trip without a check:
/// the flag is checked at every `COPIES + 1`-th back-edge.
pub(crate) const COPIES: usize = 1;

/// Run loop `looped`'s body `COPIES + 1` times per trip, if it is
/// eligible; its own back-edges are left for the caller to route through
/// the flag check.
pub(crate) fn unroll(func: &mut LocalFunction, looped: InstrSeqId) -> bool {
    if !eligible(func, looped) {
        return false;
    }
    let loc = InstrLocId::default();
    let end = func.builder_mut().dangling_instr_seq(None).id();
    // Each copy's branches to `looped` become branches to the copy itself,
    // that is, to the end of its block, where the next copy goes on. The
    // first copy is innermost: every later one opens with the block of the
    // one before.
    let mut copies: Option<InstrSeqId> = None;
    for _ in 0..COPIES {
        let copy = duplicate(func, looped, &mut Vec::new());
        let instrs = &mut func.block_mut(copy).instrs;
        if let Some(before) = copies {
            instrs.insert(0, (Block { seq: before }.into(), loc));
        }
        instrs.push((Br { block: end }.into(), loc));
        copies = Some(copy);
    }
    let body = std::mem::take(&mut func.block_mut(looped).instrs);
    let mut all = Vec::with_capacity(body.len() + 1);
    all.extend(copies.map(|seq| (Block { seq }.into(), loc)));
    all.extend(body);
    func.block_mut(end).instrs = all;
    func.block_mut(looped).instrs = vec![(Block { seq: end }.into(), loc)];
    true
}

#[cfg(test)]
#[path = "unroll_tests.rs"]
pub(crate) mod tests;
