//! Counted loops: which loops are recognised, and, run on wasmtime, that
//! a run up to the limit takes the copy without checks, a longer one the
//! loop with its point, and that results never change.

use super::{recognise, Bound, Counted, Shape, BUDGET};
use crate::hoist::tests::{
    assert_results_unchanged, call, call_interrupted, plain_of, prepare_wat_with, same, with_loops,
    Host,
};
use crate::{CountedLoops, PrepareOptions};

pub(crate) const WAT: &str = r#"(module
  (memory (export "memory") 1)
  (func $id (param i32) (result i32) (loop $spin) (local.get 0))
  ;; Down by 1 to 0, the counter's `local.tee` the condition: n trips.
  (func (export "down") (param $n i32) (result i64) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $n))))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $acc))
  ;; Up by 4096 from 0, compared with a local after the step: n / 4096
  ;; trips; n = 0 wraps round (2^20 trips). An exit that is never taken
  ;; here, so that the loop has one.
  (func (export "up") (param $n i32) (result i64) (local $i i32) (local $acc i64)
    (block $out
      (loop $l
        (br_if $out (i64.eq (local.get $acc) (i64.const -1)))
        (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 5))
          (i64.extend_i32_u (local.get $i))))
        (br_if $l (i32.ne (local.tee $i (i32.add (local.get $i) (i32.const 4096)))
          (local.get $n)))))
    (local.get $acc))
  ;; The bound first, a step of -2 written as `i32.add`, and stores.
  (func (export "first") (param $n i32) (result i64) (local $acc i64)
    (loop $l
      (i32.store8 (i32.and (local.get $n) (i32.const 255)) (local.get $n))
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 7))
        (i64.extend_i32_u (i32.load8_u (i32.and (local.get $n) (i32.const 255))))))
      (br_if $l (i32.ne (i32.const 0)
        (local.tee $n (i32.add (local.get $n) (i32.const -2))))))
    (local.get $acc))
  ;; Not counted loops.
  (func (export "step3") (param $n i32) (result i32)
    (loop $l (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 3)))))
    (local.get $n))
  (func (export "twice") (param $n i32) (result i32)
    (loop $l
      (local.set $n (i32.or (local.get $n) (i32.const 1)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "moving") (param $n i32) (param $b i32) (result i32)
    (loop $l
      (local.set $b (i32.add (local.get $b) (i32.const 1)))
      (br_if $l (i32.ne (local.tee $n (i32.add (local.get $n) (i32.const 1))) (local.get $b))))
    (local.get $n))
  (func (export "calls") (param $n i32) (result i32)
    (loop $l
      (drop (call $id (local.get $n)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "fills") (param $n i32) (result i32)
    (loop $l
      (memory.fill (i32.const 0) (i32.const 0) (local.get $n))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "second_edge") (param $n i32) (result i32)
    (loop $l
      (if (i32.eq (local.get $n) (i32.const 7))
        (then (local.set $n (i32.const 3)) (br $l)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "away") (param $n i32) (result i32) (local $i i32)
    (loop $l
      (br_if $l (i32.lt_s (local.tee $i (i32.sub (local.get $i) (i32.const 1))) (local.get $n))))
    (local.get $i))
  ;; Up by 1 from 0 while below n, unsigned: n trips for n >= 1.
  (func (export "less") (param $n i32) (result i64) (local $i i32) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $i))))
      (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (local.get $n))))
    (local.get $acc))
  ;; Down by 2 from n while 0 is below it, signed, the bound first:
  ;; ceil(n / 2) trips for n >= 1.
  (func (export "above") (param $n i32) (result i64) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 5))
        (i64.extend_i32_u (local.get $n))))
      (br_if $l (i32.lt_s (i32.const 0) (local.tee $n (i32.sub (local.get $n) (i32.const 2))))))
    (local.get $acc))
  ;; What is left of n, taken 24 at a time while 24 more are left: n / 24
  ;; trips when n >= 24 (Rust's `chunks_exact`); with `>=` the other way
  ;; round; and subtracting one local while comparing with another.
  (func (export "left") (param $n i32) (result i64) (local $by i32) (local $acc i64)
    (local.set $by (i32.const 24))
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $n))))
      (br_if $l (i32.le_u (local.get $by) (local.tee $n (i32.sub (local.get $n) (local.get $by))))))
    (local.get $acc))
  (func (export "left_ge") (param $n i32) (result i64) (local $by i32) (local $acc i64)
    (local.set $by (i32.const 24))
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $n))))
      (br_if $l (i32.ge_u (local.tee $n (i32.sub (local.get $n) (local.get $by))) (local.get $by))))
    (local.get $acc))
  (func (export "left_other") (param $n i32) (param $by i32) (result i32) (local $m i32)
    (loop $l
      (br_if $l (i32.le_u (local.get $m) (local.tee $n (i32.sub (local.get $n) (local.get $by))))))
    (local.get $n))
  (func (export "_start")))"#;

/// The first loop of export `name` of module `wat`, as [`recognise`] sees it.
fn recognised(wat: &str, name: &str) -> Option<Counted> {
    with_loops(wat, name, |func, loops| recognise(func, loops[0]))
}

/// The trip limit of export `name`'s loop.
fn limit(name: &str) -> u32 {
    recognised(WAT, name).unwrap().limit
}

fn prepared(counted: CountedLoops) -> Vec<u8> {
    let opts = PrepareOptions {
        counted_loops: counted,
        ..PrepareOptions::default()
    };
    prepare_wat_with(WAT, &opts)
}

#[test]
fn counted_loops_are_recognised_and_others_are_not() {
    let of = |name: &str| recognised(WAT, name).map(|c| c.shape);
    let exact = |step, bound| Some(Shape::Exact { step, bound });
    assert_eq!(of("down"), exact(-1, Bound::Const(0)));
    assert!(matches!(
        of("up"),
        Some(Shape::Exact {
            step: 4096,
            bound: Bound::Local(_)
        })
    ));
    assert_eq!(of("first"), exact(-2, Bound::Const(0)));
    assert!(matches!(of("left"), Some(Shape::Remaining { .. })));
    assert!(matches!(of("left_ge"), Some(Shape::Remaining { .. })));
    assert!(matches!(
        of("less"),
        Some(Shape::Ordered {
            step: 1,
            bound: Bound::Local(_),
            signed: false
        })
    ));
    assert_eq!(
        of("above"),
        Some(Shape::Ordered {
            step: -2,
            bound: Bound::Const(0),
            signed: true
        })
    );
    for name in [
        "step3",
        "twice",
        "moving",
        "calls",
        "fills",
        "second_edge",
        "away",
        "left_other",
    ] {
        assert_eq!(of(name), None, "{name}");
    }
    // The limit shrinks with the body: a run stays within the budget.
    let down = limit("down");
    assert!(down > 1 && down < BUDGET, "{down}");
    assert!(limit("first") < down);
}

#[test]
fn a_run_up_to_the_limit_takes_the_copy_without_checks() {
    let wasm = prepared(CountedLoops::On);
    let off = prepared(CountedLoops::Off);
    let cases = [
        ("down", limit("down") as i32, 1),
        ("up", (limit("up") * 4096) as i32, 4096),
        ("first", (limit("first") * 2) as i32, 2),
        ("less", limit("less") as i32, 1),
        ("above", (limit("above") * 2) as i32, 2),
    ];
    for (name, at_limit, step) in cases {
        // The flag held up: every point calls in. Up to the limit, the run
        // calls none; one trip more, the loop with its point runs.
        for arg in [step, 2 * step, at_limit - step, at_limit] {
            let (got, calls) = call(&wasm, name, arg, true, Host::Hold);
            assert!(same(got, plain_of(WAT, name, arg)), "{name}({arg})");
            assert_eq!(calls, 0, "{name}({arg}) ran with checks");
            let (_, off_calls) = call(&off, name, arg, true, Host::Hold);
            assert!(off_calls > 0, "{name}({arg}) without the option");
        }
        let over = at_limit + step;
        let (got, calls) = call(&wasm, name, over, true, Host::Hold);
        assert!(same(got, plain_of(WAT, name, over)), "{name}({over})");
        assert!(calls > 0, "{name}({over}) ran without checks");
    }
    // What is left, by 24: exactly `limit` trips up to 24 * limit + 23.
    for name in ["left", "left_ge"] {
        let at_limit = limit(name) as i32;
        for (arg, fast) in [
            (24, true),
            (47, true),
            (24 * at_limit, true),
            (24 * at_limit + 23, true),
            (24 * at_limit + 24, false),
            (24 * at_limit + 900, false),
        ] {
            let (got, calls) = call(&wasm, name, arg, true, Host::Hold);
            assert!(same(got, plain_of(WAT, name, arg)), "{name}({arg})");
            assert_eq!(calls == 0, fast, "{name}({arg}): {calls} point calls");
        }
    }
    // A counter that starts at its bound wraps round: 2^20 trips, with checks.
    let (got, calls) = call(&wasm, "up", 0, true, Host::Hold);
    assert!(same(got, plain_of(WAT, "up", 0)));
    assert!(calls > 1 << 19, "{calls}");
}

#[test]
fn results_are_unchanged_wherever_requests_land() {
    let wasm = prepared(CountedLoops::On);
    let runs = [
        ("down", vec![1, 2, 7, 100, 5000, 70_000]),
        ("up", vec![4096, 3 * 4096, 100 * 4096, 0]),
        ("first", vec![2, 10, 600, 4000, 90_000]),
        ("left", vec![24, 100, 5000, 100_000]),
        ("left_ge", vec![30, 999, 70_000]),
        ("less", vec![0, 1, 2, 50, 5000, 70_000]),
        ("above", vec![-5, 0, 1, 2, 51, 6000, 90_000]),
    ];
    assert_results_unchanged(&wasm, WAT, &runs, &[1, 3, 40]);
}

/// A function large enough for its inner loops to move (`outline.rs`):
/// the copy without checks moves and is unrolled like the loop with them.
pub(crate) const BIG: &str = r#"(module
  (memory (export "memory") 1)
  (func $id (param i32) (result i32) (loop $spin) (local.get 0))
  (func (export "big") (param $n i32) (result i64)
    (local $i i32) (local $j i32) (local $s i64) (local $acc i64)
    (local $a0 i64) (local $a1 i64) (local $a2 i64) (local $a3 i64) (local $a4 i64) (local $a5 i64) (local $a6 i64) (local $a7 i64) (local $a8 i64) (local $a9 i64) (local $a10 i64) (local $a11 i64)
    (local.set $a0 (i64.const 3)) (local.set $a1 (i64.const 10)) (local.set $a2 (i64.const 17))
    (local.set $a3 (i64.const 24)) (local.set $a4 (i64.const 31)) (local.set $a5 (i64.const 38))
    (local.set $a6 (i64.const 45)) (local.set $a7 (i64.const 52)) (local.set $a8 (i64.const 59))
    (local.set $a9 (i64.const 66)) (local.set $a10 (i64.const 73)) (local.set $a11 (i64.const 80))
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i64.extend_i32_u (call $id (local.get $i))))
        ;; i * 97 + 1 trips, down to 0: short runs first, then long ones.
        (local.set $j (i32.add (i32.mul (local.get $i) (i32.const 97)) (i32.const 1)))
        (loop $inner
          (i32.store (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2))
            (i32.add (i32.load (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2)))
              (local.get $j)))
          (local.set $s (i64.add (local.get $s) (i64.extend_i32_u (local.get $j))))
          (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
        (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 31)) (local.get $s)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (local.get $acc) (local.get $a0)) (local.get $a1)) (local.get $a2)) (local.get $a3)) (local.get $a4)) (local.get $a5)) (local.get $a6)) (local.get $a7)) (local.get $a8)) (local.get $a9)) (local.get $a10)) (local.get $a11)) (i64.extend_i32_u (i32.load (i32.const 28)))))
  (func (export "_start")))"#;

#[test]
fn a_copy_without_checks_moves_with_its_loop_and_computes_the_same() {
    let opts = |counted| PrepareOptions {
        counted_loops: counted,
        ..PrepareOptions::default()
    };
    let wasm = prepare_wat_with(BIG, &opts(CountedLoops::On));
    let off = prepare_wat_with(BIG, &opts(CountedLoops::Off));
    let moved = |wasm: &[u8]| {
        let module = walrus::ModuleConfig::new().parse(wasm).unwrap();
        let names = module.exports.iter().map(|e| e.name.clone());
        names
            .filter(|n| n.starts_with(crate::LOOP_EXPORT_PREFIX))
            .count()
    };
    // Both copies of the inner loop move.
    assert_eq!(moved(&wasm), moved(&off) + 1);
    // Up to i = 40: 3881 trips, past the limit of this body.
    for n in [1, 3, 10, 40] {
        let want = plain_of(BIG, "big", n);
        for (raise, host) in [
            (false, Host::Lower),
            (true, Host::Lower),
            (true, Host::Hold),
        ] {
            let (got, _) = call(&wasm, "big", n, raise, host);
            assert!(same(got, want), "big({n}) raise {raise}");
        }
        for every in [1, 2, 5, 13] {
            let (got, calls) = call_interrupted(&wasm, "big", n, every);
            assert!(same(got, want), "big({n}) every {every}");
            // Each call of `$id` passes a check: enough of them from n = 10.
            assert!(
                n < 10 || calls > 0,
                "big({n}) every {every}: no point taken"
            );
        }
    }
}

/// A counter that crosses the signed boundary on its way to a constant
/// bound: the test's arithmetic wraps as the loop's does.
const EDGE: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "edge") (param $x i32) (result i64) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $x))))
      (br_if $l (i32.ne (local.tee $x (i32.add (local.get $x) (i32.const 16)))
        (i32.const 0x80000000))))
    (local.get $acc))
  (func (export "_start")))"#;

#[test]
fn the_trip_count_wraps_as_the_counter_does() {
    let c = recognised(EDGE, "edge").unwrap();
    assert_eq!(
        c.shape,
        Shape::Exact {
            step: 16,
            bound: Bound::Const(i32::MIN)
        }
    );
    let wasm = prepare_wat_with(EDGE, &PrepareOptions::default());
    // k trips from i32::MIN - 16k, through i32::MAX to i32::MIN.
    for (k, fast) in [
        (1, true),
        (c.limit, true),
        (c.limit + 1, false),
        (c.limit * 2, false),
    ] {
        let start = i32::MIN.wrapping_sub(16 * k as i32);
        let want = plain_of(EDGE, "edge", start);
        let (got, calls) = call(&wasm, "edge", start, true, Host::Hold);
        assert!(same(got, want), "{k} trips");
        assert_eq!(calls == 0, fast, "{k} trips: {calls} point calls");
    }
}

/// Ordered bounds near the end of the counter's range, with the largest
/// step: `far`'s bound leaves room for the last step, `near`'s does not,
/// and a counter that steps over it wraps round.
const ORDERED_EDGE: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "far") (param $x i32) (result i64) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $x))))
      (br_if $l (i32.lt_s (local.tee $x (i32.add (local.get $x) (i32.const 4096)))
        (i32.const 0x7ffff000))))
    (local.get $acc))
  (func (export "near") (param $x i32) (result i64) (local $acc i64)
    (loop $l
      (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
        (i64.extend_i32_u (local.get $x))))
      (br_if $l (i32.lt_s (local.tee $x (i32.add (local.get $x) (i32.const 4096)))
        (i32.const 0x7ffff001))))
    (local.get $acc))
  (func (export "_start")))"#;

#[test]
fn an_ordered_bound_is_short_only_where_no_step_can_wrap() {
    let wasm = prepare_wat_with(ORDERED_EDGE, &PrepareOptions::default());
    let far = recognised(ORDERED_EDGE, "far").unwrap().limit as i32;
    let bound = 0x7fff_f000_i32;
    // k trips of 4096 up to the bound; one byte further is one trip more.
    for (start, fast) in [
        (bound - 4096, true),
        (bound - 4096 * far, true),
        (bound - 4096 * far - 1, false),
        (bound - 4096 * (far + 1), false),
        // Entered at or past the bound: one trip, with its checks.
        (bound, false),
        (bound + 7, false),
    ] {
        let want = plain_of(ORDERED_EDGE, "far", start);
        let (got, calls) = call(&wasm, "far", start, true, Host::Hold);
        assert!(same(got, want), "far({start})");
        assert_eq!(calls == 0, fast, "far({start}): {calls} point calls");
    }
    // One more: the last step may pass i32::MAX, so no run is short, not
    // even one that would end below it. (A run that does pass it never
    // ends: with a step of a power of two, the counter comes round to the
    // same place below the bound again.)
    let near = 0x7fff_f001_i32;
    for start in [near - 4096, near - 8192, near - 4096 * 20] {
        let want = plain_of(ORDERED_EDGE, "near", start);
        let (got, calls) = call(&wasm, "near", start, true, Host::Hold);
        assert!(same(got, want), "near({start})");
        assert!(calls > 0, "near({start}) ran without checks");
    }
}
