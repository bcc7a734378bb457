//! Definite assignment of locals through a loop body.
//!
//! Two steps ask the same question of a loop: which locals are surely set
//! at each read and at each branch. `loop_io.rs` wants the reads of locals
//! not yet set (those become the moved loop's parameters); `rerun.rs` wants
//! to know that the locals a stretch writes are set before every read and
//! every way out (so that running it again from its top is exact). One walk
//! serves both, and each says what it does at a read and at a branch.
//!
//! The walk is conservative in the same three ways for both:
//! - a block or `if` that some branch in the body names (`branched`) adds
//!   nothing to what is set after it, since the branch may have skipped
//!   the rest of it;
//! - a loop's body is walked once, as on its first iteration: a later
//!   iteration has set at least as much;
//! - code after a branch is walked with what was set before the branch.

use std::collections::HashSet;

use walrus::ir::{Br, BrIf, BrTable, Instr, InstrSeqId, LocalGet, LocalSet, LocalTee};
use walrus::{LocalFunction, LocalId};

/// What a walk does where a local is read and where a branch leaves.
pub(crate) trait Visit {
    /// `local` is read with `set` surely assigned.
    fn read(&mut self, local: LocalId, set: &HashSet<LocalId>);
    /// A `br`, `br_if` or `br_table` goes to `label` with `set` surely
    /// assigned.
    fn branch(&mut self, _label: InstrSeqId, _set: &HashSet<LocalId>) {}
}

/// Walks `seq` of `func` with `set` assigned on entry, and leaves in `set`
/// what is surely assigned at its end. `branched` holds every label some
/// branch in the walked code names.
pub(crate) fn walk_assigned(
    func: &LocalFunction,
    seq: InstrSeqId,
    branched: &HashSet<InstrSeqId>,
    set: &mut HashSet<LocalId>,
    visit: &mut impl Visit,
) {
    for (instr, _) in &func.block(seq).instrs {
        match instr {
            Instr::LocalGet(LocalGet { local }) => visit.read(*local, set),
            Instr::LocalSet(LocalSet { local }) | Instr::LocalTee(LocalTee { local }) => {
                set.insert(*local);
            }
            Instr::Block(b) => {
                let mut inner = set.clone();
                walk_assigned(func, b.seq, branched, &mut inner, visit);
                if !branched.contains(&b.seq) {
                    *set = inner;
                }
            }
            Instr::Loop(l) => {
                let mut inner = set.clone();
                walk_assigned(func, l.seq, branched, &mut inner, visit);
                *set = inner;
            }
            Instr::IfElse(i) => {
                let mut then = set.clone();
                walk_assigned(func, i.consequent, branched, &mut then, visit);
                let mut other = set.clone();
                walk_assigned(func, i.alternative, branched, &mut other, visit);
                // The two arms are one label.
                if !branched.contains(&i.consequent) && !branched.contains(&i.alternative) {
                    set.extend(then.intersection(&other).copied().collect::<Vec<_>>());
                }
            }
            Instr::Br(Br { block }) | Instr::BrIf(BrIf { block }) => visit.branch(*block, set),
            Instr::BrTable(BrTable { blocks, default }) => {
                for block in blocks.iter().chain([default]) {
                    visit.branch(*block, set);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
#[path = "assign_tests.rs"]
mod tests;
