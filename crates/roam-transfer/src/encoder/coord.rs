//! The coordinator thread: ordering, dedup, batching, adaptation.
//!
//! Ordering guarantee: pages get a sequence number at submission. Hash
//! results are reordered and fed to the dedup stage strictly in sequence
//! order, and records are appended to batches strictly in sequence order
//! (a page waiting for compression holds back everything after it), and
//! batches leave through one FIFO channel. So if page p is submitted twice,
//! its second record is always in a later position of the byte stream than
//! its first, and a `Copy` always follows the record that gave its source
//! the copied content. The destination only has to apply batches in order.

use super::dedup::{Decision, Dedup};
use super::worker::{Compressed, Job, Msg};
use super::Shared;
use crate::adapt::{Adapter, ModeSelect, Window};
use crate::mode::Mode;
use crate::record::{BatchWriter, Record};
use crate::stats::{ModeSwitch, Stats};
use crate::PAGE_SIZE;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Coordinator {
    pub rx: Receiver<Msg>,
    pub jobs: Sender<Job>,
    pub out: SyncSender<Vec<u8>>,
    pub shared: Arc<Shared>,
    pub dedup: Option<Dedup>,
    pub select: ModeSelect,
    pub batch_bytes: usize,
    pub flush_after: Duration,
    pub workers: usize,
    pub output_batches: usize,
}

#[derive(Default)]
struct Acc {
    pages: u64,
    with_base: u64,
    nanos: u64,
    in_bytes: u64,
    out_bytes: u64,
    hashed: u64,
    hash_nanos: u64,
    wait_nanos: u64,
    wire_start: u64,
}

struct State {
    stats: Stats,
    hashed: BTreeMap<u64, super::worker::Hashed>,
    next_decide: u64,
    ready: BTreeMap<u64, Option<Vec<u8>>>,
    next_emit: u64,
    writer: BatchWriter,
    batch_started: Option<Instant>,
    flush_upto: u64,
    finish: Option<u64>,
    mode: Mode,
    adapter: Option<Adapter>,
    window_start: Instant,
    acc: Acc,
    start: Instant,
    closed: bool,
    dedup: Dedup,
}

impl Coordinator {
    pub fn run(mut self) -> Stats {
        let dedup = self
            .dedup
            .take()
            .expect("dedup state is set at construction");
        let start = Instant::now();
        let (mode, adapter, window) = match &self.select {
            ModeSelect::Static(m) => (*m, None, Duration::from_millis(100)),
            ModeSelect::Adaptive(cfg) => (cfg.initial, Some(Adapter::new(cfg.clone())), cfg.window),
        };
        let mut s = State {
            stats: Stats {
                mode: Some(mode),
                ..Stats::default()
            },
            hashed: BTreeMap::new(),
            next_decide: 0,
            ready: BTreeMap::new(),
            next_emit: 0,
            writer: BatchWriter::default(),
            batch_started: None,
            flush_upto: 0,
            finish: None,
            mode,
            adapter,
            window_start: start,
            acc: Acc::default(),
            start,
            closed: false,
            dedup,
        };
        let tick = self.flush_after.min(window).min(Duration::from_millis(10));
        loop {
            match self.rx.recv_timeout(tick) {
                Ok(msg) => self.handle(&mut s, msg),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.emit(&mut s);
            if s.batch_started
                .is_some_and(|t| t.elapsed() >= self.flush_after)
            {
                self.send(&mut s);
            }
            if s.window_start.elapsed() >= window {
                self.end_window(&mut s);
            }
            if s.closed || s.finish.is_some_and(|n| s.next_emit >= n) {
                break;
            }
        }
        if !s.closed && !s.writer.is_empty() {
            self.send(&mut s);
        }
        s.stats.elapsed_nanos = start.elapsed().as_nanos() as u64;
        s.stats.mode = Some(s.mode);
        self.publish(&s);
        if s.closed {
            self.shared.close();
        }
        s.stats
    }

    fn handle(&self, s: &mut State, msg: Msg) {
        match msg {
            Msg::Hashed { seq, nanos, h } => {
                s.stats.hash_nanos += nanos;
                s.acc.hashed += 1;
                s.acc.hash_nanos += nanos;
                s.hashed.insert(seq, h);
                self.decide(s);
            }
            Msg::Compressed { seq, nanos, c } => {
                self.account(s, nanos, &c);
                s.ready.insert(seq, Some(c.record));
            }
            Msg::Flush { upto } => s.flush_upto = s.flush_upto.max(upto),
            Msg::Finish { total } => s.finish = Some(total),
        }
    }

    fn decide(&self, s: &mut State) {
        let t = Instant::now();
        while let Some(h) = s.hashed.remove(&s.next_decide) {
            let seq = s.next_decide;
            s.next_decide += 1;
            s.stats.pages_in += 1;
            s.stats.bytes_in += PAGE_SIZE as u64;
            let index = h.index;
            let mut buf = Vec::new();
            match s.dedup.decide(index, h.page, h.hash, h.zero, s.mode.delta) {
                Decision::Unchanged => s.stats.unchanged_pages += 1,
                Decision::Zero => {
                    s.stats.zero_pages += 1;
                    Record::Zero { index }.encode_into(&mut buf);
                }
                Decision::Initial => {
                    s.stats.initial_pages += 1;
                    Record::Initial { index }.encode_into(&mut buf);
                }
                Decision::Copy(from) => {
                    s.stats.dup_pages += 1;
                    Record::Copy { index, from }.encode_into(&mut buf);
                }
                Decision::Stored(hash) => {
                    s.stats.store_pages += 1;
                    Record::Stored { index, hash }.encode_into(&mut buf);
                }
                Decision::Compress {
                    page,
                    base,
                    eligible,
                } => {
                    let job = Job::Compress {
                        seq,
                        index,
                        page,
                        base,
                        eligible,
                        mode: s.mode,
                    };
                    // Workers outlive the coordinator's sender, so this only
                    // fails if they all died; the page then never completes
                    // and `finish` reports it.
                    let _ = self.jobs.send(job);
                    continue;
                }
            }
            s.ready.insert(seq, (!buf.is_empty()).then_some(buf));
        }
        s.stats.dedup_nanos += t.elapsed().as_nanos() as u64;
    }

    fn account(&self, s: &mut State, nanos: u64, c: &Compressed) {
        let st = &mut s.stats;
        st.compressed_pages += 1;
        st.compress_nanos += nanos;
        st.compress_in_bytes += PAGE_SIZE as u64;
        st.compress_out_bytes += c.payload;
        st.delta_pages += u64::from(c.delta);
        st.delta_unchanged_bytes += c.delta_unchanged;
        st.incompressible_pages += u64::from(c.incompressible);
        if c.mode == s.mode {
            s.acc.pages += 1;
            s.acc.with_base += u64::from(c.had_base);
            s.acc.nanos += nanos;
            s.acc.in_bytes += PAGE_SIZE as u64;
            s.acc.out_bytes += c.record.len() as u64;
        }
    }

    fn emit(&self, s: &mut State) {
        let mut released = 0;
        while let Some(rec) = s.ready.remove(&s.next_emit) {
            s.next_emit += 1;
            released += 1;
            let Some(rec) = rec else { continue };
            if !s.writer.is_empty() && s.writer.encoded_len() + rec.len() > self.batch_bytes {
                self.send(s);
            }
            s.writer.push_encoded(&rec);
            s.stats.records_out += 1;
            s.batch_started.get_or_insert_with(Instant::now);
        }
        if released > 0 {
            self.shared.release(released);
        }
        if s.flush_upto > 0 && s.next_emit >= s.flush_upto {
            self.send(s);
            s.flush_upto = 0;
        }
    }

    fn send(&self, s: &mut State) {
        s.batch_started = None;
        if s.writer.is_empty() || s.closed {
            return;
        }
        let batch = s.writer.take();
        let len = batch.len() as u64;
        let ok = match self.out.try_send(batch) {
            Ok(()) => true,
            Err(TrySendError::Full(batch)) => {
                let t = Instant::now();
                let ok = self.out.send(batch).is_ok();
                let w = t.elapsed().as_nanos() as u64;
                s.stats.output_wait_nanos += w;
                s.acc.wait_nanos += w;
                ok
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        if !ok {
            s.closed = true;
            return;
        }
        self.shared.sent.fetch_add(1, Ordering::Relaxed);
        s.stats.batches_out += 1;
        s.stats.bytes_out += len;
    }

    fn end_window(&self, s: &mut State) {
        let secs = s.window_start.elapsed().as_secs_f64();
        s.window_start = Instant::now();
        let wire = self.shared.wire.total();
        let acc = std::mem::replace(
            &mut s.acc,
            Acc {
                wire_start: wire,
                ..Acc::default()
            },
        );
        if let Some(adapter) = &mut s.adapter {
            let queued = self
                .shared
                .sent
                .load(Ordering::Relaxed)
                .saturating_sub(self.shared.received.load(Ordering::Relaxed));
            let w = Window {
                seconds: secs,
                pages: acc.pages,
                with_base: acc.with_base,
                p_nanos: acc.nanos as f64 / acc.pages.max(1) as f64,
                hash_nanos: acc.hash_nanos as f64 / acc.hashed.max(1) as f64,
                ratio: acc.out_bytes as f64 / acc.in_bytes.max(1) as f64,
                wire_bytes: wire.saturating_sub(acc.wire_start),
                network_bound: acc.wait_nanos as f64 > 0.05 * secs * 1e9
                    || queued as usize * 2 >= self.output_batches.max(1),
                workers: self.workers,
            };
            if let Some((to, reason)) = adapter.on_window(&w) {
                s.stats.mode_switches.push(ModeSwitch {
                    at_ms: s.start.elapsed().as_millis() as u64,
                    from: s.mode,
                    to,
                    reason,
                });
                s.mode = to;
            }
        }
        s.stats.mode = Some(s.mode);
        s.stats.elapsed_nanos = s.start.elapsed().as_nanos() as u64;
        self.publish(s);
    }

    fn publish(&self, s: &State) {
        *self
            .shared
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s.stats.clone();
    }
}
