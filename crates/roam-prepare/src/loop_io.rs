//! Which locals an outlined loop takes and gives back.
//!
//! A loop moved into a function of its own (`outline.rs`) pays for every
//! local it passes on every call: Cranelift passes the first few in
//! registers and the rest on the stack, and returns all but the first
//! few results through memory. `kmeans`' centroid loop, called once per
//! point, took 15 parameters and gave back 12 results, most of them
//! scratch locals that the loop sets before it reads them and that
//! nothing after it reads. So only two kinds of local cross the call:
//!
//! - **inputs**: the locals the loop may read before it has set them on
//!   some path from its top, found by definite assignment over its body.
//!   Every other local the loop uses starts at zero in the new function,
//!   and is set before it is read on every path;
//! - **outputs**: the locals it writes that are inputs too, or that are
//!   live where the loop is left: after it, or where one of its branches
//!   out lands, by a liveness pass over the whole caller (a loop header is
//!   iterated to a fixed point, so a value read only on the next trip
//!   round an enclosing loop counts). An input must come back because the
//!   caller calls the loop again with its own copies after a hoisted
//!   point's call.
//!
//! Both are conservative: definite assignment takes a block that some
//! branch leaves early as setting nothing, and liveness takes every
//! branch as possible. Code added later (points, Asyncify's save and
//! restore, the copies of spilled point calls) reads a dead local only to
//! store it and load it back, so its value does not matter.
//!
//! The locals not passed are zero in the new function; each is set
//! before it is read there on every path, by the definite assignment.
//! With trimmed calls, `wasm-opt` turned one comparison of `kmeans` round
//! into a form that costs more than trimming saves, unless `compares.rs`
//! turns it back.

use std::collections::HashSet;

use fixedbitset::FixedBitSet;
use rustc_hash::FxHashMap;
use walrus::ir::{Br, BrIf, BrTable, Instr, InstrSeqId, LocalGet, LocalSet, LocalTee};
use walrus::{LocalFunction, LocalId};

use crate::assign::{walk_assigned, Visit};
use crate::outline::{branch_targets, walk};

/// The parameters and results of the function a loop moves to, each in the
/// order of the loop's first use or write.
pub(crate) struct LoopIo {
    pub inputs: Vec<LocalId>,
    pub outputs: Vec<LocalId>,
}

/// Which of `used` and `written` (the loop `body`'s locals) cross the call
/// of the function the loop moves to, with `func` the function it leaves.
pub(crate) fn loop_io(
    func: &LocalFunction,
    body: InstrSeqId,
    used: &[LocalId],
    written: &[LocalId],
    exits: &[InstrSeqId],
) -> LoopIo {
    let mut branched = HashSet::new();
    walk(func, body, &mut |i| branched.extend(branch_targets(i)));
    let mut exposed = Exposed {
        found: HashSet::new(),
        exits,
        surely: None,
    };
    let mut at_end = HashSet::new();
    walk_assigned(func, body, &branched, &mut at_end, &mut exposed);
    // Falling off the loop's end is a way out too.
    exposed.leave(&at_end);
    let surely = exposed.surely.take().unwrap_or_default();
    let mut live = Live::new(func, body, exits);
    let end = live.empty();
    live.seq(func.entry_block(), end);
    let outputs: Vec<LocalId> = written
        .iter()
        .copied()
        .filter(|l| exposed.found.contains(l) || live.live_after(*l))
        .collect();
    LoopIo {
        // An output that some way out leaves unset must come in too, or
        // the caller would get the new function's zero back instead of
        // its own value.
        inputs: used
            .iter()
            .copied()
            .filter(|l| exposed.found.contains(l) || (outputs.contains(l) && !surely.contains(l)))
            .collect(),
        outputs,
    }
}

/// Liveness of locals over a whole function, backwards, recording what is
/// live where the loop `target` is left: after it, and at each label it
/// branches out to. A loop's header is iterated to a fixed point; the sets
/// only grow from pass to pass, so the union over passes is the answer.
///
/// The walk covers the whole function once per outlined loop, and a large
/// C function (`sqlite3VdbeExec`) has hundreds of loops, so the sets are
/// bit sets over the function's own locals, numbered densely: with hash
/// sets this pass was half of preparing the database engine.
struct Live<'a> {
    func: &'a LocalFunction,
    target: InstrSeqId,
    exits: Vec<InstrSeqId>,
    /// The function's locals, numbered from 0 in order of first use.
    index: FxHashMap<LocalId, usize>,
    /// What is live where a branch to each label lands.
    labels: FxHashMap<InstrSeqId, FixedBitSet>,
    after: FixedBitSet,
}

impl<'a> Live<'a> {
    fn new(func: &'a LocalFunction, target: InstrSeqId, exits: &[InstrSeqId]) -> Self {
        let mut index = FxHashMap::default();
        for arg in &func.args {
            let next = index.len();
            index.entry(*arg).or_insert(next);
        }
        walk(func, func.entry_block(), &mut |instr| {
            if let Instr::LocalGet(LocalGet { local })
            | Instr::LocalSet(LocalSet { local })
            | Instr::LocalTee(LocalTee { local }) = instr
            {
                let next = index.len();
                index.entry(*local).or_insert(next);
            }
        });
        let empty = FixedBitSet::with_capacity(index.len());
        Live {
            func,
            target,
            exits: exits.to_vec(),
            labels: FxHashMap::from_iter([(func.entry_block(), empty.clone())]),
            after: empty,
            index,
        }
    }

    fn empty(&self) -> FixedBitSet {
        FixedBitSet::with_capacity(self.index.len())
    }

    /// Whether `local` is live where the loop is left.
    fn live_after(&self, local: LocalId) -> bool {
        self.index
            .get(&local)
            .is_some_and(|&i| self.after.contains(i))
    }

    /// What is live at the top of `seq`, given what is live after it.
    fn seq(&mut self, seq: InstrSeqId, mut live: FixedBitSet) -> FixedBitSet {
        for (instr, _) in self.func.block(seq).instrs.iter().rev() {
            match instr {
                Instr::LocalGet(LocalGet { local }) => live.insert(self.index[local]),
                Instr::LocalSet(LocalSet { local }) | Instr::LocalTee(LocalTee { local }) => {
                    live.set(self.index[local], false);
                }
                Instr::Br(Br { block }) => live = self.at(*block),
                Instr::BrIf(BrIf { block }) => self.join(&mut live, *block),
                Instr::BrTable(BrTable { blocks, default }) => {
                    live.clear();
                    for block in blocks.iter().chain([default]) {
                        self.join(&mut live, *block);
                    }
                }
                Instr::Return(_)
                | Instr::ReturnCall(_)
                | Instr::ReturnCallIndirect(_)
                | Instr::ReturnCallRef(_)
                | Instr::Unreachable(_) => live.clear(),
                Instr::Block(b) => {
                    self.labels.insert(b.seq, live.clone());
                    live = self.seq(b.seq, live);
                }
                Instr::IfElse(i) => {
                    self.labels.insert(i.consequent, live.clone());
                    self.labels.insert(i.alternative, live.clone());
                    let mut then = self.seq(i.consequent, live.clone());
                    then.union_with(&self.seq(i.alternative, live));
                    live = then;
                }
                Instr::Loop(l) => {
                    if l.seq == self.target {
                        self.after.union_with(&live);
                        for exit in &self.exits {
                            if let Some(set) = self.labels.get(exit) {
                                self.after.union_with(set);
                            }
                        }
                    }
                    let mut head = self.at(l.seq);
                    loop {
                        self.labels.insert(l.seq, head.clone());
                        let mut top = self.seq(l.seq, live.clone());
                        top.union_with(&head);
                        if top == head {
                            break;
                        }
                        head = top;
                    }
                    live = head;
                }
                _ => {}
            }
        }
        live
    }

    /// What is live where a branch to `label` lands (nothing yet for a
    /// loop header not yet seen).
    fn at(&self, label: InstrSeqId) -> FixedBitSet {
        match self.labels.get(&label) {
            Some(set) => set.clone(),
            None => self.empty(),
        }
    }

    /// Adds to `live` what is live where a branch to `label` lands.
    fn join(&self, live: &mut FixedBitSet, label: InstrSeqId) {
        if let Some(set) = self.labels.get(&label) {
            live.union_with(set);
        }
    }
}

/// Every read of a local not yet set on some path from the loop's top, and
/// the locals surely set on every way out of the loop.
struct Exposed<'a> {
    found: HashSet<LocalId>,
    exits: &'a [InstrSeqId],
    /// The intersection over the ways out seen so far (`None`: none yet).
    surely: Option<HashSet<LocalId>>,
}

impl Exposed<'_> {
    fn leave(&mut self, set: &HashSet<LocalId>) {
        match &mut self.surely {
            Some(surely) => surely.retain(|l| set.contains(l)),
            None => self.surely = Some(set.clone()),
        }
    }
}

impl Visit for Exposed<'_> {
    fn read(&mut self, local: LocalId, set: &HashSet<LocalId>) {
        if !set.contains(&local) {
            self.found.insert(local);
        }
    }

    fn branch(&mut self, label: InstrSeqId, set: &HashSet<LocalId>) {
        if self.exits.contains(&label) {
            self.leave(set);
        }
    }
}
