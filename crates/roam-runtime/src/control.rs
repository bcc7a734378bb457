//! Asking a running cell for a checkpoint, from any thread.
//!
//! A request is recorded, then the engine's epoch is bumped: the guest's next
//! epoch check runs the store's deadline callback *on the guest's own thread*,
//! which raises the `roam.flag` global; the next migration point then calls
//! the host and unwinds. Blocking WASI calls are woken through
//! [`roam_wasi::Interrupt`] instead. Nothing writes guest state from a
//! foreign thread.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roam_wasi::Interrupt;
use wasmtime::Engine;

/// What happens after the snapshot is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// Rewind and keep running.
    Continue,
    /// Return the snapshot and stop the program.
    Stop,
    /// Stop the program without copying its memory: the snapshot returned
    /// in [`crate::Outcome::Paused`] has an empty memory image, and the
    /// memory stays live in the cell (read it with [`crate::LiveMemory`]).
    /// Only the bytes the unwound stack borrows (at most
    /// [`crate::PAUSE_BUFFER_MAX`] from address 0) are copied aside and put
    /// back. [`crate::Cell::resume`] continues the program. The snapshot
    /// carries no sandbox files either (even with
    /// [`crate::CellOptions::with_files`]): the caller reads them from the
    /// directories while the cell is paused, so a pause stays short.
    Pause,
}

/// Why a checkpoint was taken (recorded in the snapshot's origin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A signal (SIGUSR1, SIGTERM).
    Signal,
    /// `--checkpoint-after`.
    Timer,
    /// A library caller.
    Api,
    /// `--checkpoint-at-point`.
    PointCount,
    /// `--checkpoint-on-block`.
    Blocked,
}

impl Trigger {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Timer => "timer",
            Trigger::Api => "api",
            Trigger::PointCount => "point-count",
            Trigger::Blocked => "blocked",
        }
    }
}

/// A pending request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub kind: CheckpointKind,
    pub trigger: Trigger,
    /// When the request was made.
    pub at: Instant,
}

/// How long a checkpoint took, for benchmarks and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointTiming {
    /// From the request to the migration point (or blocked call) where the
    /// unwind began: the migration response time.
    pub response: Duration,
    /// From the start of the unwind to a complete in-memory snapshot.
    pub capture: Duration,
}

pub(crate) struct Control {
    pending: Mutex<Option<Request>>,
    pub(crate) interrupt: Arc<Interrupt>,
    engine: Engine,
}

impl Control {
    pub(crate) fn new(engine: Engine) -> Arc<Self> {
        Arc::new(Control {
            pending: Mutex::new(None),
            interrupt: Interrupt::new(),
            engine,
        })
    }

    pub(crate) fn request(&self, req: Request) {
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            // A stop or pause outranks a continue that has not been served yet.
            *p = match *p {
                Some(old) if old.kind != CheckpointKind::Continue => Some(old),
                _ => Some(req),
            };
        }
        self.interrupt.request();
        self.engine.increment_epoch();
    }

    pub(crate) fn pending(&self) -> Option<Request> {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take(&self) -> Option<Request> {
        let r = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.interrupt.clear();
        r
    }
}

/// A handle to ask one cell for checkpoints. Cheap to clone; usable from any
/// thread, including signal-handling threads.
#[derive(Clone)]
pub struct Controller(pub(crate) Arc<Control>);

impl Controller {
    /// Ask for a checkpoint. The cell takes it at its next migration point,
    /// or at once if it is blocked in a WASI call.
    pub fn request(&self, kind: CheckpointKind, trigger: Trigger) {
        self.0.request(Request {
            kind,
            trigger,
            at: Instant::now(),
        });
    }

    /// Checkpoint-and-stop the next time the program would block (waiting
    /// for a timer or for input). Useful for idle migration and for tests
    /// that need a checkpoint inside a blocking call.
    pub fn stop_when_blocked(&self, on: bool) {
        self.0.interrupt.set_on_block(on);
    }
}
