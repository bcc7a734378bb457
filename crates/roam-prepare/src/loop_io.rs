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
/// of the function the loop moves to, with `func` the function it leaves
/// and `live` the liveness of `func` computed for its candidate loops.
pub(crate) fn loop_io(
    func: &LocalFunction,
    body: InstrSeqId,
    used: &[LocalId],
    written: &[LocalId],
    exits: &[InstrSeqId],
    live: &LiveAfter,
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
    let outputs: Vec<LocalId> = written
        .iter()
        .copied()
        .filter(|l| exposed.found.contains(l) || live.live_after(body, *l))
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

/// What is live where each of a function's candidate loops is left: after
/// it, and at each label it branches out to.
///
/// One backward pass over the whole function serves every loop that moves
/// out of it in one round (`outline.rs`), although each move changes the
/// function. The loops of a round are disjoint, so moving one leaves the
/// others' bodies as they were; what it changes is the code around them,
/// where its call now reads each output that some way out leaves unset
/// (`loop_io`'s inputs). Such a local is live after the other loops in the
/// changed function where it was not in the original. Its value there is
/// still never used: on the way out of the moved loop that leaves it
/// unset, the original function did not read it either (else it would
/// have been live). So the original function's liveness gives each loop
/// outputs enough for the function as it is when the loop moves.
///
/// A pass per loop was the first form: quadratic in a function with
/// hundreds of loops, it was a third of `roam`'s own share of preparing
/// the database engine.
pub(crate) struct LiveAfter {
    index: FxHashMap<LocalId, usize>,
    after: FxHashMap<InstrSeqId, FixedBitSet>,
}

impl LiveAfter {
    /// The liveness of `func` where each loop of `targets` (its body and
    /// the labels outside it that it branches to) is left.
    pub(crate) fn of(func: &LocalFunction, targets: &[(InstrSeqId, &[InstrSeqId])]) -> Self {
        let mut live = Live::new(func, targets);
        let end = live.empty();
        live.seq(func.entry_block(), end);
        LiveAfter {
            index: live.index,
            after: live.after,
        }
    }

    /// Whether `local` is live where the loop `body` is left.
    fn live_after(&self, body: InstrSeqId, local: LocalId) -> bool {
        let at = self
            .after
            .get(&body)
            .expect("liveness computed for the loop");
        self.index.get(&local).is_some_and(|&i| at.contains(i))
    }
}

/// Liveness of locals over a whole function, backwards, recording what is
/// live where each target loop is left: after it, and at each label it
/// branches out to. A loop's header is iterated to a fixed point; the sets
/// only grow from pass to pass, so the union over passes is the answer.
///
/// A large C function (`sqlite3VdbeExec`) has hundreds of loops and
/// thousands of blocks, so the sets are bit sets over the function's own
/// locals, numbered densely: with hash sets this pass was half of
/// preparing the database engine.
struct Live<'a> {
    func: &'a LocalFunction,
    /// Each target loop's body, with the labels it branches out to.
    targets: FxHashMap<InstrSeqId, Vec<InstrSeqId>>,
    /// The function's locals, numbered from 0 in order of first use.
    index: FxHashMap<LocalId, usize>,
    /// What is live where a branch to each label lands.
    labels: FxHashMap<InstrSeqId, FixedBitSet>,
    /// What is live where each target is left.
    after: FxHashMap<InstrSeqId, FixedBitSet>,
}

impl<'a> Live<'a> {
    fn new(func: &'a LocalFunction, targets: &[(InstrSeqId, &[InstrSeqId])]) -> Self {
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
            targets: targets
                .iter()
                .map(|(body, exits)| (*body, exits.to_vec()))
                .collect(),
            labels: FxHashMap::from_iter([(func.entry_block(), empty.clone())]),
            after: targets
                .iter()
                .map(|(body, _)| (*body, empty.clone()))
                .collect(),
            index,
        }
    }

    fn empty(&self) -> FixedBitSet {
        FixedBitSet::with_capacity(self.index.len())
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
                    if let Some(exits) = self.targets.get(&l.seq) {
                        let after = self.after.get_mut(&l.seq).expect("every target has a set");
                        after.union_with(&live);
                        for exit in exits {
                            if let Some(set) = self.labels.get(exit) {
                                after.union_with(set);
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
