//! Post-copy: a cell whose memory pages are fetched on first touch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roam_snapshot::{MemoryImage, PageKind, Snapshot, PAGE_SIZE};

use super::common::*;
use crate::{Cell, CellOptions, Outcome, PageSource, RestoreError, RunError};

/// Serves the data pages of a captured snapshot.
struct SnapSource {
    pages: Arc<HashMap<u32, Vec<u8>>>,
    calls: Arc<AtomicUsize>,
    fail_after: Option<usize>,
    delay: Duration,
}

impl PageSource for SnapSource {
    fn fetch(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_after.is_some_and(|k| n >= k) {
            return Err("connection reset by the source".into());
        }
        std::thread::sleep(self.delay);
        Ok(pages.iter().map(|p| (*p, self.pages[p].clone())).collect())
    }
}

fn data_pages(snap: &Snapshot) -> HashMap<u32, Vec<u8>> {
    let data = snap.memory.stored_data();
    snap.memory
        .page_kinds()
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == PageKind::Data)
        .enumerate()
        .map(|(slot, (i, _))| (i as u32, data[slot * PAGE_SIZE..][..PAGE_SIZE].to_vec()))
        .collect()
}

fn without_memory(snap: &Snapshot) -> Snapshot {
    Snapshot {
        memory: MemoryImage::empty(),
        ..snap.clone()
    }
}

struct Setup {
    env: Env,
    m: Arc<crate::LoadedModule>,
    want: Vec<u8>,
    snap: Snapshot,
    pages: Arc<HashMap<u32, Vec<u8>>>,
}

fn setup() -> Option<Setup> {
    if !userfaultfd_or_skip() {
        return None;
    }
    let env = env();
    let m = load(&env.rt, COMPUTE_WAT)?;
    let want = reference(&env.rt, &m);
    let (_c, snap, _o) = stopped_at(&env.rt, &m, 100_000);
    let pages = Arc::new(data_pages(&snap));
    assert!(pages.len() > 50, "{} data pages", pages.len());
    Some(Setup {
        env,
        m,
        want,
        snap,
        pages,
    })
}

fn lazy_cell(s: &Setup, source: SnapSource, batch: usize) -> (Cell, crate::LazyMemory) {
    let incoming = Cell::incoming(&s.env.rt, s.m.clone(), CellOptions::default()).unwrap();
    incoming
        .finish_lazy_with(
            &without_memory(&s.snap),
            vec![],
            s.snap.memory.page_kinds().to_vec(),
            Box::new(source),
            batch,
        )
        .unwrap()
}

fn source(s: &Setup, fail_after: Option<usize>, delay_ms: u64) -> (SnapSource, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let src = SnapSource {
        pages: s.pages.clone(),
        calls: calls.clone(),
        fail_after,
        delay: Duration::from_millis(delay_ms),
    };
    (src, calls)
}

#[test]
fn post_copy_on_demand_equals_an_uninterrupted_run() {
    let Some(s) = setup() else { return };
    let (src, calls) = source(&s, None, 0);
    let (mut cell, lazy) = lazy_cell(&s, src, 8);
    let out = cell.capture_output();
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    assert_eq!(out.stdout(), s.want);
    let st = lazy.stats();
    eprintln!("post-copy on demand: {st:?}");
    assert!(lazy.is_complete(), "the program touches every data page");
    assert_eq!(st.pages_fetched as usize, s.pages.len());
    assert_eq!(st.fetch_calls as usize, calls.load(Ordering::SeqCst));
    assert!(
        st.pages_fetched > st.fetch_calls,
        "batches bring more than one page per fetch: {st:?}"
    );
    assert!(st.faults_served >= st.fetch_calls && st.fault_wait_max > Duration::ZERO);
}

#[test]
fn post_copy_with_a_prefetcher_equals_an_uninterrupted_run() {
    let Some(s) = setup() else { return };
    let (src, _calls) = source(&s, None, 1);
    let (mut cell, lazy) = lazy_cell(&s, src, 1);
    let out = cell.capture_output();
    let pages = s.pages.clone();
    let pre = lazy.clone();
    let prefetcher = std::thread::spawn(move || {
        for p in pre.missing_data_pages().into_iter().rev() {
            pre.install(p, &pages[&p]).unwrap();
        }
        assert!(pre.is_complete());
        assert!(pre.missing_data_pages().is_empty());
    });
    assert!(matches!(run(&mut cell), Outcome::Exited(0)));
    prefetcher.join().unwrap();
    assert_eq!(out.stdout(), s.want);
    let st = lazy.stats();
    eprintln!("post-copy with prefetch: {st:?}");
    assert_eq!(
        (st.pages_fetched + st.pages_prefetched) as usize,
        s.pages.len()
    );
    assert!(st.pages_prefetched > 0);
    assert!(lazy.install(0, &[0; 5]).is_err(), "not a page");
}

#[test]
fn a_failing_source_stops_the_cell_with_pages_lost() {
    let Some(s) = setup() else { return };
    let (src, _calls) = source(&s, Some(2), 0);
    let (mut cell, _lazy) = lazy_cell(&s, src, 2);
    match cell.run(&mut |_, _| Ok(())) {
        Err(RunError::PagesLost(why)) => assert!(why.contains("connection reset"), "{why}"),
        other => panic!("expected PagesLost, got {other:?}"),
    }
}

#[test]
fn fail_stops_a_cell_waiting_for_a_slow_source() {
    let Some(s) = setup() else { return };
    let (src, _calls) = source(&s, None, 20);
    let (mut cell, lazy) = lazy_cell(&s, src, 1);
    let l = lazy.clone();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(60));
        l.fail("the source node is gone");
    });
    let r = cell.run(&mut |_, _| Ok(()));
    killer.join().unwrap();
    match r {
        Err(RunError::PagesLost(why)) => assert_eq!(why, "the source node is gone"),
        other => panic!("expected PagesLost, got {other:?}"),
    }
    assert!(!lazy.is_complete());
    drop(cell);
    assert!(
        lazy.needs_pages(),
        "a cell whose source was given up still lacks its pages"
    );
}

#[test]
fn a_cell_that_ended_needs_no_more_pages() {
    let Some(s) = setup() else { return };
    let (src, _calls) = source(&s, None, 0);
    let (cell, lazy) = lazy_cell(&s, src, 1);
    assert!(lazy.needs_pages());
    // A program that exits on the destination before post-copy has pushed
    // every page: the pages still coming are not needed.
    drop(cell);
    assert!(!lazy.is_complete());
    assert!(!lazy.needs_pages());
}

#[test]
fn post_copy_without_userfaultfd_is_a_precise_error() {
    if crate::userfaultfd_available() {
        // Covered where userfaultfd is missing (qemu-user builds); here the
        // refusal cannot happen.
        eprintln!("not applicable: userfaultfd works here, this test covers hosts without it");
        return;
    }
    let env = env();
    let Some(m) = load(&env.rt, COMPUTE_WAT) else {
        return;
    };
    let (_c, snap, _o) = stopped_at(&env.rt, &m, 1000);
    let pages = Arc::new(data_pages(&snap));
    let src = SnapSource {
        pages,
        calls: Arc::default(),
        fail_after: None,
        delay: Duration::ZERO,
    };
    let err = Cell::incoming(&env.rt, m, CellOptions::default())
        .unwrap()
        .finish_lazy(
            &snap,
            vec![],
            snap.memory.page_kinds().to_vec(),
            Box::new(src),
        )
        .err()
        .unwrap();
    assert!(matches!(err, RestoreError::NoUserfaultfd(_)), "{err}");
}
