//! Move the loops of large functions into functions of their own.
//!
//! C compilers inline aggressively: in most of the suite, `main` holds every
//! loop nest of the program, with 30–60 locals. Asyncify then instruments
//! that one function, and every migration point in it is a call that may
//! unwind. Cranelift's register allocator, faced with that function, keeps
//! even the innermost loop's pointer, counter and loop-invariant factor in
//! stack slots, loaded and stored on every iteration. Removing Asyncify's
//! save and restore code by hand does not fix it (docs/prepare.md,
//! "Outlined loops"): the function is too large for the allocator once
//! Asyncify has added its guards.
//!
//! A loop in a function of its own, with only the locals it uses as
//! parameters, is allocated on its own and runs like the unprepared loop,
//! plus the flag check of its migration point. This pass does that on the
//! input module, before points are placed, so each loop gets its point in
//! the new function exactly as it would have in place, and the time to
//! reach a point is unchanged.
//!
//! Two stages, each in functions with at least [`MIN_LOCALS`] locals
//! ([`Stage`]): before points are placed, loop nests in which no call may
//! unwind (calls of quiet functions are fine, `quiet.rs`) move whole (one
//! call per run of the nest), and a new function that is itself large is
//! looked at again inside its loop; after points are placed, the outermost
//! loops without such a call move: innermost loops, whose hoisted point
//! leaves only a flag check in the loop, and the copies without checks of
//! counted loops and nests (`counted.rs`, `nest.rs`). The new function
//! cannot unwind and Asyncify does not instrument it: the call costs what
//! passing the locals costs.
//! Innermost loops are not moved before points are placed because their
//! point's call would move with them, and the new function would pay
//! Asyncify's entry and exit code on every call, which loops of a few
//! iterations (`kmeans`, `dhrystone`) do not earn back.
//!
//! The new function takes every local the loop reads or writes, and
//! returns every local it writes plus an exit code: 0 when the loop ends
//! by falling through, `k` when it branches to the `k`-th label outside
//! itself. The caller stores the results back into its own locals and
//! takes that branch. A loop stays in place when that cannot be said in
//! this shape: it contains a `return`, a branch that carries values out of
//! it, or has a block type other than `[] -> []`, or it uses more than
//! [`MAX_PARAMS`] locals.
//!
//! `wasm-opt` would inline a function with one caller straight back, so
//! every new function is exported (`roam.loop.<n>`), which Binaryen's
//! inliner leaves alone.

use std::collections::HashSet;

use walrus::ir::{
    BinaryOp, Binop, Br, BrIf, BrTable, Call, Const, Instr, InstrLocId, InstrSeqId, InstrSeqType,
    LocalGet, LocalSet, Value,
};
use walrus::{
    ExportItem, FunctionBuilder, FunctionId, FunctionKind, LocalFunction, LocalId, Module, ValType,
};

use crate::loop_io::{loop_io, LiveAfter, LoopIo};
use crate::pipeline::PrepareError;
use crate::quiet::Quiet;

/// Export-name prefix of an outlined loop, followed by a counter.
pub const LOOP_EXPORT_PREFIX: &str = "roam.loop.";

/// A function with fewer locals than this keeps its loops: the allocator
/// handles it well, and the call would only cost.
const MIN_LOCALS: usize = 16;

/// A loop that uses more locals than this stays: passing them all in and
/// out on every entry would cost more than it saves.
const MAX_PARAMS: usize = 32;

/// Which loops a run of the pass moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Before points are placed: loop nests in which no call may unwind,
    /// each with its inner loops. Each new function gets its points as the
    /// nest would have had them, and is looked at again while it is large.
    Nests,
    /// After points are placed: the outermost loops in which no call may
    /// unwind. A hoisted loop point (`hoist.rs`) checks the flag inside
    /// the loop and calls the point from outside it, so the loop moves
    /// without its point's call: Asyncify leaves the new function alone,
    /// and the call costs no more than passing the locals. A nest in which
    /// nothing calls is the copy without checks of a counted nest
    /// (`nest.rs`), or a hoisted loop whose inner loops leave to its point
    /// (`rerun.rs`): it moves whole, one call per run.
    Leaves,
}

/// One loop that can move.
struct Candidate {
    /// The loop's body.
    seq: InstrSeqId,
    /// Every local the loop uses, in order of first use: the parameters.
    used: Vec<LocalId>,
    /// The locals it writes, in order of first write: the results.
    written: Vec<LocalId>,
    /// Labels outside the loop that it branches to, in order of first
    /// branch: exit `k` is `exits[k - 1]`.
    exits: Vec<InstrSeqId>,
    /// It holds another loop.
    nested: bool,
    /// Something in it makes a call that may unwind.
    calls: bool,
}

impl Stage {
    fn takes(self, c: &Candidate) -> bool {
        !c.calls && c.used.len() <= MAX_PARAMS && (self == Stage::Leaves || c.nested)
    }
}

/// Outline the eligible loops of every large function, and again inside
/// the new functions while they are large. Returns how many loops moved.
pub(crate) fn outline_loops(
    module: &mut Module,
    stage: Stage,
    quiet: &Quiet,
    trim: bool,
) -> Result<u32, PrepareError> {
    // (function, where to look): the whole body, or inside the loop an
    // outlined function consists of (which must not move again).
    let mut queue: Vec<(FunctionId, Option<InstrSeqId>)> = module
        .funcs
        .iter_local()
        .map(|(id, _)| (id, None))
        .collect();
    // Numbers go on from an earlier stage's.
    let first = module
        .exports
        .iter()
        .filter(|e| e.name.starts_with(LOOP_EXPORT_PREFIX))
        .count() as u32;
    let mut moved = 0u32;
    while let Some((parent, inside)) = queue.pop() {
        let (candidates, live) = match &module.funcs.get(parent).kind {
            FunctionKind::Local(func) => {
                let candidates = find_candidates(func, inside, stage, quiet);
                // One liveness pass for the round (`LiveAfter` says why
                // that holds while the function changes).
                let targets: Vec<_> = candidates
                    .iter()
                    .map(|c| (c.seq, c.exits.as_slice()))
                    .collect();
                let live = (trim && !targets.is_empty()).then(|| LiveAfter::of(func, &targets));
                (candidates, live)
            }
            _ => continue,
        };
        for candidate in candidates {
            let number = first + moved;
            let name = format!("{LOOP_EXPORT_PREFIX}{number}");
            if module.exports.iter().any(|e| e.name == name) {
                return Err(PrepareError::ExportNameTaken { name });
            }
            let io = match (&module.funcs.get(parent).kind, &live) {
                (FunctionKind::Local(func), Some(live)) => loop_io(
                    func,
                    candidate.seq,
                    &candidate.used,
                    &candidate.written,
                    &candidate.exits,
                    live,
                ),
                _ => LoopIo {
                    inputs: candidate.used.clone(),
                    outputs: candidate.written.clone(),
                },
            };
            let (outlined, body) = build_function(module, parent, &candidate, &io, number);
            replace_loop(module, parent, &candidate, &io, outlined);
            module.exports.add(&name, ExportItem::Function(outlined));
            if stage == Stage::Nests {
                queue.push((outlined, Some(body)));
            }
            moved += 1;
        }
    }
    Ok(moved)
}

/// The loops of `func` (under `inside`, else anywhere) that `stage` moves:
/// none if the function is small. A loop that does not move has its inner
/// loops looked at instead.
fn find_candidates(
    func: &LocalFunction,
    inside: Option<InstrSeqId>,
    stage: Stage,
    quiet: &Quiet,
) -> Vec<Candidate> {
    if !is_large(func) {
        return Vec::new();
    }
    let mut found = Vec::new();
    pick(
        func,
        inside.unwrap_or(func.entry_block()),
        stage,
        quiet,
        &mut found,
    );
    found
}

/// Whether `func` has enough locals (parameters and the locals its code
/// uses) for its loops to move.
pub(crate) fn is_large(func: &LocalFunction) -> bool {
    let mut locals: HashSet<LocalId> = func.args.iter().copied().collect();
    walk(func, func.entry_block(), &mut |instr| match instr {
        Instr::LocalGet(i) => {
            locals.insert(i.local);
        }
        Instr::LocalSet(i) => {
            locals.insert(i.local);
        }
        Instr::LocalTee(i) => {
            locals.insert(i.local);
        }
        _ => {}
    });
    locals.len() >= MIN_LOCALS
}

/// Push the candidates among the outermost loops under `seq`, descending
/// into those that cannot move.
fn pick(
    func: &LocalFunction,
    seq: InstrSeqId,
    stage: Stage,
    quiet: &Quiet,
    found: &mut Vec<Candidate>,
) {
    for (instr, _) in &func.block(seq).instrs {
        match instr {
            Instr::Loop(l) => match scan(func, l.seq, quiet) {
                Some(c) if stage.takes(&c) => found.push(c),
                _ => pick(func, l.seq, stage, quiet, found),
            },
            other => {
                for child in children(other) {
                    pick(func, child, stage, quiet, found);
                }
            }
        }
    }
}

/// Visit every instruction under `seq`, in order, nested ones included.
pub(crate) fn walk(func: &LocalFunction, seq: InstrSeqId, visit: &mut impl FnMut(&Instr)) {
    for (instr, _) in &func.block(seq).instrs {
        visit(instr);
        for child in children(instr) {
            walk(func, child, visit);
        }
    }
}

/// The labels a branch instruction names (none for any other).
pub(crate) fn branch_targets(instr: &Instr) -> Vec<InstrSeqId> {
    match instr {
        Instr::Br(Br { block }) | Instr::BrIf(BrIf { block }) => vec![*block],
        Instr::BrTable(BrTable { blocks, default }) => {
            blocks.iter().chain([default]).copied().collect()
        }
        _ => Vec::new(),
    }
}

/// The sequences an instruction opens.
pub(crate) fn children(instr: &Instr) -> Vec<InstrSeqId> {
    match instr {
        Instr::Block(b) => vec![b.seq],
        Instr::Loop(l) => vec![l.seq],
        Instr::IfElse(i) => vec![i.consequent, i.alternative],
        _ => Vec::new(),
    }
}

/// The loop at `seq` as a candidate, or `None` if it cannot move.
fn scan(func: &LocalFunction, seq: InstrSeqId, quiet: &Quiet) -> Option<Candidate> {
    if func.block(seq).ty != InstrSeqType::Simple(None) {
        return None;
    }
    let mut inner = HashSet::from([seq]);
    let mut candidate = Candidate {
        seq,
        used: Vec::new(),
        written: Vec::new(),
        exits: Vec::new(),
        nested: false,
        calls: false,
    };
    let mut ok = true;
    let note_target = |target: InstrSeqId, inner: &HashSet<InstrSeqId>, c: &mut Candidate| {
        if inner.contains(&target) {
            return true;
        }
        // A branch out of the loop may carry nothing: a block (or the
        // function body) without results. A loop label with a simple type
        // takes no values either, but keep to the one shape.
        if func.block(target).ty != InstrSeqType::Simple(None) {
            return false;
        }
        if !c.exits.contains(&target) {
            c.exits.push(target);
        }
        true
    };
    scan_seq(func, seq, &mut inner, &mut |instr, inner| {
        let fine = match instr {
            Instr::Loop(_) => {
                candidate.nested = true;
                true
            }
            Instr::Return(_) | Instr::ReturnCall(_) => false,
            Instr::ReturnCallIndirect(_) | Instr::ReturnCallRef(_) => false,
            i if quiet.may_unwind(i) => {
                candidate.calls = true;
                true
            }
            Instr::BrOnNull(_) | Instr::BrOnNonNull(_) => false,
            Instr::BrOnCast(_) | Instr::BrOnCastFail(_) => false,
            Instr::TryTable(_) | Instr::Try(_) | Instr::Throw(_) => false,
            Instr::ThrowRef(_) | Instr::Rethrow(_) => false,
            Instr::Br(b) => note_target(b.block, inner, &mut candidate),
            Instr::BrIf(b) => note_target(b.block, inner, &mut candidate),
            Instr::BrTable(t) => t
                .blocks
                .iter()
                .chain([&t.default])
                .all(|b| note_target(*b, inner, &mut candidate)),
            Instr::LocalGet(i) => {
                push_new(&mut candidate.used, i.local);
                true
            }
            Instr::LocalSet(i) => {
                push_new(&mut candidate.used, i.local);
                push_new(&mut candidate.written, i.local);
                true
            }
            Instr::LocalTee(i) => {
                push_new(&mut candidate.used, i.local);
                push_new(&mut candidate.written, i.local);
                true
            }
            _ => true,
        };
        ok &= fine;
    });
    ok.then_some(candidate)
}

/// Like [`walk`], but keeps `inner`, the set of labels opened so far inside
/// the loop, up to date for the visitor.
fn scan_seq(
    func: &LocalFunction,
    seq: InstrSeqId,
    inner: &mut HashSet<InstrSeqId>,
    visit: &mut impl FnMut(&Instr, &HashSet<InstrSeqId>),
) {
    for (instr, _) in &func.block(seq).instrs {
        let opened = children(instr);
        inner.extend(opened.iter().copied());
        visit(instr, inner);
        for child in opened {
            scan_seq(func, child, inner, visit);
        }
    }
}

fn push_new(list: &mut Vec<LocalId>, local: LocalId) {
    if !list.contains(&local) {
        list.push(local);
    }
}

/// Build the function that runs the loop `c` of `parent`.
fn build_function(
    module: &mut Module,
    parent: FunctionId,
    c: &Candidate,
    io: &LoopIo,
    number: u32,
) -> (FunctionId, InstrSeqId) {
    let ty = |l: &LocalId| module.locals.get(*l).ty();
    let types: Vec<ValType> = io.inputs.iter().map(ty).collect();
    let mut results: Vec<ValType> = io.outputs.iter().map(ty).collect();
    results.push(ValType::I32);
    // Every local the loop uses gets one of its own in the new function;
    // the inputs' are its parameters, the others start at zero.
    let locals: Vec<(LocalId, LocalId)> = c
        .used
        .iter()
        .map(|l| (*l, module.locals.add(module.locals.get(*l).ty())))
        .collect();
    let map_local = |l: LocalId| {
        locals
            .iter()
            .find(|(from, _)| *from == l)
            .map(|(_, to)| *to)
    };
    let params: Vec<LocalId> = io
        .inputs
        .iter()
        .map(|l| map_local(*l).expect("inputs are used"))
        .collect();
    let written: Vec<LocalId> = io
        .outputs
        .iter()
        .map(|l| map_local(*l).expect("outputs are used"))
        .collect();
    let FunctionKind::Local(src) = &module.funcs.get(parent).kind else {
        unreachable!("candidates come from local functions");
    };
    let mut fb = FunctionBuilder::new(&mut module.types, &types, &results);
    fb.name(format!("roam_loop_{number}"));

    // Exit blocks, innermost first: `exit_seqs[k - 1]` is where a branch to
    // `c.exits[k - 1]` lands. After each, the results and the exit code.
    let exit_seqs: Vec<InstrSeqId> = c
        .exits
        .iter()
        .map(|_| fb.dangling_instr_seq(None).id())
        .collect();
    let tail = |seq: &mut walrus::InstrSeqBuilder<'_>, code: i32| {
        for w in &written {
            seq.instr(LocalGet { local: *w });
        }
        seq.i32_const(code).instr(walrus::ir::Return {});
    };
    let body_loop = fb.dangling_instr_seq(None).id();
    let mut enclosing = fb.func_body_id();
    for (k, exit) in exit_seqs.iter().enumerate().rev() {
        fb.instr_seq(enclosing)
            .instr(walrus::ir::Block { seq: *exit });
        tail(&mut fb.instr_seq(enclosing), k as i32 + 1);
        enclosing = *exit;
    }
    fb.instr_seq(enclosing)
        .instr(walrus::ir::Loop { seq: body_loop });
    tail(&mut fb.instr_seq(enclosing), 0);

    let mut copier = Copier {
        src,
        locals: &map_local,
        seqs: vec![(c.seq, body_loop)],
        exits: c
            .exits
            .iter()
            .copied()
            .zip(exit_seqs.iter().copied())
            .collect(),
    };
    copier.copy(&mut fb, c.seq, body_loop);
    (fb.finish(params, &mut module.funcs), body_loop)
}

/// Copy the whole body of `src` into `body` of `fb`, labels renamed and
/// locals kept (walrus numbers locals per function when it writes).
pub(crate) fn copy_body(src: &LocalFunction, fb: &mut FunctionBuilder, body: InstrSeqId) {
    let same = |l: LocalId| Some(l);
    let mut copier = Copier {
        src,
        locals: &same,
        seqs: vec![(src.entry_block(), body)],
        exits: Vec::new(),
    };
    copier.copy(fb, src.entry_block(), body);
}

/// Copies a loop's instructions into the new function, renaming locals and
/// labels.
struct Copier<'a, F: Fn(LocalId) -> Option<LocalId>> {
    src: &'a LocalFunction,
    locals: &'a F,
    /// Labels inside the loop: source → copy.
    seqs: Vec<(InstrSeqId, InstrSeqId)>,
    /// Labels outside the loop: source → exit block.
    exits: Vec<(InstrSeqId, InstrSeqId)>,
}

impl<F: Fn(LocalId) -> Option<LocalId>> Copier<'_, F> {
    fn label(&self, from: InstrSeqId) -> InstrSeqId {
        self.seqs
            .iter()
            .chain(&self.exits)
            .find(|(s, _)| *s == from)
            .map(|(_, d)| *d)
            .expect("every branch target was seen by the scan")
    }

    fn local(&self, from: LocalId) -> LocalId {
        (self.locals)(from).expect("every local was seen by the scan")
    }

    fn nested(&mut self, fb: &mut FunctionBuilder, from: InstrSeqId) -> InstrSeqId {
        let ty = self.src.block(from).ty;
        let to = fb.dangling_instr_seq(ty).id();
        self.seqs.push((from, to));
        self.copy(fb, from, to);
        to
    }

    fn copy(&mut self, fb: &mut FunctionBuilder, from: InstrSeqId, to: InstrSeqId) {
        for (instr, loc) in &self.src.block(from).instrs {
            let instr = match instr {
                Instr::Block(b) => Instr::Block(walrus::ir::Block {
                    seq: self.nested(fb, b.seq),
                }),
                Instr::Loop(l) => Instr::Loop(walrus::ir::Loop {
                    seq: self.nested(fb, l.seq),
                }),
                Instr::IfElse(i) => Instr::IfElse(walrus::ir::IfElse {
                    consequent: self.nested(fb, i.consequent),
                    alternative: self.nested(fb, i.alternative),
                }),
                Instr::Br(b) => Instr::Br(Br {
                    block: self.label(b.block),
                }),
                Instr::BrIf(b) => Instr::BrIf(BrIf {
                    block: self.label(b.block),
                }),
                Instr::BrTable(t) => Instr::BrTable(BrTable {
                    blocks: t.blocks.iter().map(|b| self.label(*b)).collect(),
                    default: self.label(t.default),
                }),
                Instr::LocalGet(i) => Instr::LocalGet(LocalGet {
                    local: self.local(i.local),
                }),
                Instr::LocalSet(i) => Instr::LocalSet(LocalSet {
                    local: self.local(i.local),
                }),
                Instr::LocalTee(i) => Instr::LocalTee(walrus::ir::LocalTee {
                    local: self.local(i.local),
                }),
                other => other.clone(),
            };
            fb.instr_seq(to).instrs_mut().push((instr, *loc));
        }
    }
}

/// Replace the loop in `parent` by a call of `outlined` and the branches
/// its exit code asks for.
fn replace_loop(
    module: &mut Module,
    parent: FunctionId,
    c: &Candidate,
    io: &LoopIo,
    outlined: FunctionId,
) {
    let code = module.locals.add(ValType::I32);
    let FunctionKind::Local(func) = &mut module.funcs.get_mut(parent).kind else {
        unreachable!("candidates come from local functions");
    };
    let (holder, at) =
        find_loop(func, func.entry_block(), c.seq).expect("the candidate loop is in its function");
    let loc = func.block(holder).instrs[at].1;
    let mut with: Vec<Instr> = io
        .inputs
        .iter()
        .map(|l| Instr::LocalGet(LocalGet { local: *l }))
        .collect();
    with.push(Instr::Call(Call { func: outlined }));
    with.push(Instr::LocalSet(LocalSet { local: code }));
    with.extend(
        io.outputs
            .iter()
            .rev()
            .map(|l| Instr::LocalSet(LocalSet { local: *l })),
    );
    for (k, target) in c.exits.iter().enumerate() {
        with.push(Instr::LocalGet(LocalGet { local: code }));
        with.push(Instr::Const(Const {
            value: Value::I32(k as i32 + 1),
        }));
        with.push(Instr::Binop(Binop {
            op: BinaryOp::I32Eq,
        }));
        with.push(Instr::BrIf(BrIf { block: *target }));
    }
    let with: Vec<(Instr, InstrLocId)> = with.into_iter().map(|i| (i, loc)).collect();
    func.block_mut(holder).instrs.splice(at..=at, with);
}

/// The sequence holding `loop_seq`'s `loop` instruction, and its index.
fn find_loop(
    func: &LocalFunction,
    seq: InstrSeqId,
    loop_seq: InstrSeqId,
) -> Option<(InstrSeqId, usize)> {
    for (i, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
        if matches!(instr, Instr::Loop(l) if l.seq == loop_seq) {
            return Some((seq, i));
        }
        for child in children(instr) {
            if let Some(found) = find_loop(func, child, loop_seq) {
                return Some(found);
            }
        }
    }
    None
}

#[cfg(test)]
#[path = "outline_tests.rs"]
mod tests;
