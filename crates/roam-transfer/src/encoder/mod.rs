//! The source side: pages in, batches out.
//!
//! Stages: hash (parallel workers) → dedup (one thread, in order) → delta and
//! compression (parallel workers) → batching (in order) → a bounded channel
//! the network writer drains. Input is admitted through a window of pages in
//! flight, so a slow consumer stops the pipeline (backpressure) and memory
//! stays bounded: at most `max_in_flight` pages plus `output_batches` batches.
//!
//! With delta enabled the encoder keeps a shared copy of the last version of
//! every page it sent (4 KiB per distinct non-zero page: up to the size of
//! the memory being moved), because a delta is only meaningful against bytes
//! the destination is known to hold.

mod coord;
mod dedup;
mod output;
mod worker;

pub(crate) use output::Shared;
pub use output::{BatchReceiver, WireMeter};

use crate::adapt::ModeSelect;
use crate::shuffle::SplitMix64;
use crate::stats::Stats;
use crate::store::{Page, StoreSummary};
use crate::PAGE_SIZE;
use roam_snapshot::InitialImage;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;
use worker::{Job, Msg};

/// Encoder settings.
#[derive(Debug, Clone)]
pub struct EncoderConfig {
    /// Worker threads for hashing and compression (default: available cores).
    pub workers: usize,
    /// Fixed or adaptive operating mode.
    pub mode: ModeSelect,
    /// A batch is closed once it would exceed this many bytes.
    pub batch_bytes: usize,
    /// A non-empty batch is closed at the latest this long after its first record.
    pub flush_after: Duration,
    /// Pages admitted but not yet in a batch; `submit` blocks beyond this.
    pub max_in_flight: usize,
    /// Finished batches the consumer may lag behind before the pipeline stalls.
    pub output_batches: usize,
    /// Shuffle pages within each [`Encoder::submit_set`] call with this seed.
    pub shuffle_seed: Option<u64>,
    /// Keep copies of sent pages for delta encoding (`None`: only if the mode
    /// can use delta).
    pub keep_sent_copies: Option<bool>,
}

impl Default for EncoderConfig {
    fn default() -> Self {
        EncoderConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mode: ModeSelect::Adaptive(Default::default()),
            batch_bytes: 256 * 1024,
            flush_after: Duration::from_millis(20),
            max_in_flight: 256,
            output_batches: 4,
            shuffle_seed: None,
            keep_sent_copies: None,
        }
    }
}

/// Why the encoder could not take more input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A page is not exactly one page long.
    #[error("page {index} has {len} bytes; pages are exactly 4096 bytes")]
    PageSize {
        /// Page index.
        index: u32,
        /// Length given.
        len: usize,
    },
    /// `submit_set` got the same page twice; shuffling would reorder them.
    #[error("page {0} appears twice in one set; submit later versions in a later set")]
    DuplicateInSet(u32),
    /// A page index is beyond the memory given to `submit_memory`.
    #[error("page {index} is beyond the {pages}-page memory")]
    OutOfRange {
        /// Page index.
        index: u32,
        /// Pages in the memory.
        pages: usize,
    },
    /// The batch receiver was dropped, so nothing more can be delivered.
    #[error("the batch consumer went away; the stream is closed")]
    ConsumerGone,
    /// A worker thread died.
    #[error("a pipeline thread panicked; the stream is incomplete")]
    WorkerPanicked,
}

/// The source side of one stream.
pub struct Encoder {
    jobs: Option<Sender<Job>>,
    to_coord: Sender<Msg>,
    shared: Arc<Shared>,
    max_in_flight: usize,
    seq: u64,
    rng: Option<SplitMix64>,
    threads: Vec<JoinHandle<()>>,
    coord: Option<JoinHandle<Stats>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("submitted", &self.seq)
            .finish()
    }
}

impl Encoder {
    /// Start a stream. `initial` is the module's initial memory image (pages
    /// equal to it are sent as `Initial`); `dest` is the destination's chunk
    /// store summary from the handshake, if any.
    pub fn new(
        cfg: EncoderConfig,
        initial: &InitialImage,
        dest: Option<StoreSummary>,
    ) -> (Encoder, BatchReceiver) {
        let workers = cfg.workers.max(1);
        let can_delta = match &cfg.mode {
            ModeSelect::Static(m) => m.delta,
            ModeSelect::Adaptive(a) => a.table.entries.iter().any(|e| e.mode.delta),
        };
        let shared = Arc::new(Shared {
            in_flight: Mutex::new(0),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            wire: WireMeter::default(),
            stats: Mutex::new(Stats::default()),
        });
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (msg_tx, msg_rx) = mpsc::channel::<Msg>();
        let (out_tx, out_rx) = mpsc::sync_channel(cfg.output_batches.max(1));
        let threads = (0..workers)
            .map(|i| {
                let (rx, tx) = (job_rx.clone(), msg_tx.clone());
                std::thread::Builder::new()
                    .name(format!("transfer-worker-{i}"))
                    .spawn(move || worker::run(rx, tx))
                    .expect("spawning a pipeline worker thread")
            })
            .collect();
        let c = coord::Coordinator {
            rx: msg_rx,
            jobs: job_tx.clone(),
            out: out_tx,
            shared: shared.clone(),
            dedup: Some(dedup::Dedup::new(
                initial,
                dest,
                cfg.keep_sent_copies.unwrap_or(can_delta),
            )),
            select: cfg.mode.clone(),
            batch_bytes: cfg.batch_bytes.max(64),
            flush_after: cfg.flush_after,
            workers,
            output_batches: cfg.output_batches.max(1),
        };
        let coord = std::thread::Builder::new()
            .name("transfer-coordinator".into())
            .spawn(move || c.run())
            .expect("spawning the pipeline coordinator thread");
        let enc = Encoder {
            jobs: Some(job_tx),
            to_coord: msg_tx,
            shared: shared.clone(),
            max_in_flight: cfg.max_in_flight.max(1),
            seq: 0,
            rng: cfg.shuffle_seed.map(SplitMix64::new),
            threads,
            coord: Some(coord),
        };
        (enc, BatchReceiver { rx: out_rx, shared })
    }

    /// The meter the consumer reports wire bytes to (same as the receiver's).
    pub fn wire_meter(&self) -> WireMeter {
        self.shared.wire.clone()
    }

    /// Statistics so far (refreshed every adaptation window) .
    pub fn stats(&self) -> Stats {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Submit one page (copied). Blocks while the pipeline is full.
    pub fn submit(&mut self, index: u32, page: &[u8]) -> Result<(), EncodeError> {
        let p = <&Page>::try_from(page).map_err(|_| EncodeError::PageSize {
            index,
            len: page.len(),
        })?;
        self.submit_boxed(index, Box::new(*p))
    }

    /// Submit one owned page. Blocks while the pipeline is full.
    pub fn submit_boxed(&mut self, index: u32, page: Box<Page>) -> Result<(), EncodeError> {
        {
            let mut g = self
                .shared
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            while *g >= self.max_in_flight && !self.shared.closed.load(Ordering::SeqCst) {
                g = self
                    .shared
                    .cv
                    .wait(g)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if self.shared.closed.load(Ordering::SeqCst) {
                return Err(EncodeError::ConsumerGone);
            }
            *g += 1;
        }
        let seq = self.seq;
        self.seq += 1;
        let job = Job::Hash { seq, index, page };
        match &self.jobs {
            Some(j) if j.send(job).is_ok() => Ok(()),
            _ => Err(EncodeError::WorkerPanicked),
        }
    }

    /// Submit a set of distinct pages, shuffled if a seed was configured.
    pub fn submit_set(&mut self, mut pages: Vec<(u32, Box<Page>)>) -> Result<(), EncodeError> {
        if let Some(rng) = &mut self.rng {
            let mut seen = std::collections::HashSet::with_capacity(pages.len());
            if let Some((i, _)) = pages.iter().find(|(i, _)| !seen.insert(*i)) {
                return Err(EncodeError::DuplicateInSet(*i));
            }
            rng.shuffle(&mut pages);
        }
        pages
            .into_iter()
            .try_for_each(|(i, p)| self.submit_boxed(i, p))
    }

    /// Submit pages `indices` of `memory` (copied one by one as they are
    /// admitted), shuffled if a seed was configured.
    pub fn submit_memory(&mut self, memory: &[u8], indices: &[u32]) -> Result<(), EncodeError> {
        let pages = memory.len() / PAGE_SIZE;
        let mut order = indices.to_vec();
        if let Some(rng) = &mut self.rng {
            let mut seen = std::collections::HashSet::with_capacity(order.len());
            if let Some(i) = order.iter().find(|i| !seen.insert(**i)) {
                return Err(EncodeError::DuplicateInSet(*i));
            }
            rng.shuffle(&mut order);
        }
        for i in order {
            let o = i as usize * PAGE_SIZE;
            let page = memory
                .get(o..o + PAGE_SIZE)
                .ok_or(EncodeError::OutOfRange { index: i, pages })?;
            self.submit(i, page)?;
        }
        Ok(())
    }

    /// Emit everything submitted so far as soon as it is processed, without
    /// waiting for a full batch (end of a round, or a post-copy request).
    pub fn flush(&mut self) {
        let _ = self.to_coord.send(Msg::Flush { upto: self.seq });
    }

    /// No more input: wait until every record is in a batch and return the
    /// final statistics. The receiver ends after the last batch.
    pub fn finish(mut self) -> Result<Stats, EncodeError> {
        let _ = self.to_coord.send(Msg::Finish { total: self.seq });
        self.jobs = None;
        let stats = self
            .coord
            .take()
            .map(|h| h.join())
            .transpose()
            .map_err(|_| EncodeError::WorkerPanicked)?
            .unwrap_or_default();
        for t in self.threads.drain(..) {
            t.join().map_err(|_| EncodeError::WorkerPanicked)?;
        }
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(EncodeError::ConsumerGone);
        }
        Ok(stats)
    }
}

impl Drop for Encoder {
    fn drop(&mut self) {
        // Unblock and stop the coordinator if `finish` was not called.
        let _ = self.to_coord.send(Msg::Finish { total: 0 });
        self.jobs = None;
    }
}
