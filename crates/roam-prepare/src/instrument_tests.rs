use super::*;
use crate::{validate, AsyncifyScope, EntryPoints, PrepareOptions};
use wasmparser::{ExternalKind, Operator, Parser, Payload};

/// Two loops (one nested, one call-free), recursion, a leaf, an indirect call.
pub(crate) const LOOPS_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (global $sp (mut i32) (i32.const 1024))
  (global $k i32 (i32.const 3))
  (global $count (mut i64) (i64.const 0))
  (memory (export "memory") 1)
  (table 1 funcref)
  (elem (i32.const 0) $leaf)
  (type $un (func (param i32) (result i32)))
  (func $leaf (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
  (func $sum (param $n i32) (result i32) (local $acc i32)
    (block $done
      (loop $top
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $acc (i32.add (local.get $acc) (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $top)))
    (local.get $acc))
  (func $fib (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else (i32.add (call $fib (i32.sub (local.get $n) (i32.const 1)))
                     (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
  (func $_start (export "_start") (local $i i32)
    (loop $outer
      (loop $inner
        (global.set $count (i64.add (global.get $count) (i64.const 1)))
        (br_if $inner (i32.lt_u (call_indirect (type $un) (local.get $i) (i32.const 0)) (i32.const 0))))
      (local.set $i (i32.add (local.get $i) (call $sum (i32.const 10))))
      (br_if $outer (i32.lt_u (local.get $i) (call $fib (i32.const 10)))))
    (call $exit (i32.const 0))))"#;

/// Options for `policy` with entry points in every non-leaf function (the
/// placement these tests were written for) and Asyncify's own scope.
fn opts(policy: PointPolicy) -> PrepareOptions {
    PrepareOptions {
        points: policy,
        entry_points: EntryPoints::All,
        asyncify_scope: AsyncifyScope::All,
        ..Default::default()
    }
}

fn run(wat: &str, policy: PointPolicy) -> (Vec<u8>, PointStats) {
    run_with(wat, &opts(policy))
}

fn run_with(wat: &str, opts: &PrepareOptions) -> (Vec<u8>, PointStats) {
    let wasm = wat::parse_str(wat).unwrap();
    let info = validate(&wasm).unwrap();
    let out = instrument(&wasm, &info, opts).unwrap();
    wasmparser::Validator::new()
        .validate_all(&out.bytes)
        .unwrap();
    (out.bytes, out.stats)
}

fn exports(wasm: &[u8]) -> Vec<(String, ExternalKind, u32)> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::ExportSection(r) = payload.unwrap() {
            for e in r {
                let e = e.unwrap();
                out.push((e.name.to_string(), e.kind, e.index));
            }
        }
    }
    out
}

/// Function index of the `roam.migration_point` import.
fn point_index(wasm: &[u8]) -> u32 {
    let mut funcs = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::ImportSection(r) = payload.unwrap() {
            for i in r.into_imports() {
                let i = i.unwrap();
                if let wasmparser::TypeRef::Func(_) = i.ty {
                    if (i.module, i.name) == (POINT_MODULE, POINT_FUNC) {
                        return funcs;
                    }
                    funcs += 1;
                }
            }
        }
    }
    panic!("no migration point import");
}

/// Points found in the output: each must be exactly
/// `global.get $flag; if; call $point; else; end`.
fn count_points(wasm: &[u8]) -> u32 {
    let point = point_index(wasm);
    let flag = exports(wasm)
        .into_iter()
        .find(|e| e.0 == FLAG_GLOBAL_EXPORT)
        .unwrap()
        .2;
    let mut n = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::CodeSectionEntry(body) = payload.unwrap() {
            let mut ops = body.get_operators_reader().unwrap();
            let mut window: Vec<Operator> = Vec::new();
            while !ops.eof() {
                window.push(ops.read().unwrap());
                if window.len() > 5 {
                    window.remove(0);
                }
                // walrus always writes the (empty) `else` arm.
                if let [Operator::GlobalGet { global_index }, Operator::If { .. }, Operator::Call { function_index }, Operator::Else, Operator::End] =
                    window.as_slice()
                {
                    if *global_index == flag && *function_index == point {
                        n += 1;
                    }
                }
            }
        }
    }
    n
}

#[test]
fn loops_policy_marks_every_loop_and_non_leaf_entry() {
    let (out, stats) = run(LOOPS_WAT, PointPolicy::Loops);
    // Loops: sum's loop, _start's outer and inner. Non-leaf: fib, _start.
    assert_eq!(
        stats,
        PointStats {
            loop_points: 3,
            function_points: 2,
            manual_points: 0,
            functions: 3
        }
    );
    assert_eq!(count_points(&out), 5);
}

#[test]
fn functions_policy_marks_only_non_leaf_entries() {
    let (out, stats) = run(LOOPS_WAT, PointPolicy::Functions);
    assert_eq!(
        stats,
        PointStats {
            loop_points: 0,
            function_points: 2,
            manual_points: 0,
            functions: 2
        }
    );
    assert_eq!(count_points(&out), 2);
}

#[test]
fn manual_policy_inserts_nothing_but_still_exports_the_flag() {
    let (out, stats) = run(LOOPS_WAT, PointPolicy::Manual);
    assert_eq!(stats, PointStats::default());
    assert_eq!(count_points(&out), 0);
    assert!(exports(&out)
        .iter()
        .any(|e| e.0 == FLAG_GLOBAL_EXPORT && e.1 == ExternalKind::Global));
}

#[test]
fn exports_mutable_globals_by_input_index_memory_and_tables() {
    let (out, _) = run(LOOPS_WAT, PointPolicy::Loops);
    let names: Vec<_> = exports(&out).into_iter().map(|e| (e.0, e.1)).collect();
    for (name, kind) in [
        ("memory", ExternalKind::Memory),
        ("_start", ExternalKind::Func),
        ("roam.global.0", ExternalKind::Global),
        ("roam.global.2", ExternalKind::Global),
        ("roam.memory", ExternalKind::Memory),
        ("roam.table.0", ExternalKind::Table),
        ("roam.flag", ExternalKind::Global),
    ] {
        assert!(
            names.contains(&(name.to_string(), kind)),
            "missing {name}: {names:?}"
        );
    }
    // The immutable global 1 is not exported.
    assert!(!names.iter().any(|(n, _)| n == "roam.global.1"));
}

#[test]
fn reuses_the_programs_own_migration_point_import() {
    let wat = r#"(module
        (import "roam" "migration_point" (func $mp))
        (memory 1)
        (func $work (loop $l (call $mp) (br $l)))
        (func $_start (export "_start") (call $work)))"#;
    let (out, stats) = run(wat, PointPolicy::Manual);
    assert_eq!(stats.manual_points, 1);
    assert_eq!(stats.functions, 1);
    let imports = Parser::new(0)
        .parse_all(&out)
        .filter_map(|p| match p.unwrap() {
            Payload::ImportSection(r) => Some(r.into_imports().count()),
            _ => None,
        })
        .sum::<usize>();
    assert_eq!(imports, 1, "the import must be reused, not duplicated");

    let (_, stats) = run(wat, PointPolicy::Loops);
    // $work: a loop point, and no entry point: its only call is inside the
    // loop, so every run passes the loop's point before calling.
    // $_start: an entry point.
    assert_eq!(
        stats,
        PointStats {
            loop_points: 1,
            function_points: 1,
            manual_points: 1,
            functions: 2
        }
    );
}

/// A recursive function whose every call is inside a loop (a tail call the
/// compiler turned into a loop) needs no entry point: each of its frames
/// passes the loop's point before it calls. `fib`, which calls outside any
/// loop, keeps its entry point; under the `functions` policy there are no
/// loop points, so both keep theirs.
#[test]
fn a_function_whose_calls_are_all_in_loops_needs_no_entry_point() {
    let wat = r#"(module
        (memory 1)
        (func $ack (param $m i32) (param $n i32) (result i32)
          (block $done
            (loop $again
              (br_if $done (i32.eqz (local.get $m)))
              (local.set $n
                (if (result i32) (i32.eqz (local.get $n))
                  (then (i32.const 1))
                  (else (call $ack (local.get $m) (i32.sub (local.get $n) (i32.const 1))))))
              (local.set $m (i32.sub (local.get $m) (i32.const 1)))
              (br $again)))
          (i32.add (local.get $n) (i32.const 1)))
        (func $fib (param $n i32) (result i32)
          (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
            (then (local.get $n))
            (else (i32.add (call $fib (i32.sub (local.get $n) (i32.const 1)))
                           (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
        (func $_start (export "_start")
          (drop (i32.add (call $ack (i32.const 2) (i32.const 3)) (call $fib (i32.const 5))))))"#;
    let cycles = PrepareOptions {
        entry_points: EntryPoints::Cycles,
        ..opts(PointPolicy::Loops)
    };
    let (_, stats) = run_with(wat, &cycles);
    assert_eq!(
        (stats.loop_points, stats.function_points),
        (1, 1),
        "fib only"
    );
    let functions = PrepareOptions {
        entry_points: EntryPoints::Cycles,
        ..opts(PointPolicy::Functions)
    };
    let (_, stats) = run_with(wat, &functions);
    assert_eq!((stats.loop_points, stats.function_points), (0, 2));
}

#[test]
fn refuses_an_export_name_roam_reserves() {
    let wasm = wat::parse_str(
        r#"(module (memory 1) (global (export "roam.flag") (mut i32) (i32.const 0))
           (func (export "_start")))"#,
    )
    .unwrap();
    let info = validate(&wasm).unwrap();
    let err = instrument(&wasm, &info, &opts(PointPolicy::Loops))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("already exports `roam.flag`"),
        "{err}"
    );
}

#[test]
fn drops_dwarf_but_keeps_names() {
    let mut wasm = wat::parse_str(LOOPS_WAT).unwrap();
    // A fake DWARF section; walrus must not copy it into the output.
    wasm.extend([0, 12, 11]);
    wasm.extend(b".debug_info");
    let info = validate(&wasm).unwrap();
    assert!(info.has_debug_sections);
    let out = instrument(&wasm, &info, &opts(PointPolicy::Loops))
        .unwrap()
        .bytes;
    let customs: Vec<String> = Parser::new(0)
        .parse_all(&out)
        .filter_map(|p| match p.unwrap() {
            Payload::CustomSection(c) => Some(c.name().to_string()),
            _ => None,
        })
        .collect();
    assert!(customs.contains(&"name".to_string()), "{customs:?}");
    assert!(
        !customs.iter().any(|c| c.starts_with(".debug")),
        "{customs:?}"
    );
}

/// An outer loop around a leaf inner loop (no loop, no call inside), next to
/// a top-level leaf loop.
pub(crate) const NESTED_WAT: &str = r#"(module
  (memory (export "memory") 1)
  (func $_start (export "_start") (local $i i32) (local $j i32)
    (loop $outer
      (local.set $j (i32.const 0))
      (loop $inner
        (i32.store (local.get $j) (local.get $i))
        (local.set $j (i32.add (local.get $j) (i32.const 4)))
        (br_if $inner (i32.lt_u (local.get $j) (i32.const 64))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $outer (i32.lt_u (local.get $i) (i32.const 8))))
    (loop $flat
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br_if $flat (local.get $i)))))"#;

#[test]
fn outer_policy_skips_only_nested_leaf_loops() {
    let (out, stats) = run(NESTED_WAT, PointPolicy::Loops);
    assert_eq!(stats.loop_points, 3);
    assert_eq!(count_points(&out), 3);
    let (out, stats) = run(NESTED_WAT, PointPolicy::Outer);
    // $outer and the top-level leaf $flat keep theirs; $inner does not.
    assert_eq!(stats.loop_points, 2);
    assert_eq!(count_points(&out), 2);
    // Where loops contain calls, outer and loops agree.
    assert_eq!(
        run(LOOPS_WAT, PointPolicy::Outer).1,
        run(LOOPS_WAT, PointPolicy::Loops).1
    );
}

#[test]
fn cycles_policy_keeps_entry_points_only_on_recursion() {
    let cycles = PrepareOptions {
        entry_points: EntryPoints::Cycles,
        ..opts(PointPolicy::Loops)
    };
    let (out, stats) = run_with(LOOPS_WAT, &cycles);
    // fib calls itself; _start calls but is on no cycle; loops unchanged.
    assert_eq!(stats.loop_points, 3);
    assert_eq!(stats.function_points, 1);
    assert_eq!(count_points(&out), 4);
}

#[test]
fn reachable_scope_lists_exactly_the_callers_of_unwinding_imports() {
    // $reads reaches fd_read directly, $via_table through an indirect call
    // of type $io; $pure is in the table too but of another type, and
    // $leaf only computes.
    let wat = r#"(module
      (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
      (type $io (func (result i32)))
      (type $calc (func (param i32) (result i32)))
      (memory 1)
      (table 2 funcref)
      (elem (i32.const 0) $reads $pure)
      (func $reads (result i32) (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
      (func $pure (param i32) (result i32) (local.get 0))
      (func $leaf (param i32) (result i32) (i32.mul (local.get 0) (local.get 0)))
      (func $via_table (param i32) (result i32) (call_indirect (type $io) (local.get 0)))
      (func $calc_only (param i32) (result i32) (call_indirect (type $calc) (local.get 0) (i32.const 1)))
      (func $_start (export "_start")
        (drop (call $leaf (call $calc_only (call $via_table (i32.const 0)))))))"#;
    let wasm = wat::parse_str(wat).unwrap();
    let info = validate(&wasm).unwrap();
    let manual = PrepareOptions {
        asyncify_scope: AsyncifyScope::Reachable,
        ..opts(PointPolicy::Manual)
    };
    let out = instrument(&wasm, &info, &manual).unwrap();
    assert_eq!(
        out.list.unwrap(),
        AsyncifyList::Only(vec!["reads".into(), "via_table".into(), "_start".into()]),
        "$pure, $leaf and $calc_only cannot reach fd_read"
    );
    // Scope `all` leaves the choice to Asyncify, but for the fast forms of
    // `pure.rs`: with an entry point in every function that calls,
    // $calc_only has one, and it writes nothing.
    let out = instrument(&wasm, &info, &opts(PointPolicy::Loops)).unwrap();
    assert_eq!(
        out.list,
        Some(AsyncifyList::Remove(vec!["calc_only".into()]))
    );
    let off = PrepareOptions {
        rerun_calls: crate::RerunCalls::Off,
        ..opts(PointPolicy::Loops)
    };
    let out = instrument(&wasm, &info, &off).unwrap();
    assert_eq!(out.list, None, "scope `all` leaves the choice to Asyncify");
}
