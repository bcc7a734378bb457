use wasmparser::{Operator, Parser, Payload, Validator};

use super::*;
use crate::pipeline::tests::{export_names, prepare_or_skip};
use crate::{check_prepared, Capture, CheckError, PrepareOptions};

/// `_start` loops over calls of `$work`, which loops too (so it has a
/// point), with a value of `_start` under the call's argument on the
/// operand stack; `$leaf` reaches no point and its call stays bare.
pub(crate) const WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (global $sum (mut i32) (i32.const 0))
  (func $leaf (param i32) (result i32) (i32.mul (local.get 0) (i32.const 3)))
  (func $work (param $n i32) (result i32) (local $i i32) (local $acc i32)
    (loop $l
      (local.set $acc (i32.add (local.get $acc) (call $leaf (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $acc))
  (func (export "_start") (local $k i32) (local $dead f64)
    (loop $outer
      (global.set $sum
        (i32.add (local.get $k) (call $work (i32.add (local.get $k) (i32.const 100)))))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br_if $outer (i32.lt_u (local.get $k) (i32.const 10))))
    (call $exit (i32.const 0))))"#;

fn eh_opts() -> PrepareOptions {
    PrepareOptions {
        capture: Capture::Eh,
        // Keep wasm-opt from inlining `$work` into `_start`.
        opt_level: crate::OptLevel::O0,
        ..PrepareOptions::default()
    }
}

/// (try_table, throw, throw_ref) counts.
fn eh_instrs(wasm: &[u8]) -> (usize, usize, usize) {
    let mut n = (0, 0, 0);
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CodeSectionEntry(body) = payload.unwrap() {
            let mut ops = body.get_operators_reader().unwrap();
            while !ops.eof() {
                match ops.read().unwrap() {
                    Operator::TryTable { .. } => n.0 += 1,
                    Operator::Throw { .. } => n.1 += 1,
                    Operator::ThrowRef => n.2 += 1,
                    _ => {}
                }
            }
        }
    }
    n
}

#[test]
fn calls_that_reach_a_point_are_wrapped_and_points_throw() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(out) = prepare_or_skip(&wasm, &eh_opts()) else {
        return;
    };
    let eh = out.eh.expect("eh reports what it did");
    Validator::new_with_features(OUTPUT_FEATURES)
        .validate_all(&out.bytes)
        .unwrap();
    // `$work` has a loop point; `_start`'s loop point throws too, and its
    // call of `$work` (with `$k` under the argument) is wrapped (`pure.rs`
    // may route it through a wrapper, whose calls are wrapped too); the
    // calls of `$leaf` and `proc_exit` are not. Every function with a site
    // has a rewind copy, which throws and wraps as its run form does.
    assert!(eh.copies >= 2, "{eh:?}");
    assert!(eh.points >= 4, "{eh:?}");
    assert!((2..=6).contains(&eh.wrapped), "{eh:?}");
    assert!(eh.moved >= 1, "{eh:?}");
    let (tries, throws, rethrows) = eh_instrs(&out.bytes);
    assert_eq!(tries as u32, eh.wrapped);
    assert_eq!(rethrows as u32, eh.wrapped);
    assert_eq!(throws as u32, eh.points + eh.imports);
    let exports = export_names(&out.bytes);
    for name in [
        TAG_EXPORT,
        CAPTURE_GLOBAL_EXPORT,
        CAPTURE_END_EXPORT,
        STATE_EXPORT,
        REWIND_EXPORT,
        crate::FLAG_GLOBAL_EXPORT,
    ] {
        assert!(
            exports.iter().any(|(n, _)| n == name),
            "{name}: {exports:?}"
        );
    }
    assert!(out.section.options.ends_with(";capture=eh"));
    assert_eq!(out.section.capture(), Capture::Eh);
    // The output is a prepared module like any other.
    check_prepared(&out.bytes).unwrap();
    assert!(exports.iter().all(|(n, _)| !n.starts_with("asyncify_")));
}

#[test]
fn handlers_store_only_live_locals() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(out) = prepare_or_skip(&wasm, &eh_opts()) else {
        return;
    };
    let eh = out.eh.unwrap();
    // `_start`'s handler: `$k` (live after the call) and the moved value,
    // not the never-read `$dead`; the points store what is live at each.
    let mut f64_stores = 0;
    for payload in Parser::new(0).parse_all(&out.bytes) {
        if let Payload::CodeSectionEntry(body) = payload.unwrap() {
            let mut ops = body.get_operators_reader().unwrap();
            while !ops.eof() {
                if let Operator::F64Store { .. } = ops.read().unwrap() {
                    f64_stores += 1;
                }
            }
        }
    }
    assert_eq!(f64_stores, 0);
    assert!(eh.stored >= 2, "{eh:?}");
}

#[test]
fn asyncify_leaves_the_canonical_text_as_it_was() {
    let eh = eh_opts();
    let asyncify = PrepareOptions {
        opt_level: crate::OptLevel::O0,
        capture: Capture::Asyncify,
        ..PrepareOptions::default()
    };
    assert_eq!(
        eh.canonical(),
        format!("{};capture=eh", asyncify.canonical())
    );
    assert!(!asyncify.canonical().contains("capture"));
    assert_eq!(PrepareOptions::default().capture, Capture::Returns);
    assert_eq!("eh".parse::<Capture>(), Ok(Capture::Eh));
    assert!("eh-proto".parse::<Capture>().is_err());
    assert!("exceptions".parse::<Capture>().is_err());
}

#[test]
fn eh_points_throws_at_points_and_wraps_nothing() {
    let wasm = wat::parse_str(WAT).unwrap();
    let opts = PrepareOptions {
        capture: Capture::EhPoints,
        ..eh_opts()
    };
    let Some(out) = prepare_or_skip(&wasm, &opts) else {
        return;
    };
    let eh = out.eh.unwrap();
    assert_eq!(eh.wrapped, 0, "{eh:?}");
    assert_eq!(eh.copies, 0, "{eh:?}");
    assert!(eh.points >= 2, "{eh:?}");
    assert_eq!(eh_instrs(&out.bytes), (0, eh.points as usize, 0));
    assert!(matches!(
        check_prepared(&out.bytes),
        Err(CheckError::Experimental)
    ));
}

/// A call that may unwind inside a block that sits on a value of its
/// enclosing block: the value moves to a local, which the record holds.
#[test]
fn a_value_under_a_block_that_holds_a_site_moves_to_a_local() {
    let wasm = wat::parse_str(
        r#"(module
  (import "roam" "migration_point" (func $point))
  (memory (export "memory") 1)
  (func $work (param i32) (result i32) (call $point) (i32.add (local.get 0) (i32.const 1)))
  (func (export "_start") (local $y i32)
    (local.set $y (i32.const 7))
    (drop (i32.add (local.get $y)
      (block (result i32) (call $work (local.get $y)))))))"#,
    )
    .unwrap();
    let opts = PrepareOptions {
        points: crate::PointPolicy::Manual,
        ..eh_opts()
    };
    let Some(out) = prepare_or_skip(&wasm, &opts) else {
        return;
    };
    let eh = out.eh.unwrap();
    // `$y` under the block, and under the call nothing else.
    assert!(eh.moved >= 1, "{eh:?}");
    check_prepared(&out.bytes).unwrap();
}

#[test]
fn blocking_imports_in_a_table_fall_back_to_asyncify() {
    let wasm = wat::parse_str(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (table 1 funcref)
  (elem (i32.const 0) $read)
  (func (export "_start")))"#,
    )
    .unwrap();
    let points = PrepareOptions {
        capture: Capture::EhPoints,
        ..eh_opts()
    };
    let Some(err) = crate::pipeline::tests::prepare_err_or_skip(&wasm, &points) else {
        return;
    };
    assert!(err.to_string().contains("table holds an import"), "{err}");
    assert!(err.to_string().contains("--capture asyncify"), "{err}");
    // Asked for by default, exceptions give way to Asyncify, and say why.
    let out = prepare_or_skip(&wasm, &eh_opts()).unwrap();
    assert_eq!(out.section.capture(), Capture::Asyncify);
    assert!(out.eh.is_none());
    let why = out.fallback.expect("the fallback is reported");
    assert!(why.contains("table holds an import"), "{why}");
}

/// `--capture returns`: the same sites, copies and records, but no
/// exception anywhere: the output validates without the proposal.
#[test]
fn returns_capture_the_same_sites_without_exceptions() {
    let wasm = wat::parse_str(WAT).unwrap();
    let Some(thrown) = prepare_or_skip(&wasm, &eh_opts()) else {
        return;
    };
    let opts = PrepareOptions {
        capture: Capture::Returns,
        ..eh_opts()
    };
    let Some(out) = prepare_or_skip(&wasm, &opts) else {
        return;
    };
    let (eh, thrown) = (out.eh.unwrap(), thrown.eh.unwrap());
    assert_eq!(eh, thrown, "the same sites, wrapped or checked");
    Validator::new_with_features(crate::validate::SUPPORTED_FEATURES)
        .validate_all(&out.bytes)
        .unwrap();
    assert_eq!(eh_instrs(&out.bytes), (0, 0, 0));
    let exports = export_names(&out.bytes);
    assert!(exports.iter().all(|(n, _)| n != TAG_EXPORT), "{exports:?}");
    assert!(exports.iter().any(|(n, _)| n == REWIND_EXPORT));
    assert!(out.section.options.ends_with(";capture=returns"));
    assert_eq!(out.section.capture(), Capture::Returns);
    check_prepared(&out.bytes).unwrap();
    assert_eq!("returns".parse::<Capture>(), Ok(Capture::Returns));
}

/// Regression: a pass before the capture can leave code after an
/// unconditional branch (lifting an exit puts a `return` before the rest
/// of its block), and without a `wasm-opt` run (`--opt O0`) nothing removes
/// it. walrus drops such code when it parses, wasmparser does not, so the
/// capture matched the wrong facts to calls and refused the module
/// ("instruction count differs"); this stopped `--opt O0` on Lua.
#[test]
fn code_after_a_lifted_exit_is_left_out_under_every_capture() {
    let fixture = crate::leave::tests::WAT;
    let tail = "(call $fail (i32.const 3) (i32.add (i32.const 2) (local.get $i))) (unreachable)";
    assert!(fixture.contains(tail));
    // A call and a block after the call that never returns: dead once the
    // exit is lifted.
    let wat = fixture.replace(
        tail,
        "(call $fail (i32.const 3) (i32.add (i32.const 2) (local.get $i)))
         (block (call $line (i32.const 33)))
         (unreachable)",
    );
    let wasm = wat::parse_str(&wat).unwrap();
    for capture in [Capture::Returns, Capture::Eh] {
        let opts = PrepareOptions {
            capture,
            ..eh_opts()
        };
        let Some(out) = prepare_or_skip(&wasm, &opts) else {
            return;
        };
        assert_eq!(
            out.section.capture(),
            capture,
            "no fallback: {:?}",
            out.fallback
        );
        assert!(out.eh.unwrap().sites > 0);
        check_prepared(&out.bytes).unwrap();
    }
}
