use super::*;
use crate::instrument::tests::LOOPS_WAT;
use crate::section::append_section;
use crate::{
    prepare, Capture, PointStats, PrepareError, PrepareOptions, Prepared, SECTION_VERSION,
};

/// A section as `prepare` would write it for `LOOPS_WAT`.
fn plausible_section() -> RoamSection {
    RoamSection {
        version: SECTION_VERSION,
        source_hash: [7; 32],
        points: PointPolicy::Loops,
        options: PrepareOptions {
            capture: Capture::Asyncify,
            ..PrepareOptions::default()
        }
        .canonical(),
        stats: PointStats {
            loop_points: 3,
            function_points: 2,
            manual_points: 0,
            functions: 3,
        },
        wasm_opt_version: "wasm-opt version 116".into(),
        mutable_globals: vec![0, 2],
        tables: 1,
    }
}

/// Prepare `LOOPS_WAT`; without `wasm-opt` skip, except under CI.
fn prepared() -> Option<Prepared> {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    match prepare(&wasm, &PrepareOptions::default()) {
        Err(PrepareError::WasmOptMissing { path }) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "wasm-opt ({}) is required under CI",
                path.display()
            );
            eprintln!("skipping: {} not installed", path.display());
            None
        }
        other => Some(other.unwrap()),
    }
}

/// `p`'s bytes with its `roam` section replaced by `section`.
fn restamp(p: &Prepared, section: &RoamSection) -> Vec<u8> {
    let mut stamp = Vec::new();
    append_section(&mut stamp, &p.section);
    let mut bytes = p.bytes[..p.bytes.len() - stamp.len()].to_vec();
    append_section(&mut bytes, section);
    bytes
}

#[test]
fn a_forged_section_on_an_unprepared_module_is_refused() {
    // Before this check, `prepare` returned such a module as is, marked
    // `already_prepared`.
    let mut wasm = wat::parse_str(LOOPS_WAT).unwrap();
    append_section(&mut wasm, &plausible_section());
    let err = prepare(&wasm, &PrepareOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            PrepareError::NotPrepared(CheckError::Inconsistent { .. })
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("does not match its contents"), "{msg}");
    assert!(msg.contains("asyncify_start_unwind"), "{msg}");
    assert!(msg.contains("prepare the original module"), "{msg}");
}

#[test]
fn an_unprepared_module_has_no_section() {
    let wasm = wat::parse_str(LOOPS_WAT).unwrap();
    assert!(matches!(check_prepared(&wasm), Err(CheckError::NoSection)));
}

#[test]
fn a_real_prepared_module_passes_and_preparing_it_again_is_a_no_op() {
    let Some(p) = prepared() else { return };
    assert_eq!(check_prepared(&p.bytes).unwrap(), p.section);
    let again = prepare(&p.bytes, &PrepareOptions::default()).unwrap();
    assert!(again.already_prepared);
    assert_eq!(again.bytes, p.bytes);
    // Restamping the same section changes nothing.
    assert_eq!(restamp(&p, &p.section), p.bytes);
}

#[test]
fn a_section_that_lies_about_the_module_is_refused() {
    let Some(p) = prepared() else { return };
    let lies: Vec<(RoamSection, &str)> = vec![
        (
            RoamSection {
                mutable_globals: vec![0],
                ..p.section.clone()
            },
            "lists mutable globals {0} but the module exports {0, 2}",
        ),
        (
            RoamSection {
                tables: 2,
                ..p.section.clone()
            },
            "counts 2 tables, the module has 1",
        ),
        (
            RoamSection {
                points: PointPolicy::Manual,
                ..p.section.clone()
            },
            "manual only",
        ),
    ];
    for (section, why) in lies {
        let err = check_prepared(&restamp(&p, &section)).unwrap_err();
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}

/// A hand-made module with stub Asyncify exports (which pass the export
/// checks), two hidden mutable globals (as many as Asyncify may keep), and
/// `extra` globals, stamped with a section that lists no state.
fn hand_made(extra: &str) -> Vec<u8> {
    let wat = format!(
        r#"(module
      (import "roam" "migration_point" (func))
      (global $flag (export "roam.flag") (mut i32) (i32.const 0))
      (global (mut i32) (i32.const 0))
      (global (mut i32) (i32.const 0))
      {extra}
      (memory (export "roam.memory") 1)
      (func (export "_start"))
      (func (export "asyncify_start_unwind") (param i32))
      (func (export "asyncify_stop_unwind"))
      (func (export "asyncify_start_rewind") (param i32))
      (func (export "asyncify_stop_rewind"))
      (func (export "asyncify_get_state") (result i32) (i32.const 0)))"#
    );
    let mut wasm = wat::parse_str(wat).unwrap();
    let section = RoamSection {
        mutable_globals: vec![],
        tables: 0,
        ..plausible_section()
    };
    append_section(&mut wasm, &section);
    wasm
}

#[test]
fn unexported_program_state_is_refused() {
    // One hidden mutable global more than Asyncify's two.
    let wasm = hand_made("(global (mut i32) (i32.const 0))");
    let err = check_prepared(&wasm).unwrap_err();
    assert!(
        err.to_string()
            .contains("3 mutable globals are not exported"),
        "{err}"
    );
}

#[test]
fn scratch_globals_are_accepted_only_as_mutable_globals() {
    // Exported as the scratch copies of spilled points, more globals are
    // accepted; a `roam.spill.` export that is not a mutable global is not.
    let ok = hand_made(
        r#"(global (export "roam.spill.0") (mut i32) (i32.const 0))
           (global (export "roam.spill.1") (mut f64) (f64.const 0))"#,
    );
    check_prepared(&ok).unwrap();
    let bad = hand_made(r#"(global (export "roam.spill.0") i32 (i32.const 0))"#);
    let err = check_prepared(&bad).unwrap_err();
    assert!(
        err.to_string()
            .contains("export `roam.spill.0` is not a mutable global"),
        "{err}"
    );
}
