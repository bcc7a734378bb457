//! Dirty tracking reports exactly the pages a running program writes.

use std::collections::BTreeSet;

use super::common::*;
use crate::{CellOptions, DirtyTracker, Outcome, TrackError, TrackMethod};

fn set(v: impl IntoIterator<Item = u32>) -> BTreeSet<u32> {
    v.into_iter().collect()
}

fn exact_pages(method: TrackMethod) {
    let env = env();
    let Some(m) = load(&env.rt, MAILBOX_WAT) else {
        return;
    };
    let (mut cell, _out) = start(&env.rt, &m, CellOptions::default());
    let live = cell.live_memory();
    let runner = std::thread::spawn(move || run(&mut cell));
    let mut mb = Mailbox::new(live.clone());
    mb.command(&[], 0); // the program is running and spinning
    let mut t = DirtyTracker::start(&live, method).unwrap();
    assert_eq!(t.method(), method);
    // Page 1 is the mailbox (written by the test), page 2 the answer.
    mb.command(&[40, 41, 100, 255], 0);
    assert_eq!(set(t.collect()), set([1, 2, 40, 41, 100, 255]));
    assert_eq!(set(t.collect()), set([]), "nothing written since");
    mb.command(&[41], 0);
    mb.command(&[7], 0);
    assert_eq!(set(t.collect()), set([1, 2, 7, 41]));
    // Growth: every new page is reported once, then only written ones.
    mb.command(&[3], 1);
    assert_eq!(
        set(t.collect()),
        set([1, 2, 3]).union(&set(256..272)).copied().collect()
    );
    mb.command(&[260], 0);
    assert_eq!(set(t.collect()), set([1, 2, 260]));
    // Many rounds over the same pages: none is lost.
    for round in 0..50u32 {
        let p = 10 + round % 5;
        mb.command(&[p], 0);
        assert_eq!(set(t.collect()), set([1, 2, p]), "round {round}");
    }
    mb.exit();
    assert!(matches!(runner.join().unwrap(), Outcome::Exited(0)));
    drop(t);
}

#[test]
fn hash_tracking_reports_exactly_the_written_pages() {
    exact_pages(TrackMethod::Hash);
}

#[test]
fn write_protect_tracking_reports_exactly_the_written_pages() {
    if !userfaultfd_or_skip() {
        return;
    }
    exact_pages(TrackMethod::WriteProtect);
}

#[test]
fn auto_picks_write_protect_where_userfaultfd_works() {
    let env = env();
    let Some(m) = load(&env.rt, MAILBOX_WAT) else {
        return;
    };
    let (cell, _out) = start(&env.rt, &m, CellOptions::default());
    let t = DirtyTracker::start(&cell.live_memory(), TrackMethod::Auto).unwrap();
    let want = if crate::userfaultfd_available() {
        TrackMethod::WriteProtect
    } else {
        TrackMethod::Hash
    };
    assert_eq!(t.method(), want);
    if !crate::userfaultfd_available() {
        let err = DirtyTracker::start(&cell.live_memory(), TrackMethod::WriteProtect).unwrap_err();
        assert!(matches!(err, TrackError::Unavailable(_)), "{err}");
        // The fallback is right here, but under CI write-protect tracking
        // must be what was tested.
        userfaultfd_or_skip();
    }
}

#[test]
fn pre_copy_rounds_then_pause_reproduce_the_program() {
    // Pre-copy while the compute program runs, final round while paused,
    // then finish on an incoming cell: same output as without migration.
    use crate::{Cell, CheckpointKind, Trigger};
    use roam_snapshot::PAGE_SIZE;
    let env = env();
    // Ten times the rounds of the shared program (some 0.4 s instead of
    // 40 ms): the pause must come while it runs, also on a machine busy
    // with the rest of the test suite, where the shorter one ended first.
    let wat = COMPUTE_WAT.replace("(i32.const 200)", "(i32.const 2000)");
    assert_ne!(wat, COMPUTE_WAT, "the program's round count moved");
    let Some(m) = load(&env.rt, &wat) else {
        return;
    };
    let want = reference(&env.rt, &m);
    for method in [TrackMethod::Hash, TrackMethod::Auto] {
        let (mut src, _o) = start(&env.rt, &m, CellOptions::default());
        let live = src.live_memory();
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
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            let d = tracker.collect();
            send(&mut dst, &mut tracker, &d);
        }
        ctl.request(CheckpointKind::Pause, Trigger::Api);
        let (_src, outcome) = runner.join().unwrap();
        let Outcome::Paused(snap, _) = outcome else {
            panic!("the program ended before the pause: {outcome:?}");
        };
        let d = tracker.collect();
        send(&mut dst, &mut tracker, &d);
        drop(tracker);
        let mut cell = dst.finish(&snap, vec![]).unwrap();
        let out = cell.capture_output();
        assert!(matches!(run(&mut cell), Outcome::Exited(0)));
        assert_eq!(out.stdout(), want, "{method:?}");
    }
}
