//! Chunk store: LRU eviction within the budget, summaries, thread safety.

use roam_transfer::*;
use std::sync::Arc;

fn page(n: u8) -> Vec<u8> {
    vec![n; PAGE_SIZE]
}

fn hash(p: &[u8]) -> ChunkHash {
    *blake3::hash(p).as_bytes()
}

#[test]
fn evicts_least_recently_used_within_budget() {
    let s = ChunkStore::new(3 * PAGE_SIZE as u64 + 100);
    let pages: Vec<Vec<u8>> = (1..=4).map(page).collect();
    assert_eq!(s.insert_many(pages[..3].iter().map(|p| &p[..])), 3);
    // Touch page 1 so page 2 becomes the oldest.
    assert!(s.get(&hash(&pages[0])).is_some());
    assert_eq!(s.insert_many([&pages[3][..]]), 1);
    assert_eq!(s.len(), 3);
    assert!(s.contains(&hash(&pages[0])));
    assert!(!s.contains(&hash(&pages[1])), "LRU chunk evicted");
    assert!(s.contains(&hash(&pages[2])));
    assert_eq!(&s.get(&hash(&pages[3])).unwrap()[..], &pages[3][..]);
    // Re-inserting an existing chunk is not new; wrong-sized input is ignored.
    assert_eq!(s.insert_many([&pages[3][..], &[1u8; 10][..]]), 0);
}

#[test]
fn summary_describes_contents_and_roundtrips() {
    let s = ChunkStore::new(1 << 20);
    let pages: Vec<Vec<u8>> = (0..50).map(page).collect();
    s.insert_many(pages.iter().map(|p| &p[..]));
    let sum = s.summary();
    assert_eq!(sum.len(), 50);
    let bytes = sum.to_bytes();
    assert_eq!(bytes.len(), 4 + 8 * 50);
    let back = StoreSummary::from_bytes(&bytes).unwrap();
    assert_eq!(back, sum);
    for p in &pages {
        assert!(back.contains(&hash(p)));
    }
    assert!(!back.contains(&hash(&page(200))));
    assert!(matches!(
        StoreSummary::from_bytes(&bytes[..bytes.len() - 1]),
        Err(SummaryError::Length { declared: 50, .. })
    ));
    let mut unsorted = bytes.clone();
    unsorted[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        StoreSummary::from_bytes(&unsorted),
        Err(SummaryError::Unsorted(1))
    );
    assert_eq!(
        StoreSummary::from_bytes(&[]).unwrap_err().to_string(),
        "store summary declares 0 prefixes (4 bytes) but has 0 bytes"
    );
}

#[test]
fn concurrent_inserts_and_gets() {
    let s = Arc::new(ChunkStore::new(64 * PAGE_SIZE as u64));
    std::thread::scope(|sc| {
        for t in 0..4u8 {
            let s = s.clone();
            sc.spawn(move || {
                for k in 0..50u8 {
                    let p = page(t.wrapping_mul(50).wrapping_add(k));
                    s.insert_many([&p[..]]);
                    let _ = s.get(&hash(&p));
                }
            });
        }
    });
    assert!(s.len() <= 64);
}

#[test]
fn decoder_learns_received_pages_into_the_store() {
    let initial = roam_snapshot::InitialImage::empty();
    let store = Arc::new(ChunkStore::new(1 << 20));
    let mut mem = vec![0u8; PAGE_SIZE];
    let mut w = BatchWriter::default();
    w.push(&Record::Raw {
        index: 0,
        codec: 0,
        data: &page(9),
    });
    Decoder::with_store(store.clone(), true)
        .apply(&w.take(), &mut MemoryTarget::new(&mut mem, &initial))
        .unwrap();
    assert!(store.contains(&hash(&page(9))));
}
