//! Asking a running cell for a checkpoint, from any thread.
//!
//! A request is recorded, then the cell's flag word is raised
//! ([`crate::flag`]): the guest's next migration point sees it, calls the
//! host and unwinds. Blocking WASI calls are woken through
//! [`roam_wasi::Interrupt`] instead. The flag word is the only guest-visible
//! state written from a foreign thread, and the guest only reads it.
//!
//!
//! **Killing.** A request is honoured only at a migration point, and a
//! program may never reach one: a module prepared with `--points manual`
//! or `functions` spins in a loop without calls, `outer` leaves inner leaf
//! loops without points, or a hand-made module claims points it does not
//! have. Whoever must end a cell whatever it does (`roam run` on SIGTERM,
//! `roam kill`, a node's fence, the planner taking a cell away) asks for a
//! checkpoint first, waits [`STOP_GRACE`], then calls [`Controller::kill`].
//! A kill raises the flag, wakes blocking calls and, for a module compiled
//! with epoch checks, bumps its engine's epoch. Every such store's epoch
//! deadline is always one tick ahead (`host::arm_stop`), so the bump makes
//! each running cell of that engine call the epoch callback once, at its
//! next loop header or function entry; the killed one traps with
//! [`Killed`], the others carry on. A point or a woken blocking call of a
//! killed cell traps too: that is what ends a `loops` module, which reaches
//! a point within straight-line code and is compiled without epoch checks
//! (see [`crate::EpochInterrupt`]).
//!
//! Why the epoch and not something cheaper: nothing else makes arbitrary
//! running wasm code give up its thread. Fuel costs more; a signal cannot
//! unwind wasmtime frames; revoking memory misses loops that touch none.
//! The epoch check costs a load and a compare per loop iteration, up to 2x
//! on hot numeric loops, which is why only modules that need it get it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roam_wasi::Interrupt;
use wasmtime::Engine;

use crate::flag::FlagWord;

/// How long a stop waits for a checkpoint before it kills the program.
///
/// A program that reaches points answers a request within milliseconds
/// (T3's p99 is well under one), even blocked in a WASI call; half a second
/// leaves room for a loaded machine and for qemu, and still ends any cell
/// within one second of the stop.
pub const STOP_GRACE: Duration = Duration::from_millis(500);

/// The error a killed program traps with; [`crate::Cell::run`] turns it
/// into [`crate::RunError::Killed`].
#[derive(Debug, thiserror::Error)]
#[error("the program was killed")]
pub(crate) struct Killed;

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
    /// The cell's flag words, once its instances exist: one, or one per
    /// thread of a threaded program (each instance has its own).
    flags: Mutex<Vec<FlagWord>>,
    /// The engine, when it runs with epoch interruption: bumped by a kill
    /// (and when lazily received memory is lost).
    epoch: Option<Engine>,
    /// Set for good by [`Control::kill`].
    killed: AtomicBool,
    /// Called at every alarm ([`Control::on_alarm`]).
    wakers: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Control {
    /// `epoch`: the engine to bump on a kill, when it was built with epoch
    /// interruption.
    pub(crate) fn new(epoch: Option<Engine>) -> Arc<Self> {
        Arc::new(Control {
            pending: Mutex::new(None),
            interrupt: Interrupt::new(),
            flags: Mutex::new(Vec::new()),
            epoch,
            killed: AtomicBool::new(false),
            wakers: Mutex::new(Vec::new()),
        })
    }

    /// End the program at its next epoch check, migration point or woken
    /// blocking call, without a checkpoint (see the module docs).
    pub(crate) fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        self.interrupt.request();
        self.alarm();
    }

    /// Whether [`Control::kill`] was called.
    pub(crate) fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Connect the cell's flag word; raises it at once if a request came
    /// before the instance existed.
    pub(crate) fn attach_flag(&self, flag: FlagWord) {
        let mut flags = self.flags.lock().unwrap_or_else(|e| e.into_inner());
        if self.pending().is_some() || self.killed() {
            flag.set(true);
        }
        flags.push(flag);
    }

    /// Forget the flag word of an instance that is gone (a thread ended).
    pub(crate) fn detach_flag(&self, flag: &FlagWord) {
        let mut flags = self.flags.lock().unwrap_or_else(|e| e.into_inner());
        flags.retain(|f| !f.same(flag));
    }

    /// Raise or clear every flag word (nothing before one is attached).
    pub(crate) fn set_flag(&self, up: bool) {
        for f in self.flags.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            f.set(up);
        }
    }

    /// Make the guest call the host at its next migration point and, with
    /// epoch interruption, at its next epoch check: for a request, a kill,
    /// or when its lazily received memory is lost.
    pub(crate) fn alarm(&self) {
        self.set_flag(true);
        if let Some(engine) = &self.epoch {
            engine.increment_epoch();
        }
        for wake in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            wake();
        }
    }

    /// Call `wake` at every alarm, after the flags are up: a threaded
    /// program wakes its threads parked in waits with it.
    pub(crate) fn on_alarm(&self, wake: Box<dyn Fn() + Send + Sync>) {
        self.wakers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(wake);
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
        self.alarm();
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

    /// End the program without a checkpoint: at its next loop header or
    /// function entry (epoch interruption), migration point, or woken
    /// blocking call, whichever comes first. [`crate::Cell::run`] then
    /// returns [`crate::RunError::Killed`]. A checkpoint already under way
    /// is finished, not killed. Callers normally ask for a checkpoint first
    /// and kill only after [`STOP_GRACE`]. Irreversible.
    pub fn kill(&self) {
        self.0.kill();
    }

    /// Whether [`Controller::kill`] was called.
    pub fn is_killed(&self) -> bool {
        self.0.killed()
    }

    /// How many of the program's threads have an instance now: 1 for a
    /// running single-threaded cell, one per live thread of a threaded
    /// one, 0 before the first instance exists.
    pub fn threads(&self) -> usize {
        self.0.flags.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
