//! The three ways memory travels: stop-and-copy, pre-copy and post-copy's
//! start (`docs/migration.md`). Each ends with the cell paused and held
//! (see [`Held`]), or fails with the cell running on here.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_runtime::{DirtyTracker, TrackMethod};
use roam_snapshot::PAGE_SIZE;
use roam_wire::{Msg, PageKind};

use super::error::{MigrateError, Phase};
use super::held::Held;
use super::link::Inbox;
use super::ms;
use super::options::{parse_final_round, FinalRound};
use crate::cell::{CellHandle, PAUSE_TIMEOUT};
use crate::migrate::files::FileSender;
use crate::migrate::stream::Stream;
use crate::state::{Migration, NodeInner};
use crate::types::*;

/// Pre-copy stops after this many rounds in a row that did not lower the
/// predicted final pause below its best.
const PLATEAU: u32 = 3;

/// What a mode leaves: the held cell, the rounds it took, and how dirty
/// pages were tracked (pre-copy).
pub(super) type ModeResult = Result<(Held, u32, Option<String>), MigrateError>;

/// What the phases of one migration share.
pub(super) struct Ctx<'a> {
    pub n: &'a NodeInner,
    pub spec: &'a roam_wire::CellSpec,
    pub m: &'a Migration,
    pub h: &'a Arc<CellHandle>,
    pub stream: &'a mut Stream,
    pub inbox: &'a mut Inbox,
    /// Post-copy: kind of every page.
    pub kinds: Vec<PageKind>,
    /// Post-copy: pages put into the stream (pushed, asked for, or sent
    /// ahead of the final state).
    pub post_sent: Vec<bool>,
    /// The cell's sandbox files: what went already.
    pub files: FileSender,
    /// Where the pause goes, filled as it happens.
    pub bd: PauseBreakdown,
}

impl Ctx<'_> {
    /// Pause the cell for the last time here; the gateway holds its
    /// service's clients from now on.
    async fn pause(&mut self) -> Result<Held, MigrateError> {
        let fail = |e: String| MigrateError::here(Phase::Pause, e);
        self.m.phase("pausing");
        let asked = Instant::now();
        let p = tokio::time::timeout(PAUSE_TIMEOUT, self.h.pause())
            .await
            .map_err(|_| {
                fail(format!(
                    "the cell did not reach a migration point within {} s",
                    PAUSE_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|_| fail("the cell ended before it could pause".to_string()))?;
        self.m.phase("paused");
        // Every mode pauses once, for the last time here: the gateway
        // buffers the service's clients from now until a `Serve`.
        if self.n.hold(self.spec) {
            self.m.held.store(true, Ordering::SeqCst);
        }
        self.bd.paused_wire_bytes = self.m.wire_bytes.load(Ordering::Relaxed);
        self.bd.request_to_point_ms = ms(p.at.saturating_duration_since(asked));
        self.bd.to_driver_ms = ms(p.at.elapsed());
        Ok(Held::new(p))
    }

    pub(super) async fn send_pages(&mut self, pages: &[u32]) -> Result<(), String> {
        let mem = self.h.memory.clone();
        self.send_pages_with(pages, &mut |i, buf| mem.read_page(i, buf))
            .await
    }

    async fn send_pages_with(
        &mut self,
        pages: &[u32],
        read: &mut (dyn FnMut(u32, &mut [u8; PAGE_SIZE]) -> bool + Send),
    ) -> Result<(), String> {
        self.stream.sync_size().await?;
        let (stream, counter) = (&mut *self.stream, &self.m.pages_in);
        tokio::task::block_in_place(|| stream.submit(pages, counter, read))?;
        Ok(())
    }

    pub(super) async fn stop_and_copy(&mut self) -> ModeResult {
        let held = self.pause().await?;
        let all: Vec<u32> = (0..self.h.memory.page_count()).collect();
        self.m.round.store(1, Ordering::Relaxed);
        self.bd.final_pages = all.len() as u64;
        let sent = async {
            let t0 = Instant::now();
            self.send_pages(&all).await?;
            tokio::task::block_in_place(|| self.stream.finish())?;
            let t1 = Instant::now();
            self.stream.drain().await?;
            self.bd.encode_ms = ms(t1 - t0);
            self.bd.wire_ms = ms(t1.elapsed());
            Ok::<(), String>(())
        }
        .await;
        // A failure drops `held`: the cell resumes here.
        sent.map_err(|e| MigrateError::here(Phase::Final, e))?;
        Ok((held, 1, None))
    }

    pub(super) async fn pre_copy(&mut self, t: &TransferOptions) -> ModeResult {
        let max_remaining = t.max_remaining_bytes.unwrap_or(10_000_000);
        let max_round = t
            .max_round_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis);
        let max_downtime = Duration::from_millis(t.max_downtime_ms.unwrap_or(30));
        let max_rounds = t.max_rounds.unwrap_or(30).max(1);
        let final_round = parse_final_round(t).map_err(|e| MigrateError::here(Phase::Rounds, e))?;
        let method = match t.tracking.as_deref() {
            None | Some("auto") => TrackMethod::Auto,
            Some("write-protect") => TrackMethod::WriteProtect,
            Some("hash") => TrackMethod::Hash,
            Some(o) => {
                return Err(MigrateError::here(
                    Phase::Rounds,
                    format!("unknown tracking `{o}`: use auto, write-protect or hash"),
                ))
            }
        };
        let mut tracker = DirtyTracker::start(&self.h.memory, method)
            .map_err(|e| MigrateError::here(Phase::Rounds, e.to_string()))?;
        let tracking = Some(match tracker.method() {
            TrackMethod::WriteProtect => "write-protect".to_string(),
            TrackMethod::Hash => "hash".to_string(),
            TrackMethod::Auto => "auto".to_string(),
        });
        let mut pages: Vec<u32> = (0..self.h.memory.page_count()).collect();
        let mut round = 0;
        // Pages found dirty when deciding to stop: they go in the final round.
        let mut carry = std::collections::BTreeSet::new();
        let mut stalled = 0;
        // The best predicted final pause so far, and rounds since it.
        let mut best = Duration::MAX;
        let mut flat = 0;
        let r: Result<(), String> = async {
            loop {
                round += 1;
                self.m.round.store(round, Ordering::Relaxed);
                self.m.phase(format!("round {round}"));
                let began = Instant::now();
                self.send_pages_with(&pages, &mut |i, b| tracker.read_page(i, b))
                    .await?;
                self.stream.drain().await?;
                self.stream
                    .msg(Msg::RoundDone {
                        round,
                        pages: pages.len() as u64,
                    })
                    .await?;
                let took = began.elapsed();
                if round == 1 {
                    // The files go while the cell runs; only what changes
                    // from now on waits for the pause.
                    self.m.phase("files");
                    self.files.pass(self.stream, false).await?;
                }
                let sent = (pages.len() * PAGE_SIZE) as f64;
                // Memory bytes per second through the pipeline and the link.
                let rate = sent / took.as_secs_f64().max(1e-6);
                let dirty: std::collections::BTreeSet<u32> =
                    tokio::task::block_in_place(|| tracker.collect())
                        .into_iter()
                        .collect();
                let dirty_bytes = (dirty.len() * PAGE_SIZE) as f64;
                let predicted = Duration::from_secs_f64(dirty_bytes / rate.max(1.0));
                tracing::info!(
                    round,
                    pages = pages.len(),
                    ms = took.as_millis() as u64,
                    dirty_pages = dirty.len(),
                    predicted_final_ms = predicted.as_millis() as u64,
                    "pre-copy round"
                );
                // Not converging: the cell dirties about as much as a round sends.
                stalled = if dirty_bytes >= 0.9 * sent {
                    stalled + 1
                } else {
                    0
                };
                // No better for PLATEAU rounds: more rounds will not shrink
                // the pause (a slow source, a dirty rate near the link's).
                if predicted < best {
                    best = predicted;
                    flat = 0;
                } else {
                    flat += 1;
                }
                let stop = predicted <= max_downtime
                    || max_round.is_some_and(|m| took <= m)
                    || round >= max_rounds
                    || stalled >= 2
                    || flat >= PLATEAU;
                if stop {
                    carry = dirty;
                    return Ok(());
                }
                // Let dirty state build up to the threshold before the next
                // round (VM handoff's input-queue rule), but never wait
                // longer than a round takes.
                let mut dirty = dirty;
                let waited = Instant::now();
                while ((dirty.len() * PAGE_SIZE) as u64) < max_remaining && waited.elapsed() < took
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    dirty.extend(tokio::task::block_in_place(|| tracker.collect()));
                }
                pages = dirty.into_iter().collect();
            }
        }
        .await;
        r.map_err(|e| MigrateError::here(Phase::Rounds, e))?;
        if final_round != FinalRound::Pipeline {
            // Every round so far is on the wire: close the pipeline while
            // the cell still runs, so the pause does not wait for its
            // threads to wind down.
            tokio::task::block_in_place(|| self.stream.finish())
                .map_err(|e| MigrateError::here(Phase::Rounds, e))?;
        }
        let mut held = self.pause().await?;
        // Tracking stays on until the cell resumes or moves: `held` lifts
        // it, before a resume, or after the commit, off the pause.
        held.track(tracker);
        let tracker = held.tracker().expect("just given");
        let last = async {
            let t0 = Instant::now();
            carry.extend(tokio::task::block_in_place(|| tracker.collect()));
            let dirty: Vec<u32> = std::mem::take(&mut carry).into_iter().collect();
            self.m.phase(format!("final round ({} pages)", dirty.len()));
            let t1 = Instant::now();
            if let FinalRound::Direct(codec) = final_round {
                self.bd.final_encoding = format!("direct {codec}");
                self.stream.sync_size().await?;
                let st = self
                    .stream
                    .send_direct(
                        self.h.module.initial_image(),
                        codec,
                        &dirty,
                        &self.m.pages_in,
                        &mut |i, b| tracker.read_page(i, b),
                    )
                    .await?;
                tracing::debug!(?st, "final round encoded directly");
            } else {
                self.bd.final_encoding = "pipeline".into();
                self.send_pages_with(&dirty, &mut |i, b| tracker.read_page(i, b))
                    .await?;
            }
            let t2 = Instant::now();
            if final_round == FinalRound::Pipeline {
                tokio::task::block_in_place(|| self.stream.finish())?;
            }
            let t3 = Instant::now();
            self.stream.drain().await?;
            let t4 = Instant::now();
            tracing::info!(
                pages = dirty.len(),
                collect_ms = ms(t1 - t0),
                submit_ms = ms(t2 - t1),
                finish_ms = ms(t3 - t2),
                drain_ms = ms(t4 - t3),
                "pre-copy final round"
            );
            self.bd.final_pages = dirty.len() as u64;
            self.bd.collect_ms = ms(t1 - t0);
            self.bd.encode_ms = ms(t3 - t1);
            self.bd.wire_ms = ms(t4 - t3);
            Ok::<(), String>(())
        }
        .await;
        last.map_err(|e| MigrateError::here(Phase::Final, e))?;
        Ok((held, round + 1, tracking))
    }

    pub(super) async fn post_copy(&mut self) -> ModeResult {
        let held = self.pause().await?;
        let t0 = Instant::now();
        self.kinds =
            tokio::task::block_in_place(|| classify(&self.h.memory, self.h.module.initial_image()));
        self.bd.collect_ms = ms(t0.elapsed());
        self.post_sent = vec![false; self.kinds.len()];
        let kinds = self.kinds.clone();
        // The destination's rewind reads and writes the memory under the
        // unwound stack before the cell starts, and before this side serves
        // page requests (it does so only after `Running`): send those pages
        // now, ahead of the final state, or the destination deadlocks.
        let s = &held.snapshot().stack;
        let rewind: Vec<u32> = rewind_pages(s.buffer_offset, s.data.len(), &self.kinds);
        self.bd.final_pages = rewind.len() as u64;
        let t1 = Instant::now();
        let r = async {
            self.stream.sync_size().await?;
            self.stream.msg(Msg::PageKinds { kinds }).await?;
            if !rewind.is_empty() {
                self.send_pages(&rewind).await?;
                self.stream.drain().await?;
            }
            Ok::<(), String>(())
        }
        .await;
        self.bd.wire_ms = ms(t1.elapsed());
        for &i in &rewind {
            self.post_sent[i as usize] = true;
        }
        r.map_err(|e| MigrateError::here(Phase::Final, e))?;
        Ok((held, 1, None))
    }
}

/// The data pages under an unwound stack of `len` bytes in the Asyncify
/// buffer at `offset` (its 8-byte header included): what a rewind reads
/// and writes before the program runs.
fn rewind_pages(offset: u32, len: usize, kinds: &[PageKind]) -> Vec<u32> {
    const HEADER: u64 = 8;
    let start = u64::from(offset) / PAGE_SIZE as u64;
    let end = (u64::from(offset) + HEADER + len as u64).div_ceil(PAGE_SIZE as u64);
    (start..end.min(kinds.len() as u64))
        .map(|i| i as u32)
        .filter(|&i| kinds[i as usize] == PageKind::Data)
        .collect()
}

/// Kind of every page of a (paused) memory.
pub(super) fn classify(
    mem: &roam_runtime::LiveMemory,
    initial: &roam_snapshot::InitialImage,
) -> Vec<PageKind> {
    let mut buf = Box::new([0u8; PAGE_SIZE]);
    let mut kinds = Vec::with_capacity(mem.page_count() as usize);
    for i in 0..mem.page_count() {
        if !mem.read_page(i, &mut buf) {
            break;
        }
        kinds.push(if buf.iter().all(|&b| b == 0) {
            PageKind::Zero
        } else if initial.page(u64::from(i)) == Some(&buf[..]) {
            PageKind::Initial
        } else {
            PageKind::Data
        });
    }
    kinds
}

/// Bytes of memory that differ from zero and from the initial image.
pub(super) fn modified(
    mem: &roam_runtime::LiveMemory,
    initial: &roam_snapshot::InitialImage,
) -> u64 {
    let data = classify(mem, initial)
        .iter()
        .filter(|&&k| k == PageKind::Data)
        .count();
    (data * PAGE_SIZE) as u64
}
