//! Pure recursion that gives up: which functions qualify, and that results
//! stay exact when requests land anywhere, including deep in a recursion.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use wasmtime::{Config, Engine, Linker, Module, Store, UpdateDeadline, Val};

use crate::hoist::tests::{named_body, same};
use crate::instrument::instrument;
use crate::names::function_names;
use crate::pipeline::tests::prepare_or_skip;
use crate::{validate, PrepareOptions, RerunCalls, ABORT_GLOBAL_EXPORT, FLAG_GLOBAL_EXPORT};

/// Two pure recursions (Ackermann with its tail call as a loop, and a
/// tree fold through a table of combiners), and functions that reach a
/// point but do not qualify, each for one reason.
pub(crate) const WAT: &str = r#"(module
  (type $bin (func (param i64 i64 i64) (result i64)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (table 2 2 funcref)
  (elem (i32.const 0) $add_rot $xor_mul)
  ;; which combiner each parity of a node id uses
  (data (i32.const 0) "\01\00\00\00\00\00\00\00")
  (func $add_rot (type $bin)
    (i64.add (local.get 0) (i64.rotl (local.get 1) (local.get 2))))
  (func $xor_mul (type $bin)
    (i64.mul (i64.xor (local.get 0) (local.get 1)) (i64.or (local.get 2) (i64.const 1))))
  (func $ack (param $m i64) (param $n i64) (result i64)
    (block $done
      (loop $l
        (br_if $done (i64.eqz (local.get $m)))
        (if (i64.eqz (local.get $n))
          (then (local.set $n (i64.const 1)))
          (else (local.set $n (call $ack (local.get $m) (i64.sub (local.get $n) (i64.const 1))))))
        (local.set $m (i64.sub (local.get $m) (i64.const 1)))
        (br $l)))
    (i64.add (local.get $n) (i64.const 1)))
  (func $fold (param $id i64) (param $depth i32) (result i64)
    (if (result i64) (i32.eqz (local.get $depth))
      (then (i64.mul (local.get $id) (i64.const 0x9e3779b97f4a7c15)))
      (else (call_indirect (type $bin)
        (call $fold (i64.shl (local.get $id) (i64.const 1)) (i32.sub (local.get $depth) (i32.const 1)))
        (call $fold (i64.add (i64.shl (local.get $id) (i64.const 1)) (i64.const 1))
                    (i32.sub (local.get $depth) (i32.const 1)))
        (local.get $id)
        (i32.load (i32.shl (i32.wrap_i64 (i64.and (local.get $id) (i64.const 1))) (i32.const 2)))))))
  ;; Pure and never 0, so a caller that went on with the 0 of a call that
  ;; gave up would divide by zero.
  (func $ratio (param $n i32) (result i32)
    (if (result i32) (i32.eqz (local.get $n))
      (then (i32.const 1))
      (else (i32.add (i32.const 1)
        (i32.div_u (i32.const 1000000) (call $ratio (i32.sub (local.get $n) (i32.const 1))))))))
  ;; Not pure: a store, a global, an import.
  (func $stores (param $n i32) (result i32)
    (i32.store (i32.const 64) (local.get $n))
    (if (result i32) (local.get $n)
      (then (i32.add (call $stores (i32.sub (local.get $n) (i32.const 1))) (i32.const 1)))
      (else (i32.const 0))))
  (func $sets_global (param $n i32) (result i32)
    (global.set $g (local.get $n))
    (if (result i32) (local.get $n)
      (then (call $sets_global (i32.sub (local.get $n) (i32.const 1))))
      (else (global.get $g))))
  (func $writes (param $n i32) (result i32)
    (if (result i32) (local.get $n)
      (then (call $writes (i32.sub (local.get $n) (i32.const 1))))
      (else (call $write (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 0)))))
  ;; Pure, but the host can call it, so no wrapper could stand in front;
  ;; and a pure function calling it.
  (func $exported (export "exported") (param $n i32) (result i32)
    (if (result i32) (local.get $n)
      (then (i32.add (call $exported (i32.sub (local.get $n) (i32.const 1))) (i32.const 2)))
      (else (i32.const 0))))
  (func $calls_exported (param $n i32) (result i32)
    (if (result i32) (local.get $n)
      (then (call $calls_exported (i32.sub (local.get $n) (call $exported (i32.const 1)))))
      (else (i32.const 7))))
  ;; Pure, with a loop, but the host runs it when it instantiates.
  (func $spin (local $i i32)
    (loop $l (br_if $l (i32.lt_u (local.tee $i (i32.add (local.get $i) (i32.const 1))) (i32.const 3)))))
  (start $spin)
  (func (export "ack") (param $n i32) (result i64)
    (i64.add (call $ack (i64.const 2) (i64.extend_i32_u (local.get $n)))
             (call $ack (i64.const 3) (i64.const 3))))
  (func (export "ratio") (param $n i32) (result i32) (call $ratio (local.get $n)))
  (func (export "fold") (param $depth i32) (result i64)
    (call $fold (i64.const 1) (local.get $depth)))
  (func (export "stores") (param $n i32) (result i32) (call $stores (local.get $n)))
  (func (export "sets_global") (param $n i32) (result i32) (call $sets_global (local.get $n)))
  (func (export "calls_exported") (param $n i32) (result i32) (call $calls_exported (local.get $n)))
  (func (export "_start")))"#;

/// The exports run by the behaviour tests, with their argument.
const EXPORTS: [(&str, i32); 5] = [
    ("ack", 60),
    ("fold", 10),
    ("ratio", 200),
    ("stores", 50),
    ("calls_exported", 40),
];

fn opts(rerun: RerunCalls) -> PrepareOptions {
    PrepareOptions {
        rerun_calls: rerun,
        ..PrepareOptions::default()
    }
}

/// The module instrumented (before Asyncify).
fn instrumented(rerun: RerunCalls) -> Vec<u8> {
    let wasm = wat::parse_str(WAT).unwrap();
    let out = instrument(&wasm, &validate(&wasm).unwrap(), &opts(rerun)).unwrap();
    wasmparser::Validator::new()
        .validate_all(&out.bytes)
        .unwrap();
    out.bytes
}

/// Names of the functions that got a slow copy, i.e. have a fast form.
fn fast(wasm: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = function_names(wasm)
        .into_values()
        .filter_map(|n| n.strip_suffix(".roam_slow").map(str::to_string))
        .collect();
    out.sort();
    out
}

#[test]
fn only_pure_functions_no_one_else_can_enter_get_a_fast_form() {
    assert_eq!(
        fast(&instrumented(RerunCalls::On)),
        ["ack", "fold", "ratio"]
    );
    assert!(fast(&instrumented(RerunCalls::Off)).is_empty());
}

/// Point calls, and point calls that found `roam.abort` set (must be none).
#[derive(Default)]
pub(crate) struct Calls {
    points: AtomicU32,
    abort_set: AtomicU32,
}

/// Run export `name` with `arg` on `wasm`. The flag goes up at every
/// `every`-th loop header or function entry (wasmtime's epoch checks;
/// `None`: never), and each call of the point lowers it unless `hold`.
pub(crate) fn run(
    wasm: &[u8],
    name: &str,
    arg: i32,
    every: Option<u32>,
    hold: bool,
) -> (Val, Arc<Calls>) {
    let mut config = Config::new();
    config.epoch_interruption(every.is_some());
    let engine = Engine::new(&config).unwrap();
    let module = Module::new(&engine, wasm).unwrap();
    let calls = Arc::new(Calls::default());
    let seen = calls.clone();
    let mut linker: Linker<()> = Linker::new(&engine);
    linker
        .func_wrap(
            "roam",
            "migration_point",
            move |mut caller: wasmtime::Caller<'_, ()>| {
                seen.points.fetch_add(1, Ordering::Relaxed);
                let abort = caller.get_export(ABORT_GLOBAL_EXPORT);
                if let Some(Val::I32(1)) = abort.map(|a| a.into_global().unwrap().get(&mut caller))
                {
                    seen.abort_set.fetch_add(1, Ordering::Relaxed);
                }
                if !hold {
                    let flag = caller.get_export(FLAG_GLOBAL_EXPORT).unwrap();
                    let flag = flag.into_global().unwrap();
                    flag.set(&mut caller, Val::I32(0)).unwrap();
                }
            },
        )
        .unwrap();
    linker
        .func_wrap(
            "wasi_snapshot_preview1",
            "fd_write",
            |_: i32, _: i32, _: i32, _: i32| 0i32,
        )
        .unwrap();
    let mut store = Store::new(&engine, ());
    // The start function runs before the callback is installed.
    store.set_epoch_deadline(u64::MAX / 2);
    let instance = linker.instantiate(&mut store, &module).unwrap();
    let flag = instance.get_global(&mut store, FLAG_GLOBAL_EXPORT);
    if let (Some(every), Some(flag)) = (every, flag) {
        let mut ticks = 0u32;
        store.set_epoch_deadline(0);
        store.epoch_deadline_callback(move |mut ctx| {
            ticks += 1;
            if ticks.is_multiple_of(every) {
                flag.set(&mut ctx, Val::I32(1))?;
            }
            Ok(UpdateDeadline::Continue(0))
        });
    } else if let (true, Some(flag)) = (hold, flag) {
        flag.set(&mut store, Val::I32(1)).unwrap();
    }
    let f = instance.get_func(&mut store, name).unwrap();
    let mut out = [Val::I32(0)];
    f.call(&mut store, &[Val::I32(arg)], &mut out).unwrap();
    (out[0], calls)
}

#[test]
fn requests_that_land_anywhere_in_a_recursion_leave_every_result_unchanged() {
    let plain = wat::parse_str(WAT).unwrap();
    let fast = instrumented(RerunCalls::On);
    let slow = instrumented(RerunCalls::Off);
    for (name, arg) in EXPORTS {
        let (want, _) = run(&plain, name, arg, None, false);
        // Flag down: the fast forms never call the point.
        let (got, calls) = run(&fast, name, arg, None, false);
        assert!(same(got, want), "{name}: {got:?}, want {want:?}");
        assert_eq!(calls.points.load(Ordering::Relaxed), 0, "{name}");
        for every in [1, 2, 3, 7, 40] {
            for wasm in [&fast, &slow] {
                let (got, calls) = run(wasm, name, arg, Some(every), false);
                assert!(
                    same(got, want),
                    "{name}, flag up every {every} checks: {got:?}, want {want:?}"
                );
                assert!(calls.points.load(Ordering::Relaxed) > 0, "{name}: {every}");
                assert_eq!(calls.abort_set.load(Ordering::Relaxed), 0, "{name}");
            }
        }
        // Held up, as counting modes do: every fast run gives up at once,
        // and the slow form must still finish.
        let (got, calls) = run(&fast, name, arg, None, true);
        assert!(same(got, want), "{name} held: {got:?}, want {want:?}");
        assert_eq!(calls.abort_set.load(Ordering::Relaxed), 0, "{name}");
    }
}

#[test]
fn a_call_that_runs_out_of_budget_finishes_in_the_slow_form() {
    let plain = wat::parse_str(WAT).unwrap();
    for budget in [1, 2, 7, 100] {
        crate::pure::TEST_BUDGET.with(|b| b.set(Some(budget)));
        let fast = instrumented(RerunCalls::On);
        crate::pure::TEST_BUDGET.with(|b| b.set(None));
        for (name, arg) in EXPORTS {
            let (want, _) = run(&plain, name, arg, None, false);
            // The flag stays down: only the budget makes a call give up.
            let (got, calls) = run(&fast, name, arg, None, false);
            assert!(
                same(got, want),
                "{name}, budget {budget}: {got:?}, want {want:?}"
            );
            assert_eq!(calls.abort_set.load(Ordering::Relaxed), 0, "{name}");
            if ["ack", "fold", "ratio"].contains(&name) {
                assert!(calls.points.load(Ordering::Relaxed) > 0, "{name}: {budget}");
            }
            for every in [1, 5] {
                let (got, _) = run(&fast, name, arg, Some(every), false);
                assert!(same(got, want), "{name}, budget {budget}, every {every}");
            }
        }
    }
}

/// Whether the body of the function named `name` in `wasm` stores to memory.
fn stores(wasm: &[u8], name: &str) -> bool {
    named_body(wasm, name).iter().any(|op| {
        matches!(
            op,
            wasmparser::Operator::I32Store { .. } | wasmparser::Operator::I64Store { .. }
        )
    })
}

#[test]
fn asyncify_leaves_the_fast_forms_alone() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(on) = prepare_or_skip(&wasm, &opts(RerunCalls::On)) else {
        return;
    };
    let off = prepare_or_skip(&wasm, &opts(RerunCalls::Off)).unwrap();
    // The input stores nothing in these; Asyncify saves locals by storing.
    for name in ["ack", "fold"] {
        assert!(!stores(&on.bytes, name), "{name}: fast form instrumented");
        assert!(
            stores(&off.bytes, name),
            "{name}: not instrumented without the option"
        );
        assert!(
            stores(&on.bytes, &format!("{name}.roam_slow")),
            "{name}: slow form"
        );
    }
}
