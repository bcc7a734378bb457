//! The sending side of a migration: the three modes and the commit.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use roam_runtime::{DirtyTracker, TrackMethod};
use roam_snapshot::{EncodeOptions, MemoryImage, PAGE_SIZE};
use roam_transfer::{AdaptConfig, Codec, EncoderConfig, Mode as XMode, ModeSelect, StoreSummary};
use roam_wire::{recv, Final, Mode, Msg, Offer};

use tokio::sync::mpsc;

use super::stream::{write_loop, Out, Stream, Writer};
use super::ReadHalf;
use crate::cell::{CellHandle, Decision, Paused, PAUSE_TIMEOUT};
use crate::cells::running_handle;
use crate::error::NodeError;
use crate::ids::new_id;
use crate::state::{Migration, NodeInner};
use crate::types::*;

/// Pre-copy stops after this many rounds in a row that did not lower the
/// predicted final pause below its best.
const PLATEAU: u32 = 3;

/// `POST /v1/cells/{id}/migrate`: start a migration; progress is polled.
pub(crate) async fn start(
    n: &Arc<NodeInner>,
    id: &str,
    req: MigrateRequest,
) -> Result<MigrateResponse, NodeError> {
    let bad = NodeError::BadRequest;
    let mode = Mode::parse(&req.mode).ok_or_else(|| {
        bad(format!(
            "unknown mode `{}`: use stop-and-copy, pre-copy or post-copy",
            req.mode
        ))
    })?;
    let select = parse_codec(&req.transfer).map_err(bad)?;
    parse_final_round(&req.transfer).map_err(bad)?;
    let rate = match &req.transfer.bandwidth {
        Some(b) => Some(roam_link::parse_rate(b).map_err(|e| bad(e.to_string()))?),
        None => None,
    };
    let handle = running_handle(n, id)?;
    n.set_state(id, CellState::Migrating);
    let m = Arc::new(Migration::new(new_id("m-"), id.to_string(), mode));
    n.migrations
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(m.id.clone(), m.clone());
    let (node, mig) = (n.clone(), m.clone());
    tokio::spawn(async move {
        let plan = Plan {
            req,
            mode,
            select,
            rate,
        };
        let r = run(&node, &mig, &handle, plan).await;
        let mut serve_again = None;
        let r = r.map_err(|e| {
            // Every failure before the commit resumed the cell (or it ended
            // by itself meanwhile); say so.
            let mut cells = node.cells();
            match cells.get_mut(&mig.cell) {
                Some(c) if c.state == CellState::Migrating => {
                    c.state = CellState::Running;
                    if mig.held.load(Ordering::SeqCst) {
                        serve_again = Some((c.spec.clone(), handle.net.clone()));
                    }
                    if e.contains("keeps running") {
                        e
                    } else {
                        format!("{e}; the cell keeps running on this node")
                    }
                }
                _ => e,
            }
        });
        // The gateway held the service's clients for the move: they are
        // this node's again, at the same generation (nothing else served).
        if let Some((spec, hub)) = serve_again {
            node.serve(&spec, hub.as_ref());
        }
        node.metrics.migration(
            mig.mode.as_str(),
            r.as_ref().ok().map(|s| (s.downtime_ms, s.wire_bytes)),
        );
        mig.finish(r);
    });
    Ok(MigrateResponse {
        migration: m.id.clone(),
    })
}

/// How pre-copy's final round is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinalRound {
    /// Through the transfer pipeline, like every other round.
    Pipeline,
    /// On one thread, straight into the connection, with this codec.
    Direct(Codec),
}

/// Parse `final_round` (`lz4` by default).
fn parse_final_round(t: &TransferOptions) -> Result<FinalRound, String> {
    Ok(match t.final_round.as_deref() {
        None | Some("lz4") => FinalRound::Direct(Codec::Lz4),
        Some("pipeline") => FinalRound::Pipeline,
        Some("none") => FinalRound::Direct(Codec::None),
        Some(z) if z.starts_with("zstd") => match z[4..].parse::<u8>() {
            Ok(level) if (1..=19).contains(&level) => FinalRound::Direct(Codec::Zstd(level)),
            _ => {
                return Err(format!(
                    "bad zstd level in final round `{z}`: use zstd1 ... zstd19"
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "unknown final round `{other}`: use lz4, none, zstd1 ... zstd19 or pipeline"
            ))
        }
    })
}

/// Parse `codec`/`delta` into the pipeline's mode selection.
pub(crate) fn parse_codec(t: &TransferOptions) -> Result<ModeSelect, String> {
    let delta = t.delta.unwrap_or(true);
    let codec = match t.codec.as_deref() {
        None | Some("adaptive") => return Ok(ModeSelect::Adaptive(AdaptConfig::default())),
        Some("none") => Codec::None,
        Some("lz4") => Codec::Lz4,
        Some(z) if z.starts_with("zstd") => {
            let level: u8 = z[4..]
                .parse()
                .map_err(|_| format!("bad zstd level in `{z}`"))?;
            if !(1..=19).contains(&level) {
                return Err(format!("zstd level {level} is outside 1..=19"));
            }
            Codec::Zstd(level)
        }
        Some(other) => {
            return Err(format!(
                "unknown codec `{other}`: use adaptive, none, lz4 or zstd1 ... zstd19"
            ))
        }
    };
    Ok(ModeSelect::Static(XMode::new(delta, codec)))
}

struct Plan {
    req: MigrateRequest,
    mode: Mode,
    select: ModeSelect,
    rate: Option<roam_link::Rate>,
}

/// Messages from the destination after the handshake.
type Inbox = mpsc::Receiver<Result<Msg, String>>;

fn spawn_reader(mut rd: ReadHalf) -> Inbox {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let m = recv(&mut rd).await.map_err(|e| e.to_string());
            let end = m.is_err();
            if tx.send(m).await.is_err() || end {
                break;
            }
        }
    });
    rx
}

/// When the local side of a stream fails (the writer sees a closed
/// connection), the destination usually said why just before closing:
/// prefer its reason. Waits briefly for it.
async fn abort_reason(inbox: &mut Inbox) -> Option<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, inbox.recv()).await {
        if let Ok(Msg::Abort { reason }) = m {
            return Some(format!("the destination aborted: {reason}"));
        }
    }
    None
}

async fn next(inbox: &mut Inbox, during: &str, limit: Duration) -> Result<Msg, String> {
    match tokio::time::timeout(limit, inbox.recv()).await {
        Err(_) => Err(format!(
            "the destination did not answer during {during} within {} s",
            limit.as_secs()
        )),
        Ok(None) => Err(format!(
            "the connection to the destination closed during {during}"
        )),
        Ok(Some(Err(e))) => Err(format!("{during}: {e}")),
        Ok(Some(Ok(Msg::Abort { reason }))) => Err(format!("the destination refused: {reason}")),
        Ok(Some(Ok(m))) => Ok(m),
    }
}

async fn run(
    n: &Arc<NodeInner>,
    m: &Migration,
    h: &Arc<CellHandle>,
    plan: Plan,
) -> Result<MigrationSummary, String> {
    let spec = n
        .cells()
        .get(&m.cell)
        .map(|e| (e.spec.clone(), e.log.clone()))
        .ok_or("the cell disappeared")?;
    let (spec, log) = spec;
    m.memory_bytes
        .store(h.memory.len() as u64, Ordering::Relaxed);

    // Who is the destination?
    let dest_api = n
        .client(&plan.req.to)
        .map_err(|e| format!("cannot reach destination {}: {e}", plan.req.to))?;
    let info: NodeInfo = dest_api
        .node()
        .await
        .map_err(|e| format!("cannot reach destination {}: {e}", plan.req.to))?;
    let super::transport::Conn {
        mut rd,
        mut wr,
        peer_cert,
    } = super::transport::connect(n, &info.migrate_addr, &info.name).await?;
    let peer = super::dest::handshake(n, &mut rd, &mut wr).await?;
    super::transport::check_peer(n, peer_cert.as_ref(), &peer.node)?;
    let mut wr: Writer = match plan.rate {
        Some(r) => Box::new(roam_link::Shaped::new(wr, r)),
        None => Box::new(wr),
    };
    let mut inbox = spawn_reader(rd);

    // Offer, before anything pauses.
    m.phase("offering");
    let offer = Offer {
        migration_id: m.id.clone(),
        cell: spec.clone(),
        mode: plan.mode,
        module_len: h.module.bytes().len() as u64,
        memory_bytes: h.memory.len() as u64,
    };
    let sent = roam_wire::send(&mut wr, &Msg::Offer(offer))
        .await
        .map_err(|e| format!("sending the offer failed: {e}"))?;
    m.wire_bytes.fetch_add(sent as u64, Ordering::Relaxed);
    let accept = match next(&mut inbox, "the offer", Duration::from_secs(60)).await? {
        Msg::Accept(a) => a,
        other => {
            return Err(format!(
                "protocol error: `{}` instead of accept",
                other.name()
            ))
        }
    };
    let summary = StoreSummary::from_bytes(&accept.store_summary).ok();
    let (out_tx, out_rx) = mpsc::channel::<Out>(if plan.mode == Mode::PostCopy { 2 } else { 8 });
    let (mut stream, meter) = Stream::new(
        encoder_config(&plan),
        h.module.initial_image(),
        summary,
        out_tx,
        h.memory.clone(),
    );
    let writer = tokio::spawn(write_loop(
        wr,
        out_rx,
        m.wire_bytes.clone(),
        stream.pages_on_wire.clone(),
        meter,
    ));
    if accept.need_module {
        m.phase("sending-module");
        for (k, chunk) in h.module.bytes().chunks(1 << 20).enumerate() {
            stream
                .msg(Msg::ModuleChunk {
                    offset: (k << 20) as u64,
                    bytes: chunk.to_vec(),
                })
                .await?;
        }
    }
    m.phase("preparing");
    match next(
        &mut inbox,
        "the destination's preparation",
        Duration::from_secs(600),
    )
    .await?
    {
        Msg::Prepared => {}
        other => {
            return Err(format!(
                "protocol error: `{}` instead of prepared",
                other.name()
            ))
        }
    }

    let preopens = crate::cells::make_preopens(n, &spec.id, &spec.dirs)
        .map_err(|e| format!("cannot open the cell's directories: {e}"))?;
    let mut ctx = Ctx {
        n,
        spec: &spec,
        m,
        h,
        stream: &mut stream,
        inbox: &mut inbox,
        kinds: Vec::new(),
        post_sent: Vec::new(),
        files: super::files::FileSender::open(&preopens)?,
        bd: PauseBreakdown::default(),
        tracker: None,
    };
    let outcome = match plan.mode {
        Mode::StopAndCopy => ctx.stop_and_copy().await,
        Mode::PreCopy => ctx.pre_copy(&plan.req.transfer).await,
        Mode::PostCopy => ctx.post_copy().await,
    };
    let (paused, rounds, tracking) = match outcome {
        Ok(x) => x,
        Err((e, paused)) => {
            match paused {
                Some(p) => ctx.resume(p),
                None => ctx.stop_tracking(),
            }
            writer.abort();
            if ctx.h.has_ended() {
                // Our own reason: the destination only saw us close.
                return Err(format!(
                    "the program ended on this node while it was being moved ({e}); there is \
                     nothing left to move, and its output and exit status stay here"
                ));
            }
            let e = abort_reason(&mut inbox).await.unwrap_or(e);
            return Err(format!("{e}; the cell keeps running on this node"));
        }
    };

    // Files that changed (all of them, but for pre-copy), the log, then
    // the final state and the commit.
    let pages_done = Instant::now();
    let rest = async {
        ctx.files.pass(ctx.stream, true).await?;
        super::files::send_log(ctx.stream, &log).await
    }
    .await;
    let state_began = Instant::now();
    ctx.bd.files_log_ms = ms(state_began - pages_done);
    let log_bytes = match rest {
        Ok(b) => b,
        Err(e) => {
            ctx.resume(paused);
            writer.abort();
            let e = abort_reason(ctx.inbox).await.unwrap_or(e);
            return Err(format!("{e}; the cell keeps running on this node"));
        }
    };
    // The memory went as pages; the snapshot only records its size.
    let mut state = (*paused.snapshot).clone();
    state.memory = MemoryImage::placeholder(h.memory.len() as u64, h.module.initial_image());
    let snapshot = match state.encode(&EncodeOptions::default()) {
        Ok(s) => s,
        Err(e) => {
            ctx.resume(paused);
            writer.abort();
            return Err(format!(
                "encoding the execution state failed: {e}; the cell keeps running on this node"
            ));
        }
    };
    let fin = Final {
        snapshot,
        memory_bytes: h.memory.len() as u64,
    };
    let commit_began = Instant::now();
    ctx.bd.state_encode_ms = ms(commit_began - state_began);
    ctx.bd.state_bytes = fin.snapshot.len() as u64;
    let committed = commit(&mut ctx, fin, &dest_api).await;
    let running_at = Instant::now();
    ctx.bd.commit_ms = ms(running_at - commit_began);
    ctx.bd.paused_wire_bytes = m
        .wire_bytes
        .load(Ordering::Relaxed)
        .saturating_sub(ctx.bd.paused_wire_bytes);
    if let Some(bps) = plan.rate.and_then(|r| r.as_bits_per_sec()) {
        ctx.bd.paused_wire_floor_ms = ctx.bd.paused_wire_bytes as f64 * 8.0 / bps as f64 * 1e3;
    }
    match committed {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            ctx.resume(paused);
            writer.abort();
            let e = committed
                .err()
                .unwrap_or_else(|| "the destination aborted".into());
            let e = abort_reason(ctx.inbox).await.unwrap_or(e);
            return Err(format!("{e}; the cell keeps running on this node"));
        }
    }
    // Post-copy classified the paused memory already.
    let modified_bytes = if ctx.kinds.is_empty() {
        modified(&h.memory, h.module.initial_image())
    } else {
        (ctx.kinds.iter().filter(|&&k| k == 2).count() * PAGE_SIZE) as u64
    };
    // Post-copy: keep serving pages until the destination has them all.
    let post = if plan.mode == Mode::PostCopy {
        m.phase("post-copy");
        Some(ctx.serve_post_copy(running_at).await)
    } else {
        None
    };
    let mut stay = None;
    if let Some(Err(e)) = &post {
        use super::postfail::{after_broken_post_copy, Verdict};
        m.phase("post-copy broken");
        let all_sent = ctx.all_data_sent();
        let mut verdict = after_broken_post_copy(&dest_api, &m.cell, all_sent).await;
        // With a planner the destination owns the cell (at the generation
        // after the source's): the source resumes only if it takes it back.
        if let (Verdict::Resume(_), Some(_), Some(g)) = (&verdict, &n.planner, spec.generation) {
            match crate::cluster::planner::take_from(n, &m.cell, &peer.node, g + 1).await {
                crate::cluster::planner::Back::Won(g) => {
                    if let Some(c) = n.cells().get_mut(&m.cell) {
                        c.spec.generation = Some(g);
                    }
                }
                // The planner does not handle the cell: today's rules.
                crate::cluster::planner::Back::Unknown(why) => {
                    tracing::warn!(cell = %m.cell, %why, "the planner cannot settle the broken post-copy");
                }
                crate::cluster::planner::Back::Lost(why) => {
                    verdict = Verdict::Stay(format!(
                        "the planner did not give the cell back ({why}), so it stays on the destination"
                    ));
                }
            }
        }
        tracing::warn!(migration = %m.id, cell = %m.cell, error = %e, ?verdict,
            "post-copy broke after the cell started on the destination");
        match verdict {
            Verdict::Resume(why) => {
                let _ = paused.reply.send(Decision::Resume);
                if spec.service.is_some() {
                    // The destination's copy served the clients at hops + 1
                    // and ran: the cell went there and came back, and its
                    // `Serve` from here must supersede that copy's.
                    if let Some(e) = n.cells().get_mut(&m.cell) {
                        e.spec.hops += 2;
                    }
                }
                writer.abort();
                return Err(format!(
                    "post-copy broke after the cell started on the destination ({e}); {why}, \
                     so the cell resumed from its paused state and keeps running on this node"
                ));
            }
            Verdict::Stay(why) => stay = Some(why),
        }
    }
    let pipeline = ctx.stream.stats();
    let (files_before, files_paused) = (ctx.files.before_pause, ctx.files.paused);
    // The cell runs on the destination: lift the tracking before the
    // memory goes away with the released cell.
    ctx.stop_tracking();
    let _ = paused.reply.send(Decision::Release);
    let mut bd = std::mem::take(&mut ctx.bd);
    // Off the pause: the destination's share of the commit.
    bd.destination = dest_api.inbound_timings(&m.id).await.ok();
    // The wall-clock time of the pause: `paused.at` is that long ago.
    let paused_unix = super::unix_ms(std::time::SystemTime::now()) - ms(paused.at.elapsed());
    bd.dest_behind_ms = bd
        .destination
        .as_ref()
        .filter(|d| d.last_round_done_unix_ms > 0.0)
        .map(|d| (d.last_round_done_unix_ms - paused_unix).max(0.0));
    log_breakdown(m, &bd);
    {
        // If the cell comes back, most of it need not travel again.
        let (store, mem) = (n.store.clone(), h.memory.clone());
        tokio::task::spawn_blocking(move || {
            let new = super::remember(&store, &mem);
            tracing::debug!(chunks = new, "kept the departed cell's pages for dedup");
        });
    }
    n.set_state(
        &m.cell,
        CellState::Moved {
            to: plan.req.to.clone(),
        },
    );
    let post = match post {
        Some(Err(e)) => {
            return Err(format!(
                "post-copy broke after the cell started on the destination ({e}); {}",
                stay.unwrap_or_default()
            ))
        }
        Some(Ok(p)) => Some(p),
        None => None,
    };
    drop(stream);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    Ok(MigrationSummary {
        mode: plan.mode.as_str().into(),
        from_isa: roam_runtime::host_isa().into(),
        to_isa: peer.isa,
        total_ms: ms(m.started.elapsed()),
        downtime_ms: ms(running_at.saturating_duration_since(paused.at)),
        paused_pages_ms: ms(pages_done.saturating_duration_since(paused.at)),
        commit_ms: ms(running_at.saturating_duration_since(pages_done)),
        wire_bytes: m.wire_bytes.load(Ordering::Relaxed),
        modified_bytes,
        memory_bytes: h.memory.len() as u64,
        rounds,
        tracking,
        files_bytes_before_pause: files_before,
        files_bytes_paused: files_paused,
        log_bytes,
        post_copy: post,
        pipeline: serde_json::to_value(pipeline).unwrap_or_default(),
        pause: Some(bd),
    })
}

fn log_breakdown(m: &Migration, b: &PauseBreakdown) {
    let d = b.destination.clone().unwrap_or_default();
    tracing::info!(
        migration = %m.id, cell = %m.cell,
        request_to_point_ms = b.request_to_point_ms, to_driver_ms = b.to_driver_ms,
        final_pages = b.final_pages, collect_ms = b.collect_ms, encode_ms = b.encode_ms,
        wire_ms = b.wire_ms, files_log_ms = b.files_log_ms,
        state_encode_ms = b.state_encode_ms, state_bytes = b.state_bytes,
        commit_ms = b.commit_ms, paused_wire_bytes = b.paused_wire_bytes,
        paused_wire_floor_ms = b.paused_wire_floor_ms, dest_behind_ms = ?b.dest_behind_ms,
        dest_backlog_ms = d.backlog_ms,
        dest_decode_ms = d.decode_ms, dest_install_ms = d.install_ms,
        dest_register_ms = d.register_ms, dest_to_running_ms = d.to_running_ms,
        "pause breakdown"
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn encoder_config(plan: &Plan) -> EncoderConfig {
    let mut c = EncoderConfig {
        mode: plan.select.clone(),
        shuffle_seed: plan.req.transfer.randomize.then_some(0x5eed),
        ..EncoderConfig::default()
    };
    if plan.mode == Mode::PostCopy {
        // Demand requests must not queue behind a deep pipeline.
        c.max_in_flight = 64;
        c.output_batches = 1;
        c.batch_bytes = 64 * 1024;
        c.flush_after = Duration::from_millis(2);
    }
    c
}

/// The data pages under an unwound stack of `len` bytes in the Asyncify
/// buffer at `offset` (its 8-byte header included): what a rewind reads
/// and writes before the program runs.
fn rewind_pages(offset: u32, len: usize, kinds: &[u8]) -> Vec<u32> {
    const HEADER: u64 = 8;
    let start = u64::from(offset) / PAGE_SIZE as u64;
    let end = (u64::from(offset) + HEADER + len as u64).div_ceil(PAGE_SIZE as u64);
    (start..end.min(kinds.len() as u64))
        .map(|i| i as u32)
        .filter(|&i| kinds[i as usize] == 2)
        .collect()
}

/// Kind of every page of a (paused) memory: 0 zero, 1 equal to the initial
/// image, 2 data (modified state).
fn classify(mem: &roam_runtime::LiveMemory, initial: &roam_snapshot::InitialImage) -> Vec<u8> {
    let mut buf = Box::new([0u8; PAGE_SIZE]);
    let mut kinds = Vec::with_capacity(mem.page_count() as usize);
    for i in 0..mem.page_count() {
        if !mem.read_page(i, &mut buf) {
            break;
        }
        kinds.push(if buf.iter().all(|&b| b == 0) {
            0
        } else if initial.page(u64::from(i)) == Some(&buf[..]) {
            1
        } else {
            2
        });
    }
    kinds
}

/// Bytes of memory that differ from zero and from the initial image.
fn modified(mem: &roam_runtime::LiveMemory, initial: &roam_snapshot::InitialImage) -> u64 {
    let data = classify(mem, initial).iter().filter(|&&k| k == 2).count();
    (data * PAGE_SIZE) as u64
}

type ModeResult = Result<(Paused, u32, Option<String>), (String, Option<Paused>)>;

struct Ctx<'a> {
    n: &'a NodeInner,
    spec: &'a roam_wire::CellSpec,
    m: &'a Migration,
    h: &'a Arc<CellHandle>,
    stream: &'a mut Stream,
    inbox: &'a mut Inbox,
    /// Post-copy: kind of every page (0 zero, 1 initial, 2 data).
    kinds: Vec<u8>,
    /// Post-copy: pages put into the stream (pushed, asked for, or sent
    /// ahead of the final state).
    post_sent: Vec<bool>,
    /// The cell's sandbox files: what went already.
    files: super::files::FileSender,
    /// Where the pause goes, filled as it happens.
    bd: PauseBreakdown,
    /// Pre-copy's dirty tracking, still on after the final round (see
    /// [`Ctx::stop_tracking`]).
    tracker: Option<DirtyTracker>,
}

impl Ctx<'_> {
    /// End pre-copy's dirty tracking. Must happen before the cell resumes
    /// here; after a commit it happens off the pause.
    fn stop_tracking(&mut self) {
        if let Some(t) = self.tracker.take() {
            tokio::task::block_in_place(|| drop(t));
        }
    }

    /// Stop tracking, then let the paused cell continue on this node.
    fn resume(&mut self, paused: Paused) {
        self.stop_tracking();
        let _ = paused.reply.send(Decision::Resume);
    }

    async fn pause(&mut self) -> Result<Paused, String> {
        self.m.phase("pausing");
        let asked = Instant::now();
        let p = tokio::time::timeout(PAUSE_TIMEOUT, self.h.pause())
            .await
            .map_err(|_| {
                format!(
                    "the cell did not reach a migration point within {} s",
                    PAUSE_TIMEOUT.as_secs()
                )
            })?
            .map_err(|_| "the cell ended before it could pause".to_string())?;
        self.m.phase("paused");
        // Every mode pauses once, for the last time here: the gateway
        // buffers the service's clients from now until a `Serve`.
        if self.n.hold(self.spec) {
            self.m.held.store(true, Ordering::SeqCst);
        }
        self.bd.paused_wire_bytes = self.m.wire_bytes.load(Ordering::Relaxed);
        self.bd.request_to_point_ms = ms(p.at.saturating_duration_since(asked));
        self.bd.to_driver_ms = ms(p.at.elapsed());
        Ok(p)
    }

    async fn send_pages(&mut self, pages: &[u32]) -> Result<(), String> {
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

    async fn stop_and_copy(&mut self) -> ModeResult {
        let paused = self.pause().await.map_err(|e| (e, None))?;
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
        match sent {
            Ok(()) => Ok((paused, 1, None)),
            Err(e) => Err((e, Some(paused))),
        }
    }

    async fn pre_copy(&mut self, t: &TransferOptions) -> ModeResult {
        let max_remaining = t.max_remaining_bytes.unwrap_or(10_000_000);
        let max_round = t
            .max_round_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis);
        let max_downtime = Duration::from_millis(t.max_downtime_ms.unwrap_or(30));
        let max_rounds = t.max_rounds.unwrap_or(30).max(1);
        let final_round = parse_final_round(t).map_err(|e| (e, None))?;
        let method = match t.tracking.as_deref() {
            None | Some("auto") => TrackMethod::Auto,
            Some("write-protect") => TrackMethod::WriteProtect,
            Some("hash") => TrackMethod::Hash,
            Some(o) => {
                return Err((
                    format!("unknown tracking `{o}`: use auto, write-protect or hash"),
                    None,
                ))
            }
        };
        let mut tracker =
            DirtyTracker::start(&self.h.memory, method).map_err(|e| (e.to_string(), None))?;
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
        if let Err(e) = r {
            return Err((e, None));
        }
        if final_round != FinalRound::Pipeline {
            // Every round so far is on the wire: close the pipeline while
            // the cell still runs, so the pause does not wait for its
            // threads to wind down.
            tokio::task::block_in_place(|| self.stream.finish()).map_err(|e| (e, None))?;
        }
        let paused = self.pause().await.map_err(|e| (e, None))?;
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
        // Lifting write protection from the whole memory takes tens of
        // milliseconds for hundreds of MiB: not while paused. The caller
        // stops tracking after the commit, or before resuming here.
        self.tracker = Some(tracker);
        match last {
            Ok(()) => Ok((paused, round + 1, tracking)),
            Err(e) => Err((e, Some(paused))),
        }
    }

    async fn post_copy(&mut self) -> ModeResult {
        let paused = self.pause().await.map_err(|e| (e, None))?;
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
        let s = &paused.snapshot.stack;
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
        match r {
            Ok(()) => Ok((paused, 1, None)),
            Err(e) => Err((e, Some(paused))),
        }
    }

    /// After the destination runs the cell: answer its page requests first,
    /// push every other data page meanwhile, until it has them all.
    async fn serve_post_copy(&mut self, began: Instant) -> Result<PostCopyStats, String> {
        const PUSH: usize = 32;
        let data: Vec<u32> = (0..self.kinds.len() as u32)
            .filter(|&i| self.kinds[i as usize] == 2 && !self.post_sent[i as usize])
            .collect();
        let mut stats = PostCopyStats::default();
        let mut cursor = 0;
        let mut done_sent = false;
        loop {
            // Requests first, without waiting.
            while let Ok(m) = self.inbox.try_recv() {
                if self.on_post_copy_msg(m, &mut stats).await? {
                    stats.complete_ms = ms(began.elapsed());
                    return Ok(stats);
                }
            }
            if cursor < data.len() {
                let end = (cursor + PUSH).min(data.len());
                // Pages a request already fetched need not go again.
                let batch: Vec<u32> = data[cursor..end]
                    .iter()
                    .copied()
                    .filter(|&i| !self.post_sent[i as usize])
                    .collect();
                cursor = end;
                if !batch.is_empty() {
                    self.send_pages(&batch).await?;
                    self.mark_sent(&batch);
                    stats.pushed_pages += batch.len() as u64;
                }
                continue;
            }
            if !done_sent {
                self.stream.drain().await?;
                self.stream.msg(Msg::PagesDone).await?;
                done_sent = true;
                continue;
            }
            let m = match tokio::time::timeout(Duration::from_secs(300), self.inbox.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => return Err("the destination closed the connection".into()),
                Err(_) => {
                    return Err(
                        "the destination neither asked for pages nor finished in 300 s".into(),
                    )
                }
            };
            if self.on_post_copy_msg(m, &mut stats).await? {
                stats.complete_ms = ms(began.elapsed());
                return Ok(stats);
            }
        }
    }

    fn mark_sent(&mut self, pages: &[u32]) {
        for &i in pages {
            if let Some(s) = self.post_sent.get_mut(i as usize) {
                *s = true;
            }
        }
    }

    /// Whether every data page went into the stream: only then can the
    /// destination have all of its memory.
    fn all_data_sent(&self) -> bool {
        self.kinds
            .iter()
            .zip(&self.post_sent)
            .all(|(&k, &s)| k != 2 || s)
    }

    /// Handle one message during post-copy; true when the destination has
    /// every page.
    async fn on_post_copy_msg(
        &mut self,
        m: Result<Msg, String>,
        stats: &mut PostCopyStats,
    ) -> Result<bool, String> {
        match m? {
            Msg::PageRequest { pages } => {
                stats.requests += 1;
                stats.demand_pages += pages.len() as u64;
                self.send_pages(&pages).await?;
                self.mark_sent(&pages);
                Ok(false)
            }
            Msg::Complete => Ok(true),
            Msg::Abort { reason } => Err(reason),
            other => Err(format!(
                "protocol error: `{}` during post-copy",
                other.name()
            )),
        }
    }
}

/// Send the final state and learn whether the cell runs on the
/// destination. `Ok(true)`: it runs there. `Ok(false)`: it does not and
/// never will. `Err`: the destination refused or failed before starting.
async fn commit(ctx: &mut Ctx<'_>, fin: Final, to: &crate::client::Client) -> Result<bool, String> {
    ctx.m.phase("committing");
    ctx.stream.msg(Msg::Final(Box::new(fin))).await?;
    match next(ctx.inbox, "the commit", Duration::from_secs(120)).await {
        Ok(Msg::Running) => Ok(true),
        Ok(other) => Err(format!(
            "protocol error: `{}` instead of running",
            other.name()
        )),
        Err(e) if e.starts_with("the destination refused") => Err(e),
        Err(e) => {
            // With a planner, the ownership key decides: the destination
            // started the cell only if it took ownership first.
            if let (Some(_), Some(generation)) = (&ctx.n.planner, ctx.spec.generation) {
                tracing::warn!(error = %e, "commit interrupted; asking the planner for the cell back");
                match crate::cluster::planner::take_back(ctx.n, &ctx.m.cell, generation).await {
                    crate::cluster::planner::Back::Won(g) => {
                        tracing::info!(cell = %ctx.m.cell, generation = g, "the planner gave the cell back: it resumes here");
                        if let Some(c) = ctx.n.cells().get_mut(&ctx.m.cell) {
                            c.spec.generation = Some(g);
                        }
                        return Ok(false);
                    }
                    crate::cluster::planner::Back::Lost(why) => {
                        tracing::info!(cell = %ctx.m.cell, %why, "the destination owns the cell: it never resumes here");
                        return Ok(true);
                    }
                    crate::cluster::planner::Back::Unknown(why) => {
                        tracing::warn!(cell = %ctx.m.cell, %why, "the planner cannot settle the commit; asking the destination");
                    }
                }
            }
            // The connection broke after the final state went out: only the
            // destination knows whether it started the cell.
            tracing::warn!(error = %e, "commit interrupted; asking the destination to resolve");
            match to.resolve(&ctx.m.id).await {
                Ok(Resolution::Running) => Ok(true),
                Ok(Resolution::Aborted) => Ok(false),
                // Unreachable: a dead destination runs nothing.
                Err(_) => Ok(false),
            }
        }
    }
}
