//! A hook for benchmarks: push a whole memory image through an encoder.
//!
//! The benchmark supplies the consumer (`sink`), which typically paces itself
//! to a simulated bandwidth and reports what it "wrote" to the meter; the
//! encoder's adapter then sees that bandwidth exactly as it would see a real
//! network writer's.

use crate::encoder::{EncodeError, Encoder, EncoderConfig, WireMeter};
use crate::stats::Stats;
use crate::store::StoreSummary;
use crate::PAGE_SIZE;
use roam_snapshot::InitialImage;
use std::time::{Duration, Instant};

/// The outcome of [`push_image`].
#[derive(Debug, Clone)]
pub struct PushReport {
    /// From the first submission to the consumer having taken the last batch.
    pub elapsed: Duration,
    /// When the consumer received its first batch.
    pub first_batch_after: Option<Duration>,
    /// Bytes of memory pushed.
    pub bytes_in: u64,
    /// Bytes of batches produced.
    pub bytes_out: u64,
    /// Encoder statistics.
    pub stats: Stats,
}

/// Push pages `pages` (all pages if `None`) of `memory` through an encoder
/// configured by `cfg`, handing each batch to `sink` on a separate thread.
/// `sink` must call [`WireMeter::record`] for the bytes it sends.
pub fn push_image<F>(
    memory: &[u8],
    pages: Option<&[u32]>,
    initial: &InitialImage,
    dest: Option<StoreSummary>,
    cfg: EncoderConfig,
    mut sink: F,
) -> Result<PushReport, EncodeError>
where
    F: FnMut(&[u8], &WireMeter) + Send,
{
    let all: Vec<u32>;
    let pages = match pages {
        Some(p) => p,
        None => {
            all = (0..(memory.len() / PAGE_SIZE) as u32).collect();
            &all
        }
    };
    let start = Instant::now();
    let (mut enc, rx) = Encoder::new(cfg, initial, dest);
    let meter = enc.wire_meter();
    let (stats, first) = std::thread::scope(|s| {
        let consumer = s.spawn(move || {
            let mut first = None;
            for batch in rx {
                first.get_or_insert_with(|| start.elapsed());
                sink(&batch, &meter);
            }
            first
        });
        let r = enc.submit_memory(memory, pages).and_then(|()| enc.finish());
        let first = consumer.join().map_err(|_| EncodeError::WorkerPanicked);
        (r, first)
    });
    let stats = stats?;
    Ok(PushReport {
        elapsed: start.elapsed(),
        first_batch_after: first?,
        bytes_in: stats.bytes_in,
        bytes_out: stats.bytes_out,
        stats,
    })
}
