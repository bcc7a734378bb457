//! Which calls can never unwind.
//!
//! Hoisting a loop's point (`hoist.rs`) and moving a loop into a function of
//! its own (`outline.rs`) both pay off only when nothing inside the loop can
//! unwind: then Asyncify leaves the loop's body alone. Both used to demand a
//! loop without any call, which left out the common loop that calls a small
//! helper, e.g. `dhrystone`'s main loop calling its `Proc_*` functions, or
//! a string compare moved out of it.
//!
//! A call may unwind when its callee can reach an unwinding import (the
//! blocking WASI calls of [`ASYNC_IMPORTS`] or `roam.migration_point`) or a
//! function that gets a migration point of its own: one with a loop (under
//! `loops` and `outer`), or one on a call cycle that calls (its entry point).
//! Every other callee is *quiet*: it runs to its end in bounded time and
//! cannot unwind, so a loop that calls only quiet functions is as good as a
//! loop that calls nothing. Indirect calls are never quiet here: Binaryen's
//! own analysis (the default `--asyncify-scope all`) assumes they may
//! unwind, and a hoisted loop gains nothing if Asyncify instruments it
//! anyway.
//!
//! Being wrong in the quiet direction could only cost speed, never
//! correctness: Asyncify decides by its own analysis (or by the list
//! `callgraph.rs` computes) what it instruments, and a hoisted or moved
//! loop keeps its flag check.

use std::collections::HashSet;

use walrus::ir::Instr;
use walrus::{FunctionId, FunctionKind, ImportKind, LocalFunction, Module};

use crate::callgraph::CallGraph;
use crate::outline::walk;
use crate::{EntryPoints, PointPolicy, ASYNC_IMPORTS, POINT_FUNC, POINT_MODULE};

/// The functions a call to which cannot unwind.
#[derive(Debug, Default)]
pub(crate) struct Quiet(HashSet<FunctionId>);

impl Quiet {
    /// Compute the quiet functions of `module`, whose call graph is
    /// `graph`, under `policy`; `cycles` is the set of functions on a call
    /// cycle when only those get entry points ([`EntryPoints::Cycles`]).
    pub(crate) fn new(
        module: &Module,
        graph: &CallGraph,
        policy: PointPolicy,
        entries: EntryPoints,
        cycles: Option<&HashSet<FunctionId>>,
    ) -> Self {
        let unwinding: HashSet<FunctionId> = ASYNC_IMPORTS
            .iter()
            .chain([&(POINT_MODULE, POINT_FUNC)])
            .filter_map(|(m, n)| module.imports.find(m, n))
            .filter_map(|id| match module.imports.get(id).kind {
                ImportKind::Function(f) => Some(f),
                _ => None,
            })
            .collect();
        let pointed = |id: FunctionId| match &module.funcs.get(id).kind {
            FunctionKind::Local(func) => {
                let (loops, calls) = shape(func);
                let loop_points = matches!(policy, PointPolicy::Loops | PointPolicy::Outer);
                let entry_allowed = match entries {
                    EntryPoints::Cycles => cycles.is_some_and(|c| c.contains(&id)),
                    EntryPoints::All => true,
                };
                (loop_points && loops) || (policy != PointPolicy::Manual && calls && entry_allowed)
            }
            _ => false,
        };
        let loud = graph.reaching(|f| unwinding.contains(&f) || pointed(f));
        Quiet(
            module
                .funcs
                .iter()
                .map(|f| f.id())
                .filter(|id| !loud.contains(id))
                .collect(),
        )
    }

    /// Whether a call of `f` can never unwind.
    pub(crate) fn contains(&self, f: FunctionId) -> bool {
        self.0.contains(&f)
    }

    /// Whether `instr` is a call that may unwind.
    pub(crate) fn may_unwind(&self, instr: &Instr) -> bool {
        match instr {
            Instr::Call(c) => !self.0.contains(&c.func),
            Instr::CallIndirect(_) | Instr::CallRef(_) => true,
            Instr::ReturnCall(_) | Instr::ReturnCallIndirect(_) | Instr::ReturnCallRef(_) => true,
            _ => false,
        }
    }
}

/// Whether `func` has a loop, and whether it calls.
fn shape(func: &LocalFunction) -> (bool, bool) {
    let (mut loops, mut calls) = (false, false);
    walk(func, func.entry_block(), &mut |instr| match instr {
        Instr::Loop(_) => loops = true,
        Instr::Call(_) | Instr::CallIndirect(_) | Instr::CallRef(_) => calls = true,
        _ => {}
    });
    (loops, calls)
}

#[cfg(test)]
mod tests {
    use walrus::ir::Call;

    use super::*;

    const WAT: &str = r#"(module
      (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
      (func $leaf (export "leaf") (param i32) (result i32) (i32.add (local.get 0) (i32.const 1)))
      (func $writes (export "writes") (result i32) (call $write (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 0)))
      (func $reads (export "reads") (result i32) (call $read (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))
      (func $loops (export "loops") (loop $l (br_if $l (i32.const 0))))
      (func $calls_loops (export "calls_loops") (call $loops))
      (func $calls_leaf (export "calls_leaf") (result i32) (call $leaf (i32.const 1)))
      (func $recurses (export "recurses") (param i32) (result i32)
        (if (result i32) (local.get 0)
          (then (call $recurses (i32.sub (local.get 0) (i32.const 1))))
          (else (i32.const 0)))))"#;

    fn quiet(policy: PointPolicy) -> (Module, Quiet) {
        let module = Module::from_buffer(&wat::parse_str(WAT).unwrap()).unwrap();
        let graph = CallGraph::new(&module);
        let cycles = graph.on_cycle();
        let quiet = Quiet::new(&module, &graph, policy, EntryPoints::Cycles, Some(&cycles));
        (module, quiet)
    }

    fn loud(module: &Module, quiet: &Quiet, name: &str) -> bool {
        let func = module.exports.get_func(name).unwrap();
        quiet.may_unwind(&Instr::Call(Call { func }))
    }

    #[test]
    fn calls_that_reach_no_point_and_no_blocking_import_are_quiet() {
        let (module, q) = quiet(PointPolicy::Loops);
        for name in ["leaf", "writes", "calls_leaf"] {
            assert!(!loud(&module, &q, name), "{name} is quiet");
        }
        for name in ["reads", "loops", "calls_loops", "recurses"] {
            assert!(loud(&module, &q, name), "{name} may unwind");
        }
        // Without loop points a loop is no point; an entry still is.
        let (module, q) = quiet(PointPolicy::Functions);
        assert!(!loud(&module, &q, "calls_loops"));
        assert!(loud(&module, &q, "recurses"));
        let (module, q) = quiet(PointPolicy::Manual);
        assert!(!loud(&module, &q, "recurses"));
        assert!(loud(&module, &q, "reads"));
    }

    #[test]
    fn indirect_calls_are_never_quiet() {
        let wat = r#"(module
          (type $t (func (param i32) (result i32)))
          (table 1 funcref)
          (func $leaf (type $t) (local.get 0))
          (elem (i32.const 0) $leaf)
          (func (export "f") (result i32) (call_indirect (type $t) (i32.const 1) (i32.const 0))))"#;
        let module = Module::from_buffer(&wat::parse_str(wat).unwrap()).unwrap();
        let graph = CallGraph::new(&module);
        let q = Quiet::new(&module, &graph, PointPolicy::Loops, EntryPoints::All, None);
        let f = module.exports.get_func("f").unwrap();
        let FunctionKind::Local(func) = &module.funcs.get(f).kind else {
            panic!("f is local")
        };
        let calls: Vec<bool> = func
            .block(func.entry_block())
            .instrs
            .iter()
            .filter(|(i, _)| matches!(i, Instr::CallIndirect(_)))
            .map(|(i, _)| q.may_unwind(i))
            .collect();
        assert_eq!(calls, [true]);
    }
}
