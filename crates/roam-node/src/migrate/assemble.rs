//! The receiving thread of a migration: it builds the arriving cell's
//! instance, writes pages into it as they come, applies the final state
//! and then runs the cell.
//!
//! Why apart from `dest.rs`: that file speaks the protocol on the node's
//! runtime; everything here runs on the one thread that owns the instance
//! (wasmtime stores are not shared across threads).

use std::sync::Arc;
use std::time::{Duration, Instant};

use roam_runtime::{Cell, Incoming, LazyMemory, LoadedModule, ThreadedCell, ThreadedIncoming};
use roam_snapshot::{PageKind, Snapshot};
use roam_transfer::Decoder;
use roam_wire::{Final, Msg, Offer};
use tokio::sync::{mpsc, oneshot};

use super::dest::{learn_inline, StartMarks, Started};
use super::pages::{IncomingTarget, PostCopyPages};
use crate::cell::{self, Program};
use crate::cells::{make_preopens, on_end, register};
use crate::log::CellLog;
use crate::state::{Inbound, NodeInner};

/// How the arriving cell runs: its migration, and how its memory is
/// paged (post-copy or far memory), if it is.
pub(super) struct Run {
    pub inbound: Arc<Inbound>,
    pub post: Option<Arc<PostCopyPages>>,
    pub far: Option<crate::cells::FarPlan>,
}

/// The memory of an arriving program, one thread's or several's.
// One per cell, moved once onto its thread: the size does not matter.
#[allow(clippy::large_enum_variant)]
enum Arriving {
    One(Incoming),
    Threads(ThreadedIncoming),
}

impl Arriving {
    fn grow_to(&mut self, bytes: u64) -> Result<(), roam_runtime::RestoreError> {
        match self {
            Arriving::One(i) => i.grow_to(bytes),
            Arriving::Threads(i) => i.grow_to(bytes),
        }
    }

    fn memory_mut(&mut self) -> &mut [u8] {
        match self {
            Arriving::One(i) => i.memory_mut(),
            Arriving::Threads(i) => i.memory_mut(),
        }
    }
}

/// Build what receives the pages: a threaded program's shared memory, or
/// an instance (with its far memory attached, for a far cell).
fn build(
    n: &NodeInner,
    module: &Arc<LoadedModule>,
    offer: &Offer,
    far: Option<crate::cells::FarPlan>,
    post_copy: bool,
) -> Result<(Arriving, Option<(roam_runtime::FarMemory, String)>), String> {
    let opts = crate::cells::options(n, &offer.cell.dirs, offer.cell.max_memory);
    if roam_runtime::is_threaded(module) {
        // Both page a memory that roam maps; a shared memory is wasmtime's.
        if far.is_some() || post_copy {
            return Err(
                "a threaded program moves by stop-and-copy or pre-copy, without far memory".into(),
            );
        }
        return ThreadedCell::incoming(&n.rt, module.clone(), opts)
            .map(|i| (Arriving::Threads(i), None))
            .map_err(|e| format!("cannot make the program's shared memory here: {e}"));
    }
    let mut i = Cell::incoming(&n.rt, module.clone(), opts)
        .map_err(|e| format!("cannot instantiate the module here: {e}"))?;
    match far {
        Some(plan) => i
            .attach_far(plan.opts, plan.store)
            .map(|far| (Arriving::One(i), Some((far, plan.server))))
            .map_err(|e| format!("far memory: {e}")),
        None => Ok((Arriving::One(i), None)),
    }
}

/// The receiving thread: build the instance, apply pages, finish, run.
pub(super) fn assemble(
    n: Arc<NodeInner>,
    module: Arc<LoadedModule>,
    offer: Offer,
    mut rx: mpsc::Receiver<Msg>,
    prep_tx: oneshot::Sender<Result<(), String>>,
    run_tx: oneshot::Sender<Started>,
    run: Run,
) {
    let Run { inbound, post, far } = run;
    let built = build(&n, &module, &offer, far, post.is_some());
    let (mut incoming, far) = match built {
        Ok(x) => x,
        Err(e) => {
            let _ = prep_tx.send(Err(e));
            return;
        }
    };
    let _ = prep_tx.send(Ok(()));
    // Pages that arrive are remembered in the chunk store for later
    // migrations here, but hashing them on this thread delays the final
    // round: that is done after the start, in the background (post-copy
    // keeps learning as pages arrive: its memory faults when read).
    let learn_after = post.is_none() && !learn_inline();
    let mut decoder = Decoder::with_store(n.store.clone(), !learn_after);
    let mut written = Vec::new();
    let mut kinds: Option<Vec<roam_wire::PageKind>> = None;
    let mut files = match super::files::receiver(&n, &offer) {
        Ok(f) => f,
        Err(e) => {
            let _ = run_tx.send(Err(e));
            return;
        }
    };
    let log = CellLog::new(n.log_capacity());
    let mut last_apply = Duration::ZERO;
    let fin: Box<Final> = loop {
        let Some(m) = rx.blocking_recv() else {
            tracing::debug!("source went away before the final state; dropping the instance");
            return;
        };
        let step = match m {
            Msg::Grow { bytes } => incoming.grow_to(bytes).map_err(|e| e.to_string()),
            // Post-copy: the pages the rewind touches, kept for the fault
            // handler (this memory is dropped and refilled lazily).
            Msg::Pages { batch } if post.is_some() => post
                .as_ref()
                .map_or(Ok(()), |p| p.receive_early(&mut decoder, &batch)),
            Msg::Pages { batch } => {
                let began = Instant::now();
                let mut t = IncomingTarget::new(
                    incoming.memory_mut(),
                    module.initial_image(),
                    &mut written,
                );
                let r = decoder
                    .apply(&batch, &mut t)
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                last_apply += began.elapsed();
                r
            }
            Msg::RoundDone { .. } => {
                last_apply = Duration::ZERO;
                Ok(())
            }
            Msg::PageKinds { kinds: k } => {
                kinds = Some(k);
                Ok(())
            }
            Msg::LogChunk { dropped, bytes } => {
                log.receive(&bytes, dropped);
                Ok(())
            }
            m @ (Msg::FileEntry(_) | Msg::FileData { .. } | Msg::FileRemoved { .. }) => {
                files.apply(m)
            }
            Msg::Final(f) => break f,
            _ => Ok(()),
        };
        if let Err(e) = step {
            let _ = run_tx.send(Err(e));
            return;
        }
    };
    let picked = Instant::now();
    let started = files
        .check_complete()
        .and_then(|()| start(&n, incoming, &offer, *fin, kinds, log, &inbound, post));
    let (cell, handle, lazy, mut marks) = match started {
        Ok(x) => x,
        Err(e) => {
            let _ = run_tx.send(Err(e));
            return;
        }
    };
    let id = offer.cell.id.clone();
    if let Some(far) = far {
        let _ = handle.far.set(far);
    }
    marks.picked = picked;
    marks.last_apply = last_apply;
    if learn_after {
        let (store, mem) = (n.store.clone(), handle.memory.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("learn-{id}"))
            .spawn(move || {
                let new = super::remember(&store, &mem);
                tracing::debug!(chunks = new, "kept the arrived cell's pages for dedup");
            });
        if let Err(e) = spawned {
            tracing::warn!(cell = %id, "cannot keep the arrived pages for dedup: {e}");
        }
    }
    if run_tx.send(Ok((lazy, marks))).is_err() {
        tracing::warn!(cell = %id, "the connection closed as the cell started; it runs here");
    }
    on_end(&n, &id)(cell::run(cell, &handle));
}

type StartedCell = (
    Program,
    Arc<cell::CellHandle>,
    Option<LazyMemory>,
    StartMarks,
);

#[allow(clippy::too_many_arguments)]
fn start(
    n: &Arc<NodeInner>,
    mut incoming: Arriving,
    offer: &Offer,
    fin: Final,
    kinds: Option<Vec<roam_wire::PageKind>>,
    log: CellLog,
    inbound: &Inbound,
    post: Option<Arc<PostCopyPages>>,
) -> Result<StartedCell, String> {
    let picked = Instant::now();
    // A final state carries no pages (they came on their own): one that
    // declares some is refused before any is decompressed.
    let mut snapshot =
        Snapshot::decode_state(&fin.snapshot).map_err(|e| format!("final state: {e}"))?;
    if snapshot.memory.byte_len() != fin.memory_bytes || snapshot.memory.stored_pages() != 0 {
        return Err("final state: its memory record does not match the streamed memory".into());
    }
    // The pages arrived on their own; the snapshot's image is a placeholder.
    snapshot.memory = roam_snapshot::MemoryImage::empty();
    let decoded = Instant::now();
    incoming
        .grow_to(fin.memory_bytes)
        .map_err(|e| e.to_string())?;
    let preopens = make_preopens(n, &offer.cell.id, &offer.cell.dirs).map_err(|e| e.to_string())?;
    let (mut cell, lazy) = match (incoming, post, kinds) {
        (Arriving::Threads(incoming), _, _) => (
            Program::Threads({
                tracing::info!(
                    cell = %offer.cell.id,
                    threads = 1 + snapshot.threads.len(),
                    "threaded cell arrives"
                );
                incoming
                    .finish(&snapshot, preopens)
                    .map_err(|e| e.to_string())?
            }),
            None,
        ),
        (Arriving::One(incoming), Some(post), Some(kinds)) => {
            let kinds = kinds
                .iter()
                .map(|k| match k {
                    roam_wire::PageKind::Zero => PageKind::Zero,
                    roam_wire::PageKind::Initial => PageKind::Initial,
                    roam_wire::PageKind::Data => PageKind::Data,
                })
                .collect();
            let (cell, lazy) = incoming
                .finish_lazy(&snapshot, preopens, kinds, Box::new(post.source()))
                .map_err(|e| e.to_string())?;
            (Program::One(cell), Some(lazy))
        }
        (Arriving::One(_), Some(_), None) => return Err("post-copy without page kinds".into()),
        (Arriving::One(incoming), None, _) => (
            Program::One(
                incoming
                    .finish(&snapshot, preopens)
                    .map_err(|e| e.to_string())?,
            ),
            None,
        ),
    };
    let installed = Instant::now();
    // The commit point: from here on the cell is this node's.
    if !inbound.try_start() {
        return Err("the source gave up on this migration before the cell started".into());
    }
    let mut spec = offer.cell.clone();
    // A planner's cell starts here only once this node owns it: the
    // transaction names the source and the generation it was given.
    if let (Some(_), Some(generation)) = (&n.planner, spec.generation) {
        match crate::cluster::planner::take(n, &spec.id, inbound.source(), generation) {
            Ok(g) => spec.generation = Some(g),
            Err(e) => {
                inbound.unstart();
                tracing::warn!(cell = %spec.id, error = %e, "ownership refused; the cell does not start here");
                return Err(e);
            }
        }
    }
    spec.hops += 1;
    let handle = register(n, spec, Arc::new(log), &mut cell);
    let marks = StartMarks {
        last_apply: Duration::ZERO,
        picked,
        decoded,
        installed,
        registered: Instant::now(),
    };
    Ok((cell, handle, lazy, marks))
}
