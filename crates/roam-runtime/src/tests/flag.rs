//! The migration flag word: requests from another thread are honoured
//! without epoch interruption, and a guest cannot raise the flag itself.

use std::time::Duration;

use roam_wasi::WasiConfig;
use walrus::ir::Value;
use walrus::{ConstExpr, ExportItem};

use super::common::*;
use crate::{Cell, CellOptions, CheckpointKind, Outcome, Runtime, RuntimeConfig, Trigger};

/// [`COMPUTE_WAT`] that also calls `roam.migration_point` itself on every
/// inner iteration, as a program trying to force checkpoints would.
fn self_raising_wat() -> String {
    COMPUTE_WAT
        .replace(
            "(memory (export \"memory\") 7)",
            "(import \"roam\" \"migration_point\" (func $mp))\n  (memory (export \"memory\") 7)",
        )
        .replace(
            "(i64.store (local.get $i) (local.get $x))",
            "(i64.store (local.get $i) (local.get $x)) (call $mp)",
        )
}

/// Prepared bytes whose `_start` first sets the old `roam.flag` global, as
/// a hand-made module could.
fn with_flag_set_at_start(prepared: &[u8]) -> Vec<u8> {
    let mut m = walrus::Module::from_buffer(prepared).unwrap();
    let find = |m: &walrus::Module, name: &str| {
        m.exports
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.item)
            .unwrap()
    };
    let (ExportItem::Global(flag), ExportItem::Function(start)) = (
        find(&m, roam_prepare::FLAG_GLOBAL_EXPORT),
        find(&m, "_start"),
    ) else {
        panic!("unexpected export kinds");
    };
    // Also start the global raised, in case `_start` is re-entered.
    m.globals.get_mut(flag).kind = walrus::GlobalKind::Local(ConstExpr::Value(Value::I32(1)));
    let func = m.funcs.get_mut(start).kind.unwrap_local_mut();
    let entry = func.entry_block();
    let mut body = func.builder_mut().instr_seq(entry);
    body.global_set_at(0, flag);
    body.const_at(0, Value::I32(1));
    m.emit_wasm()
}

fn runtime(epoch: bool) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig {
        cache_dir: dir.path().to_path_buf(),
        epoch_interrupt: if epoch {
            crate::EpochInterrupt::Always
        } else {
            crate::EpochInterrupt::Never
        },
        ..RuntimeConfig::default()
    })
    .unwrap();
    (rt, dir)
}

#[test]
fn a_guest_raising_the_flag_itself_is_not_checkpointed_but_a_request_stops_it() {
    let (rt, _dir) = runtime(false);
    let Some(honest) = load(&rt, &self_raising_wat()) else {
        return;
    };
    let want = reference(&rt, &honest);
    let forged = rt
        .load_bytes(&with_flag_set_at_start(honest.bytes()))
        .unwrap();
    // No request: millions of self-made calls, no checkpoint, same output
    // (`run` fails on any checkpoint-and-continue, and a stop is not Exited).
    let (mut cell, out) = start(&rt, &forged, CellOptions::default());
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(out.stdout(), want);

    // A real request is still honoured, and the stopped program restores
    // and finishes with the uninterrupted output.
    let (mut cell, _) = start(&rt, &forged, CellOptions::default());
    cell.controller()
        .request(CheckpointKind::Stop, Trigger::Api);
    let Outcome::Stopped(snap, _) = run(&mut cell) else {
        panic!("a real request must stop the program");
    };
    let mut back =
        Cell::restore(&rt, forged.clone(), &snap, vec![], CellOptions::default()).unwrap();
    let out = back.capture_output();
    assert!(matches!(run(&mut back), Outcome::Exited(0)));
    assert_eq!(out.stdout(), want);
}

/// A program that only ends when told to is stopped by a request from
/// another thread mid-run, restored, and finishes its work.
fn request_from_another_thread_stops_a_spinning_program(epoch_interrupt: bool) {
    let (rt, _dir) = runtime(epoch_interrupt);
    let Some(m) = load(&rt, MAILBOX_WAT) else {
        return;
    };
    let mut cell = Cell::start(
        &rt,
        m.clone(),
        WasiConfig::default(),
        CellOptions::default(),
    )
    .unwrap();
    let ctl = cell.controller();
    let asker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        ctl.request(CheckpointKind::Stop, Trigger::Api);
    });
    // Without the request the program spins forever: only a stop returns.
    let Outcome::Stopped(snap, timing) = run(&mut cell) else {
        panic!("expected a stop");
    };
    asker.join().unwrap();
    eprintln!("response {:?}", timing.response);
    let mut back = Cell::restore(&rt, m, &snap, vec![], CellOptions::default()).unwrap();
    let mut mb = Mailbox::new(back.live_memory());
    let driver = std::thread::spawn(move || {
        let seq = mb.command(&[20], 0);
        mb.exit();
        seq
    });
    assert!(matches!(run(&mut back), Outcome::Exited(0)));
    let seq = driver.join().unwrap();
    let at = 20 * 4096 + 100;
    let word = u32::from_le_bytes(back.memory()[at..at + 4].try_into().unwrap());
    assert_eq!(word, seq, "the restored program did not do the work");
}

#[test]
fn a_request_is_honoured_without_epoch_interruption() {
    request_from_another_thread_stops_a_spinning_program(false);
}

#[test]
fn a_request_is_honoured_with_epoch_interruption_back_on() {
    request_from_another_thread_stops_a_spinning_program(true);
}

/// `bytes` without the export `name`, its `roam` section kept.
fn without_export(bytes: &[u8], name: &str) -> Vec<u8> {
    let mut m = walrus::Module::from_buffer(bytes).unwrap();
    let id = m.exports.iter().find(|e| e.name == name).unwrap().id();
    m.exports.delete(id);
    m.emit_wasm()
}

/// The check of a prepared module is remembered by the module's hash, so a
/// second load skips it; a forged module has another hash and is checked,
/// even when a mark of an older check revision claims otherwise.
#[test]
fn a_module_is_checked_once_and_a_forged_one_is_always_checked() {
    let (rt, _dir) = runtime(false);
    let Some(honest) = load(&rt, COMPUTE_WAT) else {
        return;
    };
    let mark = |hash, rev| rt.cache().verified_path(hash, rev);
    assert!(mark(honest.hash(), roam_prepare::CHECK_REVISION).exists());
    let again = rt.load_bytes(honest.bytes()).unwrap();
    assert_eq!(again.hash(), honest.hash());

    let forged = without_export(honest.bytes(), roam_prepare::MEMORY_EXPORT);
    let hash = *blake3::hash(&forged).as_bytes();
    std::fs::write(mark(&hash, roam_prepare::CHECK_REVISION - 1), b"").unwrap();
    let err = rt
        .load_bytes(&forged)
        .err()
        .expect("a forged module must be refused");
    let mut why = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        why.push_str(&format!(": {e}"));
        source = e.source();
    }
    assert!(why.contains(roam_prepare::MEMORY_EXPORT), "{why}");
    assert!(!mark(&hash, roam_prepare::CHECK_REVISION).exists());
}
