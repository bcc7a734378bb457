//! What the pipeline did, stage by stage.
//!
//! Counters are kept per stage so an operator (and the benchmarks) can see
//! where the bytes went: how much each dedup source removed, what delta and
//! compression saved, and where the time was spent. Serialisable so the node
//! can report it as JSON.

use crate::mode::Mode;
use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// One change of operating mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeSwitch {
    /// Milliseconds since the encoder started.
    pub at_ms: u64,
    /// Mode before.
    pub from: Mode,
    /// Mode after.
    pub to: Mode,
    /// The measurements and prediction that motivated it.
    pub reason: String,
}

/// Encoder statistics. Byte counts of removed pages are `pages * 4096`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Pages submitted.
    pub pages_in: u64,
    /// Bytes submitted (`pages_in * 4096`).
    pub bytes_in: u64,
    /// Pages whose content equals what this stream already sent for them:
    /// no record at all.
    pub unchanged_pages: u64,
    /// Pages sent as `Zero`.
    pub zero_pages: u64,
    /// Pages sent as `Initial`.
    pub initial_pages: u64,
    /// Pages sent as `Stored` (found in the destination's chunk store).
    pub store_pages: u64,
    /// Pages sent as `Copy` (duplicates of a chunk sent earlier in the stream).
    pub dup_pages: u64,
    /// Pages that reached the compressor (sent as `Raw` or `Delta`).
    pub compressed_pages: u64,
    /// Of those, pages sent as `Delta`.
    pub delta_pages: u64,
    /// Bytes of delta-encoded pages that were unchanged since the previous
    /// version (zero bytes of the XOR): what the delta stage removed.
    pub delta_unchanged_bytes: u64,
    /// Pages that did not shrink and were sent uncompressed.
    pub incompressible_pages: u64,
    /// Bytes given to the compressor.
    pub compress_in_bytes: u64,
    /// Bytes the compressor produced (payloads only).
    pub compress_out_bytes: u64,
    /// Records emitted.
    pub records_out: u64,
    /// Batches emitted.
    pub batches_out: u64,
    /// Bytes of batches emitted (everything the transport has to carry).
    pub bytes_out: u64,
    /// Worker time spent hashing, summed over workers.
    pub hash_nanos: u64,
    /// Coordinator time spent on dedup decisions.
    pub dedup_nanos: u64,
    /// Worker time spent on XOR and compression, summed over workers.
    pub compress_nanos: u64,
    /// Time the pipeline waited for the consumer (backpressure).
    pub output_wait_nanos: u64,
    /// Wall time from start to the last batch.
    pub elapsed_nanos: u64,
    /// Mode in use at the end (or now).
    pub mode: Option<Mode>,
    /// Every mode switch, in order.
    pub mode_switches: Vec<ModeSwitch>,
}

impl Stats {
    /// Bytes removed by dedup (zero, initial, store, in-stream) and unchanged pages.
    pub fn dedup_saved_bytes(&self) -> u64 {
        (self.unchanged_pages
            + self.zero_pages
            + self.initial_pages
            + self.store_pages
            + self.dup_pages)
            * PAGE_SIZE as u64
    }

    /// Bytes removed by compression (of raw pages and deltas).
    pub fn compression_saved_bytes(&self) -> u64 {
        self.compress_in_bytes
            .saturating_sub(self.compress_out_bytes)
    }

    /// `bytes_out / bytes_in`, or 0 before any input.
    pub fn ratio(&self) -> f64 {
        if self.bytes_in == 0 {
            0.0
        } else {
            self.bytes_out as f64 / self.bytes_in as f64
        }
    }
}
