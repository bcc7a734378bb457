//! Restore from a file with pages read on demand: the restored program
//! must behave as an uninterrupted run whether its pages come from faults
//! or from the background reader, and a file damaged after it was opened
//! must stop the program, never feed it wrong pages.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_snapshot::{EncodeOptions, Format, Opened, PageKind, Snapshot};

use super::common::*;
use crate::{Cell, CellOptions, LoadedModule, Outcome, RunError};

/// Writes 1,303 of the 1,536 4 KiB pages of a 6 MiB memory (every page
/// from 16 on, except those with `page % 7 == 3`, so the stored pages form
/// many runs over several chunks), rewrites them in 12 rounds, and prints a
/// checksum.
const WIDE_WAT: &str = concat!(
    r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 96)
  (global $sum (mut i64) (i64.const 0))
  (func $_start (export "_start")
    (local $r i32) (local $p i32) (local $i i32) (local $end i32) (local $x i64)
    (local $k i32) (local $n i32)
    ;; one word in every page first, so that a snapshot taken early
    ;; already stores them all
    (local.set $p (i32.const 16))
    (loop $seed
      (if (i32.ne (i32.rem_u (local.get $p) (i32.const 7)) (i32.const 3))
        (then (i32.store (i32.shl (local.get $p) (i32.const 12)) (local.get $p))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (br_if $seed (i32.lt_u (local.get $p) (i32.const 1536))))
    (loop $rounds
      (local.set $p (i32.const 16))
      (loop $pages
        (if (i32.ne (i32.rem_u (local.get $p) (i32.const 7)) (i32.const 3))
          (then
            (local.set $i (i32.shl (local.get $p) (i32.const 12)))
            (local.set $end (i32.add (local.get $i) (i32.const 4096)))
            (loop $words
              (local.set $x
                (i64.add
                  (i64.mul (i64.load (local.get $i)) (i64.const 6364136223846793005))
                  (i64.extend_i32_u (i32.add (local.get $r) (local.get $i)))))
              (i64.store (local.get $i) (local.get $x))
              (global.set $sum
                (i64.xor (i64.rotl (global.get $sum) (i64.const 7)) (local.get $x)))
              (local.set $i (i32.add (local.get $i) (i32.const 8)))
              (br_if $words (i32.lt_u (local.get $i) (local.get $end))))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br_if $pages (i32.lt_u (local.get $p) (i32.const 1536))))
      (local.set $r (i32.add (local.get $r) (i32.const 1)))
      (br_if $rounds (i32.lt_u (local.get $r) (i32.const 12))))
"#,
    print_sum_wat!(),
    ")\n"
);

struct Setup {
    env: Env,
    m: Arc<LoadedModule>,
    want: Vec<u8>,
    dir: tempfile::TempDir,
}

fn setup() -> Option<Setup> {
    if !userfaultfd_or_skip() {
        return None;
    }
    let env = env();
    let m = load(&env.rt, WIDE_WAT)?;
    let want = reference(&env.rt, &m);
    Some(Setup {
        env,
        m,
        want,
        dir: tempfile::tempdir().unwrap(),
    })
}

/// A v2 file of the program stopped at migration point `n`.
fn file_at(s: &Setup, n: u64, name: &str) -> std::path::PathBuf {
    let (_c, snap, _o) = stopped_at(&s.env.rt, &s.m, n);
    assert!(
        snap.memory.stored_pages() > 1000,
        "{}",
        snap.memory.stored_pages()
    );
    let path = s.dir.path().join(name);
    let v2 = EncodeOptions {
        format: Format::V2,
        ..Default::default()
    };
    snap.write_file_with(&path, &v2).unwrap();
    path
}

fn restore(s: &Setup, opened: &Opened) -> (Cell, crate::LazyMemory) {
    let (cell, lazy) = Cell::restore_file(
        &s.env.rt,
        s.m.clone(),
        opened,
        vec![],
        CellOptions::default(),
    )
    .unwrap();
    (
        cell,
        lazy.expect("a v2 file with userfaultfd restores lazily"),
    )
}

fn wait_complete(lazy: &crate::LazyMemory) {
    let until = Instant::now() + Duration::from_secs(20);
    while !lazy.is_complete() {
        assert!(
            Instant::now() < until,
            "the background reader did not finish"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_lazy_restore_equals_an_uninterrupted_run() {
    let Some(s) = setup() else { return };
    for (n, name) in [(50_000, "early.roam"), (1_000_000, "late.roam")] {
        let path = file_at(&s, n, name);
        let (opened, _) = Snapshot::open_file(&path).unwrap();
        let stored = match &opened {
            Opened::Lazy { pages, .. } => pages.stored_pages() as u64,
            Opened::Whole(_) => panic!("a v2 file opens lazily"),
        };
        // At once: faults and the background reader race for the pages.
        let (mut cell, lazy) = restore(&s, &opened);
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), s.want, "point {n}, run at once");
        // After the background reader has read everything.
        let (mut cell, lazy2) = restore(&s, &opened);
        wait_complete(&lazy2);
        let st = lazy2.stats();
        assert_eq!(st.pages_fetched + st.pages_prefetched, stored, "{st:?}");
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), s.want, "point {n}, after the reader");
        eprintln!("point {n}: at once {:?}, after {:?}", lazy.stats(), st);
    }
}

#[test]
fn a_lazy_restore_checkpoints_again_before_its_pages_are_all_read() {
    let Some(s) = setup() else { return };
    let path = file_at(&s, 50_000, "first.roam");
    let (opened, _) = Snapshot::open_file(&path).unwrap();
    let opts = CellOptions {
        checkpoint_at_point: Some(60_000),
        ..CellOptions::default()
    };
    let (mut cell, _lazy) =
        Cell::restore_file(&s.env.rt, s.m.clone(), &opened, vec![], opts).unwrap();
    let Outcome::Stopped(second, _) = run(&mut cell) else {
        panic!("expected a second stop");
    };
    drop(cell);
    let mut cell = Cell::restore(
        &s.env.rt,
        s.m.clone(),
        &second,
        vec![],
        CellOptions::default(),
    )
    .unwrap();
    let out = cell.capture_output();
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(out.stdout(), s.want);
}

#[test]
fn a_file_damaged_after_opening_stops_the_cell_with_pages_lost() {
    let Some(s) = setup() else { return };
    let path = file_at(&s, 50_000, "damaged.roam");
    let (opened, _) = Snapshot::open_file(&path).unwrap();
    // Flip a byte every 256 from 4096 on, in place (the open file sees
    // it): the chunk area starts there or later, so every chunk is damaged
    // (the metadata before it was read when the file was opened).
    let bytes = std::fs::read(&path).unwrap();
    let Opened::Lazy { pages, .. } = &opened else {
        panic!("a v2 file opens lazily");
    };
    assert!(pages.chunk_count() >= 4);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    for at in (4096..bytes.len()).step_by(256) {
        f.write_all_at(&[bytes[at] ^ 0x10], at as u64).unwrap();
    }
    let (mut cell, lazy) = restore(&s, &opened);
    match cell.run(&mut |_, _| Ok(())) {
        Err(RunError::PagesLost(why)) => {
            assert!(
                why.contains("memory chunk") && why.contains("checksum"),
                "{why}"
            )
        }
        other => panic!("expected PagesLost, got {other:?}"),
    }
    assert!(!lazy.is_complete());
}

#[test]
fn a_lazy_restore_refuses_another_module_and_a_v1_file_restores_whole() {
    let Some(s) = setup() else { return };
    let path = file_at(&s, 50_000, "v2.roam");
    let (opened, _) = Snapshot::open_file(&path).unwrap();
    let other = load(&s.env.rt, COMPUTE_WAT).unwrap();
    let err = Cell::restore_file(&s.env.rt, other, &opened, vec![], CellOptions::default())
        .err()
        .expect("another module is refused");
    assert!(err.to_string().contains("module"), "{err}");

    let Opened::Lazy { snapshot, pages } = &opened else {
        panic!("a v2 file opens lazily");
    };
    assert!(pages.kinds().contains(&PageKind::Data));
    // The same state as a v1 file: read whole, no lazy memory.
    let (_c, snap, _o) = stopped_at(&s.env.rt, &s.m, 50_000);
    assert_eq!(snap.globals, snapshot.globals);
    let v1_path = s.dir.path().join("v1.roam");
    let v1 = EncodeOptions {
        format: Format::V1,
        ..Default::default()
    };
    snap.write_file_with(&v1_path, &v1).unwrap();
    let (opened, _) = Snapshot::open_file(&v1_path).unwrap();
    let (mut cell, lazy) = Cell::restore_file(
        &s.env.rt,
        s.m.clone(),
        &opened,
        vec![],
        CellOptions::default(),
    )
    .unwrap();
    assert!(lazy.is_none());
    let out = cell.capture_output();
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(out.stdout(), s.want);
}
