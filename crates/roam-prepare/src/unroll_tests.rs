//! Unrolled checks, run: a function large enough for its inner loop to
//! move (`outline.rs`) is instrumented with and without them, executed on
//! wasmtime, and compared with the uninstrumented module.

use wasmparser::Operator;

use crate::hoist::tests::{call, call_interrupted, named_body, plain_of, prepare_wat, same, Host};
use crate::unroll::COPIES;
use crate::{LoopPoints, UnrollChecks};

pub(crate) const WAT: &str = r#"(module
  (memory (export "memory") 1)
  ;; `$id` has a loop, so it gets a point and a call of it may unwind.
  (func $id (param i32) (result i32) (loop $spin) (local.get 0))
  ;; A function with more than sixteen locals, so that its call-free inner
  ;; loop moves into a function of its own once its point is hoisted; the
  ;; outer loop calls `$id` and gets a hoisted point of its own
  ;; (`--hoist-calls`), or an inline one with that option off. The inner loop
  ;; stores, so it cannot run again from the outer loop's point.
  (func (export "big") (param $n i32) (result i64)
    (local $i i32) (local $j i32) (local $s i64) (local $acc i64)
    (local $a0 i64) (local $a1 i64) (local $a2 i64) (local $a3 i64) (local $a4 i64) (local $a5 i64) (local $a6 i64) (local $a7 i64) (local $a8 i64) (local $a9 i64) (local $a10 i64) (local $a11 i64)
    (local.set $a0 (i64.const 3))
    (local.set $a1 (i64.const 10))
    (local.set $a2 (i64.const 17))
    (local.set $a3 (i64.const 24))
    (local.set $a4 (i64.const 31))
    (local.set $a5 (i64.const 38))
    (local.set $a6 (i64.const 45))
    (local.set $a7 (i64.const 52))
    (local.set $a8 (i64.const 59))
    (local.set $a9 (i64.const 66))
    (local.set $a10 (i64.const 73))
    (local.set $a11 (i64.const 80))
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i64.extend_i32_u (call $id (local.get $i))))
        (local.set $j (i32.const 0))
        (loop $inner
          (i32.store (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2))
            (i32.add (i32.load (i32.shl (i32.and (local.get $j) (i32.const 15)) (i32.const 2)))
              (local.get $j)))
          (local.set $s (i64.add (local.get $s) (i64.extend_i32_u (local.get $j))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.le_u (local.get $j) (local.get $i))))
        (local.set $acc (i64.add (i64.mul (local.get $acc) (i64.const 31)) (local.get $s)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (i64.add (local.get $acc) (local.get $a0)) (local.get $a1)) (local.get $a2)) (local.get $a3)) (local.get $a4)) (local.get $a5)) (local.get $a6)) (local.get $a7)) (local.get $a8)) (local.get $a9)) (local.get $a10)) (local.get $a11)) (i64.extend_i32_u (i32.load (i32.const 28)))))
  (func (export "_start")))"#;

/// The inner loop's new function (`outline.rs` numbers them from 0).
const MOVED: &str = "roam_loop_0";

fn prepared(unroll: UnrollChecks) -> Vec<u8> {
    prepare_wat(WAT, LoopPoints::Rerun, unroll)
}

fn count(ops: &[Operator], what: fn(&Operator) -> bool) -> usize {
    ops.iter().filter(|op| what(op)).count()
}

#[test]
fn a_short_moved_inner_loop_runs_its_body_more_than_once_and_checks_once() {
    let every = prepared(UnrollChecks::Off);
    let other = prepared(UnrollChecks::On);
    let stores = |op: &Operator| matches!(op, Operator::I32Store { .. });
    let flag = |op: &Operator| matches!(op, Operator::GlobalGet { .. });
    let (every, other) = (named_body(&every, MOVED), named_body(&other, MOVED));
    assert_eq!(count(&every, stores), 1);
    assert_eq!(count(&other, stores), 1 + COPIES);
    // The copies read no flag.
    assert_eq!(count(&every, flag), count(&other, flag));
    // A small function's loops stay as they were (they do not move).
    let small = r#"(module
      (memory 1)
      (func (export "f") (param $n i32) (result i32)
        (loop $l
          (local.set $n (i32.sub (local.get $n) (i32.const 1)))
          (br_if $l (local.get $n)))
        (local.get $n))
      (func (export "_start")))"#;
    assert_eq!(
        prepare_wat(small, LoopPoints::Rerun, UnrollChecks::On),
        prepare_wat(small, LoopPoints::Rerun, UnrollChecks::Off)
    );
}

#[test]
fn unrolled_loops_compute_the_same_and_serve_every_request() {
    let n = 30;
    let want = plain_of(WAT, "big", n);
    let every = prepared(UnrollChecks::Off);
    let other = prepared(UnrollChecks::On);
    for (raise, host) in [
        (false, Host::Lower),
        (true, Host::Lower),
        (true, Host::Hold),
    ] {
        let (got, calls) = call(&other, "big", n, raise, host);
        assert!(same(got, want), "gave {got:?}, want {want:?}");
        let (_, before) = call(&every, "big", n, raise, host);
        match (raise, host) {
            (false, _) => assert_eq!(calls, 0, "flag down"),
            (true, Host::Lower) => assert_eq!(calls, 1, "one request"),
            // Held up: the inner loop, run with i + 1 iterations for each
            // i < n, checks at every (COPIES + 1)-th of its i back-edges
            // instead of every one; everything else calls as before.
            (true, Host::Hold) => {
                let per = COPIES as u32 + 1;
                let fewer: u32 = (0..n as u32).map(|i| i - i / per).sum();
                assert_eq!(calls, before - fewer, "held up");
            }
        }
    }
    // Requests that land anywhere, also between the copies.
    for k in [1, 2, 3, 5, 8, 13, 40] {
        let (got, calls) = call_interrupted(&other, "big", n, k);
        assert!(
            same(got, want),
            "flag up every {k} checks: {got:?}, want {want:?}"
        );
        assert!(calls > 0, "every {k}: no point taken");
    }
}
