use super::*;

fn module(wat: &str) -> Module {
    Module::from_buffer(&wat::parse_str(wat).unwrap()).unwrap()
}

fn names(module: &Module, set: &HashSet<FunctionId>) -> Vec<String> {
    let mut out: Vec<String> = set
        .iter()
        .map(|f| module.funcs.get(*f).name.clone().unwrap())
        .collect();
    out.sort();
    out
}

fn named(module: &Module, name: &str) -> FunctionId {
    module.funcs.by_name(name).unwrap()
}

#[test]
fn direct_calls_reach_their_callers_only() {
    let m = module(
        r#"(module
          (import "env" "block" (func $block))
          (func $a (call $b))
          (func $b (call $block))
          (func $c (call $d))
          (func $d))"#,
    );
    let g = CallGraph::new(&m);
    let block = named(&m, "block");
    assert_eq!(names(&m, &g.reaching(|f| f == block)), ["a", "b", "block"]);
    assert!(g.on_cycle().is_empty());
}

#[test]
fn indirect_calls_resolve_by_signature() {
    let m = module(
        r#"(module
          (import "env" "block" (func $block))
          (type $v (func))
          (type $i (func (param i32)))
          (table 3 funcref)
          (elem (i32.const 0) $blocks $other_type)
          (func $blocks (call $block))
          (func $other_type (param i32))
          (func $not_in_table)
          (func $calls_v (call_indirect (type $v) (i32.const 0)))
          (func $calls_i (call_indirect (type $i) (i32.const 1) (i32.const 1))))"#,
    );
    let g = CallGraph::new(&m);
    let block = named(&m, "block");
    assert_eq!(
        names(&m, &g.reaching(|f| f == block)),
        ["block", "blocks", "calls_v"]
    );
}

#[test]
fn recursion_through_a_table_is_a_cycle() {
    let m = module(
        r#"(module
          (type $v (func))
          (table 1 funcref)
          (elem (i32.const 0) $ping)
          (func $ping (call $pong))
          (func $pong (call_indirect (type $v) (i32.const 0)))
          (func $self (call $self))
          (func $main (call $ping) (call $self)))"#,
    );
    assert_eq!(
        names(&m, &CallGraph::new(&m).on_cycle()),
        ["ping", "pong", "self"]
    );
}

#[test]
fn unknown_table_contents_are_the_worst_case() {
    let m = module(
        r#"(module
          (import "env" "t" (table 1 funcref))
          (type $v (func))
          (func $calls (call_indirect (type $v) (i32.const 0)))
          (func $main (call $calls))
          (func $idle))"#,
    );
    let g = CallGraph::new(&m);
    assert_eq!(names(&m, &g.reaching(|_| false)), ["calls", "main"]);
    assert_eq!(names(&m, &g.on_cycle()), ["calls"]);
}

#[test]
fn elements_given_as_expressions_count() {
    let m = module(
        r#"(module
          (import "env" "block" (func $block))
          (type $v (func))
          (table 2 funcref)
          (elem (i32.const 0) funcref (ref.func $blocks) (ref.null func))
          (func $blocks (call $block))
          (func $calls (call_indirect (type $v) (i32.const 0))))"#,
    );
    let g = CallGraph::new(&m);
    let block = named(&m, "block");
    assert_eq!(
        names(&m, &g.reaching(|f| f == block)),
        ["block", "blocks", "calls"]
    );
}

#[test]
fn deep_chains_do_not_overflow_the_stack() {
    let mut wat = String::from("(module");
    for i in 0..20_000 {
        wat.push_str(&format!(" (func $f{i} (call $f{}))", (i + 1) % 20_000));
    }
    wat.push(')');
    let m = module(&wat);
    assert_eq!(CallGraph::new(&m).on_cycle().len(), 20_000);
}
