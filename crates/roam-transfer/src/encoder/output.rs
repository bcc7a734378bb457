//! The output side of the encoder: the bounded batch channel, the wire meter
//! the consumer reports to, and the state shared with the coordinator.
//!
//! Counting batches sent and received lets the adapter see whether the
//! consumer is falling behind, and the meter gives it the bandwidth without
//! knowing anything about the transport.

use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Bytes the consumer has written to the wire. The network writer calls
/// [`WireMeter::record`] after each write; the adapter derives the bandwidth.
#[derive(Debug, Clone, Default)]
pub struct WireMeter(Arc<AtomicU64>);

impl WireMeter {
    /// Report `bytes` written.
    pub fn record(&self, bytes: u64) {
        self.0.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Total reported so far.
    pub fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub(crate) struct Shared {
    pub(super) in_flight: Mutex<usize>,
    pub(super) cv: Condvar,
    pub(super) closed: AtomicBool,
    pub(super) sent: AtomicU64,
    pub(super) received: AtomicU64,
    pub(super) wire: WireMeter,
    pub(super) stats: Mutex<Stats>,
}

impl Shared {
    pub(super) fn release(&self, n: usize) {
        let mut g = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *g = g.saturating_sub(n);
        self.cv.notify_all();
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _g = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.cv.notify_all();
    }
}

/// The finished batches, in order. Iterating ends after the last batch.
#[derive(Debug)]
pub struct BatchReceiver {
    pub(super) rx: Receiver<Vec<u8>>,
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

impl BatchReceiver {
    /// The next batch; `None` once the encoder finished and all were taken.
    pub fn recv(&self) -> Option<Vec<u8>> {
        let b = self.rx.recv().ok()?;
        self.shared.received.fetch_add(1, Ordering::Relaxed);
        Some(b)
    }

    /// Like [`BatchReceiver::recv`] with a timeout; `Ok(None)` means finished.
    pub fn recv_timeout(&self, t: Duration) -> Result<Option<Vec<u8>>, RecvTimeoutError> {
        match self.rx.recv_timeout(t) {
            Ok(b) => {
                self.shared.received.fetch_add(1, Ordering::Relaxed);
                Ok(Some(b))
            }
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The meter the consumer reports wire bytes to.
    pub fn wire_meter(&self) -> WireMeter {
        self.shared.wire.clone()
    }
}

impl Iterator for BatchReceiver {
    type Item = Vec<u8>;
    fn next(&mut self) -> Option<Vec<u8>> {
        self.recv()
    }
}
