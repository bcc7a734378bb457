use super::*;

/// A minimal command around `body` (module fields).
fn command(body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module {body} (memory 1) (func $_start (export "_start")))"#
    ))
    .unwrap()
}

fn refusal(body: &str) -> String {
    validate(&command(body)).unwrap_err().to_string()
}

#[test]
fn accepts_a_plain_command_and_summarises_it() {
    let wasm = wat::parse_str(
        r#"(module
            (import "roam" "migration_point" (func $mp))
            (import "env" "g" (global $g (mut i32)))
            (global $sp (mut i32) (i32.const 1024))
            (global $k i32 (i32.const 7))
            (global $h (mut i64) (i64.const 0))
            (table 2 funcref)
            (memory 2 10)
            (func $_start (export "_start") call $mp call $mp))"#,
    )
    .unwrap();
    let info = validate(&wasm).unwrap();
    assert_eq!(info.imported_functions, 1);
    assert_eq!(info.defined_functions, 1);
    assert_eq!(info.memory_initial_pages, 2);
    assert_eq!(info.memory_maximum_pages, Some(10));
    assert_eq!(info.mutable_globals, vec![0, 1, 3]);
    assert_eq!(info.tables, 1);
    assert_eq!(info.migration_point_import, Some(0));
    assert_eq!(info.manual_points, 2);
    assert!(!info.has_debug_sections);
}

#[test]
fn refuses_table_grow_naming_function_and_feature() {
    let msg = refusal(
        r#"(table 1 funcref)
           (func $ok)
           (func $push_frame (drop (table.grow 0 (ref.null func) (i32.const 1))))"#,
    );
    assert!(msg.contains("function 1 `push_frame`"), "{msg}");
    assert!(msg.contains("`table.grow`"), "{msg}");
    assert!(msg.contains("tables mutated at run time"), "{msg}");
}

#[test]
fn refuses_every_table_mutation() {
    for (instr, code) in [
        ("table.set", "(table.set 0 (i32.const 0) (ref.null func))"),
        (
            "table.fill",
            "(table.fill 0 (i32.const 0) (ref.null func) (i32.const 1))",
        ),
        (
            "table.copy",
            "(table.copy (i32.const 0) (i32.const 0) (i32.const 0))",
        ),
        (
            "table.init",
            "(table.init 0 (i32.const 0) (i32.const 0) (i32.const 0))",
        ),
    ] {
        let msg = refusal(&format!(
            "(table 1 funcref) (elem funcref (ref.func $f)) (func $f {code})"
        ));
        assert!(msg.contains(&format!("`{instr}`")), "{msg}");
        assert!(msg.contains("function 0 `f`"), "{msg}");
    }
}

#[test]
fn accepts_an_imported_shared_memory_and_atomics_but_no_shared_memory_of_its_own() {
    let threaded = wat::parse_str(
        r#"(module (import "env" "memory" (memory 1 1 shared))
            (func $bump (drop (i32.atomic.rmw.add (i32.const 0) (i32.const 1)))
              (drop (memory.atomic.notify (i32.const 0) (i32.const 1)))
              (drop (memory.atomic.wait32 (i32.const 0) (i32.const 0) (i64.const 0))))
            (func $_start (export "_start")))"#,
    )
    .unwrap();
    let info = validate(&threaded).unwrap();
    assert!(info.shared_memory);
    // Once prepared, a raw wait is refused: nothing could interrupt it.
    let msg = crate::validate::validate_as(&threaded, true)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`memory.atomic.wait32`"), "{msg}");
    assert!(msg.contains("function 0 `bump`"), "{msg}");

    let own =
        wat::parse_str(r#"(module (memory 1 1 shared) (func $_start (export "_start")))"#).unwrap();
    let msg = validate(&own).unwrap_err().to_string();
    assert!(msg.contains("shared memory of its own"), "{msg}");

    let unshared = wat::parse_str(
        r#"(module (import "env" "memory" (memory 1)) (func $_start (export "_start")))"#,
    )
    .unwrap();
    let msg = validate(&unshared).unwrap_err().to_string();
    assert!(msg.contains("imports its memory"), "{msg}");
}

#[test]
fn refuses_exception_handling() {
    let msg = refusal(r#"(tag $e) (func $boom (throw $e))"#);
    assert!(msg.contains("exception tags (exception handling)"), "{msg}");
    let msg = refusal(r#"(func $catcher (try_table (nop)))"#);
    assert!(msg.contains("function 0 `catcher`"), "{msg}");
    assert!(msg.contains("`try_table`"), "{msg}");
    assert!(msg.contains("exception handling"), "{msg}");
}

#[test]
fn refuses_memory64_multi_memory_and_imported_memory() {
    let m64 = wat::parse_str(r#"(module (memory i64 1) (func (export "_start")))"#).unwrap();
    assert!(validate(&m64).unwrap_err().to_string().contains("memory64"));
    let multi =
        wat::parse_str(r#"(module (memory 1) (memory 1) (func (export "_start")))"#).unwrap();
    assert!(validate(&multi)
        .unwrap_err()
        .to_string()
        .contains("multi-memory"));
    let imported =
        wat::parse_str(r#"(module (import "env" "memory" (memory 1)) (func (export "_start")))"#)
            .unwrap();
    let msg = validate(&imported).unwrap_err().to_string();
    assert!(msg.contains("imports its memory (`env.memory`)"), "{msg}");
}

#[test]
fn refuses_tail_calls() {
    let msg = refusal(r#"(func $loop_forever (return_call $loop_forever))"#);
    assert!(msg.contains("function 0 `loop_forever`"), "{msg}");
    assert!(msg.contains("`return_call`"), "{msg}");
}

#[test]
fn refuses_missing_start_and_missing_memory() {
    let no_start = wat::parse_str(r#"(module (memory 1) (func (export "main")))"#).unwrap();
    assert!(matches!(validate(&no_start), Err(ValidateError::NoStart)));
    let no_mem = wat::parse_str(r#"(module (func (export "_start")))"#).unwrap();
    assert!(matches!(validate(&no_mem), Err(ValidateError::NoMemory)));
}

#[test]
fn refuses_wrong_migration_point_signature() {
    let msg = refusal(r#"(import "roam" "migration_point" (func (param i32)))"#);
    assert!(msg.contains("1 parameter(s) and 0 result(s)"), "{msg}");
    assert!(msg.contains("[] -> []"), "{msg}");
    let msg = refusal(r#"(import "roam" "migration_point" (global i32))"#);
    assert!(msg.contains("non-function"), "{msg}");
    let msg = refusal(r#"(import "roam" "checkpoint" (func))"#);
    assert!(msg.contains("`roam.checkpoint`"), "{msg}");
}

#[test]
fn refuses_garbage_and_truncation_precisely() {
    let err = validate(b"hello").unwrap_err();
    assert!(matches!(err, ValidateError::Invalid(_)), "{err}");
    let mut wasm = command("");
    wasm.truncate(wasm.len() - 3);
    let err = validate(&wasm).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("not a valid WebAssembly module"),
        "{err}"
    );
}

#[test]
fn refuses_components() {
    let component = wat::parse_str("(component)").unwrap();
    assert!(matches!(
        validate(&component),
        Err(ValidateError::Component)
    ));
}

#[test]
fn catch_all_refuses_features_outside_wasm2() {
    // extended-const in a global initialiser has no instruction in a function.
    let msg = refusal(r#"(global i32 (i32.add (i32.const 1) (i32.const 2)))"#);
    assert!(msg.contains("does not support"), "{msg}");
}

/// A command whose function `$deep` nests `depth` blocks inside a loop.
fn nested(depth: u32) -> Vec<u8> {
    let d = depth as usize;
    wat::parse_str(format!(
        r#"(module (memory 1)
             (func $deep (loop $l (br_if $l (i32.const 0)) {}(nop){}))
             (func $_start (export "_start") (call $deep)))"#,
        "(block ".repeat(d - 1),
        ")".repeat(d - 1),
    ))
    .unwrap()
}

#[test]
fn nesting_past_the_limit_is_refused_and_names_the_function() {
    let err = validate(&nested(MAX_NESTING + 1)).unwrap_err();
    assert!(matches!(err, ValidateError::TooDeep { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("`deep`"), "{text}");
    assert!(text.contains("10000 deep"), "{text}");
}

#[test]
fn nesting_at_the_limit_is_prepared_from_a_small_stack() {
    let wasm = nested(MAX_NESTING);
    validate(&wasm).unwrap();
    // Tokio's blocking threads, where a node prepares uploads, have 2 MiB.
    let out = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let opts = crate::PrepareOptions::default();
            crate::pipeline::tests::prepare_or_skip(&wasm, &opts).map(|p| p.bytes.len())
        })
        .unwrap()
        .join()
        .expect("preparing must not overflow the caller's 2 MiB stack");
    if let Some(len) = out {
        assert!(len > 0);
    }
}

/// Found by the generated-program differential test: `wasm-opt` failed on
/// such a block with "Block requires more values than are available".
#[test]
fn refuses_blocks_with_parameters_but_not_functions_with_several_results() {
    let msg = refusal(
        r#"(type $t (func (param i32) (result i32)))
           (func $pair (result i32 i64) (i32.const 1) (i64.const 2))
           (func $inc (i32.const 1) (block (type $t) (i32.add (i32.const 1))) (drop))"#,
    );
    assert!(msg.contains("function 1 `inc`"), "{msg}");
    assert!(msg.contains("block with 1 parameter(s)"), "{msg}");
    assert!(msg.contains("Binaryen cannot read"), "{msg}");
    validate(&command(
        r#"(func $pair (result i32 i64) (i32.const 1) (i64.const 2))
           (func $ok (result i32) (block (result i32) (i32.const 1)))"#,
    ))
    .unwrap();
}
