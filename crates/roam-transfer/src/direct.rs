//! Encoding a few pages on the calling thread, for the pause.
//!
//! Why it exists: the [`crate::Encoder`] pipeline is built for throughput.
//! Every page crosses several threads (hashing workers, the coordinator,
//! compression workers, the coordinator again, the batch pump), which costs
//! nothing while it overlaps with a long transfer but is pure latency for
//! the few hundred pages of a final pre-copy round: on a busy two-core host
//! each hand-off waits for the scheduler, and 800 pages took 56 ms through
//! the pipeline where the wire needed 15. The final round runs while the
//! program is paused, so latency is all that counts there.
//!
//! [`DirectEncoder`] does the same job on one thread with no dedup state
//! and no delta: a page is a zero record, an initial-image record, or the
//! page compressed with one cheap codec (sent as it is when that does not
//! shrink it). Its batches use the ordinary wire format, so any decoder
//! applies them. Because it keeps no copy of what it sent, it can only end
//! a stream: nothing encoded by a pipeline may follow its batches, or a
//! delta could refer to a page version the pipeline never saw.

use std::time::Instant;

use roam_snapshot::InitialImage;
use serde::{Deserialize, Serialize};

use crate::codec::{Codec, PageCompressor};
use crate::record::{BatchWriter, Record};
use crate::PAGE_SIZE;

/// What a [`DirectEncoder`] did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectStats {
    /// Pages encoded.
    pub pages: u64,
    /// Of those, all-zero pages (sent as a zero record).
    pub zero_pages: u64,
    /// Of those, pages equal to the module's initial image.
    pub initial_pages: u64,
    /// Pages the codec did not shrink (sent as they are).
    pub incompressible_pages: u64,
    /// Batch bytes produced.
    pub bytes_out: u64,
    /// Time spent encoding, nanoseconds.
    pub nanos: u64,
}

/// Encodes pages into batches on the calling thread (see the module docs).
pub struct DirectEncoder<'a> {
    initial: &'a InitialImage,
    codec: Codec,
    comp: PageCompressor,
    writer: BatchWriter,
    batch_bytes: usize,
    stats: DirectStats,
}

impl std::fmt::Debug for DirectEncoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectEncoder")
            .field("codec", &self.codec)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<'a> DirectEncoder<'a> {
    /// Pages equal to `initial`'s are sent as references to it; others are
    /// compressed with `codec`; a batch is closed once it would exceed
    /// `batch_bytes` (at least one record per batch).
    pub fn new(initial: &'a InitialImage, codec: Codec, batch_bytes: usize) -> Self {
        DirectEncoder {
            initial,
            codec,
            comp: PageCompressor::default(),
            writer: BatchWriter::default(),
            batch_bytes: batch_bytes.max(64),
            stats: DirectStats::default(),
        }
    }

    /// Encode page `index`. Returns a finished batch when this page did not
    /// fit in the current one (the page then starts the next batch).
    pub fn push(&mut self, index: u32, page: &[u8; PAGE_SIZE]) -> Option<Vec<u8>> {
        let t = Instant::now();
        let mut rec = Vec::with_capacity(PAGE_SIZE + 16);
        self.stats.pages += 1;
        if page.iter().all(|&b| b == 0) {
            self.stats.zero_pages += 1;
            Record::Zero { index }.encode_into(&mut rec);
        } else if self.initial.page(u64::from(index)) == Some(&page[..]) {
            self.stats.initial_pages += 1;
            Record::Initial { index }.encode_into(&mut rec);
        } else {
            let (used, data) = self.comp.compress(self.codec, page);
            if used == Codec::None && self.codec != Codec::None {
                self.stats.incompressible_pages += 1;
            }
            Record::Raw {
                index,
                codec: used.wire_id(),
                data,
            }
            .encode_into(&mut rec);
        }
        let full = (!self.writer.is_empty()
            && self.writer.encoded_len() + rec.len() > self.batch_bytes)
            .then(|| self.take());
        self.writer.push_encoded(&rec);
        self.stats.nanos += t.elapsed().as_nanos() as u64;
        full
    }

    /// The last, partial batch, if any page is in it.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        (!self.writer.is_empty()).then(|| self.take())
    }

    /// What was done so far.
    pub fn stats(&self) -> &DirectStats {
        &self.stats
    }

    fn take(&mut self) -> Vec<u8> {
        let b = self.writer.take();
        self.stats.bytes_out += b.len() as u64;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_batch, Decoder, MemoryTarget};

    fn page(seed: u8) -> [u8; PAGE_SIZE] {
        let mut p = [0u8; PAGE_SIZE];
        for (i, b) in p.iter_mut().enumerate() {
            *b = (i as u8 / 9).wrapping_mul(seed);
        }
        p
    }

    #[test]
    fn batches_rebuild_the_pages_exactly_whatever_the_codec() {
        let mut init = vec![0u8; 2 * PAGE_SIZE];
        init[PAGE_SIZE..].copy_from_slice(&page(3));
        let initial = InitialImage::new(init.len() as u64, vec![(0, init)]);
        // Page 0 zero, 1 initial, 2..6 data, 6 incompressible.
        let mut src = vec![0u8; 7 * PAGE_SIZE];
        src[PAGE_SIZE..2 * PAGE_SIZE].copy_from_slice(&page(3));
        for i in 2..6 {
            src[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(&page(i as u8 + 5));
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in &mut src[6 * PAGE_SIZE..] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for codec in [Codec::None, Codec::Lz4, Codec::Zstd(1)] {
            // Small batches: several of them, cut between records.
            let mut enc = DirectEncoder::new(&initial, codec, 3000);
            let mut batches = Vec::new();
            for i in 0..7u32 {
                let p: &[u8; PAGE_SIZE] = src[i as usize * PAGE_SIZE..(i as usize + 1) * PAGE_SIZE]
                    .try_into()
                    .unwrap();
                batches.extend(enc.push(i, p));
            }
            batches.extend(enc.finish());
            assert!(batches.len() > 1, "{codec}: expected several batches");
            let s = enc.stats().clone();
            assert_eq!((s.pages, s.zero_pages, s.initial_pages), (7, 1, 1));
            assert_eq!(s.incompressible_pages, u64::from(codec != Codec::None));
            assert_eq!(
                s.bytes_out,
                batches.iter().map(|b| b.len() as u64).sum::<u64>()
            );
            let records: usize = batches.iter().map(|b| decode_batch(b).unwrap().len()).sum();
            assert_eq!(records, 7);
            // The destination holds something else everywhere beforehand.
            let mut dst = vec![0xa5u8; 7 * PAGE_SIZE];
            let mut dec = Decoder::new();
            for b in &batches {
                dec.apply(b, &mut MemoryTarget::new(&mut dst, &initial))
                    .unwrap();
            }
            assert!(dst == src, "{codec}: the pages differ after decoding");
        }
    }

    #[test]
    fn nothing_pushed_gives_no_batch() {
        let initial = InitialImage::empty();
        let mut enc = DirectEncoder::new(&initial, Codec::Lz4, 1 << 16);
        assert_eq!(enc.finish(), None);
        assert_eq!(enc.stats().pages, 0);
    }
}
