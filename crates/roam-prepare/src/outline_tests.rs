//! Outlined loops, run: each module is outlined, validated and executed on
//! wasmtime against the original for a range of inputs.

use wasmtime::{Engine, Instance, Module as WasmModule, Store};

use super::{outline_loops, Stage, LOOP_EXPORT_PREFIX, MIN_LOCALS};
use crate::callgraph::CallGraph;
use crate::quiet::Quiet;
use crate::{EntryPoints, PointPolicy};

/// A module with one exported `f: i32 -> i32` whose body is `body`, after
/// `MIN_LOCALS` extra locals that are set from the argument before it and
/// added to the result after it, so the function is large enough to be
/// outlined and every extra local is live across the loops.
fn module(locals: &str, body: &str, extra: usize) -> String {
    let decls: String = (0..extra).map(|k| format!("(local $d{k} i32)")).collect();
    let set: String = (0..extra)
        .map(|k| format!("(local.set $d{k} (i32.add (local.get $n) (i32.const {k})))"))
        .collect();
    let sum: String = (0..extra)
        .map(|k| format!("(local.set $acc (i32.add (local.get $acc) (local.get $d{k})))"))
        .collect();
    format!(
        r#"(module
  (func $id (param i32) (result i32) (local.get 0))
  (func (export "f") (param $n i32) (result i32) {locals} {decls}
    {set}
    {body}
    {sum}
    (local.get $acc)))"#
    )
}

/// Outline `wat`; returns the original and outlined bytes and the count.
/// With `quiet`, calls are judged as `prepare` judges them under the
/// `loops` policy; without, every call may unwind.
fn outline_with(wat: &str, stage: Stage, quiet: bool) -> (Vec<u8>, Vec<u8>, u32) {
    let original = wat::parse_str(wat).unwrap();
    let mut module = walrus::Module::from_buffer(&original).unwrap();
    let quiet = if quiet {
        let graph = CallGraph::new(&module);
        let cycles = graph.on_cycle();
        Quiet::new(
            &module,
            &graph,
            PointPolicy::Loops,
            EntryPoints::Cycles,
            Some(&cycles),
        )
    } else {
        Quiet::default()
    };
    let moved = outline_loops(&mut module, stage, &quiet, true).unwrap();
    let outlined = module.emit_wasm();
    wasmparser::Validator::new()
        .validate_all(&outlined)
        .expect("outlined module validates");
    let exports = wasmparser::Parser::new(0)
        .parse_all(&outlined)
        .filter_map(|p| match p.unwrap() {
            wasmparser::Payload::ExportSection(r) => Some(
                r.into_iter()
                    .filter(|e| e.as_ref().unwrap().name.starts_with(LOOP_EXPORT_PREFIX))
                    .count(),
            ),
            _ => None,
        })
        .sum::<usize>();
    assert_eq!(exports, moved as usize, "one export per outlined loop");
    (original, outlined, moved)
}

fn outline(wat: &str, stage: Stage) -> (Vec<u8>, Vec<u8>, u32) {
    outline_with(wat, stage, false)
}

fn run(engine: &Engine, wasm: &[u8], n: i32) -> i32 {
    let module = WasmModule::new(engine, wasm).unwrap();
    let mut store = Store::new(engine, ());
    let instance = Instance::new(&mut store, &module, &[]).unwrap();
    let f = instance
        .get_typed_func::<i32, i32>(&mut store, "f")
        .unwrap();
    f.call(&mut store, n).unwrap()
}

/// Outline `wat`, expect `moved` loops to move, and compare runs.
fn check(wat: &str, stage: Stage, moved: u32) {
    compare(outline(wat, stage), moved);
}

fn compare((original, outlined, count): (Vec<u8>, Vec<u8>, u32), moved: u32) {
    assert_eq!(count, moved, "loops moved");
    let engine = Engine::default();
    for n in [0, 1, 2, 3, 7, 8, 9, 15, 40, 200] {
        assert_eq!(
            run(&engine, &outlined, n),
            run(&engine, &original, n),
            "f({n}) after outlining"
        );
    }
}

/// A nest that calls nothing moves whole: its exits are a `br_if` and a
/// `br_table` to the block round it, and the inner loop breaks to a block
/// inside the outer loop.
#[test]
fn a_nest_without_calls_moves_whole() {
    let body = r#"
    (block $done
      (loop $outer
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $j (i32.const 0))
        (block $skip
          (loop $inner
            (br_if $skip (i32.eq (local.get $j) (i32.const 7)))
            (local.set $acc (i32.add (local.get $acc) (i32.mul (local.get $i) (local.get $j))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br_if $inner (i32.lt_u (local.get $j) (local.get $i)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_table $outer $done (i32.gt_u (local.get $acc) (i32.const 2000)))))"#;
    let locals = "(local $i i32) (local $j i32) (local $acc i32)";
    let wat = module(locals, body, MIN_LOCALS);
    check(&wat, Stage::Nests, 1);
    // Once points are placed, only its inner loop would move.
    check(&wat, Stage::Leaves, 1);
}

/// With a call in the outer loop only the inner loop moves. It leaves in
/// three ways: to the end of everything, back to the outer loop's header,
/// and by falling through.
#[test]
fn an_inner_loop_moves_out_of_a_loop_that_calls() {
    let body = r#"
    (block $all
      (loop $outer
        (local.set $acc (call $id (local.get $acc)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $all (i32.gt_u (local.get $i) (local.get $n)))
        (local.set $j (i32.const 0))
        (loop $inner
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (local.set $acc (i32.add (local.get $acc) (local.get $j)))
          (br_if $all (i32.gt_u (local.get $acc) (i32.const 5000)))
          (br_if $outer (i32.eq (local.get $j) (i32.const 30)))
          (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
        (local.set $acc (i32.xor (local.get $acc) (i32.const 1)))
        (br $outer)))"#;
    let locals = "(local $i i32) (local $j i32) (local $acc i32)";
    let wat = module(locals, body, MIN_LOCALS);
    check(&wat, Stage::Leaves, 1);
    check(&wat, Stage::Nests, 0);
    // `$id` has no loop and calls nothing: its call cannot unwind, so the
    // nest moves whole after all.
    compare(outline_with(&wat, Stage::Nests, true), 1);
}

/// A loop that returns, or branches out with a value, stays; so do the
/// loops of a small function.
#[test]
fn loops_that_cannot_be_said_as_a_call_stay() {
    let locals = "(local $i i32) (local $acc i32)";
    let returns = r#"
    (loop $l
      (if (i32.gt_u (local.get $i) (i32.const 5)) (then (return (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))"#;
    let carries = r#"
    (local.set $acc
      (block $b (result i32)
        (loop $l
          (drop (br_if $b (local.get $i) (i32.gt_u (local.get $i) (i32.const 5))))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
        (i32.const 99)))"#;
    for stage in [Stage::Nests, Stage::Leaves] {
        check(&module(locals, returns, MIN_LOCALS), stage, 0);
        check(&module(locals, carries, MIN_LOCALS), stage, 0);
    }
    let plain = r#"
    (loop $l
      (local.set $acc (i32.add (local.get $acc) (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))"#;
    check(&module(locals, plain, 2), Stage::Leaves, 0);
    check(&module(locals, plain, MIN_LOCALS), Stage::Leaves, 1);
    check(&module(locals, plain, MIN_LOCALS), Stage::Nests, 0);
}

/// The same input gives the same bytes.
#[test]
fn outlining_is_deterministic() {
    let body = r#"
    (loop $a
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $a (i32.lt_u (local.get $i) (local.get $n))))
    (loop $b
      (local.set $acc (i32.add (local.get $acc) (local.get $i)))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br_if $b (i32.gt_s (local.get $i) (i32.const 0))))"#;
    let wat = module("(local $i i32) (local $acc i32)", body, MIN_LOCALS);
    let (_, first, moved) = outline(&wat, Stage::Leaves);
    let (_, second, _) = outline(&wat, Stage::Leaves);
    assert_eq!(moved, 2);
    assert_eq!(first, second);
    check(&wat, Stage::Leaves, 2);
}

/// The parameter and result counts of the function exported as
/// `roam.loop.<n>`.
fn signature(wasm: &[u8], n: u32) -> (usize, usize) {
    let engine = Engine::default();
    let module = WasmModule::new(&engine, wasm).unwrap();
    let name = format!("{LOOP_EXPORT_PREFIX}{n}");
    let ty = module
        .get_export(&name)
        .and_then(|e| e.func().cloned())
        .expect("the outlined loop is exported");
    let counts = (ty.params().len(), ty.results().len());
    counts
}

/// A moved loop takes only what it may read before it sets it, and gives
/// back only what is read after it or is taken again: a scratch local set
/// first in every iteration neither comes in nor goes out, one only
/// written goes out, one only read comes in.
#[test]
fn only_the_locals_that_cross_the_call_are_passed() {
    let body = r#"
    (local.set $k (i32.add (local.get $n) (i32.const 3)))
    (loop $l
      (local.set $t (i32.mul (local.get $i) (local.get $k)))
      (local.set $acc (i32.add (local.get $acc) (local.get $t)))
      (local.set $last (i32.xor (local.get $t) (i32.const 5)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.set $acc (i32.add (local.get $acc) (local.get $last)))"#;
    let locals = "(local $i i32) (local $k i32) (local $t i32) (local $acc i32) (local $last i32)";
    let wat = module(locals, body, MIN_LOCALS);
    let (original, outlined, moved) = outline(&wat, Stage::Leaves);
    // In: $i, $k, $acc, $n. Out: $acc, $last, $i and the exit code; $t
    // is neither, and $i goes out because a hoisted point calls again.
    assert_eq!(signature(&outlined, 0), (4, 4));
    compare((original, outlined, moved), 1);
}

/// What the caller reads only on its next trip round an enclosing loop,
/// or only where the moved loop's branch out lands, still comes back:
/// without the loop header's fixed point or the exit's live set the
/// results differ.
#[test]
fn locals_read_round_a_loop_or_past_an_exit_come_back() {
    let body = r#"
    (block $all
      (loop $outer
        (local.set $acc (call $id (i32.add (local.get $acc) (local.get $x))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $all (i32.gt_u (local.get $i) (local.get $n)))
        (local.set $j (i32.const 0))
        (loop $inner
          (local.set $x (i32.mul (local.get $j) (i32.const 3)))
          (local.set $y (i32.add (local.get $j) (i32.const 100)))
          (br_if $all (i32.eq (local.get $j) (i32.const 11)))
          (local.set $j (i32.add (local.get $j) (i32.const 1)))
          (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
        (br $outer)))
    (local.set $acc (i32.add (local.get $acc) (local.get $y)))"#;
    let locals = "(local $i i32) (local $j i32) (local $x i32) (local $y i32) (local $acc i32)";
    let wat = module(locals, body, MIN_LOCALS);
    let (original, outlined, moved) = outline(&wat, Stage::Leaves);
    // In: $j, $i. Out: $x, $y, $j and the exit code.
    assert_eq!(signature(&outlined, 0), (2, 4));
    compare((original, outlined, moved), 1);
}

/// A local the loop writes on some paths only, and never reads, must come
/// in as well as go out: on a path that leaves it unset the caller's own
/// value has to survive the call. Found in SQLite under `--points manual`,
/// where the first `CREATE TABLE` was rejected.
#[test]
fn a_local_set_on_some_paths_only_keeps_the_callers_value() {
    let body = r#"
    (local.set $found (i32.const 77))
    (local.set $seen (i32.const 5))
    (block $out
      (loop $l
        (if (i32.eq (local.get $i) (i32.const 9))
          (then (local.set $found (local.get $i))))
        (br_if $out (i32.eq (local.get $i) (i32.const 30)))
        (local.set $seen (i32.add (local.get $i) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
    (local.set $acc (i32.add (local.get $found) (i32.mul (local.get $seen) (i32.const 1000))))"#;
    let locals = "(local $i i32) (local $found i32) (local $seen i32) (local $acc i32)";
    let wat = module(locals, body, MIN_LOCALS);
    let (original, outlined, moved) = outline(&wat, Stage::Leaves);
    // In: $i, $n, and $found and $seen, which some way out leaves unset
    // ($seen by the `br_if $out` before it is written). Out: $found,
    // $seen, $i and the exit code.
    assert_eq!(signature(&outlined, 0), (4, 4));
    compare((original, outlined, moved), 1);
}

/// Two loops move out of one function in one round, on one liveness pass
/// over the function as it was (`loop_io::LiveAfter`). Inside an outer
/// loop that calls, `$a` comes first and sets `$x` only on its way out to
/// `$e1`, where `$x` is read; `$b` writes `$x` without reading it. Once
/// `$a` has moved, its call reads `$x` (an output some way out leaves
/// unset), so `$x` is live after `$b` in the changed function though not
/// in the original; `$b` then keeps `$x` to itself, and the program must
/// still compute what it did.
#[test]
fn loops_moved_in_one_round_share_one_liveness_pass() {
    let body = r#"
    (block $done
      (loop $outer
        (block $e2
          (block $e1
            (loop $a
              (if (i32.eq (local.get $j) (i32.const 25))
                (then
                  (local.set $x (i32.mul (local.get $j) (i32.const 5)))
                  (br $e1)))
              (br_if $e2 (i32.ge_u (local.get $j) (local.get $n)))
              (local.set $j (i32.add (local.get $j) (i32.const 1)))
              (br $a)))
          (local.set $acc (i32.add (local.get $acc) (local.get $x)))
          (br $done))
        (local.set $acc (i32.add (local.get $acc) (i32.const 1000)))
        (local.set $k (i32.const 0))
        (loop $b
          (local.set $x (i32.mul (local.get $k) (i32.const 3)))
          (local.set $acc (i32.add (local.get $acc) (local.get $x)))
          (local.set $k (i32.add (local.get $k) (i32.const 1)))
          (br_if $b (i32.lt_u (local.get $k) (local.get $n))))
        (local.set $n (i32.add (call $id (local.get $n)) (i32.const 1)))
        (br_if $outer (i32.lt_u (local.get $n) (i32.const 40)))))"#;
    let locals = "(local $j i32) (local $k i32) (local $x i32) (local $acc i32)";
    let wat = module(locals, body, MIN_LOCALS);
    compare(outline(&wat, Stage::Leaves), 2);
}
