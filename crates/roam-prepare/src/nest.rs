//! Counted nests: a short run of a counted loop whose inner loops are short
//! counted loops needs no check either, and a long run checks once per
//! trip of the outer loop.
//!
//! Why: `counted.rs` takes only innermost loops. The loop around a short
//! inner loop still has its point, and since a run of the inner loop with
//! checks calls a point too, the outer loop calls: Asyncify guards its body,
//! and its function cannot lose its instrumentation. `matmul`'s `k` loop
//! around the blocked `j` kernel (64 × 64 trips) and `kmeans`' loop over the
//! centroids around the distance loop (`dim` trips) are such nests. The
//! whole nest is as short as the `j` loop alone was allowed to be.
//!
//! How: the outer loop `K` is versioned as a counted loop is, with a budget
//! of [`NEST_BUDGET`] instructions split between the levels. In the copy
//! without checks, each inner loop `J` keeps a test of its own trip count
//! against [`INNER_BUDGET`] instructions, and a run that passes it runs
//! without checks. A run that fails it (a long row, a wrapping counter) has
//! to run with checks, so the copy cannot go on: it leaves to a *tail*, a
//! copy of the rest of that iteration of `K`, starting with `J`, in which
//! `J` and every inner loop after it have points; after it, the rest of
//! the run of `K` starts again from the test of its trips.
//!
//! A run of `K` too long for the copy runs in `K` itself, with its point,
//! hoisted as any loop's: a check at each back-edge. Its inner loops get no
//! point of their own. Each keeps a test of its trip count against its
//! share of [`TRIP_BUDGET`] instructions, and leaves to its tail as in the
//! copy when a run is longer. So `K` calls nothing either: Asyncify leaves
//! its body alone, and it moves whole into a function of its own.
//!
//! ```wasm
//! block $exit
//!   loop $resume
//!     block $tail
//!       block $long
//!         <K's trips> <= limit
//!         i32.eqz
//!         br_if $long
//!         loop $K'              ;; a copy of K: no point, no check
//!           ...
//!           <J's trips> <= inner limit
//!           if  loop $J' ... end  ;; a copy of J: no point, no check
//!           else br $tail end
//!           ...
//!         end
//!         br $exit
//!       end
//!       loop $K                 ;; K, with its point as before
//!         ...
//!         <J's trips> <= trip limit
//!         if  loop $J ... end     ;; J: no point, no check
//!         else br $tail end
//!         ...
//!       end
//!       br $exit
//!     end
//!     loop $J'' ... end         ;; the rest of this iteration of K, from J,
//!     ...                       ;; J'' and the inner loops after it with
//!     br $exit                  ;; hoisted points; `br $K` is `br $resume`
//!   end
//! end
//! ```
//!
//! A run of `K'` makes at most `limit` trips, each of at most its own
//! instructions plus [`INNER_BUDGET`] per inner loop, so it executes at
//! most [`NEST_BUDGET`] instructions before the code after the nest or the
//! tail's point; a trip of `K` at most its own plus [`TRIP_BUDGET`] before
//! its check. With no point inside it, `K'` calls nothing, so its
//! function's Asyncify code stays out of it, and it moves into a function
//! of its own like an innermost loop does (`outline.rs`, stage `Leaves`).
//! `$resume` has no point: each of its trips after the first runs a tail,
//! whose first loop checks the flag on entry (`hoist.rs`).
//!
//! Why `K` runs that way: `linpack`'s elimination updates up to `n` rows
//! of up to `n` elements each, too long for one run of the copy. `K` ran
//! with its inner loop's own counted copies, whose long runs have points,
//! so `K` called, Asyncify guarded it, and the short copy of the row
//! update moved into a function called once per row: 1.22× plain at size
//! M, against 1.00× now (docs/prepare.md).
//!
//! The tail is the rest of the iteration because `J` can sit inside blocks
//! and `if`s of `K`'s body: each of those becomes a block ending where the
//! original's code after it begins, so a branch to it lands where it did.
//! For that, every structure between `K` and `J` takes and gives no value,
//! and no value is left on the stack across any of them (checked by
//! [`height`]).

use walrus::ir::{Block, Br, BrIf, IfElse, Instr, InstrSeqId, InstrSeqType, Loop, UnaryOp};
use walrus::{FunctionId, GlobalId, LocalFunction};

use crate::counted::Counted;
use crate::hoist::{copy_instrs, duplicate, replace_loop};
use crate::outline::walk;

/// Instructions a run of a nest without checks may execute.
pub(crate) const NEST_BUDGET: u32 = 1 << 18;

/// Instructions each run of an inner loop may execute inside a nest's run
/// without checks.
pub(crate) const INNER_BUDGET: u32 = 1 << 11;

/// Instructions the inner loops' runs may execute together in one trip of
/// the outer loop when it runs with its point: `linpack`'s row updates (up
/// to 2000 elements at size L, two per trip of some fifty instructions)
/// fit.
pub(crate) const TRIP_BUDGET: u32 = 1 << 16;

/// Instructions of an inner loop's test and branch, counted per trip of the
/// outer loop on top of [`INNER_BUDGET`].
const TEST_COST: u32 = 16;

/// A recognised counted nest.
pub(crate) struct Nest {
    outer: Counted,
    inner: Vec<Inner>,
}

/// An inner loop of a nest.
struct Inner {
    seq: InstrSeqId,
    /// With its limit in a run of the outer loop without checks.
    counted: Counted,
    /// With its limit in a trip of the outer loop with its point.
    in_trip: Counted,
    /// From the outer loop's body down: each sequence, and the index in it
    /// of the structure that holds the next one (at the end, of the loop).
    path: Vec<(InstrSeqId, usize)>,
}

/// Loop `outer`, whose inner loops are `inner` (each holding no loop), as
/// a counted nest, or `None` (see the module docs for the conditions).
pub(crate) fn recognise(
    func: &LocalFunction,
    outer: InstrSeqId,
    inner: &[InstrSeqId],
) -> Option<Nest> {
    if inner.is_empty() || func.block(outer).ty != InstrSeqType::Simple(None) {
        return None;
    }
    let mut loops = Vec::with_capacity(inner.len());
    let share = TRIP_BUDGET / u32::try_from(inner.len()).ok()?;
    let mut own = size(func, outer);
    for &seq in inner {
        // The guard runs it in an `if` arm that gives no value.
        if func.block(seq).ty != InstrSeqType::Simple(None) {
            return None;
        }
        let counted = crate::counted::recognise_within(func, seq, INNER_BUDGET, &[])?;
        let path = path(func, outer, seq)?;
        for &(at, index) in &path {
            if func.block(at).ty != InstrSeqType::Simple(None) {
                return None;
            }
            let opens_if = matches!(func.block(at).instrs[index].0, Instr::IfElse(_));
            if height(func, at, index)? != i32::from(opens_if) {
                return None;
            }
        }
        own = own.saturating_sub(size(func, seq));
        let in_trip = crate::counted::recognise_within(func, seq, share, &[])?;
        loops.push(Inner {
            seq,
            counted,
            in_trip,
            path,
        });
    }
    let outer_counted = crate::counted::recognise_within(func, outer, NEST_BUDGET, inner)?;
    let per_trip = own.saturating_add(inner.len() as u32 * (INNER_BUDGET + TEST_COST));
    let limit = NEST_BUDGET / per_trip.max(1);
    // A nest that can run only one trip without checks gains nothing over
    // its inner loops' own copies.
    (limit >= 2).then(|| Nest {
        outer: outer_counted.with_limit(limit),
        inner: loops,
    })
}

/// Instructions under `seq`, nested ones included.
fn size(func: &LocalFunction, seq: InstrSeqId) -> u32 {
    let mut n = 0u32;
    walk(func, seq, &mut |_| n = n.saturating_add(1));
    n
}

/// Where loop `target` is under `seq`: each sequence on the way and the
/// index of the structure that opens the next (or of the loop). Other
/// loops are not looked into.
fn path(
    func: &LocalFunction,
    seq: InstrSeqId,
    target: InstrSeqId,
) -> Option<Vec<(InstrSeqId, usize)>> {
    for (index, (instr, _)) in func.block(seq).instrs.iter().enumerate() {
        let inside = match instr {
            Instr::Loop(l) if l.seq == target => return Some(vec![(seq, index)]),
            Instr::Block(b) => vec![b.seq],
            Instr::IfElse(i) => vec![i.consequent, i.alternative],
            _ => continue,
        };
        for child in inside {
            if let Some(mut rest) = path(func, child, target) {
                rest.insert(0, (seq, index));
                return Some(rest);
            }
        }
    }
    None
}

/// How many values the first `upto` instructions of `seq` leave on the
/// stack, or `None` if that is not plain to see (a branch that makes the
/// rest unreachable, a call, a structure with parameters, a SIMD load).
fn height(func: &LocalFunction, seq: InstrSeqId, upto: usize) -> Option<i32> {
    let results = |seq: InstrSeqId| match func.block(seq).ty {
        InstrSeqType::Simple(None) => Some(0),
        InstrSeqType::Simple(Some(_)) => Some(1),
        InstrSeqType::MultiValue(_) => None,
    };
    let mut h = 0i32;
    for (instr, _) in &func.block(seq).instrs[..upto] {
        h += match instr {
            Instr::LocalGet(_) | Instr::GlobalGet(_) | Instr::Const(_) | Instr::MemorySize(_) => 1,
            Instr::LocalTee(_) | Instr::Unop(_) | Instr::Load(_) => 0,
            Instr::LocalSet(_) | Instr::GlobalSet(_) | Instr::Drop(_) | Instr::BrIf(_) => -1,
            Instr::Binop(_) => -1,
            Instr::Store(_) | Instr::Select(_) | Instr::TernOp(_) => -2,
            Instr::Block(b) => results(b.seq)?,
            Instr::Loop(l) => results(l.seq)?,
            Instr::IfElse(i) => results(i.consequent)? - 1,
            _ => return None,
        };
        if h < 0 {
            return None;
        }
    }
    Some(h)
}

/// Put the copy without checks of nest `outer` (at `parent.instrs[index]`)
/// beside the loop itself, both behind the test of a run's trips, and the
/// tails round them; returns where the loop now is, for its point to be
/// placed as before. Its inner loops need no point of their own: each run
/// of one is short, or leaves to its tail. Every loop of a tail (the inner
/// loop that left to it and any inner loop after it) gets a hoisted point.
pub(crate) fn version(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    outer: InstrSeqId,
    nest: &Nest,
    (point, flag): (FunctionId, GlobalId),
) -> (InstrSeqId, usize) {
    let none = InstrSeqType::Simple(None);
    let mut renamed = Vec::new();
    let fast = duplicate(func, outer, &mut renamed);
    let copy_of = |seq: InstrSeqId| {
        renamed
            .iter()
            .find(|(from, _)| *from == seq)
            .map(|(_, to)| *to)
            .expect("every sequence of the nest was copied")
    };
    let exit = func.builder_mut().dangling_instr_seq(none).id();
    let resume = func.builder_mut().dangling_instr_seq(none).id();
    // Innermost block first: the test of the run's trips, then one block
    // per inner loop, after whose end that loop's tail runs. A short run
    // skips `K` by a branch, not an `if`/`else`: with the point's call in
    // its other arm, Asyncify would keep the test's result alive across the
    // copy to choose the arm again when rewinding, and `kmeans`' copy lost
    // registers to it. `short` is the block `$long` of the module docs: a
    // long run branches out of it to `K`.
    let short = func.builder_mut().dangling_instr_seq(none).id();
    {
        let mut b = func.builder_mut().instr_seq(short);
        nest.outer.push_short(&mut b);
        b.unop(UnaryOp::I32Eqz)
            .instr(BrIf { block: short })
            .instr(Loop { seq: fast })
            .instr(Br { block: exit });
    }
    let long = func.builder_mut().dangling_instr_seq(none).id();
    func.builder_mut()
        .instr_seq(long)
        .instr(Block { seq: short })
        .instr(Br { block: exit });
    let mut current = long;
    // (where to look, loop): the loops of the tails, which get points.
    let mut hoists = Vec::new();
    let mut targets = Vec::new();
    for j in &nest.inner {
        let (at, slot) = *j.path.last().expect("a path ends at its loop");
        guard(
            func,
            (copy_of(at), slot),
            copy_of(j.seq),
            &j.counted,
            current,
        );
        targets.push(current);
        let next = func.builder_mut().dangling_instr_seq(none).id();
        let mut body = vec![(Block { seq: current }.into(), Default::default())];
        let (tail, renamed) = tail(func, outer, resume, j);
        body.extend(tail);
        body.push((Br { block: exit }.into(), Default::default()));
        func.block_mut(next).instrs = body;
        // The tail's copy of `j`, and of every inner loop after it.
        hoists.extend(
            nest.inner
                .iter()
                .filter_map(|k| renamed.iter().find(|(from, _)| *from == k.seq))
                .map(|(_, copy)| (next, *copy)),
        );
        current = next;
    }
    // The tails are copies of the loop as the program wrote it; now its
    // inner loops run only short runs too, within one trip's budget.
    for (j, target) in nest.inner.iter().zip(targets) {
        let (at, slot) = *j.path.last().expect("a path ends at its loop");
        guard(func, (at, slot), j.seq, &j.in_trip, target);
    }
    replace_loop(func, (parent, index), outer, Block { seq: exit }.into());
    func.block_mut(long)
        .instrs
        .insert(1, (Loop { seq: outer }.into(), Default::default()));
    func.builder_mut()
        .instr_seq(resume)
        .instr(Block { seq: current });
    func.builder_mut()
        .instr_seq(exit)
        .instr(Loop { seq: resume });
    for (root, seq) in hoists {
        // Tails hold no loop round these (`path` does not look into loops).
        let path = path(func, root, seq).expect("a tail holds the copies of its loops");
        let (at, slot) = *path.last().expect("a path ends at its loop");
        crate::hoist::hoist(func, at, slot, seq, point, flag, false);
    }
    (long, 1)
}

/// Run inner loop `looped` (at `parent.instrs[index]`) only when its run
/// is short by `counted`'s limit; otherwise leave to the end of block
/// `tail`.
fn guard(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    looped: InstrSeqId,
    counted: &Counted,
    tail: InstrSeqId,
) {
    let none = InstrSeqType::Simple(None);
    let builder = func.builder_mut();
    let then = builder.dangling_instr_seq(none).id();
    builder.instr_seq(then).instr(Loop { seq: looped });
    let otherwise = builder.dangling_instr_seq(none).id();
    builder.instr_seq(otherwise).instr(Br { block: tail });
    let wrapper = builder.dangling_instr_seq(none).id();
    let mut b = builder.instr_seq(wrapper);
    counted.push_short(&mut b);
    b.instr(IfElse {
        consequent: then,
        alternative: otherwise,
    });
    replace_loop(func, (parent, index), looped, Block { seq: wrapper }.into());
}

/// The rest of an iteration of `outer` from inner loop `j` on, as
/// instructions to run in place of a fall out of `outer`'s body: a branch
/// back to `outer` goes to loop `resume` instead. Also returns which
/// sequence copies which (for the copies of `j` and of the inner loops
/// after it, which need points).
#[allow(clippy::type_complexity)]
fn tail(
    func: &mut LocalFunction,
    outer: InstrSeqId,
    resume: InstrSeqId,
    j: &Inner,
) -> (
    Vec<(Instr, walrus::InstrLocId)>,
    Vec<(InstrSeqId, InstrSeqId)>,
) {
    let none = InstrSeqType::Simple(None);
    // Each structure on the way becomes a block that ends where the code
    // after it begins.
    let mut renamed = vec![(outer, resume)];
    let blocks: Vec<InstrSeqId> = j.path[1..]
        .iter()
        .map(|(seq, _)| {
            let block = func.builder_mut().dangling_instr_seq(none).id();
            renamed.push((*seq, block));
            block
        })
        .collect();
    let rest = |func: &LocalFunction, (seq, index): (InstrSeqId, usize)| {
        func.block(seq).instrs[index + 1..].to_vec()
    };
    let (last, slot) = *j.path.last().expect("a path ends at its loop");
    let copy = duplicate(func, j.seq, &mut renamed);
    let mut code = vec![(Loop { seq: copy }.into(), Default::default())];
    let after = rest(func, (last, slot));
    code.extend(copy_instrs(func, after, &mut renamed));
    // From the innermost structure out: its block holds the code so far,
    // and the code after the structure follows it.
    for (level, block) in blocks.iter().enumerate().rev() {
        func.block_mut(*block).instrs = code;
        let after = rest(func, j.path[level]);
        code = vec![(Block { seq: *block }.into(), Default::default())];
        code.extend(copy_instrs(func, after, &mut renamed));
    }
    (code, renamed)
}

#[cfg(test)]
#[path = "nest_tests.rs"]
pub(crate) mod tests;
