//! The capture fast path: classify pages, then copy the Data pages.
//!
//! Capture runs while the guest is paused, so its latency is the checkpoint's
//! pause time. It reads memory once to classify pages, allocates the stored
//! page buffer once at its exact size (or reuses one), and copies without
//! zeroing first; large memories are split across two threads.

use std::mem::MaybeUninit;

use super::{InitialCursor, MemoryImage, PageKind};
use crate::initial::InitialImage;
use crate::{MAX_MEMORY_BYTES, PAGE_SIZE, WASM_PAGE_SIZE};

/// Memories at least this large are captured by two threads.
pub(super) const PARALLEL_MIN_BYTES: usize = 32 << 20;

/// Capture using `threads` (1 or 2) threads.
pub(crate) fn capture_with(
    memory: &[u8],
    initial: &InitialImage,
    mut data: Vec<u8>,
    threads: usize,
) -> MemoryImage {
    let len = memory.len() as u64;
    assert!(
        len.is_multiple_of(WASM_PAGE_SIZE),
        "memory length {len} is not a multiple of 64 KiB"
    );
    assert!(len <= MAX_MEMORY_BYTES, "memory length {len} exceeds 4 GiB");
    let pages = memory.len() / PAGE_SIZE;
    // Split at a page boundary; with one thread the second half is empty.
    let mid_page = if threads > 1 { pages / 2 } else { pages };
    let (lo, hi) = memory.split_at(mid_page * PAGE_SIZE);

    // Pass 1: classify (reads only).
    let mut kinds = vec![PageKind::Zero; pages];
    let (k_lo, k_hi) = kinds.split_at_mut(mid_page);
    std::thread::scope(|s| {
        if !hi.is_empty() {
            s.spawn(|| classify(hi, mid_page as u64, initial, k_hi));
        }
        classify(lo, 0, initial, k_lo);
    });

    // Pass 2: copy Data pages into one exactly-sized buffer, without zeroing it first.
    let count = |k: &[PageKind]| k.iter().filter(|k| **k == PageKind::Data).count();
    let (n_lo, n_hi) = (count(&kinds[..mid_page]), count(&kinds[mid_page..]));
    let total = (n_lo + n_hi) * PAGE_SIZE;
    data.clear();
    data.reserve_exact(total);
    let (d_lo, d_hi) = data.spare_capacity_mut()[..total].split_at_mut(n_lo * PAGE_SIZE);
    let (k_lo, k_hi) = kinds.split_at(mid_page);
    let written = std::thread::scope(|s| {
        let h = (!hi.is_empty()).then(|| s.spawn(|| copy_data(hi, k_hi, d_hi)));
        copy_data(lo, k_lo, d_lo) + h.map_or(0, |h| h.join().expect("capture thread panicked"))
    });
    assert_eq!(written, total, "every reserved byte is written");
    // SAFETY: `copy_data` initialised `written == total` bytes: each half
    // wrote its whole spare slice (one full page per Data kind, and the slices
    // were sized from those same counts), and `total <= capacity` by `reserve_exact`.
    unsafe { data.set_len(total) };
    MemoryImage {
        byte_len: len,
        initial_digest: initial.digest(),
        kinds,
        data: crate::pages::Store::Heap(data),
    }
}

/// Classify the pages of `mem`, whose first page has index `first_page`.
fn classify(mem: &[u8], first_page: u64, initial: &InitialImage, out: &mut [PageKind]) {
    let mut cursor = InitialCursor::new(initial);
    for (i, (page, kind)) in mem.chunks_exact(PAGE_SIZE).zip(out).enumerate() {
        *kind = if is_zero(page) {
            PageKind::Zero
        } else if cursor.page(first_page + i as u64) == Some(page) {
            PageKind::Initial
        } else {
            PageKind::Data
        };
    }
}

/// Copy the Data pages of `mem` into consecutive pages of `out`; returns the
/// number of bytes written (all of `out` exactly when it was sized from
/// the number of Data pages in `kinds`).
fn copy_data(mem: &[u8], kinds: &[PageKind], out: &mut [MaybeUninit<u8>]) -> usize {
    let mut dst = out.chunks_exact_mut(PAGE_SIZE);
    let mut written = 0;
    for (page, kind) in mem.chunks_exact(PAGE_SIZE).zip(kinds) {
        if *kind == PageKind::Data {
            if let Some(d) = dst.next() {
                d.write_copy_of_slice(page);
                written += PAGE_SIZE;
            }
        }
    }
    written
}

/// Whether every byte of `bytes` is zero. ORs 256-byte blocks as u64 words so
/// the compiler vectorises the inner loop, and exits at the first non-zero block.
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(256);
    for block in &mut blocks {
        let mut acc = 0u64;
        for w in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(w.try_into().expect("8-byte chunk"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&b| b == 0)
}
