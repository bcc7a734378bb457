//! Counted loops: a short run of a counted loop needs no check at all.
//!
//! Why: a migration point only has to bound the time until the next point.
//! A loop whose every run is short bounds it by itself, so a check on each
//! trip buys nothing there. Most hot inner loops are *counted*: a counter
//! moves by a constant step at the end of each trip, and the loop goes on
//! while it differs from a bound that does not change. Their trip count is
//! then known when the loop is entered, even though it is not known when the
//! module is prepared: `kmeans`' distance loop runs `dim` trips (8), the
//! blocked `matmul` kernel 64, `linpack`'s row updates at most `n`. Such a
//! bound can rarely be proved when the module is prepared; the program
//! states it when it runs.
//!
//! How: such a loop `L` becomes two copies behind a test of its trip count,
//! made once on entry from the counter's and the bound's values:
//!
//! ```wasm
//! block                        ;; same block type as $L
//!   <trips from the counter and the bound> <= limit
//!   if                         ;; same block type
//!     loop $F ... end          ;; a copy of $L: no point, no check
//!   else
//!     loop $L ... end          ;; $L, which gets its point as before
//!   end
//! end
//! ```
//!
//! The limit is [`BUDGET`] instructions divided by the size of the body, so
//! a run of the copy without checks executes at most about [`BUDGET`]
//! instructions (some tens of microseconds) before the code after the loop,
//! where the next point is: the enclosing loop's check, or the caller's.
//! A longer run takes the original loop with its point, as before.
//!
//! Which loops: the last instruction of the body is the only branch back to
//! the loop, `br_if $L`, and its condition is one of
//!
//! - `local.tee $x (x + s)`: go on while `x != 0`;
//! - `(x + s, local.tee $x) != b` or `b != (x + s, local.tee $x)`, with `b`
//!   a constant or a local the loop never writes;
//!
//! where `s` is a constant whose magnitude is a power of two up to
//! [`MAX_STEP`] (`x - s` counts as `x + (-s)`), and that `local.tee` is the
//! only write of `x` in the loop. The body has no inner loop, no call, and
//! nothing whose time grows with an operand (`memory.grow`, `memory.fill`,
//! `memory.copy`, table bulk operations): only the instructions of
//! [`bounded`]. Then each trip adds `s` to `x` exactly once, and the loop
//! ends (unless it leaves earlier) at the first trip after which `x == b`.
//! With `e = b - x` on entry (`x - b` when `s` is negative), that is trip
//! `e / |s|` when `e` is a non-zero multiple of `|s|`; otherwise, or when
//! `e == 0`, the counter passes `b` and wraps round (or never meets it),
//! and the test sends the run to the loop with its point. So the test is
//! `e - 1 < limit * |s|` (unsigned) and `e & (|s| - 1) == 0`.
//!
//! Ordered comparisons are counted too: `x op b` or `b op x` after the
//! update, with `op` one of `i32.lt_s`, `lt_u`, `gt_s`, `gt_u`, the step
//! moving `x` towards `b` (up for `x < b`, down for `x > b`), of any
//! magnitude up to [`MAX_STEP`]. That is how clang leaves `for (i = 1; i <
//! n - 1; i += 2)` when it cannot prove that `i` meets the bound exactly
//! (`mg`'s stencils, unrolled by two). The test computes the distance in
//! 64 bits: a run is short when `1 <= d <= limit * |s|` and the bound sits
//! far enough from the end of the counter's range that no trip wraps it
//! (see [`Counted::push_short`]).
//!
//! One more shape counts down what is left of a slice walked in chunks
//! whose size is known only when the program runs (Rust's
//! `chunks_exact(dim)`, `kmeans`' loop over the centroids): the condition
//! is `by <= (x - by, local.tee $x)` or `(x - by, local.tee $x) >= by`,
//! unsigned, with `by` a local the loop never writes. A run then makes
//! `x / by` trips when `x >= by >= 1` on entry, and otherwise wraps round
//! or never moves; the test is `by != 0 && x >= by && x / by <= limit`.
//!
//! The copy without checks is never where a migration stops, so a point
//! held up (the counting modes) is not called on entry to a short run:
//! the next point after the loop is.

use walrus::ir::{
    BinaryOp, Binop, Block, BrIf, Const, IfElse, Instr, InstrSeqId, InstrSeqType, LocalGet,
    LocalTee, Loop, Value,
};
use walrus::{LocalFunction, LocalId};

use crate::outline::walk;

/// Instructions a run of a loop without checks may execute: the trip limit
/// is this divided by the body's size.
pub(crate) const BUDGET: u32 = 1 << 16;

/// The largest step (in magnitude) of a counter that is recognised.
pub(crate) const MAX_STEP: u32 = 1 << 12;

/// What a counted loop's back-edge compares its counter with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    Const(i32),
    Local(LocalId),
}

impl Bound {
    /// Push the bound's value.
    fn push(self, b: &mut walrus::InstrSeqBuilder) {
        match self {
            Bound::Const(c) => b.i32_const(c),
            Bound::Local(l) => b.local_get(l),
        };
    }
}

/// How a counted loop's counter moves and when the loop goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `x += step` (a constant) once per trip; on while `x != bound`.
    Exact { step: i32, bound: Bound },
    /// `x -= by` (a local the loop never writes) once per trip; on while
    /// `by <= x`, unsigned: what is left of a slice walked in chunks of
    /// `by` (Rust's `chunks_exact`).
    Remaining { by: LocalId },
    /// `x += step` once per trip; on while `x < bound` (a positive step)
    /// or `x > bound` (a negative one), signed or unsigned: C's `for (i =
    /// a; i < n; i += s)` as clang leaves it when it cannot prove the
    /// counter meets the bound exactly.
    Ordered {
        step: i32,
        bound: Bound,
        signed: bool,
    },
}

/// A recognised counted loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    x: LocalId,
    shape: Shape,
    /// Most trips a run without checks may make.
    pub(crate) limit: u32,
}

/// Whether `instr` takes a time that does not grow with its operands and
/// cannot call: the only instructions a counted loop's body may hold
/// (nested blocks and `if`s are looked into).
fn bounded(instr: &Instr) -> bool {
    matches!(
        instr,
        Instr::Block(_)
            | Instr::IfElse(_)
            | Instr::LocalGet(_)
            | Instr::LocalSet(_)
            | Instr::LocalTee(_)
            | Instr::GlobalGet(_)
            | Instr::GlobalSet(_)
            | Instr::Const(_)
            | Instr::Binop(_)
            | Instr::Unop(_)
            | Instr::TernOp(_)
            | Instr::Select(_)
            | Instr::Unreachable(_)
            | Instr::Br(_)
            | Instr::BrIf(_)
            | Instr::BrTable(_)
            | Instr::Drop(_)
            | Instr::Return(_)
            | Instr::MemorySize(_)
            | Instr::Load(_)
            | Instr::Store(_)
            | Instr::LoadSimd(_)
    )
}

/// `x + s` as the instructions `local.get $x; i32.const c; i32.add|i32.sub`:
/// returns `s`.
fn step_of(get: &Instr, constant: &Instr, op: &Instr, x: LocalId) -> Option<i32> {
    let (
        Instr::LocalGet(LocalGet { local }),
        Instr::Const(Const {
            value: Value::I32(c),
        }),
    ) = (get, constant)
    else {
        return None;
    };
    if *local != x {
        return None;
    }
    match op {
        Instr::Binop(Binop {
            op: BinaryOp::I32Add,
        }) => Some(*c),
        Instr::Binop(Binop {
            op: BinaryOp::I32Sub,
        }) => Some(c.wrapping_neg()),
        _ => None,
    }
}

fn bound_of(instr: &Instr) -> Option<Bound> {
    match instr {
        Instr::Const(Const {
            value: Value::I32(c),
        }) => Some(Bound::Const(*c)),
        Instr::LocalGet(LocalGet { local }) => Some(Bound::Local(*local)),
        _ => None,
    }
}

/// `local.get a; local.get b; i32.sub` at `at..at + 3`: `(a, b)`.
fn gets_then(instrs: &[&Instr], at: usize) -> Option<(LocalId, LocalId)> {
    match instrs.get(at..at + 3)? {
        [Instr::LocalGet(a), Instr::LocalGet(b), Instr::Binop(Binop {
            op: BinaryOp::I32Sub,
        })] => Some((a.local, b.local)),
        _ => None,
    }
}

/// The [`Shape::Remaining`] back-edges: `by; x - by; local.tee x; i32.le_u`
/// or `x - by; local.tee x; by; i32.ge_u`, then `br_if`.
fn remaining(instrs: &[&Instr]) -> Option<(LocalId, Shape)> {
    let n = instrs.len();
    let tee = |i: usize| match instrs.get(i) {
        Some(Instr::LocalTee(LocalTee { local })) => Some(*local),
        _ => None,
    };
    let compare = match instrs.get(n.checked_sub(2)?) {
        Some(Instr::Binop(Binop { op })) => op,
        _ => return None,
    };
    let (x, by) = if matches!(compare, BinaryOp::I32LeU) {
        let by = match instrs.get(n.checked_sub(7)?) {
            Some(Instr::LocalGet(LocalGet { local })) => *local,
            _ => return None,
        };
        let update = gets_then(instrs, n - 6)?;
        (tee(n - 3).filter(|x| update == (*x, by))?, by)
    } else if matches!(compare, BinaryOp::I32GeU) {
        let (x, by) = gets_then(instrs, n.checked_sub(7)?)?;
        let again = match instrs.get(n - 3) {
            Some(Instr::LocalGet(LocalGet { local })) => *local,
            _ => return None,
        };
        (tee(n - 4).filter(|t| *t == x && again == by)?, by)
    } else {
        return None;
    };
    (x != by).then_some((x, Shape::Remaining { by }))
}

/// The counter and shape of loop `seq`'s back-edge, if it has one of the
/// recognised forms (the rest is checked by [`recognise`]).
fn back_edge(func: &LocalFunction, seq: InstrSeqId) -> Option<(LocalId, Shape)> {
    let instrs: Vec<&Instr> = func.block(seq).instrs.iter().map(|(i, _)| i).collect();
    let n = instrs.len();
    match instrs.last()? {
        Instr::BrIf(BrIf { block }) if *block == seq => {}
        _ => return None,
    }
    if let Some(found) = remaining(&instrs) {
        return Some(found);
    }
    let exact = |x: LocalId, step: i32, bound: Bound| {
        let magnitude = step.unsigned_abs();
        let fine = step != 0
            && magnitude.is_power_of_two()
            && magnitude <= MAX_STEP
            && bound != Bound::Local(x);
        fine.then_some((x, Shape::Exact { step, bound }))
    };
    let tee_at = |i: usize| match instrs.get(i) {
        Some(Instr::LocalTee(LocalTee { local })) => Some(*local),
        _ => None,
    };
    // `local.get x; const; add; local.tee x` ending at index `end`.
    let update = |end: usize| -> Option<(LocalId, i32)> {
        let x = tee_at(end)?;
        let s = step_of(
            instrs[end.checked_sub(3)?],
            instrs[end - 2],
            instrs[end - 1],
            x,
        )?;
        Some((x, s))
    };
    // `... local.tee x; br_if`: on while x != 0.
    if let Some((x, s)) = n.checked_sub(2).and_then(update) {
        return exact(x, s, Bound::Const(0));
    }
    let op = match instrs.get(n.checked_sub(2)?) {
        Some(Instr::Binop(Binop { op })) => *op,
        _ => return None,
    };
    if let Some((less, signed)) = ordered(op) {
        return ordered_edge(&instrs, less, signed, update);
    }
    if !matches!(op, BinaryOp::I32Ne) {
        return None;
    }
    // `update; b; i32.ne; br_if`
    if let Some((x, s)) = n.checked_sub(4).and_then(update) {
        return exact(x, s, bound_of(instrs[n - 3])?);
    }
    // `b; update; i32.ne; br_if`
    let (x, s) = n.checked_sub(3).and_then(update)?;
    exact(x, s, bound_of(instrs[n.checked_sub(7)?])?)
}

/// `(x < b, signed)` for `x op b` when `op` is an ordered comparison that
/// a counted loop may go on by (`x > b` gives `less == false`).
fn ordered(op: BinaryOp) -> Option<(bool, bool)> {
    match op {
        BinaryOp::I32LtS => Some((true, true)),
        BinaryOp::I32LtU => Some((true, false)),
        BinaryOp::I32GtS => Some((false, true)),
        BinaryOp::I32GtU => Some((false, false)),
        _ => None,
    }
}

/// The [`Shape::Ordered`] back-edges: `update; b; op; br_if` (on while
/// `x op b`) or `b; update; op; br_if` (on while `b op x`, that is `x`
/// against `b` the other way round). The step must move `x` towards the
/// bound: up while `x < b`, down while `x > b`.
fn ordered_edge(
    instrs: &[&Instr],
    less: bool,
    signed: bool,
    update: impl Fn(usize) -> Option<(LocalId, i32)>,
) -> Option<(LocalId, Shape)> {
    let n = instrs.len();
    let (x, step, bound, less) = match n.checked_sub(4).and_then(&update) {
        Some((x, s)) => (x, s, bound_of(instrs[n - 3])?, less),
        None => {
            let (x, s) = n.checked_sub(3).and_then(&update)?;
            (x, s, bound_of(instrs[n.checked_sub(7)?])?, !less)
        }
    };
    let magnitude = step.unsigned_abs();
    let fine = (step > 0) == less && step != 0 && magnitude <= MAX_STEP && bound != Bound::Local(x);
    fine.then_some((
        x,
        Shape::Ordered {
            step,
            bound,
            signed,
        },
    ))
}

/// Loop `seq` as a counted loop, or `None` (see the module docs for the
/// conditions).
pub(crate) fn recognise(func: &LocalFunction, seq: InstrSeqId) -> Option<Counted> {
    recognise_within(func, seq, BUDGET, &[])
}

/// Loop `seq` as a counted loop whose runs without checks may execute
/// `budget` instructions, and which may hold the loops `inner` (each
/// checked by the caller, `nest.rs`; their instructions count towards the
/// size).
pub(crate) fn recognise_within(
    func: &LocalFunction,
    seq: InstrSeqId,
    budget: u32,
    inner: &[InstrSeqId],
) -> Option<Counted> {
    if !matches!(func.block(seq).ty, InstrSeqType::Simple(_)) {
        return None;
    }
    let (x, shape) = back_edge(func, seq)?;
    // The local the loop must not write besides the counter.
    let bound = match shape {
        Shape::Exact { bound, .. } | Shape::Ordered { bound, .. } => bound,
        Shape::Remaining { by } => Bound::Local(by),
    };
    let (mut size, mut ok, mut edges, mut writes_x) = (0u32, true, 0u32, 0u32);
    walk(func, seq, &mut |instr| {
        size = size.saturating_add(1);
        ok &= bounded(instr) || matches!(instr, Instr::Loop(l) if inner.contains(&l.seq));
        match instr {
            Instr::Br(b) if b.block == seq => edges += 1,
            Instr::BrIf(b) if b.block == seq => edges += 1,
            Instr::BrTable(t) if t.default == seq || t.blocks.contains(&seq) => edges += 2,
            Instr::LocalSet(s) if s.local == x => writes_x += 1,
            Instr::LocalTee(t) if t.local == x => writes_x += 1,
            Instr::LocalSet(s) if Bound::Local(s.local) == bound => ok = false,
            Instr::LocalTee(t) if Bound::Local(t.local) == bound => ok = false,
            _ => {}
        }
    });
    if !ok || edges != 1 || writes_x != 1 {
        return None;
    }
    Some(Counted {
        x,
        shape,
        limit: (budget / size.max(1)).max(1),
    })
}

impl Counted {
    /// The same loop with at most `limit` trips per run without checks.
    pub(crate) fn with_limit(self, limit: u32) -> Counted {
        Counted { limit, ..self }
    }

    /// Push 1 if a run of the loop entered now ends within its limit of
    /// trips, else 0 (see the module docs).
    pub(crate) fn push_short(&self, b: &mut walrus::InstrSeqBuilder) {
        // limit <= 2^18 (a nest's budget, `nest.rs`) and |s| <= 2^12: the
        // product fits a positive i32.
        debug_assert!(self.limit <= 1 << 18);
        let (step, bound) = match self.shape {
            Shape::Exact { step, bound } => (step, bound),
            Shape::Remaining { by } => return self.push_short_remaining(b, by),
            Shape::Ordered {
                step,
                bound,
                signed,
            } => return self.push_short_ordered(b, step, bound, signed),
        };
        let magnitude = step.unsigned_abs();
        // e = b - x (x - b for a negative step), wrapping.
        let distance = |b: &mut walrus::InstrSeqBuilder| {
            if step < 0 {
                b.local_get(self.x);
                bound.push(b);
            } else {
                bound.push(b);
                b.local_get(self.x);
            }
            b.binop(BinaryOp::I32Sub);
        };
        distance(b);
        b.i32_const(1).binop(BinaryOp::I32Sub);
        b.i32_const((self.limit * magnitude) as i32)
            .binop(BinaryOp::I32LtU);
        if magnitude > 1 {
            distance(b);
            b.i32_const((magnitude - 1) as i32)
                .binop(BinaryOp::I32And)
                .unop(walrus::ir::UnaryOp::I32Eqz)
                .binop(BinaryOp::I32And);
        }
    }

    /// [`Shape::Ordered`], in 64 bits so nothing wraps. With `d` the
    /// distance from `x` on entry to the bound in the step's direction, a
    /// run makes `ceil(d / |s|)` trips when `d >= 1`, and the counter
    /// stays within `|s| - 1` past the bound. The test is `1 <= d <=
    /// limit × |s|`, and that the bound is at least `|s| - 1` from the end
    /// of the counter's range (signed or not), so that no trip wraps it
    /// round.
    /// `d <= 0` (entered past the bound) goes to the loop with its point:
    /// one trip, unless that trip wraps.
    fn push_short_ordered(
        &self,
        b: &mut walrus::InstrSeqBuilder,
        step: i32,
        bound: Bound,
        signed: bool,
    ) {
        use walrus::ir::UnaryOp::{I64ExtendSI32, I64ExtendUI32};
        let extend = if signed { I64ExtendSI32 } else { I64ExtendUI32 };
        let magnitude = i64::from(step.unsigned_abs());
        let push_bound = |b: &mut walrus::InstrSeqBuilder| {
            bound.push(b);
            b.unop(extend);
        };
        let (low, high) = match signed {
            true => (i64::from(i32::MIN), i64::from(i32::MAX)),
            false => (0, i64::from(u32::MAX)),
        };
        // d - 1 < limit * |s|, unsigned: 1 <= d <= limit * |s|.
        if step > 0 {
            push_bound(b);
            b.local_get(self.x).unop(extend);
        } else {
            b.local_get(self.x).unop(extend);
            push_bound(b);
        }
        b.binop(BinaryOp::I64Sub);
        b.i64_const(1).binop(BinaryOp::I64Sub);
        b.i64_const(i64::from(self.limit) * magnitude)
            .binop(BinaryOp::I64LtU);
        // The last trip leaves the counter at most |s| - 1 past the bound.
        push_bound(b);
        if step > 0 {
            b.i64_const(high - (magnitude - 1)).binop(BinaryOp::I64LeS);
        } else {
            b.i64_const(low + (magnitude - 1)).binop(BinaryOp::I64GeS);
        }
        b.binop(BinaryOp::I32And);
    }

    /// [`Shape::Remaining`]: a run makes `x / by` trips when `x >= by >= 1`
    /// on entry; otherwise the first trip wraps round (or `by == 0` never
    /// moves), so the test is `by != 0 && x >= by && x / by <= limit`. The
    /// division is by `by`, or by 1 when `by == 0`, so it cannot trap.
    fn push_short_remaining(&self, b: &mut walrus::InstrSeqBuilder, by: LocalId) {
        use walrus::ir::UnaryOp::I32Eqz;
        b.local_get(by).unop(I32Eqz).unop(I32Eqz);
        b.local_get(self.x)
            .local_get(by)
            .binop(BinaryOp::I32GeU)
            .binop(BinaryOp::I32And);
        b.local_get(self.x)
            .local_get(by)
            .i32_const(1)
            .local_get(by)
            .instr(walrus::ir::Select { ty: None })
            .binop(BinaryOp::I32DivU)
            .i32_const(self.limit as i32)
            .binop(BinaryOp::I32LeU)
            .binop(BinaryOp::I32And);
    }
}

/// Put the two copies of counted loop `looped` (at `parent.instrs[index]`)
/// behind the test of its trip count; returns where the original loop now
/// is (inside the `else` arm), for its point to be placed as before, and
/// the body of the copy without checks.
pub(crate) fn version(
    func: &mut LocalFunction,
    (parent, index): (InstrSeqId, usize),
    looped: InstrSeqId,
    counted: Counted,
) -> ((InstrSeqId, usize), InstrSeqId) {
    let ty = func.block(looped).ty;
    let fast = crate::hoist::duplicate(func, looped, &mut vec![]);
    let builder = func.builder_mut();
    let (then, otherwise) = {
        let mut t = builder.dangling_instr_seq(ty);
        t.instr(Loop { seq: fast });
        let t = t.id();
        let mut e = builder.dangling_instr_seq(ty);
        e.instr(Loop { seq: looped });
        (t, e.id())
    };
    let outer = {
        let mut b = builder.dangling_instr_seq(ty);
        counted.push_short(&mut b);
        b.instr(IfElse {
            consequent: then,
            alternative: otherwise,
        });
        b.id()
    };
    crate::hoist::replace_loop(func, (parent, index), looped, Block { seq: outer }.into());
    ((otherwise, 0), fast)
}

#[cfg(test)]
#[path = "counted_tests.rs"]
pub(crate) mod tests;
