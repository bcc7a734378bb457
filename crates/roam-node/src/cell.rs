//! Cells on a node: one OS thread each, and the handshake with migrations.
//!
//! A cell that must stop (`roam kill`, the fence, the planner's `stop`) is
//! paused if it can be within [`roam_runtime::STOP_GRACE`] and killed
//! otherwise ([`CellHandle::pause_or_kill`]), so every stop ends within a
//! second even for a program that never reaches a migration point; such a
//! cell is reported [`CellState::Killed`].
//!
//! A cell's thread owns its wasmtime store and runs it until the program
//! exits or pauses. A threaded program ([`Program::Threads`]) has more OS
//! threads, but this one is its first and stands for all of them here.
//! A pause is always asked for by someone on the node (a migration,
//! `kill`); the thread hands the paused state to whoever asked and waits
//! for a [`Decision`]. *Resume* is the default: if the asker goes
//! away without deciding, the program continues. That is what makes a failed
//! migration harmless to the cell.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use roam_runtime::{
    AfterPause, Cell, CheckpointKind, CheckpointTiming, Controller, LiveMemory, LoadedModule,
    Outcome, RunError, Taken, ThreadedCell, Trigger,
};
use roam_snapshot::{MemoryImage, Snapshot};
use roam_wire::CellSpec;
use tokio::sync::oneshot;

use crate::log::CellLog;
use crate::types::CellState;

/// A paused cell, handed to whoever asked for the pause.
pub(crate) struct Paused {
    /// Everything but memory (memory stays live in the cell).
    pub snapshot: Box<Snapshot>,
    /// When the migration point was reached.
    pub at: Instant,
    /// The decision goes back here. Dropping it resumes the cell.
    pub reply: std::sync::mpsc::Sender<Decision>,
}

/// What a paused cell does next.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Continue here.
    Resume,
    /// End the thread; the cell now lives elsewhere (or was killed).
    Release,
}

/// A checkpoint-and-continue: the snapshot, and the cell's log as it was
/// at that instant (its output before the checkpoint).
pub(crate) struct Checkpoint {
    pub snapshot: Box<Snapshot>,
    pub log: Vec<u8>,
    pub log_dropped: u64,
}

/// Where a requested checkpoint-and-continue goes.
type CheckpointReply = oneshot::Sender<Result<Checkpoint, String>>;

/// What the rest of the node holds of a running cell.
pub(crate) struct CellHandle {
    /// The cell's thread has returned: nothing will ever pause again.
    ended: std::sync::atomic::AtomicBool,
    pub controller: Controller,
    pub memory: LiveMemory,
    pub module: Arc<roam_runtime::LoadedModule>,
    /// The cell's sockets (listeners and connections), shared with the
    /// gateway link: `None` for a cell without listeners.
    pub net: Option<Arc<roam_wasi::net::NetHub>>,
    /// The cell's output.
    log: Arc<CellLog>,
    /// The cell's id and CPU settings, which its thread applies to itself.
    id: String,
    cpu_limits: roam_wire::CpuLimits,
    cpu_ctl: Arc<crate::cpu::Cpu>,
    /// The CPU limits the cell's thread got, once it runs.
    pub cpu: OnceLock<roam_api::types::CellCpu>,
    /// The cell's thread, once it runs: where its CPU time is read.
    tid: OnceLock<i32>,
    /// The CPU time its thread had used when the program started here
    /// (a migration's assembly), and when the thread returned.
    start_cpu: OnceLock<std::time::Duration>,
    final_cpu: OnceLock<std::time::Duration>,
    /// Far memory, for a cell launched with it: the pages' counters and
    /// the memory server's name.
    pub far: OnceLock<(roam_runtime::FarMemory, String)>,
    /// The cell failed because pages of its memory were lost (its memory
    /// server died): a kept checkpoint can bring it back.
    pub memory_lost: std::sync::atomic::AtomicBool,
    waiter: Mutex<Option<oneshot::Sender<Paused>>>,
    checkpoint: Mutex<Option<CheckpointReply>>,
}

impl CellHandle {
    /// Whether the cell's thread has returned (the program exited, trapped
    /// or was stopped): it will never pause again.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// CPU time the program has used on this node, and all it used once
    /// the thread returned (the program ended, or the cell moved on):
    /// `None` before it runs. Counted from the program's start here, so a
    /// migration's assembly on the same thread is left out: what the
    /// planner learns a program's speed from is its own work. Read from
    /// the kernel's scheduler statistics of the thread, which cost nothing
    /// to keep.
    pub(crate) fn cpu_time(&self) -> Option<std::time::Duration> {
        let start = *self.start_cpu.get()?;
        if let Some(t) = self.final_cpu.get() {
            return Some(t.saturating_sub(start));
        }
        let end = || self.final_cpu.get().map(|t| t.saturating_sub(start));
        if self.has_ended() {
            return end();
        }
        // The thread may return between the two reads: its final figure.
        thread_cpu(*self.tid.get()?)
            .map(|t| t.saturating_sub(start))
            .or_else(end)
    }

    /// Ask the cell to pause at its next migration point; the returned
    /// receiver gets the paused state.
    pub(crate) fn pause(&self) -> oneshot::Receiver<Paused> {
        let (tx, rx) = oneshot::channel();
        *self.waiter.lock().unwrap_or_else(PoisonError::into_inner) = Some(tx);
        if self.has_ended() {
            // The program already ended: the asker learns it at once.
            self.waiter
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
        } else {
            self.controller.request(CheckpointKind::Pause, Trigger::Api);
        }
        rx
    }

    /// Kill the program (no checkpoint), then wait up to `limit` for its
    /// thread to end. True when it ended. The program runs no wasm code
    /// after its next loop header, function entry, migration point or
    /// woken blocking call, so only a host call that does not return (a
    /// blocking read of a file, say) makes this wait the whole `limit`.
    pub(crate) async fn kill(&self, limit: Duration) -> bool {
        self.controller.kill();
        let start = Instant::now();
        while !self.has_ended() {
            if start.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Pause the cell for a stop: within [`roam_runtime::STOP_GRACE`] if it
    /// can, else kill it (a cell that reaches no migration point cannot be
    /// paused, but must still stop). `None` when it was killed (or ended
    /// meanwhile): its thread ends, or has ended, on its own.
    pub(crate) async fn pause_or_kill(&self) -> Option<Paused> {
        match tokio::time::timeout(roam_runtime::STOP_GRACE, self.pause()).await {
            Ok(Ok(p)) => Some(p),
            Ok(Err(_)) => None,
            Err(_) => {
                // A pause that completes after this still resumes into the
                // kill: a killed cell never runs again.
                self.kill(KILL_WAIT).await;
                None
            }
        }
    }

    /// Ask for a checkpoint-and-continue; the receiver gets the snapshot.
    pub(crate) fn checkpoint(&self) -> oneshot::Receiver<Result<Checkpoint, String>> {
        let (tx, rx) = oneshot::channel();
        *self
            .checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(tx);
        self.controller
            .request(CheckpointKind::Continue, Trigger::Api);
        rx
    }
}

/// One entry of the node's cell table.
pub(crate) struct CellEntry {
    pub spec: CellSpec,
    pub state: CellState,
    pub log: Arc<CellLog>,
    pub handle: Option<Arc<CellHandle>>,
    /// It failed because pages of its memory were lost (kept from its
    /// handle, which goes when the cell ends).
    pub memory_lost: bool,
    /// CPU time its thread used here, read when it stopped running here
    /// (ended or moved on), kept from its handle likewise.
    pub cpu_used: Option<std::time::Duration>,
}

/// The program a cell runs: one thread, or several over a shared memory.
// One per cell, moved once onto its thread: the size does not matter.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Program {
    One(Cell),
    Threads(ThreadedCell),
}

impl Program {
    fn controller(&self) -> Controller {
        match self {
            Program::One(c) => c.controller(),
            Program::Threads(c) => c.controller(),
        }
    }

    pub(crate) fn live_memory(&self) -> LiveMemory {
        match self {
            Program::One(c) => c.live_memory(),
            Program::Threads(c) => c.live_memory(),
        }
    }

    fn module(&self) -> &Arc<LoadedModule> {
        match self {
            Program::One(c) => c.module(),
            Program::Threads(c) => c.module(),
        }
    }

    fn net(&self) -> Option<Arc<roam_wasi::net::NetHub>> {
        match self {
            Program::One(c) => c.net(),
            Program::Threads(c) => c.net(),
        }
    }

    fn set_output(&mut self, sink: Arc<dyn roam_wasi::OutputSink>) {
        match self {
            Program::One(c) => c.set_output(sink),
            Program::Threads(c) => c.set_output(sink),
        }
    }
}

/// Called by the cell's thread when its state changes for good.
/// `None` when the cell was released (moved or killed): whoever released it
/// has set its state.
pub(crate) type OnEnd = Box<dyn FnOnce(Option<CellState>) + Send>;

/// Route the cell's output to `log` and build the handle the node keeps;
/// the cell's thread will run under `cpu` with the spec's CPU settings.
pub(crate) fn handle_for(
    cell: &mut Program,
    log: Arc<CellLog>,
    cpu: Arc<crate::cpu::Cpu>,
    spec: &CellSpec,
) -> Arc<CellHandle> {
    cell.set_output(log.clone());
    Arc::new(CellHandle {
        log,
        id: spec.id.clone(),
        cpu_limits: spec.cpu,
        cpu_ctl: cpu,
        cpu: OnceLock::new(),
        tid: OnceLock::new(),
        start_cpu: OnceLock::new(),
        final_cpu: OnceLock::new(),
        far: OnceLock::new(),
        memory_lost: std::sync::atomic::AtomicBool::new(false),
        ended: std::sync::atomic::AtomicBool::new(false),
        controller: cell.controller(),
        memory: cell.live_memory(),
        module: cell.module().clone(),
        net: cell.net(),
        waiter: Mutex::new(None),
        checkpoint: Mutex::new(None),
    })
}

/// Start the thread that runs `cell` with `handle` (from [`handle_for`]).
pub(crate) fn spawn(
    id: &str,
    cell: Program,
    handle: Arc<CellHandle>,
    on_end: OnEnd,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("cell-{id}"))
        .stack_size(roam_runtime::RUN_THREAD_STACK)
        .spawn(move || on_end(run(cell, &handle)))?;
    Ok(())
}

/// Run `cell` on the current thread until it ends here. Used by [`spawn`]
/// and by a migration destination, whose assembling thread becomes the
/// cell's thread.
pub(crate) fn run(cell: Program, h: &CellHandle) -> Option<CellState> {
    // The thread leaves its CPU group when this drops, as it returns.
    let placement = h.cpu_ctl.enter(&h.id, h.cpu_limits);
    let _ = h.cpu.set(placement.applied.clone());
    let tid = rustix::thread::gettid().as_raw_pid();
    let _ = h.start_cpu.set(thread_cpu(tid).unwrap_or_default());
    let _ = h.tid.set(tid);
    let end = match cell {
        Program::One(cell) => run_until_end(cell, h),
        Program::Threads(cell) => run_threads(cell, h),
    };
    if let Some(t) = h.tid.get().and_then(|tid| thread_cpu(*tid)) {
        let _ = h.final_cpu.set(t);
    }
    drop(placement);
    h.ended.store(true, std::sync::atomic::Ordering::SeqCst);
    // A pause asked for while the program was ending gets its answer now.
    h.waiter
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    end
}

/// CPU time thread `tid` of this process has used.
fn thread_cpu(tid: i32) -> Option<std::time::Duration> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(std::time::Duration::from_nanos(ns))
}

/// How a run that ended with `e` is recorded: the checkpoint waiting for
/// it learns why, and a loss of far pages is kept for the planner.
fn failed(h: &CellHandle, e: RunError) -> Option<CellState> {
    if let Some(tx) = h
        .checkpoint
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        let _ = tx.send(Err(e.to_string()));
    }
    if matches!(e, RunError::PagesLost(_)) {
        h.memory_lost
            .store(true, std::sync::atomic::Ordering::Release);
    }
    Some(CellState::Failed {
        error: e.to_string(),
    })
}

/// Hand a paused program's state to whoever asked for the pause, and wait
/// for their decision (resume when nobody asked, or they went away).
fn hand_over(h: &CellHandle, snapshot: &Snapshot, timing: CheckpointTiming) -> Decision {
    let waiter = h
        .waiter
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let (reply, decision) = std::sync::mpsc::channel();
    let at = Instant::now()
        .checked_sub(timing.capture)
        .unwrap_or_else(Instant::now);
    let handed = waiter.is_some_and(|w| {
        w.send(Paused {
            snapshot: Box::new(snapshot.clone()),
            at,
            reply,
        })
        .is_ok()
    });
    if handed {
        decision.recv().unwrap_or(Decision::Resume)
    } else {
        Decision::Resume
    }
}

/// A checkpoint-and-continue's reply: the snapshot (its memory taken, not
/// copied) and the log as it was at that instant.
fn checkpoint_reply(h: &CellHandle, s: &mut Snapshot) -> Checkpoint {
    Checkpoint {
        snapshot: Box::new(Snapshot {
            module: s.module.clone(),
            origin: s.origin.clone(),
            memory: std::mem::replace(&mut s.memory, MemoryImage::empty()),
            globals: s.globals.clone(),
            stack: s.stack.clone(),
            os_state: s.os_state.clone(),
            files: s.files.take(),
            threads: s.threads.clone(),
        }),
        // The cell's thread writes its output: the log holds exactly what
        // the program wrote before this point.
        log: h.log.contents(),
        log_dropped: h.log.dropped(),
    }
}

/// [`run_until_end`] for a threaded program: its pauses and checkpoints
/// come while every thread is stopped, and a released pause ends them all.
fn run_threads(cell: ThreadedCell, h: &CellHandle) -> Option<CellState> {
    let mut on_checkpoint = |s: &mut Snapshot, _t: CheckpointTiming| {
        if let Some(tx) = h
            .checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = tx.send(Ok(checkpoint_reply(h, s)));
        }
        Ok(())
    };
    let mut on_pause = |s: &Snapshot, t: CheckpointTiming| match hand_over(h, s, t) {
        Decision::Resume => {
            tracing::debug!("cell resumes");
            AfterPause::Resume
        }
        Decision::Release => AfterPause::Release,
    };
    match cell.run_with(&mut on_checkpoint, &mut on_pause) {
        Ok(Outcome::Exited(code)) => Some(CellState::Exited { code }),
        // Released: it runs elsewhere now, or was killed.
        Ok(Outcome::Paused(..)) => None,
        // Nobody here asks a cell to stop with a checkpoint.
        Ok(Outcome::Stopped(..)) | Err(RunError::Killed) => Some(CellState::Killed),
        Err(e) => failed(h, e),
    }
}

fn run_until_end(mut cell: Cell, h: &CellHandle) -> Option<CellState> {
    loop {
        let mut on_checkpoint = |taken: Taken<'_>, _t: CheckpointTiming| {
            let Some(tx) = h
                .checkpoint
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            else {
                return Ok(());
            };
            let reply = match taken {
                // The memory is taken, not copied: the snapshot's memory is
                // the one copy outside the cell, and the cell keeps no
                // buffer for the next capture.
                Taken::Snapshot(s) => Ok(checkpoint_reply(h, s)),
                Taken::Failed(e) => Err(format!(
                    "the checkpoint failed, and the program runs on: {}",
                    roam_wire::error_chain(e)
                )),
            };
            let _ = tx.send(reply);
            Ok(())
        };
        let (snapshot, timing) = match cell.run_taking(&mut on_checkpoint) {
            Ok(Outcome::Exited(code)) => return Some(CellState::Exited { code }),
            Err(RunError::Killed) => return Some(CellState::Killed),
            Ok(Outcome::Paused(s, t)) | Ok(Outcome::Stopped(s, t)) => (s, t),
            Err(e) => return failed(h, e),
        };
        match hand_over(h, &snapshot, timing) {
            Decision::Release => return None,
            Decision::Resume => {
                if let Err(e) = cell.resume(&snapshot) {
                    return Some(CellState::Failed {
                        error: format!("cannot resume after a pause: {e}"),
                    });
                }
                tracing::debug!("cell resumes");
            }
        }
    }
}

/// How long a pause may take before the asker gives up (a program that
/// computes without reaching a migration point). Only for pauses that may
/// fail (a migration, a checkpoint); a stop kills after
/// [`roam_runtime::STOP_GRACE`] instead.
pub(crate) const PAUSE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a kill waits for the cell's thread to end before it reports the
/// cell killed anyway (it runs no more wasm code either way).
pub(crate) const KILL_WAIT: Duration = Duration::from_millis(400);
