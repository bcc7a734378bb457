//! The frames queued to one node link, written in batches.
//!
//! Why not a channel of frames: under load the gateway makes one small
//! frame per client read (a RESP request is tens of bytes) and one
//! syscall per frame was a large part of its CPU. Here every frame is
//! encoded straight into one buffer; the link's writer swaps the whole
//! buffer out and writes it with one `write_all`, so everything queued
//! while it was writing goes out in the next single write. Nothing is
//! allocated per frame.
//!
//! The bound is the same as before: the bytes queued (waiting, plus the
//! batch being written) never pass the link's limit. A frame that would
//! pass it is not queued; the queue says so and the link's task closes the
//! link (a node that does not read must not grow the gateway's memory, see
//! `docs/gateway.md`, "Limits and backpressure").

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

/// A batch buffer keeps at most this capacity between batches, so one
/// burst does not pin its memory for the link's life.
const KEEP_CAPACITY: usize = 1 << 20;

#[derive(Default)]
struct Queue {
    /// Encoded frames waiting for the writer.
    buf: Vec<u8>,
    /// Bytes of the batch the writer is writing now.
    in_flight: usize,
    /// No more frames: the writer writes what is queued, then stops.
    closed: bool,
    /// A frame was refused for the bound.
    over: bool,
}

/// One node link's outgoing frames.
pub(crate) struct LinkOut {
    q: Mutex<Queue>,
    limit: usize,
    /// The writer: frames to write, or closed.
    wake: Notify,
    /// The link's task: the bound was hit.
    pub stuck: Notify,
}

impl LinkOut {
    /// An empty queue of at most `limit` bytes.
    pub fn new(limit: usize) -> LinkOut {
        LinkOut {
            q: Mutex::new(Queue::default()),
            limit,
            wake: Notify::new(),
            stuck: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue what `encode` appends to the buffer (one or more whole
    /// frames). Returns false, and queues nothing, when the queue is closed
    /// or the frames would pass the bound (then `stuck` is told).
    pub fn push<E>(&self, encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<bool, E> {
        let mut q = self.lock();
        if q.closed || q.over {
            return Ok(false);
        }
        let before = q.buf.len();
        if let Err(e) = encode(&mut q.buf) {
            q.buf.truncate(before);
            return Err(e);
        }
        if q.buf.len() + q.in_flight > self.limit {
            // The node reads nothing: drop the frame; the link is closed
            // and its services are held as for any lost link.
            q.buf.truncate(before);
            q.over = true;
            drop(q);
            self.stuck.notify_one();
            return Ok(false);
        }
        let first = before == 0 && !q.buf.is_empty();
        drop(q);
        if first {
            self.wake.notify_one();
        }
        Ok(true)
    }

    /// No more frames after what is queued (a final `Refused` may still be
    /// pushed before this).
    pub fn close(&self) {
        self.lock().closed = true;
        self.wake.notify_one();
    }

    /// Bytes queued and being written.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        let q = self.lock();
        q.buf.len() + q.in_flight
    }

    /// Write batches to `wr` until the queue is closed and empty, or a
    /// write fails; then shut `wr` down.
    pub async fn write_to<W: AsyncWrite + Unpin>(&self, wr: &mut W) -> std::io::Result<()> {
        let mut batch = Vec::new();
        loop {
            let wait = {
                let mut q = self.lock();
                q.in_flight = 0;
                if q.buf.is_empty() {
                    if q.closed {
                        break;
                    }
                    true
                } else {
                    std::mem::swap(&mut q.buf, &mut batch);
                    q.in_flight = batch.len();
                    false
                }
            };
            if wait {
                // A push since the check left a permit: nothing is missed.
                self.wake.notified().await;
                continue;
            }
            wr.write_all(&batch).await?;
            wr.flush().await?;
            batch.clear();
            if batch.capacity() > KEEP_CAPACITY {
                batch = Vec::new();
            }
        }
        wr.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{read_frame, ToNode};
    use std::sync::Arc;

    fn data(conn: u64, offset: u64, bytes: &[u8]) -> ToNode {
        ToNode::Data {
            conn,
            offset,
            bytes: bytes.to_vec(),
        }
    }

    #[tokio::test]
    async fn many_frames_in_one_write_come_out_identical() {
        let out = LinkOut::new(1 << 20);
        let msgs: Vec<ToNode> = (0..500u64)
            .map(|i| match i % 3 {
                0 => data(i, i * 7, &vec![i as u8; (i as usize * 13) % 700]),
                1 => ToNode::Delivered {
                    conn: i,
                    offset: i * 100,
                },
                _ => ToNode::Open {
                    service: "kv".into(),
                    conn: i,
                    peer: "127.0.0.1:1".into(),
                },
            })
            .collect();
        for m in &msgs {
            assert!(out.push(|b| m.encode(b)).unwrap());
        }
        out.close();
        let mut wire = Vec::new();
        out.write_to(&mut wire).await.unwrap();
        let mut rd = wire.as_slice();
        for m in &msgs {
            let (kind, p) = read_frame(&mut rd).await.unwrap();
            assert_eq!(&ToNode::decode(kind, &p).unwrap(), m);
        }
        assert!(rd.is_empty());
    }

    #[tokio::test]
    async fn a_node_that_never_reads_hits_the_bound() {
        // A duplex pipe of 4 KiB that nobody reads: the writer blocks with
        // its batch in flight, and the queue behind it fills to the bound.
        let (mut wr, _keep) = tokio::io::duplex(4096);
        let out = Arc::new(LinkOut::new(256 << 10));
        let o = out.clone();
        let writer = tokio::spawn(async move { o.write_to(&mut wr).await });
        let chunk = vec![7u8; 60 << 10];
        let mut queued = 0;
        let mut refused = false;
        for i in 0..100u64 {
            if !out.push(|b| data(1, i, &chunk).encode(b)).unwrap() {
                refused = true;
                break;
            }
            queued += 1;
            tokio::task::yield_now().await;
        }
        assert!(refused, "the bound was never hit");
        assert!((3..=5).contains(&queued), "{queued} frames queued");
        assert!(out.queued() <= 256 << 10, "{} bytes held", out.queued());
        // Told once, then every later push is refused without growing.
        tokio::time::timeout(std::time::Duration::from_secs(1), out.stuck.notified())
            .await
            .expect("stuck is told");
        assert!(!out.push(|b| data(1, 0, b"x").encode(b)).unwrap());
        writer.abort();
    }

    #[tokio::test]
    async fn frames_pushed_while_writing_go_out_in_the_next_batch() {
        let (mut wr, mut rd) = tokio::io::duplex(1 << 16);
        let out = Arc::new(LinkOut::new(1 << 20));
        let o = out.clone();
        let writer = tokio::spawn(async move { o.write_to(&mut wr).await });
        for i in 0..50u64 {
            out.push(|b| data(i, 0, b"hello").encode(b)).unwrap();
            if i % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        out.close();
        for i in 0..50u64 {
            let (kind, p) = read_frame(&mut rd).await.unwrap();
            assert_eq!(ToNode::decode(kind, &p).unwrap(), data(i, 0, b"hello"));
        }
        assert!(matches!(
            read_frame(&mut rd).await,
            Err(crate::proto::FrameError::Closed)
        ));
        writer.await.unwrap().unwrap();
    }
}
