//! The sending side of a migration: connect and offer, move the memory in
//! one of three modes, send the files, the log and the final state, commit.
//!
//! The files of this module, in the order a migration meets them:
//! [`options`] (the request), [`link`] (the destination's messages),
//! [`modes`] (memory), [`held`] (the paused cell, resumed unless the
//! migration commits), [`commit`] (where the cell runs), [`postcopy`]
//! (pages after the start), and [`error`] (how it fails).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use roam_snapshot::{EncodeOptions, MemoryImage, PAGE_SIZE};
use roam_transfer::StoreSummary;
use roam_wire::{Final, Hello, Mode, Msg, Offer, PageKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::stream::{write_loop, Out, Stream, Writer};
use crate::cell::CellHandle;
use crate::cells::running_handle;
use crate::client::Client;
use crate::error::NodeError;
use crate::ids::new_id;
use crate::state::{Migration, NodeInner};
use crate::types::*;

mod commit;
mod error;
mod held;
mod link;
mod modes;
mod options;
mod postcopy;

use commit::{commit, Commit};
pub(crate) use error::{After, Cause, MigrateError, Phase};
use link::{abort_reason, next, spawn_reader, unexpected, Inbox};
use modes::Ctx;
use options::Plan;

/// `POST /v1/cells/{id}/migrate`: start a migration; progress is polled.
pub(crate) async fn start(
    n: &Arc<NodeInner>,
    id: &str,
    req: MigrateRequest,
) -> Result<MigrateResponse, NodeError> {
    let plan = Plan::parse(req).map_err(NodeError::BadRequest)?;
    let handle = running_handle(n, id)?;
    if handle.far.get().is_some() && plan.mode != Mode::StopAndCopy {
        // Dirty tracking and lazy pages use the same kernel mechanism on
        // the same pages as far memory.
        return Err(NodeError::bad(format!(
            "cell {id} runs with far memory: it moves by stop-and-copy only, not {}",
            plan.mode.as_str()
        )));
    }
    if roam_runtime::is_threaded(&handle.module) && plan.mode == Mode::PostCopy {
        // Post-copy empties the memory and fills it on faults, in a mapping
        // roam makes; a threaded program's shared memory is wasmtime's.
        return Err(NodeError::bad(format!(
            "cell {id} runs a threaded program: it moves by stop-and-copy or pre-copy, not post-copy"
        )));
    }
    n.set_state(id, CellState::Migrating);
    let m = Arc::new(Migration::new(new_id("m-"), id.to_string(), plan.mode));
    n.migrations
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(m.id.clone(), m.clone());
    tokio::spawn(drive(n.clone(), m.clone(), handle, plan));
    Ok(MigrateResponse {
        migration: m.id.clone(),
    })
}

/// Run a migration to its end and record how it ended.
async fn drive(n: Arc<NodeInner>, m: Arc<Migration>, handle: Arc<CellHandle>, plan: Plan) {
    let r = run(&n, &m, &handle, plan).await;
    let mut serve_again = None;
    let r = r.map_err(|mut e| {
        let mut cells = n.cells();
        match cells.get_mut(&m.cell) {
            // It runs on here: say so in the table too.
            Some(c) if c.state == CellState::Migrating && e.after == After::Here => {
                c.state = CellState::Running;
                if m.held.load(Ordering::SeqCst) {
                    serve_again = Some((c.spec.clone(), handle.net.clone()));
                }
            }
            // It ended by itself meanwhile.
            _ if e.after == After::Here => e.after = After::Ended,
            _ => {}
        }
        tracing::warn!(migration = %m.id, cell = %m.cell, phase = e.phase_name(), "migration failed");
        e.to_string()
    });
    // The gateway held the service's clients for the move: they are this
    // node's again, at the same generation (nothing else served).
    if let Some((spec, hub)) = serve_again {
        n.serve(&spec, hub.as_ref());
    }
    n.metrics.migration(
        m.mode.as_str(),
        r.as_ref().ok().map(|s| (s.downtime_ms, s.wire_bytes)),
    );
    m.finish(r);
}

/// A connection to the destination, past its offer and preparation.
struct Connected {
    api: Client,
    peer: Hello,
    inbox: Inbox,
    stream: Stream,
    writer: JoinHandle<Result<Writer, String>>,
}

/// Reach the destination, offer the cell and wait until it is prepared.
async fn connect(
    n: &NodeInner,
    m: &Migration,
    h: &CellHandle,
    spec: &roam_wire::CellSpec,
    plan: &Plan,
) -> Result<Connected, MigrateError> {
    let fail = |phase| move |e: String| MigrateError::here(phase, e);
    let super::transport::Reached {
        rd, wr, api, peer, ..
    } = super::transport::reach(n, &plan.req.to, "destination")
        .await
        .map_err(fail(Phase::Connect))?;
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
        .map_err(|e| fail(Phase::Connect)(format!("sending the offer failed: {e}")))?;
    m.wire_bytes.fetch_add(sent as u64, Ordering::Relaxed);
    let offered = next(&mut inbox, "the offer", Duration::from_secs(60)).await;
    let accept = match offered.map_err(|c| MigrateError::here(Phase::Connect, c))? {
        Msg::Accept(a) => a,
        other => {
            return Err(MigrateError::here(
                Phase::Connect,
                unexpected(&other, "accept"),
            ))
        }
    };
    let summary = StoreSummary::from_bytes(&accept.store_summary).ok();
    let (out_tx, out_rx) = mpsc::channel::<Out>(if plan.mode == Mode::PostCopy { 2 } else { 8 });
    let (stream, meter) = Stream::new(
        plan.encoder_config(),
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
    let prepared = async {
        if accept.need_module {
            m.phase("sending-module");
            for (k, chunk) in h.module.bytes().chunks(1 << 20).enumerate() {
                let bytes = chunk.to_vec();
                let offset = (k << 20) as u64;
                stream.msg(Msg::ModuleChunk { offset, bytes }).await?;
            }
        }
        m.phase("preparing");
        let limit = Duration::from_secs(600);
        match next(&mut inbox, "the destination's preparation", limit).await? {
            Msg::Prepared => Ok(()),
            other => Err(unexpected(&other, "prepared")),
        }
    }
    .await;
    if let Err(c) = prepared {
        writer.abort();
        return Err(MigrateError::here(Phase::Prepare, c));
    }
    Ok(Connected {
        api,
        peer,
        inbox,
        stream,
        writer,
    })
}

/// The task that writes the stream to the destination: aborted when a
/// migration ends without a commit, given a few seconds to flush after one.
struct WriterTask(Option<JoinHandle<Result<Writer, String>>>);

impl WriterTask {
    async fn finish(mut self) {
        if let Some(h) = self.0.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

async fn run(
    n: &Arc<NodeInner>,
    m: &Migration,
    h: &Arc<CellHandle>,
    plan: Plan,
) -> Result<MigrationSummary, MigrateError> {
    let (spec, log) = n
        .cells()
        .get(&m.cell)
        .map(|e| (e.spec.clone(), e.log.clone()))
        .ok_or_else(|| MigrateError::here(Phase::Connect, "the cell disappeared".to_string()))?;
    m.memory_bytes
        .store(h.memory.len() as u64, Ordering::Relaxed);
    let Connected {
        api,
        peer,
        mut inbox,
        mut stream,
        writer,
    } = connect(n, m, h, &spec, &plan).await?;
    // From here on, every way out but a commit stops the writer.
    let writer = WriterTask(Some(writer));
    // The planner lets the destination take the cell only once its owner
    // said so; before anything moves, so a refusal costs nothing.
    crate::cluster::planner::hand_off(n, &spec.id, &peer.node, spec.generation)
        .await
        .map_err(|e| MigrateError::here(Phase::Connect, e))?;
    let preopens = crate::cells::make_preopens(n, &spec.id, &spec.dirs).map_err(|e| {
        MigrateError::here(
            Phase::Prepare,
            format!("cannot open the cell's directories: {e}"),
        )
    })?;
    let files = super::files::FileSender::open(&preopens)
        .map_err(|e| MigrateError::here(Phase::Prepare, e))?;
    let mut ctx = Ctx {
        n,
        spec: &spec,
        m,
        h,
        stream: &mut stream,
        inbox: &mut inbox,
        kinds: Vec::new(),
        post_sent: Vec::new(),
        files,
        bd: PauseBreakdown::default(),
    };
    let outcome = match plan.mode {
        Mode::StopAndCopy => ctx.stop_and_copy().await,
        Mode::PreCopy => ctx.pre_copy(&plan.req.transfer).await,
        Mode::PostCopy => ctx.post_copy().await,
    };
    let (held, rounds, tracking) = match outcome {
        Ok(x) => x,
        Err(mut e) => {
            // The cell resumed (`held` was dropped), or was never paused.
            if ctx.h.has_ended() {
                // Our own reason: the destination only saw us close.
                e.after = After::Ended;
            } else if let Some(c) = abort_reason(ctx.inbox).await {
                e.cause = c;
            }
            return Err(e);
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
            drop(held);
            let cause = abort_reason(ctx.inbox).await.unwrap_or(Cause::Failed(e));
            return Err(MigrateError::here(Phase::Final, cause));
        }
    };
    // The memory went as pages; the snapshot only records its size.
    let mut state = held.snapshot().clone();
    state.memory = MemoryImage::placeholder(h.memory.len() as u64, h.module.initial_image());
    let snapshot = state.encode(&EncodeOptions::default()).map_err(|e| {
        MigrateError::here(
            Phase::Final,
            format!("encoding the execution state failed: {e}"),
        )
    })?;
    let fin = Final {
        snapshot,
        memory_bytes: h.memory.len() as u64,
    };
    let commit_began = Instant::now();
    ctx.bd.state_encode_ms = ms(commit_began - state_began);
    ctx.bd.state_bytes = fin.snapshot.len() as u64;
    let committed = commit(&mut ctx, fin, &api, &peer.node).await;
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
        Commit::There => {}
        Commit::Here(cause) => {
            drop(held);
            let cause = match cause {
                Cause::Failed(_) => abort_reason(ctx.inbox).await.unwrap_or(cause),
                refused => refused,
            };
            return Err(MigrateError::here(Phase::Commit, cause));
        }
        Commit::Elsewhere(why) => {
            held.release();
            n.set_state(&m.cell, CellState::Failed { error: why.clone() });
            return Err(MigrateError {
                phase: Phase::Commit,
                cause: Cause::Failed(why),
                after: After::There,
            });
        }
    }
    // Post-copy classified the paused memory already.
    let modified_bytes = if ctx.kinds.is_empty() {
        modes::modified(&h.memory, h.module.initial_image())
    } else {
        let data = ctx.kinds.iter().filter(|&&k| k == PageKind::Data).count();
        (data * PAGE_SIZE) as u64
    };
    // Post-copy: keep serving pages until the destination has them all.
    let post = if plan.mode == Mode::PostCopy {
        m.phase("post-copy");
        match ctx.serve_post_copy(running_at).await {
            Ok(p) => Some(p),
            Err(e) => {
                let all_sent = ctx.all_data_sent();
                let back = postcopy::after_break(n, m, &spec, &api, &peer.node, all_sent, &e).await;
                match back {
                    // Dropping `held` resumes it here.
                    postcopy::Broken::Resume(err) => return Err(err),
                    postcopy::Broken::Stay(err) => {
                        held.release();
                        n.set_state(
                            &m.cell,
                            CellState::Moved {
                                to: plan.req.to.clone(),
                            },
                        );
                        return Err(err);
                    }
                }
            }
        }
    } else {
        None
    };
    let pipeline = ctx.stream.stats();
    let (files_before, files_paused) = (ctx.files.before_pause, ctx.files.paused);
    let at = held.at();
    // The cell runs on the destination: lift the tracking before the
    // memory goes away with the released cell.
    held.release();
    let mut bd = std::mem::take(&mut ctx.bd);
    // Off the pause: the destination's share of the commit.
    bd.destination = api.inbound_timings(&m.id).await.ok();
    // The wall-clock time of the pause: `at` is that long ago.
    let paused_unix = super::unix_ms(std::time::SystemTime::now()) - ms(at.elapsed());
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
    crate::cells::forget_files(n, &m.cell);
    drop(stream);
    writer.finish().await;
    Ok(MigrationSummary {
        mode: plan.mode.as_str().into(),
        from_isa: roam_runtime::host_isa().into(),
        to_isa: peer.isa,
        total_ms: ms(m.started.elapsed()),
        downtime_ms: ms(running_at.saturating_duration_since(at)),
        paused_pages_ms: ms(pages_done.saturating_duration_since(at)),
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
