//! A cell's output log.
//!
//! A node keeps what each cell writes to stdout and stderr, so that
//! `roam logs` works without a terminal attached and the log can travel with
//! the cell when it migrates. The log is bounded: beyond [`LOG_LIMIT`] bytes
//! the oldest output is dropped (and the count of dropped bytes is kept), so
//! a chatty program cannot exhaust the node's memory.

use std::sync::{Mutex, PoisonError};

/// Most bytes of output kept per cell.
pub const LOG_LIMIT: usize = 4 << 20;

/// One cell's output, stdout and stderr interleaved as written.
#[derive(Debug, Default)]
pub struct CellLog {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    bytes: Vec<u8>,
    dropped: u64,
}

impl CellLog {
    /// A log that starts with `history` (the output the cell produced on
    /// earlier nodes).
    pub fn with_history(history: Vec<u8>) -> CellLog {
        let log = CellLog::default();
        log.append(&history);
        log
    }

    fn append(&self, data: &[u8]) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.bytes.extend_from_slice(data);
        if g.bytes.len() > LOG_LIMIT {
            let cut = g.bytes.len() - LOG_LIMIT;
            g.bytes.drain(..cut);
            g.dropped += cut as u64;
        }
    }

    /// Everything kept so far.
    pub fn contents(&self) -> Vec<u8> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
            .clone()
    }

    /// Bytes dropped because the log was full.
    #[cfg(test)]
    pub fn dropped(&self) -> u64 {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .dropped
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

    #[test]
    fn keeps_history_and_output_in_order_and_bounds_it() {
        let log = CellLog::with_history(b"a\n".to_vec());
        log.write(false, b"b\n");
        log.write(true, b"c\n");
        assert_eq!(log.contents(), b"a\nb\nc\n");
        log.write(false, &vec![b'x'; LOG_LIMIT]);
        assert_eq!(log.contents().len(), LOG_LIMIT);
        assert_eq!(log.dropped(), 6);
        assert!(log.contents().iter().all(|&b| b == b'x'));
    }
}
