//! Far memory: a cell whose memory is four to sixty-four times its budget
//! gives the output of an uninterrupted run, checkpoints, and stops with a
//! precise error when its store dies.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use roam_wasi::WasiConfig;

use super::common::*;
use crate::{Cell, CellOptions, Eviction, FarOptions, LoadedModule, MemStore, Outcome, RunError};

/// Grows 16 MiB (4,096 pages), then six rounds of a write to every page in
/// a scattered order and a sequential read of all of them; prints a
/// checksum of everything it read and wrote.
const BIG_WAT: &str = concat!(
    r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (global $sum (mut i64) (i64.const 0))
  (func $_start (export "_start")
    (local $r i32) (local $i i32) (local $p i32) (local $a i32) (local $x i64) (local $k i32) (local $n i32)
    (drop (memory.grow (i32.const 256)))
    (loop $rounds
      (local.set $i (i32.const 0))
      (loop $pages
        (local.set $p
          (i32.rem_u
            (i32.add (i32.mul (local.get $i) (i32.const 7919)) (i32.mul (local.get $r) (i32.const 13)))
            (i32.const 4096)))
        (local.set $a
          (i32.add (i32.const 262144)
            (i32.add (i32.shl (local.get $p) (i32.const 12))
                     (i32.shl (i32.and (local.get $i) (i32.const 63)) (i32.const 6)))))
        (local.set $x
          (i64.add
            (i64.mul (i64.load (local.get $a)) (i64.const 6364136223846793005))
            (i64.extend_i32_u (i32.add (local.get $i) (local.get $r)))))
        (i64.store (local.get $a) (local.get $x))
        (global.set $sum (i64.xor (i64.rotl (global.get $sum) (i64.const 5)) (local.get $x)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $pages (i32.lt_u (local.get $i) (i32.const 4096))))
      (local.set $a (i32.const 262144))
      (loop $seq
        (global.set $sum (i64.add (global.get $sum) (i64.load (local.get $a))))
        (local.set $a (i32.add (local.get $a) (i32.const 512)))
        (br_if $seq (i32.lt_u (local.get $a) (i32.const 17039360))))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br_if $rounds (i32.lt_u (local.get $r) (i32.const 6))))
"#,
    print_sum_wat!(),
    ")\n"
);

fn far_run(opts: FarOptions) -> Option<(Vec<u8>, crate::FarStats)> {
    if !userfaultfd_or_skip() {
        return None;
    }
    let env = env();
    let m = load(&env.rt, BIG_WAT)?;
    let want = reference(&env.rt, &m);
    let (mut cell, out) = start(&env.rt, &m, CellOptions::default());
    let far = cell.attach_far(opts, Box::new(MemStore::new())).unwrap();
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    let stats = far.stats();
    assert_eq!(
        out.stdout(),
        want,
        "far memory changed the output: {stats:?}"
    );
    // Never more resident than the budget and one fetch batch, and the
    // counts add up (a page counted out twice would wrap them).
    assert!(
        stats.resident_peak as usize <= opts.local_pages + opts.max_batch,
        "{stats:?}"
    );
    assert!(stats.resident <= stats.resident_peak, "{stats:?}");
    assert!(stats.resident + stats.far <= 4096 + 64, "{stats:?}");
    Some((want, stats))
}

#[test]
fn a_cell_64_times_its_budget_runs_right_under_clock() {
    let opts = FarOptions::new(64);
    let Some((_, s)) = far_run(opts) else { return };
    // 4,096 pages through 64: nearly every page went out and came back.
    assert!(s.pages_out > 4096, "{s:?}");
    assert!(s.far_faults > 4096, "{s:?}");
    assert!(s.write_faults > 0, "{s:?}");
}

#[test]
fn a_cell_4_times_its_budget_runs_right_under_random() {
    let opts = FarOptions {
        eviction: Eviction::Random,
        ..FarOptions::new(1024)
    };
    let Some((_, s)) = far_run(opts) else { return };
    assert!(s.pages_out > 0 && s.far_faults > 0, "{s:?}");
}

#[test]
fn clean_pages_leave_without_being_written_again() {
    // The sequential pass reads pages that the scattered pass wrote
    // before: fetched, not written, and dropped for free.
    let Some((_, s)) = far_run(FarOptions::new(512)) else {
        return;
    };
    assert!(s.clean_drops > 0, "{s:?}");
}

#[test]
fn a_budget_below_the_minimum_is_refused() {
    if !userfaultfd_or_skip() {
        return;
    }
    let env = env();
    let Some(m) = load(&env.rt, BIG_WAT) else {
        return;
    };
    let (mut cell, _) = start(&env.rt, &m, CellOptions::default());
    let e = cell
        .attach_far(FarOptions::new(8), Box::new(MemStore::new()))
        .unwrap_err();
    assert!(e.to_string().contains("below the minimum"), "{e}");
}

/// A far cell stopped mid-run to be restored.
struct Stopped {
    env: Env,
    m: Arc<LoadedModule>,
    snap: roam_snapshot::Snapshot,
    /// What it printed before it stopped.
    before: Vec<u8>,
    far: crate::FarMemory,
    /// The uninterrupted run's output.
    want: Vec<u8>,
}

/// `BIG_WAT` under a 128-page budget, stopped at its 3,000th point; `None`
/// where the test is skipped.
fn stopped_far_cell() -> Option<Stopped> {
    if !userfaultfd_or_skip() {
        return None;
    }
    let env = env();
    let m = load(&env.rt, BIG_WAT)?;
    let want = reference(&env.rt, &m);
    let opts = CellOptions {
        checkpoint_at_point: Some(3000),
        ..CellOptions::default()
    };
    let (mut cell, out) = start(&env.rt, &m, opts);
    let far = cell
        .attach_far(FarOptions::new(128), Box::new(MemStore::new()))
        .unwrap();
    let snap = match run(&mut cell) {
        Outcome::Stopped(s, _) => *s,
        other => panic!("expected a stop, got {other:?}"),
    };
    Some(Stopped {
        env,
        m,
        snap,
        before: out.stdout(),
        far,
        want,
    })
}

#[test]
fn a_far_cell_checkpoints_and_restores_without_far_memory() {
    let Some(Stopped {
        env,
        m,
        snap,
        before,
        far,
        want,
    }) = stopped_far_cell()
    else {
        return;
    };
    assert!(far.stats().far > 0, "nothing was far: {:?}", far.stats());
    let mut back = Cell::restore(&env.rt, m, &snap, vec![], CellOptions::default()).unwrap();
    let rest = back.capture_output();
    assert!(matches!(run(&mut back), Outcome::Exited(0)));
    let mut got = before;
    got.extend(rest.stdout());
    assert_eq!(got, want);
}

#[test]
fn a_far_cell_restores_into_far_memory_within_its_budget() {
    let Some(Stopped {
        env,
        m,
        snap,
        before,
        want,
        ..
    }) = stopped_far_cell()
    else {
        return;
    };
    // The pages go to the new store as they are written: the memory
    // (16 MiB, 4,096 pages) is never all resident, even while it arrives.
    let budget = FarOptions::new(96);
    let mut incoming = Cell::incoming(&env.rt, m, CellOptions::default()).unwrap();
    let far = incoming
        .attach_far(budget, Box::new(MemStore::new()))
        .unwrap();
    let mut back = incoming.finish(&snap, vec![]).unwrap();
    let arrived = far.stats();
    assert!(
        arrived.far > 2000
            && arrived.resident_peak as usize <= budget.local_pages + budget.max_batch,
        "the restore did not page: {arrived:?}"
    );
    let rest = back.capture_output();
    assert!(matches!(run(&mut back), Outcome::Exited(0)));
    let mut got = before;
    got.extend(rest.stdout());
    assert_eq!(got, want, "{:?}", far.stats());
    let s = far.stats();
    assert!(
        s.resident_peak as usize <= budget.local_pages + budget.max_batch,
        "{s:?}"
    );
}

#[test]
fn a_dead_store_stops_the_cell_with_the_reason() {
    if !userfaultfd_or_skip() {
        return;
    }
    let env = env();
    let Some(m) = load(&env.rt, BIG_WAT) else {
        return;
    };
    let mut cell = Cell::start(
        &env.rt,
        m.clone(),
        WasiConfig::default(),
        CellOptions::default(),
    )
    .unwrap();
    let out = cell.capture_output();
    let store = MemStore::new();
    let breaker = store.breaker();
    let far = cell
        .attach_far(FarOptions::new(64), Box::new(store))
        .unwrap();
    let watcher = {
        let far = far.clone();
        std::thread::spawn(move || {
            // Once pages are far, the store dies.
            while far.stats().far < 1000 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            breaker.store(true, Ordering::Release);
        })
    };
    let r = cell.run(&mut |_, _| Err("unexpected continue".into()));
    watcher.join().unwrap();
    match r {
        Err(RunError::PagesLost(why)) => assert!(why.contains("the store is gone"), "{why}"),
        other => panic!("expected lost pages, got {other:?}"),
    }
    // No checksum of wrong memory was printed.
    assert!(out.stdout().is_empty(), "{:?}", out.stdout());
}
