//! The receiving side of a migration.
//!
//! A connection is served by a task that reads frames and a thread that owns
//! the receiving instance: pages are written straight into the future cell's
//! linear memory while the cell still runs on the source, so the pause only
//! has to carry the last dirty pages and the execution state. The thread
//! becomes the cell's thread once the cell starts.

use std::sync::{Arc, PoisonError};

use axum::extract::{Path, State};
use axum::Json;
use roam_runtime::{Cell, CellOptions, LazyMemory, LoadedModule};
use roam_snapshot::{PageKind, Snapshot};
use roam_transfer::Decoder;
use roam_wire::{recv, send, Accept, Final, Hello, Mode, Msg, Offer};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use super::pages::{IncomingTarget, PostCopyPages};
use super::Inbound;
use crate::api::{make_preopens, on_end, register, AppError};
use crate::cell;
use crate::log::CellLog;
use crate::node::NodeInner;
use crate::types::Resolution;

/// Accept migrations until the task is aborted.
pub(crate) async fn accept_loop(n: Arc<NodeInner>, l: TcpListener) {
    loop {
        match l.accept().await {
            Ok((sock, peer)) => {
                let n = n.clone();
                tokio::spawn(async move {
                    if let Err(e) = receive(n, sock).await {
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
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
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

async fn receive(n: Arc<NodeInner>, sock: TcpStream) -> Result<(), String> {
    sock.set_nodelay(true).ok();
    let (mut rd, mut wr) = sock.into_split();
    let peer = handshake(&n, &mut rd, &mut wr).await?;
    let offer = match recv(&mut rd).await.map_err(|e| e.to_string())? {
        Msg::Offer(o) => o,
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
    if let Err(reason) = admit(&n, &offer) {
        let _ = send(
            &mut wr,
            &Msg::Abort {
                reason: reason.clone(),
            },
        )
        .await;
        return Err(reason);
    }
    let inbound = Inbound::new();
    n.inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(offer.migration_id.clone(), inbound.clone());
    let result = receive_cell(&n, &offer, &inbound, &mut rd, &mut wr).await;
    if let Err(e) = &result {
        if inbound.abort() == Resolution::Aborted {
            let _ = send(&mut wr, &Msg::Abort { reason: e.clone() }).await;
            linger(&mut rd, &mut wr).await;
        }
    }
    result
}

/// Close after an abort without losing it: closing a socket with unread
/// data makes the kernel reset the connection, and a reset can discard the
/// abort before the source reads it. So: end our side, then read and drop
/// what the source still sends, until it closes or a second has passed.
async fn linger(rd: &mut OwnedReadHalf, wr: &mut OwnedWriteHalf) {
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
fn admit(n: &NodeInner, offer: &Offer) -> Result<(), String> {
    if let Some(e) = n.cells().get(&offer.cell.id) {
        if e.handle.is_some() {
            return Err(format!("cell {} already runs on this node", offer.cell.id));
        }
    }
    let m = crate::sysinfo::Machine::read();
    let need = offer.memory_bytes + n.cfg.memory_reserve;
    if m.memory_available > 0 && need > m.memory_available {
        return Err(format!(
            "node {} lacks memory: the cell needs {} MiB plus a {} MiB reserve, {} MiB are available",
            n.cfg.name,
            offer.memory_bytes >> 20,
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
    Ok(())
}

async fn load_module(
    n: &Arc<NodeInner>,
    offer: &Offer,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
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
    let mut bytes = Vec::with_capacity(offer.module_len.min(512 << 20) as usize);
    while (bytes.len() as u64) < offer.module_len {
        match recv(rd).await.map_err(|e| e.to_string())? {
            Msg::ModuleChunk { offset, bytes: b } if offset == bytes.len() as u64 => {
                bytes.extend_from_slice(&b);
            }
            Msg::Abort { reason } => return Err(format!("the source aborted: {reason}")),
            m => return Err(unexpected(&m, "the module transfer")),
        }
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

/// What the receiving thread reports once the cell has started.
type Started = Result<Option<LazyMemory>, String>;

async fn receive_cell(
    n: &Arc<NodeInner>,
    offer: &Offer,
    inbound: &Arc<Inbound>,
    rd: &mut OwnedReadHalf,
    wr: &mut OwnedWriteHalf,
) -> Result<(), String> {
    let module = load_module(n, offer, rd, wr).await?;
    let (tx, rx) = mpsc::channel::<Msg>(8);
    let (prep_tx, prep_rx) = oneshot::channel::<Result<(), String>>();
    let (run_tx, run_rx) = oneshot::channel::<Started>();
    let post = (offer.mode == Mode::PostCopy).then(PostCopyPages::new);
    {
        let (n, offer, inbound, post) = (n.clone(), offer.clone(), inbound.clone(), post.clone());
        std::thread::Builder::new()
            .name(format!("recv-{}", offer.cell.id))
            .stack_size(roam_runtime::RUN_THREAD_STACK)
            .spawn(move || assemble(n, module, offer, rx, prep_tx, run_tx, inbound, post))
            .map_err(|e| e.to_string())?;
    }
    prep_rx
        .await
        .map_err(|_| "the receiving thread ended".to_string())??;
    send(wr, &Msg::Prepared).await.map_err(|e| e.to_string())?;
    loop {
        let m = recv(rd).await.map_err(|e| e.to_string())?;
        let last = matches!(m, Msg::Final(_));
        match m {
            Msg::Pages { .. }
            | Msg::Grow { .. }
            | Msg::RoundDone { .. }
            | Msg::PageKinds { .. }
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
    let lazy = run_rx
        .await
        .map_err(|_| "the receiving thread ended".to_string())??;
    send(wr, &Msg::Running).await.map_err(|e| e.to_string())?;
    tracing::info!(cell = %offer.cell.id, "migrated cell runs here");
    match (lazy, post) {
        (Some(lazy), Some(post)) => post.serve(lazy, rd, wr, n.store.clone()).await,
        _ => Ok(()),
    }
}

/// The receiving thread: build the instance, apply pages, finish, run.
#[allow(clippy::too_many_arguments)]
fn assemble(
    n: Arc<NodeInner>,
    module: Arc<LoadedModule>,
    offer: Offer,
    mut rx: mpsc::Receiver<Msg>,
    prep_tx: oneshot::Sender<Result<(), String>>,
    run_tx: oneshot::Sender<Started>,
    inbound: Arc<Inbound>,
    post: Option<Arc<PostCopyPages>>,
) {
    let opts = CellOptions {
        with_files: !offer.cell.dirs.is_empty(),
        ..CellOptions::default()
    };
    let mut incoming = match Cell::incoming(&n.rt, module.clone(), opts) {
        Ok(i) => i,
        Err(e) => {
            let _ = prep_tx.send(Err(format!("cannot instantiate the module here: {e}")));
            return;
        }
    };
    let _ = prep_tx.send(Ok(()));
    let mut decoder = Decoder::with_store(n.store.clone(), true);
    let mut written = Vec::new();
    let mut kinds: Option<Vec<u8>> = None;
    let fin: Box<Final> = loop {
        let Some(m) = rx.blocking_recv() else {
            tracing::debug!("source went away before the final state; dropping the instance");
            return;
        };
        let step = match m {
            Msg::Grow { bytes } => incoming.grow_to(bytes).map_err(|e| e.to_string()),
            Msg::Pages { batch } => {
                let mut t = IncomingTarget::new(
                    incoming.memory_mut(),
                    module.initial_image(),
                    &mut written,
                );
                decoder
                    .apply(&batch, &mut t)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            Msg::PageKinds { kinds: k } => {
                kinds = Some(k);
                Ok(())
            }
            Msg::Final(f) => break f,
            _ => Ok(()),
        };
        if let Err(e) = step {
            let _ = run_tx.send(Err(e));
            return;
        }
    };
    let started = start(&n, incoming, &offer, *fin, kinds, &inbound, post);
    let (cell, handle, lazy) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = run_tx.send(Err(e));
            return;
        }
    };
    let id = offer.cell.id.clone();
    if run_tx.send(Ok(lazy)).is_err() {
        tracing::warn!(cell = %id, "the connection closed as the cell started; it runs here");
    }
    on_end(&n, &id)(cell::run(cell, &handle));
}

type StartedCell = (Cell, Arc<cell::CellHandle>, Option<LazyMemory>);

fn start(
    n: &Arc<NodeInner>,
    mut incoming: roam_runtime::Incoming,
    offer: &Offer,
    fin: Final,
    kinds: Option<Vec<u8>>,
    inbound: &Inbound,
    post: Option<Arc<PostCopyPages>>,
) -> Result<StartedCell, String> {
    let mut snapshot = Snapshot::decode(&fin.snapshot).map_err(|e| format!("final state: {e}"))?;
    if snapshot.memory.byte_len() != fin.memory_bytes || snapshot.memory.stored_pages() != 0 {
        return Err("final state: its memory record does not match the streamed memory".into());
    }
    // The pages arrived on their own; the snapshot's image is a placeholder.
    snapshot.memory = roam_snapshot::MemoryImage::empty();
    incoming
        .grow_to(fin.memory_bytes)
        .map_err(|e| e.to_string())?;
    let preopens = make_preopens(n, &offer.cell.id, &offer.cell.dirs).map_err(|e| e.to_string())?;
    let (mut cell, lazy) = match (post, kinds) {
        (Some(post), Some(kinds)) => {
            let kinds = kinds
                .iter()
                .map(|k| match k {
                    0 => Ok(PageKind::Zero),
                    1 => Ok(PageKind::Initial),
                    2 => Ok(PageKind::Data),
                    k => Err(format!("page kind {k} is not 0, 1 or 2")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let (cell, lazy) = incoming
                .finish_lazy(&snapshot, preopens, kinds, Box::new(post.source()))
                .map_err(|e| e.to_string())?;
            (cell, Some(lazy))
        }
        (Some(_), None) => return Err("post-copy without page kinds".into()),
        (None, _) => (
            incoming
                .finish(&snapshot, preopens)
                .map_err(|e| e.to_string())?,
            None,
        ),
    };
    // The commit point: from here on the cell is this node's.
    if !inbound.try_start() {
        return Err("the source gave up on this migration before the cell started".into());
    }
    let mut spec = offer.cell.clone();
    spec.hops += 1;
    let handle = register(n, spec, Arc::new(CellLog::with_history(fin.log)), &mut cell);
    Ok((cell, handle, lazy))
}

/// `POST /v1/migrations/{id}/resolve`: a source whose connection broke asks
/// whether the cell started here. An unstarted migration is aborted for good.
pub(crate) async fn resolve(
    State(n): State<Arc<NodeInner>>,
    Path(id): Path<String>,
) -> Result<Json<Resolution>, AppError> {
    let inbound = n
        .inbound
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
        .cloned();
    Ok(Json(inbound.map_or(Resolution::Aborted, |i| i.abort())))
}
