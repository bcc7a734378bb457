//! A stable, deterministic stand-in for the fuzzer: thousands of mutations of
//! a valid snapshot must all be refused cleanly (no panic, no success).

use crate::testutil::{sample_snapshot, Rng};
use crate::*;

fn mutate(rng: &mut Rng, good: &[u8]) -> Vec<u8> {
    let mut b = good.to_vec();
    match rng.below(5) {
        0 => {
            let at = rng.below(b.len() as u64) as usize;
            b[at] ^= 1 << rng.below(8);
        }
        1 => {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(b.len() as u64) as usize;
                b[at] = rng.next_u64() as u8;
            }
        }
        2 => b.truncate(rng.below(b.len() as u64) as usize),
        3 => {
            let at = rng.below(b.len() as u64) as usize;
            b.insert(at, rng.next_u64() as u8);
        }
        _ => {
            let at = rng.below(b.len() as u64) as usize;
            b.remove(at);
        }
    }
    b
}

#[test]
fn mutations_of_a_valid_snapshot_are_refused_without_panic() {
    for format in [Format::V1, Format::V2] {
        mutations_are_refused(format);
    }
}

fn mutations_are_refused(format: Format) {
    let (_, _, snap) = sample_snapshot(2, 50);
    let opts = EncodeOptions {
        format,
        ..Default::default()
    };
    let good = snap.encode(&opts).unwrap();
    let mut rng = Rng::new(0xfeed);
    let mut seen = std::collections::HashSet::new();
    for i in 0..4000 {
        let b = mutate(&mut rng, &good);
        if b == good {
            continue;
        }
        match Snapshot::decode(&b) {
            Ok(_) => panic!("mutation {i} decoded successfully"),
            Err(e) => {
                seen.insert(std::mem::discriminant(&e));
            }
        }
    }
    // The mutations reach several distinct checks, not just one.
    assert!(seen.len() >= 4, "only {} error kinds reached", seen.len());
}

#[test]
fn random_bytes_with_a_valid_header_prefix_are_refused() {
    let mut rng = Rng::new(7);
    for len in [0usize, 1, 8, 12, 79, 80, 81, 200, 5000] {
        let mut b = vec![0u8; len];
        rng.fill(&mut b);
        let n = len.min(8);
        b[..n].copy_from_slice(&MAGIC[..n]);
        if len >= 12 {
            b[8..12].copy_from_slice(&[1, 0, 0, 0]);
        }
        assert!(Snapshot::decode(&b).is_err(), "len {len}");
    }
}
