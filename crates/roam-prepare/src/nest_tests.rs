//! Counted nests: which nests are recognised, and, run on wasmtime, that a
//! short nest runs without checks, that a long inner run leaves to its tail
//! with a point, and that results never change.

use super::{recognise, INNER_BUDGET, NEST_BUDGET};
use crate::hoist::tests::{
    assert_results_unchanged, call, plain_of, prepare_wat_with, same, with_loops, Host,
};
use crate::{CountedNests, PrepareOptions};

/// The inner loop's store and sum, on `$j`.
macro_rules! inner_body {
    () => {
        r#"(i32.store (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2))
            (i32.add (i32.load (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2)))
              (local.get $j)))
          (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 3))
            (i64.extend_i32_u (local.get $j))))"#
    };
}

pub(crate) const WAT: &str = concat!(
    r#"(module
  (memory (export "memory") 1)
  (func $id (param i32) (result i32) (loop $spin) (local.get 0))
  ;; n outer trips down to 0; the inner loop sits in a block and an `if`,
  ;; and runs ((i * 37) & 63) + 1 trips: every run short.
  (func (export "short") (param $n i32) (result i64) (local $i i32) (local $j i32) (local $acc i64)
    (local.set $i (local.get $n))
    (loop $outer
      (block $skip
        (br_if $skip (i32.eq (i32.and (local.get $i) (i32.const 7)) (i32.const 5)))
        (local.set $j (i32.add (i32.and (i32.mul (local.get $i) (i32.const 37)) (i32.const 63)) (i32.const 1)))
        (if (i32.and (local.get $i) (i32.const 1))
          (then
            (loop $inner
              "#,
    inner_body!(),
    r#"
              (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
            (local.set $acc (i64.xor (local.get $acc) (i64.const 0x55)))))
        (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $i)))))
      (br_if $outer (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))
    (i64.add (local.get $acc) (i64.extend_i32_u (i32.load (i32.const 28)))))
  ;; The same with ((i * 37) & 4095) + 1 inner trips, past the inner limit
  ;; now and then (and past a long run's too), and two inner loops, the
  ;; second counting up to a bound.
  (func (export "long") (param $n i32) (result i64) (local $i i32) (local $j i32) (local $k i32) (local $acc i64)
    (local.set $i (local.get $n))
    (loop $outer
      (block $skip
        (br_if $skip (i32.eq (i32.and (local.get $i) (i32.const 7)) (i32.const 5)))
        (local.set $j (i32.add (i32.and (i32.mul (local.get $i) (i32.const 37)) (i32.const 4095)) (i32.const 1)))
        (if (i32.and (local.get $i) (i32.const 2))
          (then
            (loop $inner
              "#,
    inner_body!(),
    r#"
              (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
            (local.set $acc (i64.xor (local.get $acc) (i64.const 0x55)))))
        (local.set $k (i32.const 0))
        (loop $up
          (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $k))))
          (br_if $up (i32.ne (local.tee $k (i32.add (local.get $k) (i32.const 2))) (local.get $i))))
        (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $i)))))
      (br_if $outer (local.tee $i (i32.sub (local.get $i) (i32.const 2)))))
    (i64.add (local.get $acc) (i64.extend_i32_u (i32.load (i32.const 28)))))
  ;; Two outer trips: in the first, 3000 inner trips (past the inner
  ;; limit: the tail), then n trips of a second inner loop, which in the
  ;; tail must have its checks too.
  (func (export "then_long") (param $n i32) (result i64) (local $i i32) (local $j i32) (local $k i32) (local $acc i64)
    (local.set $i (i32.const 2))
    (loop $outer
      (local.set $j (select (i32.const 3000) (i32.const 5) (i32.eq (local.get $i) (i32.const 2))))
      (loop $inner
        "#,
    inner_body!(),
    r#"
        (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
      (local.set $k (i32.const 0))
      (loop $second
        (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $k))))
        (br_if $second (i32.ne (local.tee $k (i32.add (local.get $k) (i32.const 1))) (local.get $n))))
      (br_if $outer (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))
    (local.get $acc))
  ;; Not nests: a call in the outer loop; an inner loop that is not counted;
  ;; a value on the stack across the inner loop; an inner loop that gives a
  ;; value.
  (func (export "calls") (param $n i32) (result i32) (local $j i32)
    (loop $outer
      (drop (call $id (local.get $n)))
      (local.set $j (i32.const 4))
      (loop $inner (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
      (br_if $outer (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "at_most") (param $n i32) (result i32) (local $j i32)
    (loop $outer
      (local.set $j (i32.const 0))
      (loop $inner (br_if $inner (i32.le_u (local.tee $j (i32.add (local.get $j) (i32.const 1))) (i32.const 9))))
      (br_if $outer (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "stack") (param $n i32) (result i32) (local $j i32)
    (loop $outer
      (local.set $j (i32.const 4))
      (i32.const 1)
      (loop $inner (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1)))))
      (drop)
      (br_if $outer (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "valued") (param $n i32) (result i32) (local $j i32)
    (loop $outer
      (local.set $j (i32.const 4))
      (drop (loop $inner (result i32)
        (br_if $inner (local.tee $j (i32.sub (local.get $j) (i32.const 1))))
        (local.get $j)))
      (br_if $outer (local.tee $n (i32.sub (local.get $n) (i32.const 1)))))
    (local.get $n))
  (func (export "_start")))"#
);

/// The first loop of export `name` and the loops inside it, as
/// [`recognise`] sees them: whether it is a nest, and its trip limit.
fn recognised(name: &str) -> Option<u32> {
    with_loops(WAT, name, |func, loops| {
        recognise(func, loops[0], &loops[1..]).map(|n| n.outer.limit)
    })
}

fn prepared(nests: CountedNests) -> Vec<u8> {
    let opts = PrepareOptions {
        counted_nests: nests,
        ..PrepareOptions::default()
    };
    prepare_wat_with(WAT, &opts)
}

#[test]
fn nests_of_counted_loops_are_recognised_and_others_are_not() {
    let short = recognised("short").expect("short");
    let long = recognised("long").expect("long");
    // Each trip may run an inner run of the inner budget: the limit keeps
    // the nest within its own.
    assert!(short > 2 && short < NEST_BUDGET / INNER_BUDGET, "{short}");
    assert!(long < short, "{long} {short}");
    for name in ["calls", "at_most", "stack", "valued"] {
        assert_eq!(recognised(name), None, "{name}");
    }
}

#[test]
fn a_short_nest_runs_without_checks_and_a_long_inner_run_with_them() {
    let wasm = prepared(CountedNests::On);
    let off = prepared(CountedNests::Off);
    let limit = recognised("short").unwrap() as i32;
    // The flag held up: every point calls in.
    for n in [1, 2, 9, limit] {
        let want = plain_of(WAT, "short", n);
        let (got, calls) = call(&wasm, "short", n, true, Host::Hold);
        assert!(same(got, want), "short({n})");
        assert_eq!(calls, 0, "short({n}) ran with checks");
        let (got, off_calls) = call(&off, "short", n, true, Host::Hold);
        assert!(same(got, want), "short({n}) without the option");
        // Only the outer loop has checks left without the option.
        assert!(off_calls > 0, "short({n}) without the option");
    }
    let over = limit + 1;
    let (got, calls) = call(&wasm, "short", over, true, Host::Hold);
    assert!(same(got, plain_of(WAT, "short", over)), "short({over})");
    assert!(calls > 0, "short({over}) ran without checks");
    // Up to 4096 inner trips: past the inner limit for some i, so those
    // runs take the tail, with its point, and the rest of the nest the
    // loop with checks.
    let n = 2 * (limit / 2);
    let (got, calls) = call(&wasm, "long", n, true, Host::Hold);
    assert!(same(got, plain_of(WAT, "long", n)), "long({n})");
    assert!(calls > 0, "long({n}) ran without checks");
    // Short inner runs only (i = 2: 75 trips; the second loop, 1).
    let (got, calls) = call(&wasm, "long", 2, true, Host::Hold);
    assert!(same(got, plain_of(WAT, "long", 2)), "long(2)");
    assert_eq!(calls, 0, "long(2) ran with checks");
}

#[test]
fn a_long_run_checks_once_per_outer_trip_and_its_inner_runs_never() {
    let wasm = prepared(CountedNests::On);
    let limit = recognised("short").unwrap() as i32;
    // The flag held up: past the limit, the loop runs with its hoisted
    // point (on entry, and at each back-edge), and its inner runs, all
    // short, without checks.
    for n in [limit + 1, 3 * limit, 1000] {
        let (got, calls) = call(&wasm, "short", n, true, Host::Hold);
        assert!(same(got, plain_of(WAT, "short", n)), "short({n})");
        assert_eq!(calls, n as u32, "short({n})");
    }
    // Up to 4096 inner trips in a long run: some of them too many for one
    // trip's budget, and those leave to their tail, which checks at every
    // inner trip; after it the run goes on from the test of its trips.
    let n = 2 * limit + 200;
    let (got, calls) = call(&wasm, "long", n, true, Host::Hold);
    assert!(same(got, plain_of(WAT, "long", n)), "long({n})");
    assert!(calls > (n / 2) as u32 + 2000, "long({n}): {calls}");
}

#[test]
fn every_loop_of_a_tail_has_its_checks() {
    let wasm = prepared(CountedNests::On);
    assert!(recognised("then_long").is_some());
    // The flag held up: every check calls the point. The first outer trip
    // takes the tail, whose second loop then runs n trips with a check
    // each; the second outer trip runs both inner loops as short counted
    // loops, without checks.
    let mut calls = Vec::new();
    for n in [10, 5000] {
        let (got, c) = call(&wasm, "then_long", n, true, Host::Hold);
        assert!(same(got, plain_of(WAT, "then_long", n)), "then_long({n})");
        calls.push(c);
    }
    assert!(calls[1] >= calls[0] + 4000, "{calls:?}");
}

#[test]
fn nest_results_are_unchanged_wherever_requests_land() {
    let wasm = prepared(CountedNests::On);
    let limit = recognised("short").unwrap() as i32;
    let runs = [
        ("short", vec![1, 5, 40, limit, limit + 1, 3 * limit]),
        ("long", vec![2, 6, 40, 2 * limit, 400]),
        ("then_long", vec![1, 10, 5000]),
    ];
    assert_results_unchanged(&wasm, WAT, &runs, &[1, 3, 40, 997]);
}
