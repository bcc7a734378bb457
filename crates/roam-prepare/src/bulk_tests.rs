//! Long bulk-memory instructions in chunks: run on wasmtime, every fill and
//! copy leaves memory exactly as the uninstrumented instruction does
//! (overlaps both ways, exact chunk multiples, traps that write nothing),
//! and a long one calls the point between chunks while a short one runs
//! inline.

use wasmtime::{Engine, Instance, Module, Store, Val};

use super::CHUNK;
use crate::hoist::tests::{body, instantiate, prepare_wat_with, Host};
use crate::{BulkChunks, PrepareOptions, FLAG_GLOBAL_EXPORT};

const PAGES: usize = 64;
const SIZE: i32 = (PAGES << 16) as i32;

pub(crate) const WAT: &str = r#"(module
  (memory (export "memory") 64)
  (func (export "_start"))
  (func (export "fill") (param $d i32) (param $v i32) (param $n i32)
    (memory.fill (local.get $d) (local.get $v) (local.get $n)))
  (func (export "copy") (param $d i32) (param $s i32) (param $n i32)
    (memory.copy (local.get $d) (local.get $s) (local.get $n)))
  ;; A constant length of one chunk: left inline.
  (func (export "short") (param $d i32) (param $s i32) (param $n i32)
    (memory.copy (local.get $d) (local.get $s) (i32.const 65536)))
)"#;

fn prepared(bulk: BulkChunks) -> Vec<u8> {
    let opts = PrepareOptions {
        bulk_chunks: bulk,
        ..PrepareOptions::default()
    };
    prepare_wat_with(WAT, &opts)
}

/// A pattern no fill or copy can produce by accident.
fn pattern() -> &'static [u8] {
    static PATTERN: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| roam_testkit::pseudo_random(SIZE as usize, 0x9e37_79b9))
}

/// Memory after `name(args)` on a patterned memory, whether it trapped,
/// and the point's calls (`wasm` prepared, the flag held up) or `None`
/// (the uninstrumented module).
fn run(wasm: Option<&[u8]>, name: &str, args: [i32; 3]) -> (Vec<u8>, bool, Option<u32>) {
    let engine = Engine::default();
    let (mut store, instance, calls) = match wasm {
        Some(w) => {
            let (mut store, instance, calls) = instantiate(&engine, w, Host::Hold);
            let flag = instance.get_global(&mut store, FLAG_GLOBAL_EXPORT).unwrap();
            flag.set(&mut store, Val::I32(1)).unwrap();
            (store, instance, Some(calls))
        }
        None => {
            let m = Module::new(&engine, wat::parse_str(WAT).unwrap()).unwrap();
            let mut store = Store::new(&engine, ());
            let i = Instance::new(&mut store, &m, &[]).unwrap();
            (store, i, None)
        }
    };
    let memory = instance.get_memory(&mut store, "memory").unwrap();
    memory.data_mut(&mut store).copy_from_slice(pattern());
    let f = instance.get_func(&mut store, name).unwrap();
    let args = args.map(Val::I32);
    let trapped = f.call(&mut store, &args, &mut []).is_err();
    let bytes = memory.data(&store).to_vec();
    let calls = calls.map(|c| c.load(std::sync::atomic::Ordering::Relaxed));
    (bytes, trapped, calls)
}

/// Runs `name(args)` both ways and checks they agree; returns the calls.
fn agree(wasm: &[u8], name: &str, args: [i32; 3]) -> u32 {
    let (want, want_trap) = {
        let (m, t, _) = run(None, name, args);
        (m, t)
    };
    let (got, trapped, calls) = run(Some(wasm), name, args);
    assert_eq!(trapped, want_trap, "{name}{args:?}: trap");
    if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("{name}{args:?}: memory differs first at byte {at}");
    }
    calls.expect("prepared")
}

#[test]
fn fills_and_copies_leave_memory_as_the_plain_instructions_do() {
    let wasm = prepared(BulkChunks::On);
    let c = CHUNK;
    let lengths = [0, 1, c - 1, c, c + 1, 2 * c, 3 * c + 17];
    for n in lengths {
        for d in [0, 5, SIZE - n] {
            agree(&wasm, "fill", [d, 0x1ab, n]);
        }
        // Overlapping both ways, by less than a chunk and by more, and
        // the same place.
        let base = 4 * c + 3;
        for delta in [1, 100, c - 1, c + 7, 3 * c] {
            agree(&wasm, "copy", [base, base + delta, n]);
            agree(&wasm, "copy", [base + delta, base, n]);
        }
        agree(&wasm, "copy", [base, base, n]);
    }
    // The whole memory, and ranges reaching one byte past the end, or
    // wrapping round 2^32: each traps before writing anything.
    agree(&wasm, "fill", [0, 7, SIZE]);
    agree(&wasm, "copy", [1, 0, SIZE - 1]);
    for (d, s, n) in [
        (SIZE - 3 * c, 0, 3 * c + 1),
        (0, SIZE - 3 * c, 3 * c + 1),
        (c, 0, -c),
        (-1, 0, 2 * c),
    ] {
        agree(&wasm, "fill", [d, 3, n]);
        agree(&wasm, "copy", [d, s, n]);
    }
}

#[test]
fn a_long_fill_or_copy_calls_the_point_between_chunks() {
    let wasm = prepared(BulkChunks::On);
    let off = prepared(BulkChunks::Off);
    let c = CHUNK;
    // The flag held up: every check calls in. The chunks' loop checks on
    // entry and before each further chunk; a run of at most one chunk
    // never enters it.
    for (n, checks) in [(1, 0), (c, 0), (c + 1, 2), (10 * c, 10), (10 * c + 1, 11)] {
        assert_eq!(agree(&wasm, "fill", [0, 1, n]), checks, "fill of {n}");
        assert_eq!(agree(&wasm, "copy", [0, 7, n]), checks, "copy of {n}");
        assert_eq!(agree(&wasm, "copy", [7, 0, n]), checks, "copy back of {n}");
        assert_eq!(run(Some(&off), "fill", [0, 1, n]).2, Some(0), "off: {n}");
    }
    // A constant length of one chunk stays one instruction.
    assert_eq!(agree(&wasm, "short", [0, 7, 0]), 0);
    assert!(!body(&wasm, "short")
        .iter()
        .any(|o| matches!(o, wasmparser::Operator::Call { .. })));
}
