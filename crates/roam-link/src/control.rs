//! The remote control of a running proxy: faults and counters.
//!
//! Tests need to break a link at a precise moment (a cut in the middle of a
//! snapshot transfer, one corrupted byte at a known offset) and to observe
//! what went through. [`LinkHandle`] is cheap to clone and can be moved into
//! whatever task decides when to strike, while the proxy keeps running.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::config::Direction;

/// What the proxy does with new connections after [`LinkHandle::cut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterCut {
    /// Keep accepting: the link "flaps" once and reconnecting succeeds.
    Accept,
    /// Reset every new connection until [`LinkHandle::restore`]: a
    /// partition. The listening socket stays open, so clients see their
    /// connection accepted and then reset rather than refused, like a link
    /// that drops everything behind a reachable first hop.
    Refuse,
}

/// A pending byte corruption for one direction.
#[derive(Clone, Copy, Debug)]
struct CorruptPlan {
    offset: u64,
    every_connection: bool,
}

/// State shared by the proxy's tasks and every [`LinkHandle`].
#[derive(Debug)]
pub(crate) struct Shared {
    /// Bumped by every cut; each connection watches it.
    cuts: watch::Sender<u64>,
    /// Set once by shutdown; the accept loop watches it.
    shutdown: watch::Sender<bool>,
    refusing: AtomicBool,
    corrupt: [Mutex<Option<CorruptPlan>>; 2],
    corrupted: [AtomicU64; 2],
    forwarded: [AtomicU64; 2],
    accepted: AtomicU64,
    refused: AtomicU64,
    connect_failures: AtomicU64,
    active: AtomicUsize,
}

impl Shared {
    pub(crate) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            cuts: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            refusing: AtomicBool::new(false),
            corrupt: [Mutex::new(None), Mutex::new(None)],
            corrupted: [AtomicU64::new(0), AtomicU64::new(0)],
            forwarded: [AtomicU64::new(0), AtomicU64::new(0)],
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            active: AtomicUsize::new(0),
        })
    }

    pub(crate) fn cut_watch(&self) -> watch::Receiver<u64> {
        self.cuts.subscribe()
    }

    pub(crate) fn shutdown_watch(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub(crate) fn request_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub(crate) fn cut_all(&self) {
        self.cuts.send_modify(|epoch| *epoch += 1);
    }

    pub(crate) fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::SeqCst)
    }

    /// The offset to corrupt in `dir` for a connection being accepted now,
    /// consuming a one-shot plan.
    pub(crate) fn claim_corruption(&self, dir: Direction) -> Option<u64> {
        let mut plan = self.corrupt[dir.index()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let current = (*plan)?;
        if !current.every_connection {
            *plan = None;
        }
        Some(current.offset)
    }

    pub(crate) fn note_corrupted(&self, dir: Direction) {
        self.corrupted[dir.index()].fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn note_forwarded(&self, dir: Direction, bytes: usize) {
        self.forwarded[dir.index()].fetch_add(bytes as u64, Ordering::SeqCst);
    }

    pub(crate) fn note_accepted(&self) {
        self.accepted.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn note_refused(&self) {
        self.refused.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn note_connect_failure(&self) {
        self.connect_failures.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a live connection until the guard is dropped.
    pub(crate) fn active_guard(self: &Arc<Shared>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(Arc::clone(self))
    }
}

/// Decrements the live-connection count when a connection task ends.
pub(crate) struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Controls a running [`LinkProxy`](crate::LinkProxy): inject faults, read
/// counters. Clones control the same proxy.
#[derive(Clone, Debug)]
pub struct LinkHandle {
    pub(crate) shared: Arc<Shared>,
}

impl LinkHandle {
    /// Abruptly closes every current connection: both the client and the
    /// target get a TCP reset (a read returns `ConnectionReset`, or end of
    /// file if the reset raced with a close), and bytes still in flight
    /// inside the proxy are dropped. `after` says whether new connections
    /// are accepted or reset until [`LinkHandle::restore`].
    pub fn cut(&self, after: AfterCut) {
        if after == AfterCut::Refuse {
            self.shared.refusing.store(true, Ordering::SeqCst);
        }
        self.shared.cut_all();
    }

    /// Accepts new connections again after [`AfterCut::Refuse`].
    pub fn restore(&self) {
        self.shared.refusing.store(false, Ordering::SeqCst);
    }

    /// Whether new connections are currently being reset.
    pub fn is_refusing(&self) -> bool {
        self.shared.is_refusing()
    }

    /// Flips one byte (XOR 0xFF) at `byte_offset` (0-based, counted from the
    /// start of the stream in `dir`) of the next connection accepted after
    /// this call. Connections already open are not affected. A stream that
    /// ends before the offset is left intact and the plan is spent anyway.
    /// Replaces any earlier plan for `dir`.
    pub fn corrupt_after(&self, dir: Direction, byte_offset: u64) {
        self.set_corruption(dir, byte_offset, false);
    }

    /// Like [`LinkHandle::corrupt_after`], but for every connection accepted
    /// from now on, until [`LinkHandle::clear_corruption`].
    pub fn corrupt_each_after(&self, dir: Direction, byte_offset: u64) {
        self.set_corruption(dir, byte_offset, true);
    }

    /// Cancels the corruption plan of `dir` (connections that already
    /// claimed it still apply it).
    pub fn clear_corruption(&self, dir: Direction) {
        *self.shared.corrupt[dir.index()]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn set_corruption(&self, dir: Direction, offset: u64, every_connection: bool) {
        let plan = CorruptPlan {
            offset,
            every_connection,
        };
        *self.shared.corrupt[dir.index()]
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(plan);
    }

    /// Bytes flipped so far in `dir` (one per corrupted connection).
    pub fn bytes_corrupted(&self, dir: Direction) -> u64 {
        self.shared.corrupted[dir.index()].load(Ordering::SeqCst)
    }

    /// Bytes written to the receiving side in `dir`, over all connections.
    pub fn bytes_forwarded(&self, dir: Direction) -> u64 {
        self.shared.forwarded[dir.index()].load(Ordering::SeqCst)
    }

    /// Connections accepted and forwarded (refused ones not included).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections reset on arrival because of [`AfterCut::Refuse`].
    pub fn connections_refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Accepted connections whose target could not be reached (the client
    /// was reset).
    pub fn target_connect_failures(&self) -> u64 {
        self.shared.connect_failures.load(Ordering::SeqCst)
    }

    /// Connections currently being forwarded.
    pub fn connections_active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }
}
