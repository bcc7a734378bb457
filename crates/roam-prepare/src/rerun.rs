//! Inner loops that leave to the enclosing loop's point (`--loop-points
//! rerun`).
//!
//! A hoisted point (`hoist.rs`) keeps Asyncify out of a loop only if the
//! loop makes no call that may unwind. In a nest, the inner loop's hoisted
//! point is such a call inside the outer loop, so the outer loop is
//! instrumented on every iteration: `kmeans`' loop over the centroids, whose
//! body runs an eight-step distance loop, spends most of its time in
//! Asyncify's guards.
//!
//! Often the inner loop sits in a stretch at the top of the outer loop's body
//! that only computes: it reads memory and writes locals, and every local it
//! writes is set again before it is read on every run of that body. Leaving
//! such a stretch half done and running the body again from its top gives the
//! same result as finishing it. So the inner loop checks the flag at its
//! back-edges like a hoisted loop, but when the flag is up it leaves to the
//! *outer* loop's hoisted point, and the outer iteration is run again from
//! its top. The nest then makes no call at all, and the time to the next
//! point is still one iteration of the innermost loop.
//!
//! Running the iteration again from the top must not be able to repeat for
//! ever (the flag stays up while `--checkpoint-every-points` counts, and a
//! new request could arrive each time the stretch runs). So after the point,
//! the outer loop's wrapper runs that one iteration in a slow copy of the
//! body that has an inline point in every inner loop and is never left half
//! done (`hoist::hoist_rerun`).
//!
//! A loop `P` *owns* its inner loops when:
//! - nothing in it makes a call that may unwind (`hoist::hoistable`);
//! - every loop directly inside it lies in its *stretch*: the statements of
//!   its body from the first up to the last one that holds a loop;
//! - the stretch makes no call, writes no memory, no global and no table;
//! - every local the stretch writes is set, on every path from the top of
//!   the body, before it is read, before the body branches out of `P`, and
//!   before the body ends. Its value on entry to an iteration is then never
//!   used, so a half-done stretch leaves nothing behind.
//!
//! An owned loop's inner loops leave to the same point, and an owner that is
//! itself in the stretch of an owner leaves to that one's point.

use std::collections::{HashMap, HashSet};

use walrus::ir::{Instr, InstrSeqId, LocalGet, LocalSet, LocalTee};
use walrus::{LocalFunction, LocalId};

use crate::assign::{walk_assigned, Visit};
use crate::outline::{branch_targets, children, walk};
use crate::quiet::Quiet;

/// A loop of the function, as `instrument.rs`'s walk lists them (pre-order).
pub(crate) struct Nested {
    /// The loop's body.
    pub seq: InstrSeqId,
    /// Index (in the same list) of the closest loop around it.
    pub enclosing: Option<usize>,
}

/// For each loop that leaves to another loop's point, that loop's body.
pub(crate) fn owners(
    func: &LocalFunction,
    loops: &[Nested],
    quiet: &Quiet,
) -> HashMap<InstrSeqId, InstrSeqId> {
    let mut kids: Vec<HashSet<InstrSeqId>> = vec![HashSet::new(); loops.len()];
    for l in loops {
        if let Some(p) = l.enclosing {
            kids[p].insert(l.seq);
        }
    }
    let reads = reads_in(func, func.entry_block());
    let owns: Vec<bool> = (0..loops.len())
        .map(|i| {
            !kids[i].is_empty()
                && crate::hoist::hoistable(func, loops[i].seq, quiet)
                && owns_all(func, loops[i].seq, &kids[i], &reads)
        })
        .collect();
    // Pre-order: a loop's enclosing loop is resolved before it.
    let mut owner: Vec<Option<InstrSeqId>> = vec![None; loops.len()];
    for (i, l) in loops.iter().enumerate() {
        if let Some(p) = l.enclosing {
            owner[i] = owner[p].or(owns[p].then_some(loops[p].seq));
        }
    }
    loops
        .iter()
        .zip(owner)
        .filter_map(|(l, o)| o.map(|o| (l.seq, o)))
        .collect()
}

/// How many times each local is read under `seq`.
fn reads_in(func: &LocalFunction, seq: InstrSeqId) -> HashMap<LocalId, usize> {
    let mut reads = HashMap::new();
    walk(func, seq, &mut |i| {
        if let Instr::LocalGet(LocalGet { local }) = i {
            *reads.entry(*local).or_insert(0usize) += 1;
        }
    });
    reads
}

/// Whether every loop of `kids` lies in the stretch of loop `body` that can
/// be run again from its top; `reads` counts the function's local reads.
fn owns_all(
    func: &LocalFunction,
    body: InstrSeqId,
    kids: &HashSet<InstrSeqId>,
    reads: &HashMap<LocalId, usize>,
) -> bool {
    let stmts = &func.block(body).instrs;
    let holds = |instr: &Instr| {
        let mut found = false;
        let mut look = |i: &Instr| found |= matches!(i, Instr::Loop(l) if kids.contains(&l.seq));
        look(instr);
        for child in children(instr) {
            walk(func, child, &mut look);
        }
        found
    };
    let Some(last) = (0..stmts.len()).rev().find(|&k| holds(&stmts[k].0)) else {
        return false;
    };
    // Everything a kid could be in is up to `last`; each kid is somewhere.
    let mut written = HashSet::new();
    for (instr, _) in &stmts[..=last] {
        let mut pure = true;
        let mut note = |i: &Instr| {
            pure &= computes(i);
            match i {
                Instr::LocalSet(LocalSet { local }) | Instr::LocalTee(LocalTee { local }) => {
                    written.insert(*local);
                }
                _ => {}
            }
        };
        note(instr);
        for child in children(instr) {
            walk(func, child, &mut note);
        }
        if !pure {
            return false;
        }
    }
    let mut inside = HashSet::new();
    inside.insert(body);
    let mut branched = HashSet::new();
    walk(func, body, &mut |i| {
        inside.extend(children(i));
        branched.extend(branch_targets(i));
    });
    // Where the loop is left, only the locals read after it matter.
    let read_in_loop = reads_in(func, body);
    let outlive: HashSet<LocalId> = written
        .iter()
        .copied()
        .filter(|w| reads.get(w) != read_in_loop.get(w))
        .collect();
    let mut check = Assigned {
        written: &written,
        outlive: &outlive,
        inside: &inside,
        ok: true,
    };
    let mut set = HashSet::new();
    walk_assigned(func, body, &branched, &mut set, &mut check);
    check.ok && outlive.iter().all(|w| set.contains(w))
}

/// Whether `instr` only computes: it may read memory and locals, write
/// locals and branch, but not call or write memory, globals or tables.
pub(crate) fn computes(instr: &Instr) -> bool {
    matches!(
        instr,
        Instr::Block(_)
            | Instr::Loop(_)
            | Instr::IfElse(_)
            | Instr::Br(_)
            | Instr::BrIf(_)
            | Instr::BrTable(_)
            | Instr::LocalGet(_)
            | Instr::LocalSet(_)
            | Instr::LocalTee(_)
            | Instr::GlobalGet(_)
            | Instr::Const(_)
            | Instr::Binop(_)
            | Instr::Unop(_)
            | Instr::Select(_)
            | Instr::Drop(_)
            | Instr::Load(_)
            | Instr::LoadSimd(_)
            | Instr::MemorySize(_)
            | Instr::Unreachable(_)
            | Instr::Return(_)
    )
}

/// Definite assignment of the `written` locals through a loop body: each
/// read must come after a set on every path, and so must each branch out of
/// the loop (`inside` holds the labels in it) and the end of the body for
/// those read after the loop too (`outlive`).
struct Assigned<'a> {
    written: &'a HashSet<LocalId>,
    outlive: &'a HashSet<LocalId>,
    inside: &'a HashSet<InstrSeqId>,
    ok: bool,
}

impl Visit for Assigned<'_> {
    fn read(&mut self, local: LocalId, set: &HashSet<LocalId>) {
        self.ok &= !self.written.contains(&local) || set.contains(&local);
    }

    fn branch(&mut self, label: InstrSeqId, set: &HashSet<LocalId>) {
        if !self.inside.contains(&label) {
            self.ok &= self.outlive.iter().all(|w| set.contains(w));
        }
    }
}

#[cfg(test)]
#[path = "rerun_tests.rs"]
mod tests;
