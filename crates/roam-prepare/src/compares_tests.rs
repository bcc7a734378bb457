//! Tests of `compares.rs`: which comparisons turn round, and that every
//! result stays the same, NaN and signed zeros included.

use wasmparser::{Operator, Parser, Payload};
use wasmtime::{Engine, Instance, Module, Store};

use super::turn_compares;

pub(crate) const WAT: &str = r#"(module
  ;; y > x ? x : y, the minimum as the optimiser may leave it.
  (func (export "min") (param $x f64) (param $y f64) (result f64)
    (select (local.get $x) (local.get $y) (f64.gt (local.get $y) (local.get $x))))
  ;; The same through a `local.tee`, with `ge`, in f32.
  (func (export "max32") (param $x f32) (param $y f32) (result f32) (local $c i32)
    (select (local.get $x) (local.get $y) (local.tee $c (f32.ge (local.get $x) (local.get $y)))))
  ;; A constant operand, and a comparison a branch takes: left alone.
  (func (export "clamp") (param $x f64) (param $y f64) (result f64)
    (select (local.get $x) (local.get $y) (f64.gt (local.get $x) (f64.const 1))))
  (func (export "branch") (param $x f64) (param $y f64) (result f64)
    (block $b
      (br_if $b (f64.gt (local.get $x) (local.get $y)))
      (return (local.get $y)))
    (local.get $x)))"#;

/// The comparison opcodes of each function, in order.
fn compares(wasm: &[u8]) -> Vec<Vec<&'static str>> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CodeSectionEntry(body) = payload.unwrap() {
            let mut found = Vec::new();
            let mut ops = body.get_operators_reader().unwrap();
            while !ops.eof() {
                found.push(match ops.read().unwrap() {
                    Operator::F64Gt | Operator::F32Gt => "gt",
                    Operator::F64Ge | Operator::F32Ge => "ge",
                    Operator::F64Lt | Operator::F32Lt => "lt",
                    Operator::F64Le | Operator::F32Le => "le",
                    _ => continue,
                });
            }
            out.push(found);
        }
    }
    out
}

#[test]
fn only_compares_a_select_takes_turn_round() {
    let original = wat::parse_str(WAT).unwrap();
    let mut turned = original.clone();
    assert_eq!(turn_compares(&mut turned).unwrap(), 2);
    assert_eq!(turned.len(), original.len());
    wasmparser::Validator::new().validate_all(&turned).unwrap();
    assert_eq!(
        compares(&turned),
        [vec!["lt"], vec!["le"], vec!["gt"], vec!["gt"]]
    );
    // Turning again finds nothing more.
    let mut again = turned.clone();
    assert_eq!(turn_compares(&mut again).unwrap(), 0);
    assert_eq!(again, turned);
}

#[test]
fn every_result_is_the_same() {
    let original = wat::parse_str(WAT).unwrap();
    let mut turned = original.clone();
    turn_compares(&mut turned).unwrap();
    let engine = Engine::default();
    let values = [
        0.0,
        -0.0,
        1.0,
        -1.5,
        2.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
    ];
    let run = |wasm: &[u8]| {
        let module = Module::new(&engine, wasm).unwrap();
        let mut store = Store::new(&engine, ());
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        let mut bits = Vec::new();
        for name in ["min", "clamp", "branch"] {
            let f = instance
                .get_typed_func::<(f64, f64), f64>(&mut store, name)
                .unwrap();
            for x in values {
                for y in values {
                    bits.push(f.call(&mut store, (x, y)).unwrap().to_bits());
                }
            }
        }
        let f = instance
            .get_typed_func::<(f32, f32), f32>(&mut store, "max32")
            .unwrap();
        for x in values {
            for y in values {
                let r = f.call(&mut store, (x as f32, y as f32)).unwrap();
                bits.push(u64::from(r.to_bits()));
            }
        }
        bits
    };
    assert_eq!(run(&turned), run(&original));
}
