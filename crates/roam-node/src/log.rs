//! A cell's output log.
//!
//! A node keeps what each cell writes to stdout and stderr, so that
//! `roam logs` works without a terminal attached and the log can travel with
//! the cell when it migrates. The log is a ring of a fixed capacity (`roam
//! node --log-size`): beyond it the oldest output is overwritten and the
//! count of dropped bytes grows, so a chatty program cannot exhaust the
//! node's memory, and each write costs only its own length. The count
//! travels with the cell, and `roam logs` says how much was dropped.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

/// One cell's output, stdout and stderr interleaved as written.
#[derive(Debug)]
pub struct CellLog {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    ring: VecDeque<u8>,
    capacity: usize,
    /// Dropped here.
    dropped: u64,
    /// Dropped on earlier nodes (arrived with the cell).
    carried: u64,
}

impl CellLog {
    /// An empty log that keeps the last `capacity` bytes (at least 1).
    pub fn new(capacity: usize) -> CellLog {
        let capacity = capacity.max(1);
        CellLog {
            inner: Mutex::new(Inner {
                // Grows as output comes, up to `capacity`.
                ring: VecDeque::new(),
                capacity,
                dropped: 0,
                carried: 0,
            }),
        }
    }

    /// A log that starts with `history` (the output the cell produced on
    /// earlier nodes, or before a kept checkpoint), of which `dropped`
    /// earlier bytes were lost already.
    pub fn with_history(capacity: usize, history: &[u8], dropped: u64) -> CellLog {
        let log = CellLog::new(capacity);
        log.receive(history, dropped);
        log
    }

    /// Append output from an earlier node, of which `dropped` earlier
    /// bytes were lost there (the same count with every piece).
    pub fn receive(&self, history: &[u8], dropped: u64) {
        self.append(history);
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .carried = dropped;
    }

    fn append(&self, data: &[u8]) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let cap = g.capacity;
        // Only the last `cap` bytes of `data` can survive.
        let skip = data.len().saturating_sub(cap);
        let data = &data[skip..];
        let over = (g.ring.len() + data.len()).saturating_sub(cap);
        g.ring.drain(..over);
        g.ring.extend(data);
        g.dropped += (skip + over) as u64;
    }

    /// Everything kept so far.
    pub fn contents(&self) -> Vec<u8> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = g.ring.as_slices();
        [a, b].concat()
    }

    /// Bytes of output dropped, here and on earlier nodes.
    pub fn dropped(&self) -> u64 {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.dropped + g.carried
    }
}

impl roam_wasi::OutputSink for CellLog {
    fn write(&self, _stderr: bool, data: &[u8]) {
        self.append(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_wasi::OutputSink;

    const CAP: usize = 4096;

    #[test]
    fn keeps_history_and_output_in_order_and_bounds_it() {
        let log = CellLog::with_history(CAP, b"a\n", 0);
        log.write(false, b"b\n");
        log.write(true, b"c\n");
        assert_eq!(log.contents(), b"a\nb\nc\n");
        log.write(false, &[b'x'; CAP]);
        assert_eq!(log.contents().len(), CAP);
        assert_eq!(log.dropped(), 6);
        assert!(log.contents().iter().all(|&b| b == b'x'));
    }

    #[test]
    fn far_more_output_than_the_capacity_keeps_the_tail_and_counts_the_rest() {
        let log = CellLog::new(CAP);
        let mut total = 0u64;
        for i in 0..20_000u32 {
            let line = format!("line {i}\n");
            total += line.len() as u64;
            log.write(false, line.as_bytes());
        }
        // One write larger than the whole ring.
        let big: Vec<u8> = (0..3 * CAP).map(|i| b'a' + (i % 26) as u8).collect();
        log.write(false, &big);
        total += big.len() as u64;
        log.write(false, b"last\n");
        total += 5;
        let kept = log.contents();
        assert_eq!(kept.len(), CAP);
        assert!(kept.ends_with(b"last\n"));
        assert_eq!(&kept[..CAP - 5], &big[big.len() - (CAP - 5)..]);
        assert_eq!(log.dropped() + kept.len() as u64, total);
    }

    #[test]
    fn dropped_count_travels_with_the_history() {
        let log = CellLog::with_history(CAP, b"tail", 12_345);
        assert_eq!(log.dropped(), 12_345);
        let small = CellLog::with_history(2, b"tail", 10);
        assert_eq!(small.contents(), b"il");
        assert_eq!(small.dropped(), 12);
    }
}
