use super::*;
use crate::instrument::tests::LOOPS_WAT;
use crate::{read_section, Capture, PointPolicy, SECTION_VERSION};
use wasmparser::{ExternalKind, Parser, Payload};

/// `None` (and a printed reason) when no `wasm-opt` is installed; under CI
/// that fails the test instead.
pub(crate) fn prepare_or_skip(wasm: &[u8], opts: &PrepareOptions) -> Option<Prepared> {
    match prepare(wasm, opts) {
        Err(PrepareError::WasmOptMissing { path }) => {
            roam_testkit::missing(&roam_testkit::WASM_OPT, path.display());
            None
        }
        other => Some(other.unwrap()),
    }
}

/// The error `prepare` gives, or `None` (after reporting) without wasm-opt.
pub(crate) fn prepare_err_or_skip(wasm: &[u8], opts: &PrepareOptions) -> Option<PrepareError> {
    match prepare(wasm, opts) {
        Err(PrepareError::WasmOptMissing { path }) => {
            roam_testkit::missing(&roam_testkit::WASM_OPT, path.display());
            None
        }
        Err(e) => Some(e),
        Ok(_) => panic!("prepare succeeded where it must fail"),
    }
}

pub(crate) fn export_names(wasm: &[u8]) -> Vec<(String, ExternalKind)> {
    let mut out = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        if let Payload::ExportSection(r) = payload.unwrap() {
            for e in r {
                let e = e.unwrap();
                out.push((e.name.to_string(), e.kind));
            }
        }
    }
    out
}

fn opts(points: PointPolicy) -> PrepareOptions {
    PrepareOptions {
        points,
        // The Asyncify pipeline; `eh_tests.rs` has the default's.
        capture: Capture::Asyncify,
        ..PrepareOptions::default()
    }
}

#[test]
fn prepared_module_validates_and_has_exports_and_section() {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    let Some(p) = prepare_or_skip(&wasm, &opts(PointPolicy::Loops)) else {
        return;
    };
    assert!(!p.already_prepared);
    wasmparser::Validator::new().validate_all(&p.bytes).unwrap();
    let names = export_names(&p.bytes);
    for name in ASYNCIFY_EXPORTS {
        assert!(
            names.contains(&(name.to_string(), ExternalKind::Func)),
            "{name}: {names:?}"
        );
    }
    for name in ["roam.flag", "roam.global.0", "roam.global.2"] {
        assert!(
            names.contains(&(name.to_string(), ExternalKind::Global)),
            "{name}"
        );
    }
    assert!(names.contains(&("roam.memory".to_string(), ExternalKind::Memory)));
    assert!(names.contains(&("roam.table.0".to_string(), ExternalKind::Table)));

    let section = read_section(&p.bytes).unwrap().unwrap();
    assert_eq!(section, p.section);
    assert_eq!(section.version, SECTION_VERSION);
    assert_eq!(section.source_hash, *blake3::hash(&wasm).as_bytes());
    assert_eq!(section.points, PointPolicy::Loops);
    assert_eq!(
        section.options,
        "points=loops;opt=O2;names=keep;scope=all;entries=cycles;loops=rerun;calls=spilled;outline=on;rerun-calls=on;quiet-indirect=on;unroll-checks=on;hoist-calls=on;counted-loops=on;counted-nests=on;bulk-chunks=on;trim-outlined=on;turn-compares=on;lift-exits=on"
    );
    assert_eq!(section.mutable_globals, vec![0, 2]);
    assert_eq!(section.tables, 1);
    assert!(
        section.wasm_opt_version.contains("wasm-opt"),
        "{}",
        section.wasm_opt_version
    );
    assert_eq!(section.stats, p.stats);
    // Entry points only on the call cycle ($fib).
    assert_eq!((p.stats.loop_points, p.stats.function_points), (3, 1));
}

#[test]
fn point_counts_follow_the_policy() {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    for (policy, loops, entries) in [
        (PointPolicy::Loops, 3, 1),
        (PointPolicy::Functions, 0, 1),
        (PointPolicy::Manual, 0, 0),
    ] {
        let Some(p) = prepare_or_skip(&wasm, &opts(policy)) else {
            return;
        };
        assert_eq!(
            (p.stats.loop_points, p.stats.function_points),
            (loops, entries),
            "{policy}"
        );
        assert_eq!(p.section.points, policy);
    }
}

#[test]
fn deterministic_and_idempotent() {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    let Some(a) = prepare_or_skip(&wasm, &PrepareOptions::default()) else {
        return;
    };
    let b = prepare(&wasm, &PrepareOptions::default()).unwrap();
    assert_eq!(
        a.bytes, b.bytes,
        "same input and options must give the same bytes"
    );

    let again = prepare(&a.bytes, &opts(PointPolicy::Manual)).unwrap();
    assert!(again.already_prepared);
    assert_eq!(again.bytes, a.bytes);
    assert_eq!(again.section, a.section);

    let other = prepare(&wasm, &opts(PointPolicy::Functions)).unwrap();
    assert_ne!(other.bytes, a.bytes, "options must influence the output");
}

#[test]
fn refuses_before_looking_for_wasm_opt() {
    let wasm = wat::parse_str(r#"(module (memory 1) (func (export "main")))"#).unwrap();
    let o = PrepareOptions {
        wasm_opt: Some("/nonexistent/wasm-opt".into()),
        ..Default::default()
    };
    assert!(matches!(
        prepare(&wasm, &o),
        Err(PrepareError::Validate(ValidateError::NoStart))
    ));
}

#[test]
fn missing_wasm_opt_is_reported_with_install_hint() {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    let o = PrepareOptions {
        wasm_opt: Some("/nonexistent/wasm-opt".into()),
        ..Default::default()
    };
    let err = prepare(&wasm, &o).unwrap_err();
    assert!(
        err.to_string().contains("apt-get install binaryen"),
        "{err}"
    );
    assert!(err.to_string().contains("ROAM_WASM_OPT"), "{err}");
}

#[test]
fn corrupt_roam_section_is_not_mistaken_for_prepared() {
    let mut wasm = wat::parse_str(LOOPS_WAT).unwrap();
    wasm.extend([0, 7, 4]);
    wasm.extend(b"roam\x09\x00");
    let err = prepare(&wasm, &PrepareOptions::default()).unwrap_err();
    assert!(
        matches!(err, PrepareError::Section(SectionError::Truncated)),
        "{err}"
    );
}

#[test]
fn output_without_asyncify_exports_is_refused() {
    let wasm = wat::parse_str(r#"(module (memory (export "roam.memory") 1) (global (export "roam.flag") (mut i32) (i32.const 0)))"#).unwrap();
    let err = check_output(&wasm).unwrap_err();
    assert!(err.to_string().contains("asyncify_start_unwind"), "{err}");
    assert!(matches!(
        check_output(b"\0asm"),
        Err(PrepareError::OutputInvalid(_))
    ));
}

/// Found by the generated-program differential test: the optimiser removed
/// the only points (in code after a `return`), and the section still
/// counted them, so `prepare` refused its own output as inconsistent.
#[test]
fn points_the_optimiser_removes_are_not_counted() {
    let wasm = wat::parse_str(
        r#"(module (memory 1)
             (func (export "_start") (return) (loop $l (br $l))))"#,
    )
    .unwrap();
    for capture in [Capture::Returns, Capture::Eh, Capture::Asyncify] {
        let opts = PrepareOptions {
            capture,
            ..PrepareOptions::default()
        };
        let Some(p) = prepare_or_skip(&wasm, &opts) else {
            return;
        };
        assert_eq!(p.stats.loop_points + p.stats.function_points, 0);
        assert_eq!(p.section.stats, p.stats);
        crate::check_prepared(&p.bytes).unwrap();
    }
}

/// A threaded program's shape: an imported shared memory, a wait in a
/// loop reached from `wasi_thread_start`.
const THREADED_WAT: &str = r#"(module
  (import "env" "memory" (memory 1 1 shared))
  (func $park (param i32)
    (loop $l
      (br_if $l (i32.eq (memory.atomic.wait32 (local.get 0) (i32.const 0) (i64.const -1))
                        (i32.const 0)))))
  (func (export "wasi_thread_start") (param i32 i32) (call $park (local.get 1)))
  (func (export "_start") (drop (i32.atomic.rmw.add (i32.const 0) (i32.const 1)))))"#;

#[test]
fn a_threaded_program_is_prepared_by_returns_only() {
    let wasm = wat::parse_str(THREADED_WAT).unwrap();
    let Some(p) = prepare_or_skip(&wasm, &PrepareOptions::default()) else {
        return;
    };
    let names = export_names(&p.bytes);
    assert!(names.iter().any(|(n, _)| n == crate::REWIND_THREAD_EXPORT));
    // The wait is a call now, and the checked module has no raw one.
    crate::check_prepared(&p.bytes).unwrap();
    for capture in [Capture::Eh, Capture::Asyncify] {
        let opts = PrepareOptions {
            capture,
            ..PrepareOptions::default()
        };
        let Some(e) = prepare_err_or_skip(&wasm, &opts) else {
            return;
        };
        assert!(
            matches!(e, PrepareError::ThreadsNeedRecords(_)),
            "{capture:?}: {e}"
        );
    }
}
