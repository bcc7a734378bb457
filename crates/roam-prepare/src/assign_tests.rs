//! Definite assignment on small bodies: what is set at each read and at
//! each branch, and the three conservative rules.

use std::collections::HashSet;

use walrus::ir::{Instr, InstrSeqId};
use walrus::{LocalFunction, LocalId, Module, ValType};

use super::{walk_assigned, Visit};
use crate::outline::{branch_targets, walk};

/// Every read and branch, with the names of the locals set there.
#[derive(Default)]
struct Record {
    names: Vec<(LocalId, String)>,
    reads: Vec<(String, Vec<String>)>,
    branches: Vec<Vec<String>>,
}

impl Record {
    fn names(&self, set: &HashSet<LocalId>) -> Vec<String> {
        let mut out: Vec<String> = self
            .names
            .iter()
            .filter(|(id, _)| set.contains(id))
            .map(|(_, n)| n.clone())
            .collect();
        out.sort();
        out
    }
}

impl Visit for Record {
    fn read(&mut self, local: LocalId, set: &HashSet<LocalId>) {
        let name = self
            .names
            .iter()
            .find(|(id, _)| *id == local)
            .unwrap()
            .1
            .clone();
        let set = self.names(set);
        self.reads.push((name, set));
    }

    fn branch(&mut self, _label: InstrSeqId, set: &HashSet<LocalId>) {
        let set = self.names(set);
        self.branches.push(set);
    }
}

/// Walks the only function of a module with `body`; returns the record and
/// what is set at the end. The locals are told apart by type (walrus does
/// not keep their names): the parameter `$p` is the only `i32`, `$a` an
/// `i64`, `$b` an `f32`, `$c` an `f64`.
fn run(body: &str) -> (Record, Vec<String>) {
    let wat = format!(
        "(module (func (param $p i32) (local $a i64) (local $b f32) (local $c f64) {body}))"
    );
    let module = Module::from_buffer(&wat::parse_str(wat).unwrap()).unwrap();
    let (_, func): (_, &LocalFunction) = module.funcs.iter_local().next().unwrap();
    let mut record = Record {
        names: module
            .locals
            .iter()
            .map(|l| {
                let name = match l.ty() {
                    ValType::I32 => "p",
                    ValType::I64 => "a",
                    ValType::F32 => "b",
                    _ => "c",
                };
                (l.id(), name.to_string())
            })
            .collect(),
        ..Record::default()
    };
    let entry = func.entry_block();
    let mut branched = HashSet::new();
    walk(func, entry, &mut |i: &Instr| {
        branched.extend(branch_targets(i))
    });
    let mut set = HashSet::new();
    walk_assigned(func, entry, &branched, &mut set, &mut record);
    let end = record.names(&set);
    (record, end)
}

fn read(r: &Record, i: usize) -> (&str, Vec<&str>) {
    let (name, set) = &r.reads[i];
    (name, set.iter().map(String::as_str).collect())
}

#[test]
fn a_read_sees_what_every_path_before_it_set() {
    let (r, end) = run("(local.set $a (i64.const 1))
         (if (local.get $p)
           (then (local.set $b (f32.const 2)) (local.set $c (f64.const 3)))
           (else (local.set $b (f32.const 4))))
         (drop (local.get $b))");
    assert_eq!(read(&r, 0), ("p", vec!["a"]));
    // `$b` is set on both arms, `$c` on one only.
    assert_eq!(read(&r, 1), ("b", vec!["a", "b"]));
    assert_eq!(end, ["a", "b"]);
}

#[test]
fn a_block_left_early_sets_nothing_after_it() {
    let (r, end) = run("(block $out
           (local.set $a (i64.const 1))
           (br_if $out (local.get $p))
           (local.set $b (f32.const 2)))
         (drop (local.get $a))");
    // Even `$a`, set before the branch, is not counted after the block:
    // the rule is per block, not per path.
    assert_eq!(read(&r, 1), ("a", vec![]));
    assert_eq!(r.branches, [vec!["a".to_string()]]);
    assert!(end.is_empty());
    // The same block with no branch to it passes its sets on.
    let (r, _) = run("(block $out
           (local.set $a (i64.const 1))
           (local.set $b (f32.convert_i32_u (local.get $p))))
         (drop (local.get $b))");
    assert_eq!(read(&r, 1), ("b", vec!["a", "b"]));
}

#[test]
fn an_if_some_branch_leaves_sets_nothing_and_a_loop_counts_its_first_trip() {
    let (r, _) = run("(if (local.get $p)
           (then (local.set $a (i64.const 1)) (br_if 0 (local.get $p)) (local.set $b (f32.const 1)))
           (else (local.set $a (i64.const 2)) (local.set $b (f32.const 2))))
         (drop (local.get $a))");
    assert_eq!(read(&r, 2), ("a", vec![]));
    let (r, end) = run("(loop $l
           (drop (local.get $a))
           (local.set $a (i64.const 1))
           (br_if $l (local.get $p)))
         (drop (local.get $a))");
    // Read before it is set on the first trip; set after the loop.
    assert_eq!(read(&r, 0), ("a", vec![]));
    assert_eq!(r.branches, [vec!["a".to_string()]]);
    assert_eq!(read(&r, 2), ("a", vec!["a"]));
    assert_eq!(end, ["a"]);
}

#[test]
fn every_label_of_a_br_table_is_a_branch() {
    let (r, _) = run("(block $x (block $y
           (local.set $c (f64.const 1))
           (br_table $x $y $x (local.get $p))))");
    assert_eq!(r.branches.len(), 3);
    assert!(r.branches.iter().all(|s| s == &["c".to_string()]));
}
