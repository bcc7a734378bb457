//! Encoder + decoder must reproduce the source memory byte for byte.

mod common;
use common::*;
use roam_transfer::*;
use std::sync::Arc;

#[test]
fn every_codec_with_and_without_delta_roundtrips() {
    let (initial, mem) = mixed_memory(96, 1);
    for codec in all_codecs() {
        for delta in [false, true] {
            let mode = Mode::new(delta, codec);
            let mut dst = vec![0xaau8; mem.len()];
            let (stats, _) = run_stream(
                static_cfg(mode),
                &initial,
                None,
                vec![pages_of(&mem)],
                &mut dst,
            );
            assert!(dst == mem, "{mode}: memory differs");
            assert_eq!(stats.pages_in, 96, "{mode}");
            assert_eq!(stats.zero_pages, 12 * 3 - 4 + 2, "{mode}: zero pages");
            assert_eq!(stats.initial_pages, 4, "{mode}");
            assert!(stats.dup_pages >= 11, "{mode}: dups {}", stats.dup_pages);
            if codec != Codec::None {
                assert!(stats.compress_out_bytes < stats.compress_in_bytes, "{mode}");
            }
        }
    }
}

#[test]
fn adaptive_mode_roundtrips() {
    let (initial, mem) = mixed_memory(512, 2);
    let cfg = EncoderConfig {
        workers: 2,
        mode: ModeSelect::Adaptive(short_adapt(Mode::new(true, Codec::Zstd(3)))),
        ..EncoderConfig::default()
    };
    let mut dst = vec![0u8; mem.len()];
    let (stats, _) = run_stream(cfg, &initial, None, vec![pages_of(&mem)], &mut dst);
    assert!(dst == mem);
    assert_eq!(stats.pages_in, 512);
}

#[test]
fn rounds_with_resent_pages_and_deltas_roundtrip() {
    let (initial, mut mem) = mixed_memory(64, 3);
    let mut rng = SplitMix64::new(9);
    let mut rounds = vec![pages_of(&mem)];
    for _ in 0..3 {
        let mut dirty = Vec::new();
        for i in (2..64).step_by(3) {
            let o = i * PS + rng.below(PS as u64 - 16) as usize;
            mem[o..o + 16].copy_from_slice(&rng.next().to_le_bytes().repeat(2));
            dirty.push((i as u32, mem[i * PS..(i + 1) * PS].to_vec()));
        }
        // A page that goes back to zero and one that is resent unchanged.
        mem[5 * PS..6 * PS].fill(0);
        dirty.push((5, vec![0; PS]));
        dirty.push((0, mem[..PS].to_vec()));
        rounds.push(dirty);
    }
    for mode in [
        Mode::new(true, Codec::Lz4),
        Mode::new(false, Codec::Zstd(3)),
    ] {
        let mut dst = vec![0u8; mem.len()];
        let (stats, _) = run_stream(static_cfg(mode), &initial, None, rounds.clone(), &mut dst);
        assert!(dst == mem, "{mode}");
        assert!(
            stats.unchanged_pages >= 3,
            "{mode}: {}",
            stats.unchanged_pages
        );
        if mode.delta {
            assert!(stats.delta_pages > 30, "{mode}: {}", stats.delta_pages);
            assert!(stats.delta_unchanged_bytes > stats.delta_pages * 4000);
        } else {
            assert_eq!(stats.delta_pages, 0);
        }
    }
}

#[test]
fn randomized_order_roundtrips_and_is_seedable() {
    let (initial, mem) = mixed_memory(128, 4);
    let mut outs = Vec::new();
    for seed in [1u64, 1, 2] {
        let cfg = EncoderConfig {
            shuffle_seed: Some(seed),
            ..static_cfg(Mode::new(false, Codec::Lz4))
        };
        let mut dst = vec![0u8; mem.len()];
        let (_, batches) = run_stream(cfg, &initial, None, vec![pages_of(&mem)], &mut dst);
        assert!(dst == mem, "seed {seed}");
        let order: Vec<u32> = batches
            .iter()
            .flat_map(|b| {
                decode_batch(b)
                    .unwrap()
                    .into_iter()
                    .map(|r| r.index())
                    .collect::<Vec<_>>()
            })
            .collect();
        outs.push(order);
    }
    assert_eq!(outs[0], outs[1], "same seed, same order");
    assert_ne!(outs[0], outs[2], "different seed, different order");
    let mut sorted = outs[0].clone();
    sorted.sort_unstable();
    assert_ne!(outs[0], sorted, "order is shuffled");
}

#[test]
fn copy_source_is_invalidated_when_it_changes() {
    let initial = roam_snapshot::InitialImage::empty();
    let mut rng = SplitMix64::new(5);
    let x = rng_page(&mut rng);
    let y = rng_page(&mut rng);
    // A = page 0, B = page 1, C = page 2.
    let rounds = vec![
        vec![(0, x.clone()), (1, x.clone())],
        vec![(0, y.clone())],
        vec![(2, x.clone())],
    ];
    let mut dst = vec![0u8; 3 * PS];
    let (stats, batches) = run_stream(
        static_cfg(Mode::new(false, Codec::Lz4)),
        &initial,
        None,
        rounds,
        &mut dst,
    );
    assert!(dst[..PS] == y[..], "A holds its new contents");
    assert!(dst[PS..2 * PS] == x[..], "B holds the old contents of A");
    assert!(dst[2 * PS..] == x[..], "C must hold the old contents of A");
    let recs: Vec<String> = batches
        .iter()
        .flat_map(|b| {
            decode_batch(b)
                .unwrap()
                .into_iter()
                .map(|r| format!("{r:?}"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(recs[1].starts_with("Copy { index: 1, from: 0"), "{recs:?}");
    assert!(
        !recs[3].contains("from: 0"),
        "C copied from the changed page A: {recs:?}"
    );
    assert_eq!(stats.dup_pages, 1);
}

#[test]
fn destination_store_chunks_are_referenced_not_sent() {
    let (initial, mem) = mixed_memory(64, 6);
    let store = Arc::new(ChunkStore::new(1 << 20));
    // The destination already holds every text page.
    let text: Vec<&[u8]> = (0..64)
        .filter(|i| i % 8 == 3 || i % 8 == 4)
        .map(|i| &mem[i * PS..(i + 1) * PS])
        .collect();
    store.insert_many(text.iter().copied());
    let summary = StoreSummary::from_bytes(&store.summary().to_bytes()).unwrap();
    let mut dst = vec![0u8; mem.len()];
    let (stats, _) = run_stream(
        static_cfg(Mode::new(false, Codec::Zstd(1))),
        &initial,
        Some((summary, store)),
        vec![pages_of(&mem)],
        &mut dst,
    );
    assert!(dst == mem);
    assert!(stats.store_pages >= 14, "{}", stats.store_pages);
    // Only the random pages (7; one was overwritten by the initial image) and
    // the 8 marker pages are left for the compressor.
    assert_eq!(stats.compressed_pages, 15);
}

#[test]
fn stats_serialize_to_json() {
    let (initial, mem) = mixed_memory(16, 7);
    let mut dst = vec![0u8; mem.len()];
    let (stats, _) = run_stream(
        static_cfg(Mode::new(false, Codec::Lz4)),
        &initial,
        None,
        vec![pages_of(&mem)],
        &mut dst,
    );
    let json = serde_json::to_string(&stats).unwrap();
    assert!(json.contains("\"zero_pages\""));
    let back: Stats = serde_json::from_str(&json).unwrap();
    assert_eq!(back, stats);
    assert!(stats.bytes_out > 0 && stats.batches_out > 0);
}
