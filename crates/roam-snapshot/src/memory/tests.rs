use super::*;
use crate::testutil::{sample_memory, Rng};

/// Reference classification, byte by byte.
fn reference_kind(page: &[u8], init: Option<&[u8]>) -> PageKind {
    if page.iter().all(|&b| b == 0) {
        PageKind::Zero
    } else if init == Some(page) {
        PageKind::Initial
    } else {
        PageKind::Data
    }
}

#[test]
fn capture_matches_reference_classification() {
    let (initial, mem) = sample_memory(8, 1);
    let img = MemoryImage::capture(&mem, &initial);
    assert_eq!(img.byte_len(), mem.len() as u64);
    let mut stored = Vec::new();
    for (i, page) in mem.chunks_exact(PAGE_SIZE).enumerate() {
        let want = reference_kind(page, initial.page(i as u64));
        assert_eq!(img.page_kinds()[i], want, "page {i}");
        if want == PageKind::Data {
            stored.extend_from_slice(page);
        }
    }
    assert_eq!(img.stored_data(), &stored[..]);
    assert_eq!(
        img.stored_pages() + img.zero_pages() + img.initial_pages(),
        mem.len() / PAGE_SIZE
    );
    // The fixture has all three kinds, including a zeroed and a modified initial page.
    assert_eq!(img.page_kinds()[2], PageKind::Zero);
    assert_eq!(img.page_kinds()[3], PageKind::Data);
    assert_eq!(img.page_kinds()[4], PageKind::Initial);
    assert!(img.stored_pages() > 0 && img.zero_pages() > 0 && img.initial_pages() > 0);
}

#[test]
fn restore_non_fresh_overwrites_everything() {
    let (initial, mem) = sample_memory(8, 2);
    let img = MemoryImage::capture(&mem, &initial);
    let mut dst = vec![0u8; mem.len()];
    Rng::new(99).fill(&mut dst);
    img.restore_into(&mut dst, &initial, false).unwrap();
    assert!(dst == mem);
}

#[test]
fn restore_fresh_reproduces_memory() {
    let (initial, mem) = sample_memory(8, 3);
    let img = MemoryImage::capture(&mem, &initial);
    let mut dst = vec![0u8; mem.len()];
    for (i, page) in dst.chunks_exact_mut(PAGE_SIZE).enumerate() {
        if let Some(p) = initial.page(i as u64) {
            page.copy_from_slice(p);
        }
    }
    img.restore_into(&mut dst, &initial, true).unwrap();
    assert!(dst == mem);
}

#[test]
fn restore_fresh_leaves_untouched_pages_alone() {
    let (initial, mem) = sample_memory(8, 4);
    let img = MemoryImage::capture(&mem, &initial);
    // Poison every byte; a fresh restore must write only Data pages and Zero
    // pages that lie inside the initial image.
    let mut dst = vec![0xAAu8; mem.len()];
    img.restore_into(&mut dst, &initial, true).unwrap();
    for (i, page) in dst.chunks_exact(PAGE_SIZE).enumerate() {
        let kind = img.page_kinds()[i];
        let touched =
            kind == PageKind::Data || (kind == PageKind::Zero && initial.page(i as u64).is_some());
        if touched {
            assert_eq!(page, &mem[i * PAGE_SIZE..(i + 1) * PAGE_SIZE], "page {i}");
        } else {
            assert!(
                page.iter().all(|&b| b == 0xAA),
                "page {i} ({kind:?}) was written"
            );
        }
    }
}

#[test]
fn restore_refuses_wrong_size_and_wrong_initial_image() {
    let (initial, mem) = sample_memory(2, 5);
    let img = MemoryImage::capture(&mem, &initial);
    let mut short = vec![0u8; mem.len() - PAGE_SIZE];
    assert_eq!(
        img.restore_into(&mut short, &initial, false),
        Err(RestoreError::SizeMismatch {
            expected: mem.len() as u64,
            got: short.len() as u64
        })
    );
    let mut dst = vec![7u8; mem.len()];
    assert_eq!(
        img.restore_into(&mut dst, &InitialImage::empty(), false),
        Err(RestoreError::InitialImageMismatch)
    );
    assert!(dst.iter().all(|&b| b == 7), "nothing written on error");
}

#[test]
fn from_parts_checks_consistency() {
    let d = InitialImage::empty().digest();
    assert!(MemoryImage::from_parts(100, d, vec![], crate::pages::Store::Heap(vec![])).is_err());
    assert!(MemoryImage::from_parts(
        WASM_PAGE_SIZE,
        d,
        vec![PageKind::Zero; 15],
        crate::pages::Store::Heap(vec![])
    )
    .is_err());
    assert!(MemoryImage::from_parts(
        WASM_PAGE_SIZE,
        d,
        vec![PageKind::Data; 16],
        crate::pages::Store::Heap(vec![])
    )
    .is_err());
    let ok = MemoryImage::from_parts(
        WASM_PAGE_SIZE,
        d,
        vec![PageKind::Zero; 16],
        crate::pages::Store::Heap(vec![]),
    )
    .unwrap();
    assert_eq!(ok.zero_pages(), 16);
}

#[test]
fn missing_initial_page_is_refused_before_writing() {
    let init = InitialImage::empty();
    let mut kinds = vec![PageKind::Zero; 16];
    kinds[5] = PageKind::Initial;
    let img = MemoryImage::from_parts(
        WASM_PAGE_SIZE,
        init.digest(),
        kinds,
        crate::pages::Store::Heap(vec![]),
    )
    .unwrap();
    let mut dst = vec![3u8; WASM_PAGE_SIZE as usize];
    assert_eq!(
        img.restore_into(&mut dst, &init, false),
        Err(RestoreError::MissingInitialPage { page: 5 })
    );
    assert!(dst.iter().all(|&b| b == 3));
}

#[test]
fn is_zero_finds_a_single_bit_anywhere() {
    let mut page = vec![0u8; PAGE_SIZE + 3];
    assert!(is_zero(&page));
    for pos in [0, 7, 8, 255, 256, 4095, 4096, 4098] {
        page[pos] = 0x10;
        assert!(!is_zero(&page), "bit at {pos}");
        page[pos] = 0;
    }
    assert!(is_zero(&[]));
}

#[test]
#[should_panic(expected = "multiple of 64 KiB")]
fn capture_rejects_partial_wasm_pages() {
    MemoryImage::capture(&[0u8; PAGE_SIZE], &InitialImage::empty());
}

#[test]
fn two_threads_and_reuse_give_identical_images() {
    // Odd number of 4 KiB pages per half is impossible (64 KiB multiples), but
    // the split must still be correct with Data pages on both sides.
    let (initial, mem) = sample_memory(9, 6);
    let one = capture_with(&mem, &initial, Vec::new(), 1);
    let two = capture_with(&mem, &initial, Vec::new(), 2);
    assert_eq!(one, two);
    let reused = capture_with(&mem, &initial, vec![0xEE; 3 * PAGE_SIZE], 2);
    assert_eq!(one, reused);
    let big_buffer = Vec::with_capacity(mem.len() * 2);
    let reused = MemoryImage::capture_reusing(&mem, &initial, big_buffer);
    assert_eq!(one, reused);
    let buf = reused.into_stored_data();
    assert!(buf.capacity() >= mem.len() * 2, "allocation kept");
}
