//! Operating modes and their reference costs.
//!
//! A mode is one choice of "delta or not" and codec. Absolute per-page cost
//! and compression ratio depend heavily on the workload, but how modes rank
//! against each other is much more stable; so the adapter keeps a table of
//! reference costs measured once on a reference workload and rescales it by
//! what the current mode achieves right now.

use crate::codec::{Codec, PageCompressor};
use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// One operating mode of the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Mode {
    /// Send pages that were sent before as XOR deltas against that version.
    pub delta: bool,
    /// Codec for raw pages and deltas.
    pub codec: Codec,
}

impl Mode {
    /// A mode.
    pub const fn new(delta: bool, codec: Codec) -> Self {
        Mode { delta, codec }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            if self.delta { "delta+" } else { "" },
            self.codec
        )
    }
}

/// Reference cost of one mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ModeProfile {
    /// The mode.
    pub mode: Mode,
    /// Processing time per page on one core, nanoseconds (delta + compress).
    pub p_nanos: f64,
    /// Output bytes / input bytes.
    pub ratio: f64,
}

/// Reference costs of the modes the adapter may choose from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeTable {
    /// One entry per candidate mode.
    pub entries: Vec<ModeProfile>,
}

/// The codecs the built-in table and [`ModeTable::measure`] consider by default.
pub const DEFAULT_CODECS: [Codec; 9] = [
    Codec::None,
    Codec::Lz4,
    Codec::Zstd(1),
    Codec::Zstd(3),
    Codec::Zstd(6),
    Codec::Zstd(9),
    Codec::Zstd(12),
    Codec::Zstd(15),
    Codec::Zstd(19),
];

/// Every default codec with and without delta.
pub fn default_modes() -> Vec<Mode> {
    [false, true]
        .into_iter()
        .flat_map(|d| DEFAULT_CODECS.into_iter().map(move |c| Mode::new(d, c)))
        .collect()
}

impl ModeTable {
    /// The reference table shipped with the crate, measured with
    /// [`ModeTable::measure`] on [`reference_workload`] (one x86-64 core).
    /// Only the ratios between entries matter to the adapter.
    pub fn builtin() -> Self {
        // (p_nanos, ratio) for DEFAULT_CODECS without delta, then with delta.
        const PLAIN: [(f64, f64); 9] = BUILTIN_PLAIN;
        const DELTA: [(f64, f64); 9] = BUILTIN_DELTA;
        let mut entries = Vec::new();
        for (delta, rows) in [(false, PLAIN), (true, DELTA)] {
            for (codec, (p_nanos, ratio)) in DEFAULT_CODECS.into_iter().zip(rows) {
                entries.push(ModeProfile {
                    mode: Mode::new(delta, codec),
                    p_nanos,
                    ratio,
                });
            }
        }
        ModeTable { entries }
    }

    /// Measure `modes` on `(previous, current)` page pairs: modes without
    /// delta compress `current`, modes with delta compress `previous ^
    /// current`. Each mode is timed over the whole sample on this thread.
    pub fn measure(pairs: &[(&[u8], &[u8])], modes: &[Mode]) -> Self {
        let mut c = PageCompressor::default();
        let mut x = vec![0u8; PAGE_SIZE];
        let mut rec = Vec::with_capacity(2 * PAGE_SIZE);
        let pairs: Vec<_> = pairs
            .iter()
            .filter(|(a, b)| a.len() == PAGE_SIZE && b.len() == PAGE_SIZE)
            .collect();
        let n = pairs.len().max(1) as f64;
        let entries = modes
            .iter()
            .map(|&mode| {
                // Warm up the codec context outside the timed loop.
                let _ = c.compress(mode.codec, &x);
                let start = Instant::now();
                let mut out = 0usize;
                for (prev, cur) in &pairs {
                    let input: &[u8] = if mode.delta {
                        crate::xor_into(&mut x, prev, cur);
                        &x
                    } else {
                        cur
                    };
                    // Copy the output as the pipeline does when it builds
                    // the record, so "none" is not measured as free.
                    let (_, data) = c.compress(mode.codec, input);
                    rec.clear();
                    rec.extend_from_slice(data);
                    out += rec.len();
                }
                ModeProfile {
                    mode,
                    p_nanos: start.elapsed().as_nanos() as f64 / n,
                    ratio: out as f64 / (n * PAGE_SIZE as f64),
                }
            })
            .collect();
        ModeTable { entries }
    }

    /// The entry for `mode`.
    pub fn get(&self, mode: Mode) -> Option<&ModeProfile> {
        self.entries.iter().find(|e| e.mode == mode)
    }
}

/// A deterministic synthetic workload of `(previous, current)` page pairs:
/// a mix of text, small integers, pointers, sparse and random pages, where the
/// current version changes a few scattered words of the previous one.
pub fn reference_workload(pages: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut rng = crate::shuffle::SplitMix64::new(0x5eed);
    let words = [
        "the ", "cell ", "memory ", "page ", "node ", "migrate ", "wasm ", "value ", "=", "; ",
        "{\"id\":", "}\n",
    ];
    (0..pages)
        .map(|k| {
            let mut p = vec![0u8; PAGE_SIZE];
            match k % 5 {
                0 => {
                    let mut i = 0;
                    while i < PAGE_SIZE {
                        let w = words[rng.below(words.len() as u64) as usize].as_bytes();
                        let n = w.len().min(PAGE_SIZE - i);
                        p[i..i + n].copy_from_slice(&w[..n]);
                        i += n;
                    }
                }
                1 => {
                    for c in p.chunks_exact_mut(4) {
                        c.copy_from_slice(&(rng.below(1000) as u32).to_le_bytes());
                    }
                }
                2 => {
                    let base = 0x0010_0000 + rng.below(1 << 16) as u32;
                    for c in p.chunks_exact_mut(4) {
                        c.copy_from_slice(&(base + 8 * rng.below(4096) as u32).to_le_bytes());
                    }
                }
                3 => {
                    for _ in 0..64 {
                        let i = rng.below(PAGE_SIZE as u64) as usize;
                        p[i] = rng.next() as u8;
                    }
                }
                _ => p.iter_mut().for_each(|b| *b = rng.next() as u8),
            }
            let mut cur = p.clone();
            for _ in 0..8 {
                let i = rng.below((PAGE_SIZE / 8) as u64) as usize * 8;
                cur[i..i + 8].copy_from_slice(&rng.next().to_le_bytes());
            }
            (p, cur)
        })
        .collect()
}

include!("builtin_table.rs");
