//! Spilled points: the rewrite's shape, the scratch globals it shares, and
//! the same results as the module before it, run on wasmtime.

use wasmparser::{Operator, Parser, Payload};
use wasmtime::{Engine, Instance, Linker, Module, Store, Val};

use super::*;

/// Two functions that call the point: `f` (an `i32` parameter, an `f64` and
/// an `i32` local, the call inside a loop) and `g` (an `i64` parameter,
/// three more locals, two calls in different blocks); `h` calls nothing.
pub(crate) const WAT: &str = r#"(module
  (import "roam" "migration_point" (func $p))
  (func (export "f") (param $n i32) (result f64) (local $x f64) (local $i i32)
    (loop $l
      (local.set $x (f64.add (local.get $x) (f64.convert_i32_u (local.get $i))))
      (call $p)
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $x))
  (func (export "g") (param $a i64) (result i64) (local $b i64) (local $c i64) (local $d i32)
    (local.set $b (i64.mul (local.get $a) (i64.const 3)))
    (block (call $p) (local.set $c (i64.add (local.get $b) (i64.const 7))))
    (local.set $d (i32.const 5))
    (if (local.get $d) (then (call $p)))
    (i64.add (local.get $c) (i64.extend_i32_u (local.get $d))))
  (func (export "h") (param $a i32) (result i32) (local.get $a)))"#;

/// The operators of every function body, in order.
fn bodies(wasm: &[u8]) -> Vec<Vec<Operator<'_>>> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CodeSectionEntry(b) = payload.unwrap() {
            let mut ops = b.get_operators_reader().unwrap();
            let mut body = Vec::new();
            while !ops.eof() {
                body.push(ops.read().unwrap());
            }
            out.push(body);
        }
    }
    out
}

/// The body that makes `n` calls. walrus may write the functions in
/// another order, and `f`, `g` and `h` make 1, 2 and 0 calls.
fn by_calls<'a>(all: &[Vec<Operator<'a>>], n: usize) -> Vec<Operator<'a>> {
    let calls = |body: &[Operator]| {
        body.iter()
            .filter(|op| matches!(op, Operator::Call { .. }))
            .count()
    };
    all.iter().find(|b| calls(b) == n).unwrap().clone()
}

fn run(wasm: &[u8], name: &str, arg: Val) -> Val {
    let engine = Engine::default();
    let module = Module::new(&engine, wasm).unwrap();
    let mut linker: Linker<()> = Linker::new(&engine);
    linker.func_wrap("roam", "migration_point", || {}).unwrap();
    let mut store = Store::new(&engine, ());
    let instance: Instance = linker.instantiate(&mut store, &module).unwrap();
    let mut out = [Val::I32(0)];
    instance
        .get_func(&mut store, name)
        .unwrap()
        .call(&mut store, &[arg], &mut out)
        .unwrap();
    out[0]
}

#[test]
fn every_local_goes_round_the_call_through_shared_scratch_globals() {
    let wasm = wat::parse_str(WAT).unwrap();
    let (out, stats) = spill(&wasm, true).unwrap();
    wasmparser::Validator::new().validate_all(&out).unwrap();
    assert_eq!(stats.calls, 3);
    // Shared across functions: i32 ×2 (f), f64 ×1 (f), i64 ×3 (g), not 2 + 1
    // + 1 + 1 + 3.
    assert_eq!(stats.globals, 6);
    let module = walrus::Module::from_buffer(&out).unwrap();
    let spills = module
        .exports
        .iter()
        .filter(|e| e.name.starts_with(SPILL_EXPORT_PREFIX))
        .count();
    assert_eq!(spills, 6);

    let (original, bodies) = (bodies(&wasm), bodies(&out));
    // `f` has 3 locals: 3 copies out, the call, 3 copies back.
    let f = &by_calls(&bodies, 1);
    let call = f
        .iter()
        .position(|op| matches!(op, Operator::Call { function_index: 0 }))
        .unwrap();
    // walrus may number the locals anew when it writes the module: compare
    // the sets.
    let mut out_of = Vec::new();
    let mut back_to = Vec::new();
    for k in 0..3 {
        match (&f[call - 6 + 2 * k], &f[call - 5 + 2 * k]) {
            (Operator::LocalGet { local_index }, Operator::GlobalSet { .. }) => {
                out_of.push(*local_index)
            }
            other => panic!("before the call: {other:?}"),
        }
        match (&f[call + 1 + 2 * k], &f[call + 2 + 2 * k]) {
            (Operator::GlobalGet { .. }, Operator::LocalSet { local_index }) => {
                back_to.push(*local_index)
            }
            other => panic!("after the call: {other:?}"),
        }
    }
    out_of.sort();
    back_to.sort();
    assert_eq!((out_of, back_to), (vec![0, 1, 2], vec![0, 1, 2]));
    // `g`: both calls rewritten, 4 locals each way.
    let g = &by_calls(&bodies, 2);
    let sets = g
        .iter()
        .filter(|op| matches!(op, Operator::GlobalSet { .. }))
        .count();
    assert_eq!(sets, 8);
    // `h` calls nothing and is left alone.
    assert_eq!(by_calls(&bodies, 0), by_calls(&original, 0));
}

#[test]
fn a_spilled_module_computes_what_the_original_does() {
    let wasm = wat::parse_str(WAT).unwrap();
    let (out, _) = spill(&wasm, true).unwrap();
    for n in [1, 10, 1000] {
        match (run(&wasm, "f", Val::I32(n)), run(&out, "f", Val::I32(n))) {
            (Val::F64(a), Val::F64(b)) => assert_eq!(a, b, "f({n})"),
            other => panic!("f({n}): {other:?}"),
        }
    }
    match (run(&wasm, "g", Val::I64(11)), run(&out, "g", Val::I64(11))) {
        (Val::I64(a), Val::I64(b)) => assert_eq!((a, b), (45, 45)),
        other => panic!("g: {other:?}"),
    }
}

#[test]
fn a_module_without_points_gets_no_globals() {
    let wasm =
        wat::parse_str(r#"(module (func (export "h") (param i32) (result i32) (local.get 0)))"#)
            .unwrap();
    let (out, stats) = spill(&wasm, true).unwrap();
    assert_eq!(stats, SpillStats::default());
    wasmparser::Validator::new().validate_all(&out).unwrap();
}

#[test]
fn a_function_with_too_many_locals_keeps_its_plain_call() {
    let n = MAX_SPILLED_LOCALS + 1;
    let many = " i32".repeat(n);
    // Locals the body never names do not count: read every one.
    let reads: String = (0..n).map(|i| format!("(drop (local.get {i}))")).collect();
    let wat = format!(
        r#"(module
          (import "roam" "migration_point" (func $p))
          (func (export "f") (local{many}) (call $p) {reads}))"#
    );
    let wasm = wat::parse_str(wat).unwrap();
    let (out, stats) = spill(&wasm, true).unwrap();
    assert_eq!(stats, SpillStats::default());
    wasmparser::Validator::new().validate_all(&out).unwrap();
}

#[test]
fn a_program_exporting_a_scratch_name_is_refused_by_name() {
    let wasm = wat::parse_str(
        r#"(module
          (import "roam" "migration_point" (func $p))
          (global (export "roam.spill.3") i32 (i32.const 0))
          (func (export "f") (call $p)))"#,
    )
    .unwrap();
    let err = spill(&wasm, true).unwrap_err();
    assert!(
        matches!(&err, PrepareError::ExportNameTaken { name } if name == "roam.spill.3"),
        "{err}"
    );
}
