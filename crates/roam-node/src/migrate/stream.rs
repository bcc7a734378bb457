//! The source's outgoing stream: the transfer pipeline's batches and control
//! messages, in order, on one connection.
//!
//! The encoder runs on its own threads; a pump thread moves its batches into
//! the writer task's queue, which is also where control messages go. A
//! message queued after pages were submitted is therefore written after the
//! batches holding them only if the caller waits for [`Stream::drain`]; a
//! `Grow` may go ahead of older batches (memory only grows, so that is
//! harmless). The writer counts pages put on the wire, which is how a
//! pre-copy round knows it is over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roam_runtime::LiveMemory;
use roam_snapshot::{InitialImage, PAGE_SIZE};
use roam_transfer::{
    decode_batch, BatchReceiver, Codec, DirectEncoder, DirectStats, Encoder, EncoderConfig, Stats,
    StoreSummary, WireMeter,
};
use roam_wire::{send, Msg};
use tokio::io::AsyncWrite;
use tokio::sync::mpsc;

/// What the writer task writes.
pub(crate) enum Out {
    /// Boxed: a message is far larger than a batch's handle, and batches
    /// are most of the queue.
    Msg(Box<Msg>),
    Batch(Vec<u8>, u64),
}

/// Writer half of the connection, boxed so shaping is optional.
pub(crate) type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// The writer task: write everything queued, in order; count bytes and pages.
pub(crate) async fn write_loop(
    mut wr: Writer,
    mut rx: mpsc::Receiver<Out>,
    wire: Arc<AtomicU64>,
    pages_on_wire: Arc<AtomicU64>,
    meter: WireMeter,
) -> Result<Writer, String> {
    while let Some(out) = rx.recv().await {
        let (msg, pages) = match out {
            Out::Msg(m) => (*m, 0),
            Out::Batch(batch, n) => (Msg::Pages { batch }, n),
        };
        let n = send(&mut wr, &msg)
            .await
            .map_err(|e| format!("sending `{}` to the destination failed: {e}", msg.name()))?;
        wire.fetch_add(n as u64, Ordering::Relaxed);
        meter.record(n as u64);
        pages_on_wire.fetch_add(pages, Ordering::Relaxed);
    }
    use tokio::io::AsyncWriteExt;
    wr.flush().await.map_err(|e| e.to_string())?;
    Ok(wr)
}

/// The encoder side of the stream.
pub(crate) struct Stream {
    encoder: Option<Encoder>,
    pump: Option<std::thread::JoinHandle<()>>,
    out: mpsc::Sender<Out>,
    submitted: u64,
    pub pages_on_wire: Arc<AtomicU64>,
    memory: LiveMemory,
    sent_len: u64,
    finished: Option<Stats>,
}

impl Stream {
    pub(crate) fn new(
        cfg: EncoderConfig,
        initial: &InitialImage,
        summary: Option<StoreSummary>,
        out: mpsc::Sender<Out>,
        memory: LiveMemory,
    ) -> (Stream, WireMeter) {
        let (encoder, batches) = Encoder::new(cfg, initial, summary);
        let meter = encoder.wire_meter();
        let pump = spawn_pump(batches, out.clone());
        (
            Stream {
                encoder: Some(encoder),
                pump: Some(pump),
                out,
                submitted: 0,
                pages_on_wire: Arc::new(AtomicU64::new(0)),
                memory,
                sent_len: 0,
                finished: None,
            },
            meter,
        )
    }

    /// Queue a control message.
    pub(crate) async fn msg(&self, m: Msg) -> Result<(), String> {
        self.out
            .send(Out::Msg(Box::new(m)))
            .await
            .map_err(|_| "the connection to the destination is closed".to_string())
    }

    /// Tell the destination the memory's current size if it changed.
    pub(crate) async fn sync_size(&mut self) -> Result<u64, String> {
        let len = self.memory.len() as u64;
        if len != self.sent_len {
            self.msg(Msg::Grow { bytes: len }).await?;
            self.sent_len = len;
        }
        Ok(len)
    }

    /// Read `pages` into the pipeline (blocking: call from a blocking
    /// context) through `read` (the live memory, or a dirty tracker that
    /// must see what is sent). Pages beyond the memory are skipped.
    pub(crate) fn submit(
        &mut self,
        pages: &[u32],
        counter: &AtomicU64,
        read: &mut (dyn FnMut(u32, &mut [u8; PAGE_SIZE]) -> bool + Send),
    ) -> Result<(), String> {
        let enc = self.encoder.as_mut().ok_or("stream finished")?;
        let mut buf = Box::new([0u8; PAGE_SIZE]);
        for &i in pages {
            if !read(i, &mut buf) {
                continue;
            }
            enc.submit(i, &buf[..]).map_err(|e| e.to_string())?;
            self.submitted += 1;
            counter.fetch_add(1, Ordering::Relaxed);
        }
        enc.flush();
        Ok(())
    }

    /// Encode `pages` on this thread and queue each batch as soon as it is
    /// full, so the writer sends one while the next is encoded: the final
    /// pre-copy round's fast path (see `roam_transfer::DirectEncoder`).
    /// Only after [`Stream::finish`]: nothing may follow these batches.
    pub(crate) async fn send_direct(
        &mut self,
        initial: &InitialImage,
        codec: Codec,
        pages: &[u32],
        counter: &AtomicU64,
        read: &mut (dyn FnMut(u32, &mut [u8; PAGE_SIZE]) -> bool + Send),
    ) -> Result<DirectStats, String> {
        if self.encoder.is_some() {
            return Err("internal error: direct pages before the pipeline finished".into());
        }
        /// Small batches start the wire early; the writer frames each.
        const BATCH: usize = 64 * 1024;
        let mut enc = DirectEncoder::new(initial, codec, BATCH);
        let mut buf = Box::new([0u8; PAGE_SIZE]);
        let mut in_batch = 0u64;
        for &i in pages {
            if !read(i, &mut buf) {
                continue;
            }
            let full = enc.push(i, &buf);
            self.submitted += 1;
            counter.fetch_add(1, Ordering::Relaxed);
            if let Some(b) = full {
                self.queue(b, in_batch).await?;
                in_batch = 0;
            }
            in_batch += 1;
        }
        if let Some(b) = enc.finish() {
            self.queue(b, in_batch).await?;
        }
        Ok(enc.stats().clone())
    }

    async fn queue(&self, batch: Vec<u8>, pages: u64) -> Result<(), String> {
        self.out
            .send(Out::Batch(batch, pages))
            .await
            .map_err(|_| "the connection to the destination is closed".to_string())
    }

    /// Wait until every page submitted so far is on the wire, or the writer
    /// died. A page whose content the destination already has from this
    /// stream yields no record; the encoder counts those (exactly once it
    /// finished, otherwise as of its last statistics window).
    pub(crate) async fn drain(&self) -> Result<(), String> {
        loop {
            let unchanged = match &self.finished {
                Some(s) => s.unchanged_pages,
                None => self.stats().unchanged_pages,
            };
            if self.pages_on_wire.load(Ordering::Relaxed) + unchanged >= self.submitted {
                break;
            }
            if self.out.is_closed() {
                return Err("the connection to the destination is closed".into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    /// Statistics so far.
    pub(crate) fn stats(&self) -> Stats {
        match (&self.encoder, &self.finished) {
            (Some(e), _) => e.stats(),
            (None, Some(s)) => s.clone(),
            (None, None) => Stats::default(),
        }
    }

    /// No more pages: wait for the last batch to be queued; final stats.
    pub(crate) fn finish(&mut self) -> Result<Stats, String> {
        let enc = self.encoder.take().ok_or("stream finished twice")?;
        let stats = enc.finish().map_err(|e| e.to_string())?;
        if let Some(p) = self.pump.take() {
            p.join()
                .map_err(|_| "the batch pump panicked".to_string())?;
        }
        self.finished = Some(stats.clone());
        Ok(stats)
    }
}

fn spawn_pump(batches: BatchReceiver, out: mpsc::Sender<Out>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("transfer-pump".into())
        .spawn(move || {
            for batch in batches {
                let n = decode_batch(&batch).map_or(0, |r| r.len() as u64);
                if out.blocking_send(Out::Batch(batch, n)).is_err() {
                    break;
                }
            }
        })
        .expect("spawning the batch pump thread")
}
