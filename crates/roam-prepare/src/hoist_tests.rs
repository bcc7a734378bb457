//! Hoisted loop points, run: the instrumented module (before Asyncify) is
//! executed on wasmtime with the flag down, up for one call, and held up
//! (what counting modes do), and compared with the uninstrumented module
//! and with inline points.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use wasmparser::{Operator, Parser, Payload};
use wasmtime::{Config, Engine, Instance, Linker, Module, Store, UpdateDeadline, Val};

use crate::instrument::instrument;
use crate::{validate, HoistCalls, LoopPoints, PrepareOptions, UnrollChecks, FLAG_GLOBAL_EXPORT};

/// A `while` loop (exit by `br_if` to an outer block, back-edge by `br`),
/// a `do … while` loop (back-edge by `br_if`) nested in it, a loop that
/// calls, and a loop a `br_table` targets.
pub(crate) const WAT: &str = r#"(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\05\00\00\00\07\00\00\00\0b\00\00\00\0d\00\00\00")
  ;; `$id` has a loop, so it gets a point and a call of it may unwind;
  ;; `$inc` has none and calls nothing, so a call of it cannot.
  (func $id (param i32) (result i32) (loop $spin) (local.get 0))
  (func $inc (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
  ;; sum over i < n of (sum over j < i of j)
  (func (export "nest") (param $n i32) (result i64)
    (local $i i32) (local $j i32) (local $acc i64)
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $j (i32.const 0))
        (loop $inner
          (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $j))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (local.get $acc))
  ;; sum over i < n of 3^(n-1-i) * (sum over j < i of i*j + mem[4j]): the
  ;; inner loop and the stores to $s and $j before it can run again from
  ;; the top of the outer body, so the outer loop's point serves both.
  (func (export "rerun") (param $n i32) (result i64)
    (local $i i32) (local $j i32) (local $s i64) (local $acc i64)
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i64.const 0))
        (local.set $j (i32.const 0))
        (loop $inner
          (local.set $s (i64.add (local.get $s)
            (i64.extend_i32_u (i32.add (i32.mul (local.get $j) (local.get $i))
              (i32.load (i32.shl (local.get $j) (i32.const 2)))))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
        (local.set $acc (i64.mul (i64.add (local.get $acc) (local.get $s)) (i64.const 3)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (local.get $acc))
  ;; The same, but the inner loop also stores: running it again is not the
  ;; same as finishing it.
  (func (export "stores") (param $n i32) (result i64)
    (local $i i32) (local $j i32) (local $s i64) (local $acc i64)
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i64.const 0))
        (local.set $j (i32.const 0))
        (loop $inner
          (i32.store (i32.shl (local.get $j) (i32.const 2))
            (i32.add (i32.load (i32.shl (local.get $j) (i32.const 2))) (i32.const 1)))
          (local.set $s (i64.add (local.get $s)
            (i64.extend_i32_u (i32.load (i32.shl (local.get $j) (i32.const 2))))))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
        (local.set $acc (i64.mul (i64.add (local.get $acc) (local.get $s)) (i64.const 3)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $outer)))
    (local.get $acc))
  (func (export "calls") (param $n i32) (result i32) (local $acc i32)
    (loop $l
      (local.set $acc (i32.add (local.get $acc) (call $id (local.get $n))))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n)))
    (local.get $acc))
  (func (export "quiet") (param $n i32) (result i32) (local $acc i32)
    (loop $l
      (local.set $acc (i32.add (local.get $acc) (call $inc (local.get $n))))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br_if $l (local.get $n)))
    (local.get $acc))
  (func (export "table") (param $n i32) (result i32)
    (block $out
      (loop $l
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br_table $l $out (i32.eqz (local.get $n)))))
    (local.get $n))
  (func (export "_start")))"#;

/// The exports run, with their argument.
const EXPORTS: [(&str, i32); 6] = [
    ("nest", 40),
    ("rerun", 30),
    ("stores", 30),
    ("calls", 25),
    ("quiet", 40),
    ("table", 9),
];

fn prepared(loops: LoopPoints) -> Vec<u8> {
    prepared_with(loops, UnrollChecks::default())
}

fn prepared_with(loops: LoopPoints, unroll_checks: UnrollChecks) -> Vec<u8> {
    prepare_wat(WAT, loops, unroll_checks)
}

/// `wat` instrumented (not yet through Asyncify) with the loop form and
/// unrolled checks given, the other options at their defaults.
pub(crate) fn prepare_wat(wat: &str, loops: LoopPoints, unroll_checks: UnrollChecks) -> Vec<u8> {
    let opts = PrepareOptions {
        loop_points: loops,
        unroll_checks,
        ..PrepareOptions::default()
    };
    prepare_wat_with(wat, &opts)
}

/// `wat` instrumented (not yet through Asyncify) with `opts`.
pub(crate) fn prepare_wat_with(wat: &str, opts: &PrepareOptions) -> Vec<u8> {
    let wasm = wat::parse_str(wat).unwrap();
    let info = validate(&wasm).unwrap();
    let out = instrument(&wasm, &info, opts).unwrap();
    wasmparser::Validator::new()
        .validate_all(&out.bytes)
        .unwrap();
    out.bytes
}

/// `f` of export `name`'s function in `wat` and of its loops, in the
/// order they open (outermost first): for the recognisers' tests.
pub(crate) fn with_loops<T>(
    wat: &str,
    name: &str,
    f: impl FnOnce(&walrus::LocalFunction, &[walrus::ir::InstrSeqId]) -> T,
) -> T {
    let module = walrus::ModuleConfig::new()
        .parse(&wat::parse_str(wat).unwrap())
        .unwrap();
    let export = module.exports.iter().find(|e| e.name == name).unwrap();
    let walrus::ExportItem::Function(id) = export.item else {
        panic!("`{name}` is not a function");
    };
    let walrus::FunctionKind::Local(func) = &module.funcs.get(id).kind else {
        panic!("`{name}` is imported");
    };
    let mut loops = Vec::new();
    crate::outline::walk(func, func.entry_block(), &mut |i| {
        if let walrus::ir::Instr::Loop(l) = i {
            loops.push(l.seq);
        }
    });
    f(func, &loops)
}

/// What the point import does when called.
#[derive(Clone, Copy)]
pub(crate) enum Host {
    /// Lower the flag: a request served.
    Lower,
    /// Leave it up: every point calls in (counting modes).
    Hold,
}

/// Instantiate `wasm` on `engine` with a point import that counts its
/// calls and, if `host` says so, lowers the flag.
pub(crate) fn instantiate(
    engine: &Engine,
    wasm: &[u8],
    host: Host,
) -> (Store<()>, Instance, Arc<AtomicU32>) {
    let module = Module::new(engine, wasm).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let mut linker: Linker<()> = Linker::new(engine);
    let counter = calls.clone();
    linker
        .func_wrap(
            "roam",
            "migration_point",
            move |mut caller: wasmtime::Caller<'_, ()>| {
                counter.fetch_add(1, Ordering::Relaxed);
                if let Host::Lower = host {
                    let flag = caller.get_export(FLAG_GLOBAL_EXPORT).unwrap();
                    let flag = flag.into_global().unwrap();
                    flag.set(&mut caller, Val::I32(0)).unwrap();
                }
            },
        )
        .unwrap();
    let mut store = Store::new(engine, ());
    let instance = linker.instantiate(&mut store, &module).unwrap();
    (store, instance, calls)
}

/// Run export `name` with `arg`: the result and the point's calls.
fn run(
    mut store: Store<()>,
    instance: Instance,
    calls: &AtomicU32,
    name: &str,
    arg: i32,
) -> (Val, u32) {
    let f = instance.get_func(&mut store, name).unwrap();
    let mut out = [Val::I32(0)];
    f.call(&mut store, &[Val::I32(arg)], &mut out).unwrap();
    (out[0], calls.load(Ordering::Relaxed))
}

/// Call export `name` with `arg`, the flag raised first if `raise`; the
/// result and how many times the point was called.
pub(crate) fn call(wasm: &[u8], name: &str, arg: i32, raise: bool, host: Host) -> (Val, u32) {
    let engine = Engine::default();
    let (mut store, instance, calls) = instantiate(&engine, wasm, host);
    if raise {
        let flag = instance.get_global(&mut store, FLAG_GLOBAL_EXPORT).unwrap();
        flag.set(&mut store, Val::I32(1)).unwrap();
    }
    run(store, instance, &calls, name, arg)
}

pub(crate) fn same(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::I32(x), Val::I32(y)) => x == y,
        (Val::I64(x), Val::I64(y)) => x == y,
        _ => false,
    }
}

#[test]
fn hoisted_points_compute_the_same_and_are_called_as_often_as_inline_ones() {
    let inline = prepared(LoopPoints::Inline);
    // The forms that keep the point's call out of the loop, checking the
    // flag at every back-edge (`unroll_tests` has the other case).
    for form in [
        LoopPoints::Hoisted,
        LoopPoints::Versioned,
        LoopPoints::Rerun,
    ] {
        let hoisted = prepared_with(form, UnrollChecks::Off);
        for (name, arg) in EXPORTS {
            let want = [plain(name, arg)];
            for (raise, host) in [
                (false, Host::Lower),
                (true, Host::Lower),
                (true, Host::Hold),
            ] {
                let (h, h_calls) = call(&hoisted, name, arg, raise, host);
                let (i, i_calls) = call(&inline, name, arg, raise, host);
                assert!(
                    same(h, want[0]),
                    "{name}: {form:?} gave {h:?}, want {:?}",
                    want[0]
                );
                assert!(
                    same(i, want[0]),
                    "{name}: inline gave {i:?}, want {:?}",
                    want[0]
                );
                match (raise, host) {
                    (false, _) => assert_eq!(h_calls, 0, "{name}: flag down"),
                    (true, Host::Lower) => assert_eq!(h_calls, 1, "{name}: one request"),
                    // Held up: one call per iteration of every loop, as inline.
                    (true, Host::Hold) => assert_eq!(h_calls, i_calls, "{name}: held up"),
                }
            }
        }
    }
    // nest(40): 40 + 1 outer iterations, and 1 + 0 + 1 + ... + 39 inner
    // ones (a do-while runs at least once).
    for form in [
        LoopPoints::Hoisted,
        LoopPoints::Versioned,
        LoopPoints::Rerun,
    ] {
        let wasm = prepared_with(form, UnrollChecks::Off);
        let (_, held) = call(&wasm, "nest", 40, true, Host::Hold);
        assert_eq!(held, 41 + 1 + (1..40).sum::<u32>(), "{form:?}");
    }
}

/// Operators of the body of exported function `name`.
pub(crate) fn body<'a>(wasm: &'a [u8], name: &str) -> Vec<Operator<'a>> {
    let index = Parser::new(0)
        .parse_all(wasm)
        .find_map(|payload| match payload.unwrap() {
            Payload::ExportSection(r) => r
                .into_iter()
                .map(|e| e.unwrap())
                .find(|e| e.name == name)
                .map(|e| e.index),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no export {name}"));
    body_at(wasm, index)
}

/// Operators of the body of the function named `name` (name section).
pub(crate) fn named_body<'a>(wasm: &'a [u8], name: &str) -> Vec<Operator<'a>> {
    let index = crate::names::function_names(wasm)
        .into_iter()
        .find(|(_, n)| n == name)
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("no function {name}"));
    body_at(wasm, index)
}

/// Operators of the body of function `index` (a module whose imports are
/// all functions).
fn body_at(wasm: &[u8], index: u32) -> Vec<Operator<'_>> {
    let mut imports = 0;
    let mut n = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.unwrap() {
            Payload::ImportSection(r) => imports = r.count(),
            Payload::CodeSectionEntry(b) => {
                if imports + n == index {
                    let mut ops = b.get_operators_reader().unwrap();
                    let mut out = Vec::new();
                    while !ops.eof() {
                        out.push(ops.read().unwrap());
                    }
                    return out;
                }
                n += 1;
            }
            _ => {}
        }
    }
    panic!("no function {index}");
}

fn is_add(op: &Operator) -> bool {
    matches!(op, Operator::I64Add)
}

fn is_mul(op: &Operator) -> bool {
    matches!(op, Operator::I64Mul)
}

/// Whether some `loop` whose body holds no call contains an operator
/// `work` accepts: the work runs in a loop Asyncify can guard as one
/// stretch.
fn work_in_a_call_free_loop(ops: &[Operator], work: fn(&Operator) -> bool) -> bool {
    // Each open structure: (is a loop, saw a call inside).
    let mut open: Vec<(bool, bool)> = Vec::new();
    let mut found = false;
    for op in ops {
        match op {
            Operator::Loop { .. } => open.push((true, false)),
            Operator::Block { .. } | Operator::If { .. } => open.push((false, false)),
            Operator::End => {
                if let Some((_, called)) = open.pop() {
                    if called {
                        if let Some(up) = open.last_mut() {
                            up.1 = true;
                        }
                    }
                }
            }
            Operator::Call { .. } | Operator::CallIndirect { .. } => {
                for o in open.iter_mut() {
                    o.1 = true;
                }
            }
            op if work(op) => {
                // The innermost loop around it: has it called so far? The
                // call, if any, precedes the work (the point is first).
                if let Some(&(_, called)) = open.iter().rev().find(|o| o.0) {
                    found |= !called;
                }
            }
            _ => {}
        }
    }
    found
}

/// `WAT` instrumented with loop form `loops` and hoisted calling loops
/// `hoist_calls`.
fn prepared_calls(loops: LoopPoints, hoist_calls: HoistCalls) -> Vec<u8> {
    let opts = PrepareOptions {
        loop_points: loops,
        hoist_calls,
        ..PrepareOptions::default()
    };
    prepare_wat_with(WAT, &opts)
}

/// For each loop of `ops`, in the order they close, how many calls it
/// holds (those of the loops inside it included).
fn calls_per_loop(ops: &[Operator]) -> Vec<usize> {
    // Each open structure: (is a loop, calls inside so far).
    let mut open: Vec<(bool, usize)> = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Operator::Loop { .. } => open.push((true, 0)),
            Operator::Block { .. } | Operator::If { .. } => open.push((false, 0)),
            Operator::End => {
                if let Some((is_loop, calls)) = open.pop() {
                    if is_loop {
                        out.push(calls);
                    }
                }
            }
            Operator::Call { .. } | Operator::CallIndirect { .. } => {
                for o in open.iter_mut() {
                    o.1 += 1;
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn a_call_free_loop_is_left_without_a_call_and_others_keep_theirs_inline() {
    let hoisted = prepared_calls(LoopPoints::Hoisted, HoistCalls::Off);
    let inline = prepared(LoopPoints::Inline);
    let versioned = prepared(LoopPoints::Versioned);
    assert!(work_in_a_call_free_loop(&body(&versioned, "nest"), is_add));
    assert!(work_in_a_call_free_loop(&body(&hoisted, "nest"), is_add));
    assert!(!work_in_a_call_free_loop(&body(&inline, "nest"), is_add));
    // Without hoisted calling loops, a loop that makes a call that may
    // unwind, or that a `br_table` targets, is not rewritten; one whose
    // only call cannot unwind is.
    for name in ["calls", "table"] {
        assert_eq!(body(&hoisted, name), body(&inline, name), "{name}");
    }
    assert_ne!(body(&hoisted, "quiet"), body(&inline, "quiet"));
}

#[test]
fn a_loop_that_calls_gets_its_point_outside_it_with_hoisted_calling_loops() {
    let inline = prepared(LoopPoints::Inline);
    // Inline: the one loop of `calls` holds both the call of `$id` and
    // the point's.
    assert_eq!(calls_per_loop(&body(&inline, "calls")), [2]);
    for form in [LoopPoints::Hoisted, LoopPoints::Rerun] {
        let hoisted = prepared_calls(form, HoistCalls::On);
        // The loop holds only its own call; the point's is in the loop
        // wrapped round it.
        assert_eq!(calls_per_loop(&body(&hoisted, "calls")), [1, 2], "{form:?}");
        // A loop a `br_table` targets still keeps its point inline.
        assert_eq!(body(&hoisted, "table"), body(&inline, "table"), "{form:?}");
    }
    // The option is the default, and acts only with the hoisted forms.
    assert_eq!(
        prepared(LoopPoints::Rerun),
        prepared_calls(LoopPoints::Rerun, HoistCalls::On)
    );
    let versioned = prepared_calls(LoopPoints::Versioned, HoistCalls::On);
    assert_eq!(body(&versioned, "calls"), body(&inline, "calls"));
}

/// The uninstrumented module's result for export `name`.
fn plain(name: &str, arg: i32) -> Val {
    plain_of(WAT, name, arg)
}

/// The result of export `name` of module `wat`, uninstrumented.
pub(crate) fn plain_of(wat: &str, name: &str, arg: i32) -> Val {
    let engine = Engine::default();
    let m = Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
    let mut store = Store::new(&engine, ());
    let i = Instance::new(&mut store, &m, &[]).unwrap();
    let mut want = [Val::I32(0)];
    i.get_func(&mut store, name)
        .unwrap()
        .call(&mut store, &[Val::I32(arg)], &mut want)
        .unwrap();
    want[0]
}

/// Each export of `runs`, with each of its arguments, gives the result of
/// `wat` uninstrumented when run from `wasm` (prepared from `wat`) with the
/// flag down, raised once, held up, and raised at every `every`-th loop
/// head or function entry for each of `everys`.
pub(crate) fn assert_results_unchanged(
    wasm: &[u8],
    wat: &str,
    runs: &[(&str, Vec<i32>)],
    everys: &[u32],
) {
    for (name, args) in runs {
        for &arg in args {
            let want = plain_of(wat, name, arg);
            for (raise, host) in [
                (false, Host::Lower),
                (true, Host::Lower),
                (true, Host::Hold),
            ] {
                let (got, _) = call(wasm, name, arg, raise, host);
                assert!(same(got, want), "{name}({arg}) raise {raise}");
            }
            for &every in everys {
                let (got, _) = call_interrupted(wasm, name, arg, every);
                assert!(same(got, want), "{name}({arg}) every {every}");
            }
        }
    }
}

/// Call export `name` with the flag raised at every `every`-th loop header
/// or function entry (wasmtime's epoch checks), and lowered by each call of
/// the point: requests that land anywhere, also halfway through an
/// iteration that must then run again. Returns the result and the calls.
pub(crate) fn call_interrupted(wasm: &[u8], name: &str, arg: i32, every: u32) -> (Val, u32) {
    let mut config = Config::new();
    config.epoch_interruption(true);
    let engine = Engine::new(&config).unwrap();
    let (mut store, instance, calls) = instantiate(&engine, wasm, Host::Lower);
    let flag = instance.get_global(&mut store, FLAG_GLOBAL_EXPORT).unwrap();
    let mut ticks = 0u32;
    store.set_epoch_deadline(0);
    store.epoch_deadline_callback(move |mut ctx| {
        ticks += 1;
        if ticks.is_multiple_of(every) {
            flag.set(&mut ctx, Val::I32(1))?;
        }
        // Due again at the next check.
        Ok(UpdateDeadline::Continue(0))
    });
    run(store, instance, &calls, name, arg)
}

#[test]
fn requests_that_land_anywhere_leave_every_result_unchanged() {
    for (form, hoist_calls) in [
        (LoopPoints::Inline, HoistCalls::On),
        (LoopPoints::Hoisted, HoistCalls::On),
        (LoopPoints::Hoisted, HoistCalls::Off),
        (LoopPoints::Versioned, HoistCalls::On),
        (LoopPoints::Rerun, HoistCalls::On),
        (LoopPoints::Rerun, HoistCalls::Off),
    ] {
        let wasm = prepared_calls(form, hoist_calls);
        for (name, arg) in EXPORTS {
            let want = plain(name, arg);
            for every in [1, 2, 3, 5, 8, 13, 40] {
                let (got, calls) = call_interrupted(&wasm, name, arg, every);
                assert!(
                    same(got, want),
                    "{name}: {form:?} {hoist_calls:?}, flag up every {every} checks: {got:?}, want {want:?}"
                );
                // `table`'s loop is short; the others run long enough.
                if name != "table" {
                    assert!(
                        calls > 0,
                        "{name}: {form:?} {hoist_calls:?}, every {every}: no point taken"
                    );
                }
            }
        }
    }
}

#[test]
fn rerun_serves_a_nest_that_can_run_again_from_the_outer_loop_alone() {
    let rerun = prepared(LoopPoints::Rerun);
    let hoisted = prepared(LoopPoints::Hoisted);
    // The outer body's work (`i64.mul`) runs in a loop without a call only
    // when the inner loop leaves to the outer loop's point.
    assert!(work_in_a_call_free_loop(&body(&rerun, "rerun"), is_mul));
    assert!(!work_in_a_call_free_loop(&body(&hoisted, "rerun"), is_mul));
    // Not where running again would differ: the inner loop stores, or
    // reads a local (`$acc`) before setting it.
    assert_eq!(body(&rerun, "stores"), body(&hoisted, "stores"));
    assert_eq!(body(&rerun, "nest"), body(&hoisted, "nest"));
}
