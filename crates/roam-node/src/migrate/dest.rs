//! The receiving side of a migration.
//!
//! A connection is served by a task that reads frames and a thread that owns
//! the receiving instance: pages are written straight into the future cell's
//! linear memory while the cell still runs on the source, so the pause only
//! has to carry the last dirty pages and the execution state. The thread
//! becomes the cell's thread once the cell starts.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use roam_runtime::{LazyMemory, LoadedModule};
use roam_wire::{recv, send, Accept, Hello, Mode, Msg, Offer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::assemble::{assemble, Run};
use super::pages::PostCopyPages;
use super::transport::Conn;
use super::{ReadHalf, WriteHalf};
use crate::error::NodeError;
use crate::state::{Inbound, NodeInner};
use crate::types::{DestTimings, Resolution};

/// Longest silence of the source before the final state.
const STATE_IDLE: Duration = Duration::from_secs(120);
/// Longest time from the final state to the cell's start.
const START_LIMIT: Duration = Duration::from_secs(60);

/// Accept migrations until the task is aborted.
pub(crate) async fn accept_loop(n: Arc<NodeInner>, l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((sock, peer)) => {
                let n = n.clone();
                tokio::spawn(async move {
                    let conn = super::transport::accept(&n, sock).await;
                    if let Err(e) = async { receive(n, conn?).await }.await {
                        tracing::warn!(%peer, error = %e, "incoming migration failed; nothing was started here");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("accepting a migration connection failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

fn unexpected(m: &Msg, during: &str) -> String {
    format!(
        "protocol error: unexpected `{}` message during {during}",
        m.name()
    )
}

/// Exchange hellos (both sides send first) and check the peer's.
pub(crate) async fn handshake(
    n: &NodeInner,
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
) -> Result<Hello, String> {
    let ours = Hello::new(&n.cfg.name, roam_runtime::host_isa(), n.features());
    send(wr, &Msg::Hello(ours))
        .await
        .map_err(|e| e.to_string())?;
    match recv(rd).await.map_err(|e| format!("handshake: {e}"))? {
        Msg::Hello(h) => {
            h.check()?;
            roam_wire::ident::check_node_name(&h.node)
                .map_err(|e| format!("the peer's hello is refused: {e}"))?;
            Ok(h)
        }
        m => Err(unexpected(&m, "the handshake")),
    }
}

async fn receive(n: Arc<NodeInner>, conn: Conn) -> Result<(), String> {
    let Conn {
        mut rd,
        mut wr,
        peer_cert,
    } = conn;
    let peer = handshake(&n, &mut rd, &mut wr).await?;
    super::transport::check_peer(&n, peer_cert.as_ref(), &peer.node)?;
    let mut offer = match recv(&mut rd).await.map_err(|e| e.to_string())? {
        Msg::Offer(o) => o,
        // Not a migration: a node that keeps its far pages here.
        Msg::FarOpen(open) => return super::far::serve(&n, &peer, open, &mut rd, &mut wr).await,
        m => return Err(unexpected(&m, "the offer")),
    };
    // Identifiers become host paths (`state_dir/cells/{id}`): check them
    // before anything, the log line below included, uses them.
    if let Err(e) = offer.check_idents() {
        let reason = format!("offer refused: {e}");
        let _ = send(
            &mut wr,
            &Msg::Abort {
                reason: reason.clone(),
            },
        )
        .await;
        linger(&mut rd, &mut wr).await;
        return Err(reason);
    }
    tracing::info!(
        cell = %offer.cell.id, from = %peer.node, from_isa = %peer.isa,
        mode = offer.mode.as_str(), memory = offer.memory_bytes, "incoming migration"
    );
    let admitted = admit(&n, &mut offer);
    if let Err(reason) = &admitted {
        let reason = reason.clone();
        let _ = send(
            &mut wr,
            &Msg::Abort {
                reason: reason.clone(),
            },
        )
        .await;
        return Err(reason);
    }
    let inbound = Inbound::new(&peer.node, &offer.cell.id);
    n.inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(offer.migration_id.clone(), inbound.clone());
    let had_dir = n.cell_dir(&offer.cell.id).exists();
    let result = receive_cell(&n, &offer, &inbound, &mut rd, &mut wr).await;
    if let Err(e) = &result {
        if inbound.abort() == Resolution::Aborted {
            tracing::warn!(cell = %offer.cell.id, error = %e, "incoming migration aborted; freeing what it took");
            let _ = send(&mut wr, &Msg::Abort { reason: e.clone() }).await;
            linger(&mut rd, &mut wr).await;
            release(&n, &offer, had_dir);
        }
    }
    result
}

/// After an aborted incoming migration: forget it (the resolve endpoint
/// answers `aborted` for an unknown migration too) and remove the cell's
/// directory if this migration made it and no cell of that id is here. The
/// receiving thread frees the instance by itself when its channel closes.
fn release(n: &NodeInner, offer: &Offer, had_dir: bool) {
    n.inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&offer.migration_id);
    let id = &offer.cell.id;
    let plain = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !had_dir && plain && !n.cells().contains_key(id) {
        let dir = n.cell_dir(id);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(cell = %id, "cannot remove {}: {e}", dir.display());
            }
        }
    }
}

/// Close after an abort without losing it: closing a socket with unread
/// data makes the kernel reset the connection, and a reset can discard the
/// abort before the source reads it. So: end our side, then read and drop
/// what the source still sends, until it closes or a second has passed.
async fn linger(rd: &mut ReadHalf, wr: &mut WriteHalf) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = wr.shutdown().await;
    let mut sink = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, rd.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

/// Refuse, before the source pauses anything, a cell this node cannot take.
/// The admission counts against the node's caps until dropped.
fn admit(n: &NodeInner, offer: &mut Offer) -> Result<crate::limits::Admission, String> {
    // The source chooses the migration id, and the resolve endpoint answers
    // by it: an id this node has seen must not replace what it knows.
    let known = n
        .inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains_key(&offer.migration_id);
    if known {
        return Err(format!(
            "migration id {} is already known on this node: a source must choose a new id \
             for every migration",
            offer.migration_id
        ));
    }
    if let Some(e) = n.cells().get(&offer.cell.id) {
        if e.handle.is_some() {
            return Err(format!("cell {} already runs on this node", offer.cell.id));
        }
    }
    if let Some(service) = &offer.cell.service {
        n.check_can_serve(service)?;
    }
    let admission = crate::cells::admit::admit_offer(n, offer)?;
    let m = crate::sysinfo::Machine::read();
    let here = offer
        .memory_bytes
        .min(crate::cells::admit::local_memory(&offer.cell));
    let need = here + n.cfg.memory_reserve;
    if m.memory_available > 0 && need > m.memory_available {
        return Err(format!(
            "node {} lacks memory: the cell needs {} MiB plus a {} MiB reserve, {} MiB are available",
            n.cfg.name,
            here >> 20,
            n.cfg.memory_reserve >> 20,
            m.memory_available >> 20
        ));
    }
    if offer.mode == Mode::PostCopy && !n.features().userfaultfd {
        return Err(format!(
            "node {} ({}) cannot receive post-copy migrations: userfaultfd is not available here; \
             use pre-copy or stop-and-copy",
            n.cfg.name,
            roam_runtime::host_isa()
        ));
    }
    Ok(admission)
}

async fn load_module(
    n: &Arc<NodeInner>,
    offer: &Offer,
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
) -> Result<Arc<LoadedModule>, String> {
    let hash = offer.cell.module_hash;
    let node = n.clone();
    let have = tokio::task::spawn_blocking(move || {
        // Cells of the same module running here often share pages with
        // the incoming one: offer them for dedup before the summary goes out.
        let siblings: Vec<_> = node
            .cells()
            .values()
            .filter(|e| e.spec.module_hash == hash)
            .filter_map(|e| e.handle.as_ref().map(|h| h.memory.clone()))
            .collect();
        for mem in siblings {
            super::remember(&node.store, &mem);
        }
        node.rt.load_by_hash(&hash, None).ok()
    })
    .await
    .map_err(|e| e.to_string())?;
    send(
        wr,
        &Msg::Accept(Accept {
            need_module: have.is_none(),
            store_summary: n.store.summary().to_bytes(),
        }),
    )
    .await
    .map_err(|e| e.to_string())?;
    if let Some(m) = have {
        return Ok(m);
    }
    // `admit` bounded the declared length; no more than it is taken.
    let mut bytes = Vec::with_capacity(offer.module_len as usize);
    while (bytes.len() as u64) < offer.module_len {
        match recv(rd).await.map_err(|e| e.to_string())? {
            Msg::ModuleChunk { offset, bytes: b } if offset == bytes.len() as u64 => {
                if offset + b.len() as u64 > offer.module_len {
                    return Err(format!(
                        "the source sent more than the {} module bytes it offered",
                        offer.module_len
                    ));
                }
                bytes.extend_from_slice(&b);
            }
            Msg::Abort { reason } => return Err(format!("the source aborted: {reason}")),
            m => return Err(unexpected(&m, "the module transfer")),
        }
    }
    // The hash names the prepared bytes: check it before compiling anything
    // a peer sent.
    if bytes.len() as u64 != offer.module_len || *blake3::hash(&bytes).as_bytes() != hash {
        return Err(format!(
            "the module sent by the source does not match the offered hash {}; refused \
             before compiling it",
            roam_runtime::cache::hex(&hash)
        ));
    }
    let node = n.clone();
    let module = tokio::task::spawn_blocking(move || node.rt.load_bytes(&bytes))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the module sent by the source does not load: {e}"))?;
    if *module.hash() != hash {
        return Err("the module sent by the source does not match the offered hash".into());
    }
    Ok(module)
}

/// What the receiving thread reports once the cell has started: the lazy
/// memory of a post-copy cell, and when each step of the start ended.
pub(super) type Started = Result<(Option<LazyMemory>, StartMarks), String>;

/// When the receiving thread finished each step of starting the cell.
#[derive(Debug, Clone, Copy)]
pub(super) struct StartMarks {
    /// Time spent applying the pages after the last `RoundDone`.
    pub last_apply: Duration,
    pub picked: Instant,
    pub decoded: Instant,
    pub installed: Instant,
    pub registered: Instant,
}

async fn receive_cell(
    n: &Arc<NodeInner>,
    offer: &Offer,
    inbound: &Arc<Inbound>,
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
) -> Result<(), String> {
    let module = load_module(n, offer, rd, wr).await?;
    let (tx, rx) = mpsc::channel::<Msg>(8);
    let (prep_tx, prep_rx) = oneshot::channel::<Result<(), String>>();
    let (run_tx, run_rx) = oneshot::channel::<Started>();
    let post = (offer.mode == Mode::PostCopy).then(PostCopyPages::new);
    // A far-memory cell keeps its split here: a page space of its own on
    // the same memory server, filled as the pages arrive.
    let far = match &offer.cell.far {
        Some(spec) => Some(
            super::far::open(n, spec, &offer.cell.id, offer.cell.max_memory)
                .await
                .map_err(|e| format!("far memory: {e}"))?,
        ),
        None => None,
    };
    {
        let (n, offer, inbound, post) = (n.clone(), offer.clone(), inbound.clone(), post.clone());
        let run = Run { inbound, post, far };
        std::thread::Builder::new()
            .name(format!("recv-{}", offer.cell.id))
            .stack_size(roam_runtime::RUN_THREAD_STACK)
            .spawn(move || assemble(n, module, offer, rx, prep_tx, run_tx, run))
            .map_err(|e| e.to_string())?;
    }
    prep_rx
        .await
        .map_err(|_| "the receiving thread ended".to_string())??;
    send(wr, &Msg::Prepared).await.map_err(|e| e.to_string())?;
    let mut final_at = Instant::now();
    // The first page read after the last `RoundDone`.
    let mut last_pages_at: Option<Instant> = None;
    let mut last_round_done = None;
    loop {
        // A source that went silent is gone or cut off: give up rather
        // than hold the receiving instance forever. It never stays silent
        // this long while healthy (a pause takes at most 30 s).
        let m = tokio::time::timeout(STATE_IDLE, recv(rd))
            .await
            .map_err(|_| {
                format!(
                    "the source sent nothing for {} s during the state transfer",
                    STATE_IDLE.as_secs()
                )
            })?
            .map_err(|e| e.to_string())?;
        let last = matches!(m, Msg::Final(_));
        match &m {
            Msg::Final(_) => final_at = Instant::now(),
            Msg::RoundDone { .. } => {
                last_pages_at = None;
                last_round_done = Some(std::time::SystemTime::now());
            }
            Msg::Pages { .. } => {
                last_pages_at.get_or_insert_with(Instant::now);
            }
            _ => {}
        }
        match m {
            Msg::Pages { .. }
            | Msg::Grow { .. }
            | Msg::RoundDone { .. }
            | Msg::PageKinds { .. }
            | Msg::FileEntry(_)
            | Msg::FileData { .. }
            | Msg::FileRemoved { .. }
            | Msg::LogChunk { .. }
            | Msg::Final(_) => {
                if tx.send(m).await.is_err() {
                    break;
                }
            }
            Msg::Abort { reason } => return Err(format!("the source aborted: {reason}")),
            m => return Err(unexpected(&m, "the state transfer")),
        }
        if last {
            break;
        }
    }
    drop(tx);
    let (lazy, marks) = started(offer, inbound, post.as_ref(), run_rx).await?;
    let mut t = timings(final_at, &marks);
    t.last_pages_read_ms = last_pages_at.map_or(0.0, |a| {
        final_at.saturating_duration_since(a).as_secs_f64() * 1000.0
    });
    t.last_round_done_unix_ms = last_round_done.map_or(0.0, super::unix_ms);
    tracing::info!(
        cell = %offer.cell.id, backlog_ms = t.backlog_ms, decode_ms = t.decode_ms,
        install_ms = t.install_ms, register_ms = t.register_ms,
        to_running_ms = t.to_running_ms, last_pages_read_ms = t.last_pages_read_ms,
        last_pages_apply_ms = t.last_pages_apply_ms, "migrated cell runs here"
    );
    inbound.set_timings(t);
    send(wr, &Msg::Running).await.map_err(|e| e.to_string())?;
    match (lazy, post) {
        (Some(lazy), Some(post)) => post.serve(lazy, rd, wr, n.store.clone()).await,
        _ => Ok(()),
    }
}

/// `ROAM_LEARN_INLINE=1`: hash arriving pages into the chunk store as they
/// are applied, as before the background learning (an ablation knob).
pub(super) fn learn_inline() -> bool {
    std::env::var_os("ROAM_LEARN_INLINE").is_some_and(|v| v == "1")
}

/// The destination's share of the commit, from the final state read.
fn timings(final_at: Instant, m: &StartMarks) -> DestTimings {
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1000.0;
    DestTimings {
        backlog_ms: ms(final_at, m.picked),
        decode_ms: ms(m.picked, m.decoded),
        install_ms: ms(m.decoded, m.installed),
        register_ms: ms(m.installed, m.registered),
        to_running_ms: ms(final_at, Instant::now()),
        last_pages_read_ms: 0.0,
        last_pages_apply_ms: m.last_apply.as_secs_f64() * 1000.0,
        last_round_done_unix_ms: 0.0,
    }
}

/// Wait for the receiving thread to start the cell, for at most
/// [`START_LIMIT`]. Past it, the migration is aborted (unless the cell
/// started meanwhile): the source learns it through `Abort` or the resolve
/// endpoint and keeps its cell; a thread stuck waiting for pages is
/// released, ends without starting, and frees the instance.
async fn started(
    offer: &Offer,
    inbound: &Inbound,
    post: Option<&Arc<PostCopyPages>>,
    mut run_rx: oneshot::Receiver<Started>,
) -> Started {
    let ended = |_| "the receiving thread ended".to_string();
    match tokio::time::timeout(START_LIMIT, &mut run_rx).await {
        Ok(r) => return r.map_err(ended)?,
        Err(_) if inbound.abort() == Resolution::Running => {}
        Err(_) => {
            let why = format!(
                "the cell did not start within {} s of the final state; nothing runs here",
                START_LIMIT.as_secs()
            );
            tracing::error!(cell = %offer.cell.id, "{why}");
            if let Some(p) = post {
                p.fail(&why);
            }
            return Err(why);
        }
    }
    // It started just as the limit passed: it is this node's now.
    run_rx.await.map_err(ended)?
}

/// The inbound migration `id`, if this node knows it.
fn inbound_of(n: &NodeInner, id: &str) -> Option<Arc<Inbound>> {
    n.inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(id)
        .cloned()
}

/// `POST /v1/migrations/{id}/resolve`: a source whose connection broke asks
/// whether the cell started here. An unstarted migration is aborted for good.
pub(crate) fn resolve(n: &NodeInner, id: &str) -> Resolution {
    inbound_of(n, id).map_or(Resolution::Aborted, |i| i.abort())
}

/// `GET /v1/migrations/{id}/timings`: the destination's share of the
/// commit of a migration it received, for the source's summary.
pub(crate) fn timings_of(n: &NodeInner, id: &str) -> Result<DestTimings, NodeError> {
    inbound_of(n, id).and_then(|i| i.timings()).ok_or_else(|| {
        NodeError::NotFound(format!("no started incoming migration {id} on this node"))
    })
}
