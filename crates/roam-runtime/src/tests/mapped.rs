//! Restore by mapping: a format v2 snapshot's pages are mapped
//! copy-on-write into linear memory. The restored program must behave as an
//! uninterrupted run, and dirty tracking and checkpoints must keep working
//! on such a memory.

use roam_snapshot::{EncodeOptions, Format, Snapshot, PAGE_SIZE};

use super::common::*;
use crate::{Cell, CellOptions, CheckpointKind, DirtyTracker, Outcome, TrackMethod, Trigger};

/// Encode as v2 and decode again: the pages come back in a page file.
fn through_v2(snap: &Snapshot) -> Snapshot {
    let opts = EncodeOptions {
        format: Format::V2,
        ..Default::default()
    };
    let back = Snapshot::decode(&snap.encode(&opts).unwrap()).unwrap();
    assert!(back.memory.stored_data_fd().is_some());
    back
}

/// Pages of `live` backed by the snapshot page file, from /proc/self/maps.
fn mapped_pages(live: &crate::LiveMemory) -> usize {
    let base = live.map.base() as usize;
    let end = base + live.len();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.contains("roam-snapshot-pages"))
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a >= base && b <= end).then_some((b - a) / PAGE_SIZE)
        })
        .sum()
}

fn restore(env: &Env, m: &std::sync::Arc<crate::LoadedModule>, s: &Snapshot) -> Cell {
    Cell::restore(&env.rt, m.clone(), s, vec![], CellOptions::default()).unwrap()
}

#[test]
fn a_v2_restore_maps_the_pages_and_equals_an_uninterrupted_run() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    for point in [100_000, 1_000_000] {
        let (_, snap, _) = stopped_at(&env.rt, &m, point);
        let snap = through_v2(&snap);
        let mut cell = restore(&env, &m, &snap);
        let mapped = mapped_pages(&cell.live_memory());
        assert!(
            mapped >= 64 && mapped <= snap.memory.stored_pages(),
            "{mapped} pages mapped of {}",
            snap.memory.stored_pages()
        );
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), want, "point {point}");
    }
}

#[test]
fn a_mapped_restore_checkpoints_again_and_restores_again() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    let (_, snap, _) = stopped_at(&env.rt, &m, 100_000);
    let snap = through_v2(&snap);
    let opts = CellOptions {
        checkpoint_at_point: Some(200_000),
        ..CellOptions::default()
    };
    let mut cell = Cell::restore(&env.rt, m.clone(), &snap, vec![], opts).unwrap();
    let Outcome::Stopped(second, _) = run(&mut cell) else {
        panic!("expected a second stop");
    };
    drop(cell);
    // Once as captured (heap pages, copied), once through v2 (mapped).
    for s in [(*second).clone(), through_v2(&second)] {
        let mut cell = restore(&env, &m, &s);
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), want);
    }
}

#[test]
fn pre_copy_from_a_mapped_restore_reproduces_the_program() {
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let want = reference(&env.rt, &m);
    let (_, snap, _) = stopped_at(&env.rt, &m, 100_000);
    let snap = through_v2(&snap);
    let methods = if userfaultfd_or_skip() {
        vec![TrackMethod::WriteProtect, TrackMethod::Hash]
    } else {
        vec![TrackMethod::Hash]
    };
    for method in methods {
        let mut src = restore(&env, &m, &snap);
        let _o = src.capture_output();
        let live = src.live_memory();
        assert!(mapped_pages(&live) > 0);
        let ctl = src.controller();
        let mut tracker = DirtyTracker::start(&live, method).unwrap();
        let runner = std::thread::spawn(move || {
            let out = run(&mut src);
            (src, out)
        });
        let mut dst = Cell::incoming(&env.rt, m.clone(), CellOptions::default()).unwrap();
        let mut page = [0u8; PAGE_SIZE];
        let mut send = |dst: &mut crate::Incoming, t: &mut DirtyTracker, pages: &[u32]| {
            dst.grow_to(live.len() as u64).unwrap();
            for &i in pages {
                assert!(t.read_page(i, &mut page));
                dst.memory_mut()[i as usize * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(&page);
            }
        };
        let all: Vec<u32> = (0..live.page_count()).collect();
        send(&mut dst, &mut tracker, &all);
        for _ in 0..3 {
            let d = tracker.collect();
            send(&mut dst, &mut tracker, &d);
        }
        ctl.request(CheckpointKind::Pause, Trigger::Api);
        let (_src, outcome) = runner.join().unwrap();
        let Outcome::Paused(paused, _) = outcome else {
            panic!("the program ended before the pause: {outcome:?}");
        };
        let d = tracker.collect();
        send(&mut dst, &mut tracker, &d);
        drop(tracker);
        let mut cell = dst.finish(&paused, vec![]).unwrap();
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), want, "{method:?}");
    }
}

#[test]
fn copying_restore_is_still_available_for_comparison() {
    // ROAM_RESTORE_MAP=0 is read per restore; the copy path is the one a
    // heap image (a fresh capture) always takes.
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let (_, snap, _) = stopped_at(&env.rt, &m, 100_000);
    let cell = restore(&env, &m, &snap);
    assert_eq!(mapped_pages(&cell.live_memory()), 0);
}
