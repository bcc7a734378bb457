//! Tests of `leave.rs`: which functions leave, that the calls move out of
//! them, and that every run prints and ends exactly as before.

use std::sync::{Arc, Mutex};

use wasmtime::{Caller, Engine, Linker, Module as WasmModule, Store};

use super::lift_exits;
use crate::callgraph::CallGraph;
use crate::quiet::Quiet;
use crate::{EntryPoints, PointPolicy};

/// `fail` prints `times` lines and exits with `code`; `work` sums squares
/// and fails once the sum passes a limit; `mid` calls `work` twice; `deep`
/// calls itself down to `work`; `run` (exported) prints a line with
/// `mid`'s result and then calls `deep`; `_start` runs `run(20)`, which
/// fails.
pub(crate) const WAT: &str = include_str!("leave_fixture.wat");

/// `proc_exit`'s code, as the error that ends the call.
#[derive(Debug)]
struct Exit(i32);

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}

impl std::error::Error for Exit {}

/// What a run printed, and how it ended: its result, or the exit code.
#[derive(Debug, PartialEq)]
struct Ran {
    printed: Vec<u8>,
    ended: Result<i32, i32>,
}

fn run(wasm: &[u8], n: i32) -> Ran {
    let engine = Engine::default();
    let module = WasmModule::new(&engine, wasm).unwrap();
    let printed = Arc::new(Mutex::new(Vec::new()));
    let mut linker: Linker<()> = Linker::new(&engine);
    let out = printed.clone();
    linker
        .func_wrap(
            "wasi_snapshot_preview1",
            "fd_write",
            move |mut caller: Caller<'_, ()>, _fd: i32, _iov: i32, _n: i32, _w: i32| {
                let memory = caller.get_export("memory").unwrap().into_memory().unwrap();
                let data = memory.data(&caller);
                let (ptr, len) = (
                    u32::from_le_bytes(data[0..4].try_into().unwrap()) as usize,
                    u32::from_le_bytes(data[4..8].try_into().unwrap()) as usize,
                );
                out.lock().unwrap().extend_from_slice(&data[ptr..ptr + len]);
                0
            },
        )
        .unwrap();
    linker
        .func_wrap(
            "wasi_snapshot_preview1",
            "proc_exit",
            |code: i32| -> wasmtime::Result<()> { Err(wasmtime::Error::new(Exit(code))) },
        )
        .unwrap();
    let mut store = Store::new(&engine, ());
    let instance = linker.instantiate(&mut store, &module).unwrap();
    let f = instance
        .get_typed_func::<i32, i32>(&mut store, "run")
        .unwrap();
    let ended = f
        .call(&mut store, n)
        .map_err(|e| e.downcast_ref::<Exit>().expect("ended by proc_exit").0);
    let printed = printed.lock().unwrap().clone();
    Ran { printed, ended }
}

/// Lift the exits of `wat`; returns the original, the lifted module and
/// how many functions leave.
fn lifted(wat: &str) -> (Vec<u8>, Vec<u8>, usize) {
    let original = wat::parse_str(wat).unwrap();
    let mut module = walrus::Module::from_buffer(&original).unwrap();
    let graph = CallGraph::new(&module);
    let cycles = graph.on_cycle();
    let quiet = Quiet::new(
        &module,
        &graph,
        PointPolicy::Loops,
        EntryPoints::Cycles,
        Some(&cycles),
    );
    let count = lift_exits(&mut module, &quiet).unwrap();
    let out = module.emit_wasm();
    wasmparser::Validator::new()
        .validate_all(&out)
        .expect("the lifted module validates");
    (original, out, count)
}

/// The names of the functions `caller` calls directly, by the name
/// section.
fn calls_of(wasm: &[u8], caller: &str) -> Vec<String> {
    let module = walrus::Module::from_buffer(wasm).unwrap();
    let id = module.funcs.by_name(caller).expect("named function");
    let walrus::FunctionKind::Local(func) = &module.funcs.get(id).kind else {
        panic!("{caller} is local");
    };
    let mut out = Vec::new();
    crate::outline::walk(func, func.entry_block(), &mut |i| {
        if let walrus::ir::Instr::Call(c) = i {
            out.push(module.funcs.get(c.func).name.clone().unwrap_or_default());
        }
    });
    out
}

#[test]
fn the_calls_that_end_the_program_move_to_the_exported_caller() {
    let (_, out, count) = lifted(WAT);
    // `work`, `mid` and `deep` leave; `fail` never returns, `run` is
    // exported, `line` calls nothing that ends.
    assert_eq!(count, 3);
    for f in ["work", "mid", "deep"] {
        assert!(
            !calls_of(&out, f).contains(&"fail".to_string()),
            "{f} still calls fail"
        );
    }
    assert!(!calls_of(&out, "run").contains(&"fail".to_string()));
    assert!(calls_of(&out, "run").contains(&"roam_exit_dispatch".to_string()));
    assert_eq!(calls_of(&out, "roam_exit_dispatch"), ["fail"]);
    // `fail`'s own exit stays where it is.
    assert!(calls_of(&out, "fail").contains(&"exit".to_string()));
}

#[test]
fn every_run_prints_and_ends_as_before() {
    let (original, out, _) = lifted(WAT);
    // Small `n` return; from 12 on, `work` passes 500 and fails with
    // ever more lines.
    for n in [0, 1, 5, 11, 12, 13, 20, 40] {
        let want = run(&original, n);
        assert_eq!(run(&out, n), want, "run({n})");
        if n >= 12 {
            assert_eq!(want.ended, Err(3), "run({n}) fails");
        }
    }
}

#[test]
fn nothing_leaves_when_the_exit_cannot_unwind() {
    // With a block for its loop, `fail` prints one line and reaches no
    // point: its calls may stay where they are.
    let quiet_fail = WAT.replace("(loop $l", "(block $l");
    let (original, out, count) = lifted(&quiet_fail);
    assert_eq!(count, 0);
    assert_eq!(run(&out, 20), run(&original, 20));
}
