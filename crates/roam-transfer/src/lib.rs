//! Moving a cell's linear memory between nodes: roam's page transfer pipeline.
//!
//! Live migration is bounded by whichever is slower, the CPU preparing the
//! pages or the network carrying them. This crate follows the VM handoff
//! approach: avoid sending what the destination already has (zero pages, the
//! module's initial image, chunks in the destination's store, pages sent
//! earlier in the stream), send changed pages as deltas against what was sent
//! before, compress the rest on all cores, overlap all of it with sending,
//! and keep re-choosing the delta/codec trade-off from live measurements of
//! processing cost, compression ratio and bandwidth.
//!
//! The API is transport-agnostic: the [`Encoder`] turns pages into byte
//! batches delivered through a bounded [`BatchReceiver`]; the [`Decoder`]
//! applies batches, in the same order, to any [`PageTarget`] (for example a
//! live wasm memory through [`MemoryTarget`]). See `docs/transfer.md` for the
//! byte layout and the algorithms.
//!
//! ```
//! use roam_transfer::*;
//! use roam_snapshot::InitialImage;
//! let initial = InitialImage::empty();
//! let mut src = vec![0u8; 8 * PAGE_SIZE];
//! src[PAGE_SIZE..2 * PAGE_SIZE].fill(7);
//! let (mut enc, rx) = Encoder::new(EncoderConfig::default(), &initial, None);
//! let consumer = std::thread::spawn(move || rx.collect::<Vec<_>>());
//! enc.submit_memory(&src, &(0..8).collect::<Vec<u32>>()).unwrap();
//! let stats = enc.finish().unwrap();
//! let mut dst = vec![0xffu8; 8 * PAGE_SIZE];
//! let mut dec = Decoder::new();
//! for batch in consumer.join().unwrap() {
//!     dec.apply(&batch, &mut MemoryTarget::new(&mut dst, &initial)).unwrap();
//! }
//! assert_eq!(src, dst);
//! assert_eq!(stats.zero_pages, 7);
//! ```

#![deny(missing_docs)]

mod adapt;
mod bench;
mod codec;
mod decoder;
mod direct;
mod encoder;
mod mode;
mod record;
mod shuffle;
mod stats;
mod store;
mod target;

pub use adapt::{AdaptConfig, Adapter, ModeSelect, Prediction, Window};
pub use bench::{push_image, PushReport};
pub use codec::{decompress_page, Codec, CodecError, PageCompressor};
pub use decoder::{ApplyError, DecodeStats, Decoder};
pub use direct::{DirectEncoder, DirectStats};
pub use encoder::{BatchReceiver, EncodeError, Encoder, EncoderConfig, WireMeter};
pub use mode::{default_modes, reference_workload, Mode, ModeProfile, ModeTable, DEFAULT_CODECS};
pub use record::{batch_checksum, decode_batch, BatchError, BatchWriter, Record, BATCH_VERSION};
pub use shuffle::SplitMix64;
pub use stats::{ModeSwitch, Stats};
pub use store::{ChunkHash, ChunkStore, Page, StoreSummary, SummaryError};
pub use target::{MemoryTarget, PageTarget};

/// Transfer granularity: one page of linear memory.
pub const PAGE_SIZE: usize = roam_snapshot::PAGE_SIZE;

/// `out = a ^ b` for three equally long slices.
pub(crate) fn xor_into(out: &mut [u8], a: &[u8], b: &[u8]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x ^ y;
    }
}
