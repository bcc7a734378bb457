//! Killing a cell: a program that never reaches a migration point still
//! ends when killed, and a kill never spoils a checkpoint already taken.
//!
//! Why here as well as in the CLI tests: these run in-process in a few
//! hundred milliseconds and pin the runtime's contract ([`Controller::kill`]
//! → [`RunError::Killed`]) independently of signals and nodes.

use std::time::{Duration, Instant};

use roam_prepare::{PointPolicy, PrepareOptions};

use super::common::*;
use crate::{
    Cell, CellOptions, CheckpointKind, Controller, EpochInterrupt, Outcome, RunError, Runtime,
    RuntimeConfig, Trigger,
};

/// Spins for ever without a call or a memory access, so `--points manual`
/// leaves it no migration point at all.
const SPIN_WAT: &str = r#"
(module
  (memory (export "memory") 1)
  (func $_start (export "_start")
    (local $i i32)
    (loop $spin
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $spin)))
)
"#;

fn runtime(points: PointPolicy, epoch_interrupt: EpochInterrupt) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::new(RuntimeConfig {
        cache_dir: dir.path().to_path_buf(),
        prepare: PrepareOptions {
            points,
            ..PrepareOptions::default()
        },
        epoch_interrupt,
        ..RuntimeConfig::default()
    })
    .unwrap();
    (rt, dir)
}

/// Run `cell` on this thread; `act` runs on another after 100 ms. Returns
/// the result and how long it took from `act` to the end of the run.
fn run_while(
    cell: &mut Cell,
    act: impl FnOnce(&Controller) + Send + 'static,
) -> (Result<Outcome, RunError>, Duration) {
    let ctl = cell.controller();
    let other = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let at = Instant::now();
        act(&ctl);
        at
    });
    let r = cell.run(&mut |_, _| Err("unexpected continue".into()));
    let end = Instant::now();
    let at = other.join().unwrap();
    (r, end.saturating_duration_since(at))
}

#[test]
fn a_kill_ends_a_program_with_no_migration_point() {
    let (rt, _dir) = runtime(PointPolicy::Manual, EpochInterrupt::ByPolicy);
    let Some(m) = load(&rt, SPIN_WAT) else {
        return;
    };
    assert!(m.epoch_checks(), "a `manual` module needs epoch checks");
    let (mut cell, _) = start(&rt, &m, CellOptions::default());
    let (r, took) = run_while(&mut cell, |c| {
        // A checkpoint request alone is never answered by this program.
        c.request(CheckpointKind::Stop, Trigger::Api);
        std::thread::sleep(Duration::from_millis(200));
        c.kill();
    });
    assert!(matches!(r, Err(RunError::Killed)), "{r:?}");
    assert!(took < Duration::from_secs(1), "the kill took {took:?}");
    assert!(cell.controller().is_killed());
    // A killed cell never runs again.
    let again = cell.run(&mut |_, _| Ok(()));
    assert!(matches!(again, Err(RunError::Stopped)), "{again:?}");
}

/// Without epoch checks (a `loops` module, by default) a kill ends a
/// program at its next migration point.
#[test]
fn a_kill_ends_a_program_at_a_point_without_epoch_checks() {
    let (rt, _dir) = runtime(PointPolicy::Loops, EpochInterrupt::ByPolicy);
    let Some(m) = load(&rt, MAILBOX_WAT) else {
        return;
    };
    assert!(
        !m.epoch_checks(),
        "a `loops` module runs without epoch checks"
    );
    let (mut cell, _) = start(&rt, &m, CellOptions::default());
    let (r, took) = run_while(&mut cell, |c| c.kill());
    assert!(matches!(r, Err(RunError::Killed)), "{r:?}");
    assert!(took < Duration::from_secs(1), "the kill took {took:?}");
}

/// A kill that comes after the checkpoint was taken leaves the snapshot
/// alone, and the stopped cell, killed meanwhile, never runs again (a node
/// resumes a paused cell whose asker gave up: it must not come back).
#[test]
fn a_kill_after_a_stop_keeps_the_snapshot_and_the_cell_stays_dead() {
    let (rt, _dir) = runtime(PointPolicy::Loops, EpochInterrupt::Always);
    let Some(m) = load(&rt, MAILBOX_WAT) else {
        return;
    };
    let (mut cell, _) = start(&rt, &m, CellOptions::default());
    let (r, _) = run_while(&mut cell, |c| {
        c.request(CheckpointKind::Stop, Trigger::Api);
        std::thread::sleep(Duration::from_millis(100));
        c.kill();
    });
    let Ok(Outcome::Stopped(snap, _)) = r else {
        panic!("expected a stop, got {r:?}");
    };
    cell.resume(&snap).unwrap();
    let again = cell.run(&mut |_, _| Ok(()));
    assert!(matches!(again, Err(RunError::Killed)), "{again:?}");
    // The snapshot itself restores into a live cell.
    let back = Cell::restore(&rt, m, &snap, vec![], CellOptions::default()).unwrap();
    assert!(!back.controller().is_killed());
}
