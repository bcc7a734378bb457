//! Shared helpers: synthetic memories and a threaded encode/decode harness.
#![allow(dead_code)]

use roam_snapshot::InitialImage;
use roam_transfer::*;
use std::time::Duration;

pub const PS: usize = PAGE_SIZE;

pub fn rng_page(rng: &mut SplitMix64) -> Vec<u8> {
    (0..PS).map(|_| rng.next() as u8).collect()
}

/// Text-like, compressible page.
pub fn text_page(rng: &mut SplitMix64) -> Vec<u8> {
    let words: [&[u8]; 6] = [b"alpha ", b"beta ", b"gamma ", b"delta ", b"page ", b"\n"];
    let mut p = Vec::with_capacity(PS + 8);
    while p.len() < PS {
        p.extend_from_slice(words[rng.below(6) as usize]);
    }
    p.truncate(PS);
    p
}

/// An initial image with data in pages 0..4 and a memory of `pages` pages
/// holding a mix: zero, initial, random, text, and duplicates.
pub fn mixed_memory(pages: usize, seed: u64) -> (InitialImage, Vec<u8>) {
    let mut rng = SplitMix64::new(seed);
    let mut segs = Vec::new();
    for i in 0..4u64 {
        segs.push((i * PS as u64, text_page(&mut rng)));
    }
    let initial = InitialImage::new((pages * PS) as u64, segs);
    let mut mem = vec![0u8; pages * PS];
    for i in 0..pages {
        let page = &mut mem[i * PS..(i + 1) * PS];
        match i % 8 {
            0 | 1 => {}
            2 => page.copy_from_slice(&rng_page(&mut rng)),
            3 | 4 => page.copy_from_slice(&text_page(&mut rng)),
            5 => page[..64].copy_from_slice(&[i as u8; 64]),
            _ => {}
        }
    }
    for i in 0..4.min(pages) {
        mem[i * PS..(i + 1) * PS].copy_from_slice(initial.page(i as u64).unwrap());
    }
    // Duplicates: page 6 of every 8 copies page 3 of the same group.
    for g in 0..pages / 8 {
        let (a, b) = (g * 8 + 3, g * 8 + 6);
        let src = mem[a * PS..(a + 1) * PS].to_vec();
        mem[b * PS..(b + 1) * PS].copy_from_slice(&src);
    }
    (initial, mem)
}

pub fn static_cfg(mode: Mode) -> EncoderConfig {
    EncoderConfig {
        workers: 2,
        mode: ModeSelect::Static(mode),
        batch_bytes: 64 * 1024,
        ..EncoderConfig::default()
    }
}

/// Run one stream: each round submits `(index, page)` lists (as a set, so
/// shuffled if configured); the consumer applies batches to `dst` as they
/// arrive. Returns the stats and all batches.
pub fn run_stream(
    cfg: EncoderConfig,
    initial: &InitialImage,
    dest: Option<(StoreSummary, std::sync::Arc<ChunkStore>)>,
    rounds: Vec<Vec<(u32, Vec<u8>)>>,
    dst: &mut [u8],
) -> (Stats, Vec<Vec<u8>>) {
    let (summary, store) = match dest {
        Some((s, st)) => (Some(s), Some(st)),
        None => (None, None),
    };
    let (mut enc, rx) = Encoder::new(cfg, initial, summary);
    std::thread::scope(|s| {
        let consumer = s.spawn(move || {
            let mut dec = match store {
                Some(st) => Decoder::with_store(st, false),
                None => Decoder::new(),
            };
            let meter = rx.wire_meter();
            let mut all = Vec::new();
            while let Some(b) = rx.recv() {
                meter.record(b.len() as u64);
                dec.apply(&b, &mut MemoryTarget::new(dst, initial)).unwrap();
                all.push(b);
            }
            all
        });
        for round in rounds {
            let set = round
                .into_iter()
                .map(|(i, p)| (i, Box::new(<[u8; PAGE_SIZE]>::try_from(&p[..]).unwrap())))
                .collect();
            enc.submit_set(set).unwrap();
            enc.flush();
        }
        let stats = enc.finish().unwrap();
        (stats, consumer.join().unwrap())
    })
}

pub fn pages_of(mem: &[u8]) -> Vec<(u32, Vec<u8>)> {
    mem.chunks_exact(PS)
        .enumerate()
        .map(|(i, p)| (i as u32, p.to_vec()))
        .collect()
}

pub fn all_codecs() -> Vec<Codec> {
    let mut v = vec![Codec::None, Codec::Lz4];
    v.extend((1..=19).step_by(3).map(Codec::Zstd));
    v.push(Codec::Zstd(19));
    v
}

pub fn short_adapt(initial: Mode) -> AdaptConfig {
    AdaptConfig {
        initial,
        window: Duration::from_millis(50),
        ..AdaptConfig::default()
    }
}
