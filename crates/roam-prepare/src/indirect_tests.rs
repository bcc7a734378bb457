//! Quiet indirect calls: which are routed through a helper, that Asyncify
//! then leaves their callers alone, and that results do not change.

use wasmparser::Operator;
use wasmtime::Val;

use crate::hoist::tests::{named_body as body, same};
use crate::instrument::instrument;
use crate::names::function_names;
use crate::pipeline::tests::prepare_or_skip;
use crate::pure::tests::run;
use crate::{validate, Capture, PrepareOptions, QuietIndirect};

/// A table with two leaf combiners of one type, and a function of another
/// type that has a loop (so it gets a point and may unwind). `$fold` calls
/// through the first type in a loop, `$walk` through the second; `$once`
/// and `$once_loud` call through each once.
pub(crate) const WAT: &str = r#"(module
  (type $bin (func (param i64 i64) (result i64)))
  (type $un (func (param i64) (result i64)))
  (memory (export "memory") 1)
  (table 3 3 funcref)
  (elem (i32.const 0) $add $xor $spin)
  (func $add (type $bin) (i64.add (local.get 0) (local.get 1)))
  (func $xor (type $bin) (i64.mul (i64.xor (local.get 0) (local.get 1)) (i64.const 3)))
  (func $spin (type $un) (local $i i64)
    (loop $l
      (br_if $l (i64.lt_u (local.tee $i (i64.add (local.get $i) (i64.const 1))) (local.get 0))))
    (local.get $i))
  (func $fold (export "fold") (param $n i32) (result i64) (local $acc i64) (local $i i32)
    (loop $l
      (local.set $acc (call_indirect (type $bin) (local.get $acc) (i64.extend_i32_u (local.get $i))
        (i32.and (local.get $i) (i32.const 1))))
      (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (local.get $n))))
    (local.get $acc))
  (func $walk (export "walk") (param $n i32) (result i64) (local $acc i64) (local $i i32)
    (loop $l
      (local.set $acc (i64.add (local.get $acc)
        (call_indirect (type $un) (i64.extend_i32_u (local.get $i)) (i32.const 2))))
      (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (local.get $n))))
    (local.get $acc))
  ;; One call each, no loop: no point of their own.
  (func $once (export "once") (param i64) (result i64)
    (call_indirect (type $bin) (local.get 0) (i64.const 5) (i32.const 1)))
  (func $once_loud (export "once_loud") (param i64) (result i64)
    (call_indirect (type $un) (local.get 0) (i32.const 2)))
  (func (export "_start")))"#;

fn opts(on: QuietIndirect) -> PrepareOptions {
    PrepareOptions {
        quiet_indirect: on,
        // What Asyncify makes of quiet calls is the subject here.
        capture: Capture::Asyncify,
        ..PrepareOptions::default()
    }
}

fn instrumented(on: QuietIndirect) -> Vec<u8> {
    let wasm = wat::parse_str(WAT).unwrap();
    let out = instrument(&wasm, &validate(&wasm).unwrap(), &opts(on)).unwrap();
    wasmparser::Validator::new()
        .validate_all(&out.bytes)
        .unwrap();
    out.bytes
}

fn indirect(ops: &[Operator]) -> usize {
    ops.iter()
        .filter(|o| matches!(o, Operator::CallIndirect { .. }))
        .count()
}

fn stores(ops: &[Operator]) -> bool {
    ops.iter().any(|o| {
        matches!(
            o,
            Operator::I32Store { .. } | Operator::I64Store { .. } | Operator::F64Store { .. }
        )
    })
}

#[test]
fn only_calls_that_can_reach_nothing_but_quiet_functions_go_through_a_helper() {
    let on = instrumented(QuietIndirect::On);
    assert_eq!(indirect(&body(&on, "fold")), 0, "$add and $xor are quiet");
    assert_eq!(indirect(&body(&on, "walk")), 1, "$spin has a loop");
    assert_eq!(indirect(&body(&on, "roam_quiet_indirect_0")), 1);
    let off = instrumented(QuietIndirect::Off);
    assert_eq!(indirect(&body(&off, "fold")), 1);
    assert!(!function_names(&off)
        .values()
        .any(|n| n.starts_with("roam_quiet_indirect")));
}

#[test]
fn results_are_unchanged_with_requests_anywhere() {
    let plain = wat::parse_str(WAT).unwrap();
    let on = instrumented(QuietIndirect::On);
    for (name, arg) in [("fold", 300), ("walk", 40)] {
        // (`once` and `once_loud` take an i64; these two take an i32.)
        let (want, _) = run(&plain, name, arg, None, false);
        assert!(matches!(want, Val::I64(_)));
        for every in [None, Some(1), Some(3), Some(17)] {
            let (got, _) = run(&on, name, arg, every, false);
            assert!(
                same(got, want),
                "{name}, every {every:?}: {got:?}, want {want:?}"
            );
        }
    }
}

#[test]
fn asyncify_leaves_a_function_whose_only_indirect_call_is_quiet_alone() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(on) = prepare_or_skip(&wasm, &opts(QuietIndirect::On)) else {
        return;
    };
    let off = prepare_or_skip(&wasm, &opts(QuietIndirect::Off)).unwrap();
    // `$once` stores nothing itself; Asyncify saves its locals by storing.
    assert!(
        !stores(&body(&on.bytes, "once")),
        "instrumented with the option"
    );
    assert!(
        stores(&body(&off.bytes, "once")),
        "not instrumented without it"
    );
    // `$once_loud` may really unwind, through `$spin`'s point.
    assert!(stores(&body(&on.bytes, "once_loud")));
}

/// Two functions of a helper's shape (one with no operands but the index)
/// and three that are not: operands out of order, one more instruction,
/// and a result type other than the call's.
pub(crate) const SHAPES: &str = r#"(module
  (type $bin (func (param i64 i64) (result i64)))
  (type $none (func (result i64)))
  (table 3 3 funcref)
  (elem (i32.const 0) $add $sub $seven)
  (func $add (type $bin) (i64.add (local.get 0) (local.get 1)))
  (func $sub (type $bin) (i64.sub (local.get 0) (local.get 1)))
  (func $seven (type $none) (i64.const 7))
  (func $tramp (param i64 i64 i32) (result i64)
    (call_indirect (type $bin) (local.get 0) (local.get 1) (local.get 2)))
  (func $tramp_none (param i32) (result i64)
    (call_indirect (type $none) (local.get 0)))
  (func $swapped (param i64 i64 i32) (result i64)
    (call_indirect (type $bin) (local.get 1) (local.get 0) (local.get 2)))
  (func $longer (param i64 i64 i32) (result i64)
    (i64.add (call_indirect (type $bin) (local.get 0) (local.get 1) (local.get 2)) (i64.const 1)))
  (func $dropped (param i64 i64 i32)
    (drop (call_indirect (type $bin) (local.get 0) (local.get 1) (local.get 2))))
  (func $user (export "user") (param $a i64) (result i64)
    (call $dropped (local.get $a) (i64.const 2) (i32.const 0))
    (i64.add
      (i64.add (call $tramp (local.get $a) (i64.const 100) (i32.const 1))
               (call $tramp_none (i32.const 2)))
      (i64.add (call $swapped (local.get $a) (i64.const 10) (i32.const 1))
               (call $longer (local.get $a) (i64.const 1000) (i32.const 0))))))"#;

fn call_user(wasm: &[u8], a: i64) -> i64 {
    let engine = wasmtime::Engine::default();
    let module = wasmtime::Module::new(&engine, wasm).unwrap();
    let mut store = wasmtime::Store::new(&engine, ());
    let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
    let user = instance
        .get_typed_func::<i64, i64>(&mut store, "user")
        .unwrap();
    user.call(&mut store, a).unwrap()
}

#[test]
fn calls_of_a_helper_shape_become_the_indirect_call_and_nothing_else_does() {
    let wasm = wat::parse_str(SHAPES).unwrap();
    let mut module = walrus::Module::from_buffer(&wasm).unwrap();
    assert_eq!(crate::indirect::inline_helpers(&mut module), 2);
    let out = module.emit_wasm();
    let user = body(&out, "user");
    assert_eq!(indirect(&user), 2, "$tramp and $tramp_none inlined");
    let calls = user
        .iter()
        .filter(|o| matches!(o, Operator::Call { .. }))
        .count();
    assert_eq!(calls, 3, "$swapped, $longer and $dropped stay calls");
    for a in [0, 5, -3, i64::MAX] {
        assert_eq!(call_user(&out, a), call_user(&wasm, a), "user({a})");
    }
}

#[test]
fn the_prepared_caller_makes_the_indirect_call_itself() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(on) = prepare_or_skip(&wasm, &opts(QuietIndirect::On)) else {
        return;
    };
    let fold = body(&on.bytes, "fold");
    assert_eq!(indirect(&fold), 1, "the helper's call_indirect is back");
    let helpers: Vec<u32> = function_names(&on.bytes)
        .into_iter()
        .filter(|(_, n)| n.starts_with("roam_quiet_indirect"))
        .map(|(i, _)| i)
        .collect();
    assert!(
        !fold.iter().any(
            |o| matches!(o, Operator::Call { function_index } if helpers.contains(function_index))
        ),
        "fold still calls a helper"
    );
}
