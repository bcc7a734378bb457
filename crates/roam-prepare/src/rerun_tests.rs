//! Which loops leave to an enclosing loop's point: the analysis alone. The
//! transformed code is run in `hoist_tests.rs`.

use walrus::ir::{Instr, InstrSeqId};
use walrus::{LocalFunction, Module};

use super::{owners, Nested};
use crate::quiet::Quiet;

fn collect(func: &LocalFunction, seq: InstrSeqId, enclosing: Option<usize>, out: &mut Vec<Nested>) {
    for (instr, _) in &func.block(seq).instrs {
        match instr {
            Instr::Block(b) => collect(func, b.seq, enclosing, out),
            Instr::Loop(l) => {
                out.push(Nested {
                    seq: l.seq,
                    enclosing,
                });
                let me = out.len() - 1;
                collect(func, l.seq, Some(me), out);
            }
            Instr::IfElse(i) => {
                collect(func, i.consequent, enclosing, out);
                collect(func, i.alternative, enclosing, out);
            }
            _ => {}
        }
    }
}

/// How many loops of the module's only function leave to another's point.
fn owned(body: &str) -> usize {
    let wat = format!(
        "(module (memory 1) (func (param $n i32) (result i64) \
         (local $i i32) (local $j i32) (local $k i32) (local $s i64) (local $acc i64) {body}))"
    );
    let module = Module::from_buffer(&wat::parse_str(wat).unwrap()).unwrap();
    let (_, func) = module.funcs.iter_local().next().unwrap();
    let mut loops = Vec::new();
    collect(func, func.entry_block(), None, &mut loops);
    owners(func, &loops, &Quiet::default()).len()
}

/// A `while` loop whose body is `$head`, then `$s = 0; $j = 0`, then an
/// inner loop summing into `$s`, then `$tail`; returns `$ret`.
fn nest(head: &str, tail: &str, ret: &str) -> String {
    format!(
        "(block $done (loop $outer
           {head}
           (local.set $s (i64.const 0))
           (local.set $j (i32.const 0))
           (loop $inner
             (local.set $s (i64.add (local.get $s)
               (i64.load (i32.shl (local.get $j) (i32.const 3)))))
             (local.set $j (i32.add (local.get $j) (i32.const 1)))
             (br_if $inner (i32.lt_u (local.get $j) (local.get $i))))
           {tail}
           (local.set $acc (i64.add (local.get $acc) (local.get $s)))
           (local.set $i (i32.add (local.get $i) (i32.const 1)))
           (br $outer)))
         (local.get {ret})"
    )
}

const EXIT: &str = "(br_if $done (i32.ge_u (local.get $i) (local.get $n)))";

#[test]
fn a_stretch_that_only_computes_owns_its_inner_loop() {
    assert_eq!(owned(&nest(EXIT, "", "$acc")), 1);
    // A store after the inner loop is not in the stretch.
    let store = "(i64.store (i32.const 0) (local.get $s))";
    assert_eq!(owned(&nest(EXIT, store, "$acc")), 1);
}

#[test]
fn a_store_or_a_memory_grow_before_the_inner_loop_keeps_it_apart() {
    let store = "(i64.store (i32.const 0) (local.get $acc))";
    assert_eq!(owned(&nest(&format!("{EXIT} {store}"), "", "$acc")), 0);
    let grow = "(drop (memory.grow (i32.const 0)))";
    assert_eq!(owned(&nest(&format!("{EXIT} {grow}"), "", "$acc")), 0);
}

#[test]
fn a_local_read_before_the_stretch_sets_it_keeps_the_inner_loop_apart() {
    // `$s` carried from one iteration into the next.
    let carried = nest(EXIT, "", "$acc").replace("(local.set $s (i64.const 0))", "");
    assert_eq!(owned(&carried), 0);
    // `$s` read after the loop, which leaves before `$s` is set: a half-done
    // stretch would be seen there.
    assert_eq!(owned(&nest(EXIT, "", "$s")), 0);
    // Leaving at the bottom instead (do-while), `$s` is always set by then.
    let bottom = nest("", "", "$s").replace(
        "(br $outer)",
        "(br_if $outer (i32.lt_u (local.get $i) (local.get $n)))",
    );
    assert_eq!(owned(&bottom), 1);
}

#[test]
fn every_inner_loop_of_a_nest_leaves_to_the_outermost_owner() {
    let deep = nest(EXIT, "", "$acc").replace(
        "(local.set $j (i32.add (local.get $j) (i32.const 1)))",
        "(local.set $k (i32.const 0))
         (loop $innermost
           (local.set $s (i64.add (local.get $s) (i64.extend_i32_u (local.get $k))))
           (local.set $k (i32.add (local.get $k) (i32.const 1)))
           (br_if $innermost (i32.lt_u (local.get $k) (local.get $j))))
         (local.set $j (i32.add (local.get $j) (i32.const 1)))",
    );
    assert_eq!(owned(&deep), 2);
}
