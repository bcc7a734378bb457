//! Where the threads of one program meet for a checkpoint and a restore.
//!
//! A stop must see one memory that no thread is writing, and every thread
//! at a site its records can describe. So each thread that finds a stop
//! pending parks here (at a migration point, in a wait, or in a blocking
//! WASI call), and the last to arrive reads the memory and the OS layer
//! once. Threads blocked elsewhere cannot exist: every wait and blocking
//! call is a site, and every loop has a point.
//!
//! Then the threads unwind one at a time. An unwind borrows program memory
//! from address 0 for its records (as a single thread's does, see
//! `crate::asyncify`), and only one thread may hold that buffer; the memory
//! image was read before any of them wrote there. A restore rewinds them
//! one at a time through the same buffer, and nobody runs program code
//! until every thread is back at its site and the borrowed bytes are put
//! back: the gate opens for all of them together.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use roam_snapshot::{GlobalValue, Snapshot, ThreadImage, UnwoundStack};

use super::Shared;
use crate::control::{CheckpointKind, CheckpointTiming, Killed};
use crate::error::CheckpointError;

/// How often a parked thread looks whether the program was ended.
const LOOK: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// A stop is pending; some threads are parked.
    Parking,
    /// Everyone is parked and memory is read; threads unwind by turns.
    Unwinding,
    /// Every stack is in; the snapshot is ready.
    Stopped,
    /// A restore: threads rewind by turns.
    Rewinding,
}

struct State {
    phase: Phase,
    /// Threads running program code or parked (the first included).
    live: usize,
    /// Each live thread's start argument (the first has none).
    args: BTreeMap<u32, u32>,
    /// Parked threads and their globals, read before they unwind.
    parked: BTreeMap<u32, Vec<GlobalValue>>,
    /// Stacks of the threads that have unwound.
    stacks: BTreeMap<u32, Vec<u8>>,
    /// The thread that borrows the buffer at address 0 now, if any: one at
    /// a time.
    busy: Option<u32>,
    /// Bumped each time the gate lets every rewound thread go: a thread
    /// waits for it to change, not for a phase another thread may already
    /// have left again.
    opened: u64,
    /// Memory and OS layer, read when the last thread parked.
    taken: Option<Result<Snapshot, CheckpointError>>,
    /// The finished snapshot (or why there is none).
    done: Option<Result<Snapshot, CheckpointError>>,
    /// Rewinding: how many threads must reach their site, how many did.
    to_rewind: usize,
    rewound: usize,
    /// The bytes the rewinds borrow, as the snapshot had them.
    prefix: Vec<u8>,
    /// When the stop was asked for, when the last thread parked, when the
    /// snapshot was complete.
    asked: Option<Instant>,
    all_parked: Option<Instant>,
    complete: Option<Instant>,
    /// The kind of checkpoint under way, and how many threads it holds.
    kind: CheckpointKind,
    held: usize,
    /// How far from address 0 an unwind may write its records: all of
    /// memory, or for a pause [`crate::PAUSE_BUFFER_MAX`] (only that much
    /// is copied aside, since the memory stays live).
    limit: usize,
    /// A pause's copy of the bytes the unwinds borrow, put back once all
    /// have unwound (a migration reads the live memory meanwhile).
    saved: Vec<u8>,
}

pub(crate) struct Gate {
    state: Mutex<State>,
    cv: Condvar,
}

impl Gate {
    pub(crate) fn new() -> Gate {
        Gate {
            state: Mutex::new(State {
                phase: Phase::Running,
                live: 1,
                args: BTreeMap::new(),
                parked: BTreeMap::new(),
                stacks: BTreeMap::new(),
                busy: None,
                opened: 0,
                taken: None,
                done: None,
                to_rewind: 0,
                rewound: 0,
                prefix: Vec::new(),
                asked: None,
                all_parked: None,
                complete: None,
                kind: CheckpointKind::Stop,
                held: 0,
                limit: 0,
                saved: Vec::new(),
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A thread is about to start with `arg`, unless the program already
    /// has `max` threads besides its first (checked and counted at once).
    pub(crate) fn spawned(&self, tid: u32, arg: u32, max: usize) -> bool {
        let mut s = self.lock();
        if s.live > max {
            return false;
        }
        s.live += 1;
        s.args.insert(tid, arg);
        true
    }

    /// Whether `tid` was given the buffer for its unwind (so that the
    /// records it left there are its own, written while the others were
    /// parked).
    pub(crate) fn holds_buffer(&self, tid: u32) -> bool {
        let s = self.lock();
        s.phase == Phase::Unwinding && s.busy == Some(tid)
    }

    /// A thread ended (returned, trapped or was killed). If the others are
    /// all parked for a stop, its end completes the rendezvous.
    pub(crate) fn ended(&self, shared: &Shared, tid: u32) {
        let mut s = self.lock();
        s.live = s.live.saturating_sub(1);
        s.args.remove(&tid);
        s.parked.remove(&tid);
        Self::all_parked(&mut s, shared);
        self.cv.notify_all();
    }

    /// Wait, holding `s`, until `ready` or the program is ended.
    fn wait_for<'a>(
        &'a self,
        mut s: MutexGuard<'a, State>,
        shared: &Shared,
        ready: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>, Killed> {
        while !ready(&s) {
            // A kill never spoils a capture under way: once every thread
            // is parked and the memory read, the unwinds finish.
            if shared.control.killed() && s.phase != Phase::Unwinding {
                return Err(Killed);
            }
            s = self
                .cv
                .wait_timeout(s, LOOK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(s)
    }

    /// Park thread `tid` for a stop, with its globals. Returns when it may
    /// unwind (everyone is parked, memory is read, and the buffer is its),
    /// with the end its records must stay below.
    pub(crate) fn park(
        &self,
        shared: &Shared,
        tid: u32,
        globals: Vec<GlobalValue>,
        asked: Instant,
        kind: CheckpointKind,
    ) -> Result<usize, Killed> {
        let mut s = self.lock();
        if s.phase == Phase::Running {
            s.phase = Phase::Parking;
            s.asked = Some(asked);
            s.kind = kind;
        }
        s.parked.insert(tid, globals);
        Self::all_parked(&mut s, shared);
        self.cv.notify_all();
        let mut s = self.wait_for(s, shared, |s| {
            s.phase == Phase::Unwinding && s.busy.is_none()
        })?;
        s.busy = Some(tid);
        Ok(s.limit)
    }

    /// When every live thread is parked: read memory and the OS layer (a
    /// pause reads only the bytes the unwinds will borrow).
    fn all_parked(s: &mut State, shared: &Shared) {
        if s.phase == Phase::Parking && s.parked.len() == s.live {
            s.all_parked = Some(Instant::now());
            let pause = s.kind == CheckpointKind::Pause;
            let len = shared.memory.data_size();
            s.limit = if pause {
                len.min(crate::PAUSE_BUFFER_MAX)
            } else {
                len
            };
            if pause {
                // SAFETY: every thread is parked.
                s.saved = unsafe { shared.bytes() }[..s.limit].to_vec();
            }
            s.taken = Some(shared.read_state(!pause));
            s.phase = Phase::Unwinding;
        }
    }

    /// Thread `tid` unwound to its entry: these are its records. The last
    /// one finishes the snapshot (and, for a pause, puts back the bytes
    /// the unwinds borrowed, so that the live memory is the program's).
    pub(crate) fn unwound(&self, shared: &Shared, tid: u32, records: Vec<u8>) {
        let mut s = self.lock();
        s.stacks.insert(tid, records);
        s.busy = None;
        if s.stacks.len() == s.parked.len() {
            if s.kind == CheckpointKind::Pause {
                shared.write_memory(0, &s.saved);
            }
            let capacity = s.limit.min(u32::MAX as usize) as u32;
            let done = Self::assemble(&mut s, capacity);
            s.done = Some(done);
            s.complete = Some(Instant::now());
            s.phase = Phase::Stopped;
        }
        self.cv.notify_all();
    }

    fn assemble(s: &mut State, capacity: u32) -> Result<Snapshot, CheckpointError> {
        let mut snap = s
            .taken
            .take()
            .unwrap_or_else(|| Err(CheckpointError::Stack("memory was never read".into())))?;
        let stack = |data: Vec<u8>| UnwoundStack {
            buffer_offset: 0,
            capacity,
            data,
        };
        s.held = s.parked.len();
        let mut parked = std::mem::take(&mut s.parked);
        let mut stacks = std::mem::take(&mut s.stacks);
        snap.globals = parked.remove(&0).unwrap_or_default();
        snap.stack = stack(stacks.remove(&0).unwrap_or_default());
        for (tid, globals) in parked {
            let Some(&start_arg) = s.args.get(&tid) else {
                return Err(CheckpointError::Stack(format!(
                    "thread {tid} has no start argument"
                )));
            };
            snap.threads.push(ThreadImage {
                tid,
                start_arg,
                globals,
                stack: stack(stacks.remove(&tid).unwrap_or_default()),
            });
        }
        Ok(snap)
    }

    /// The first thread, after its own unwind: wait for the snapshot, and
    /// how long the threads took to park and the capture took. A pause's
    /// snapshot has no memory (it is live), and comes with the bytes the
    /// rewinds borrow; the other kinds' come with none (the snapshot's
    /// image holds them).
    pub(crate) fn snapshot(
        &self,
        shared: &Shared,
    ) -> Result<(Snapshot, CheckpointTiming, CheckpointKind, Vec<u8>), CheckpointError> {
        let s = self.lock();
        let mut s = self
            .wait_for(s, shared, |s| s.phase == Phase::Stopped)
            .map_err(|_| {
                CheckpointError::Stack("the program ended during the checkpoint".into())
            })?;
        let snap = s
            .done
            .take()
            .unwrap_or_else(|| Err(CheckpointError::Stack("no snapshot".into())))?;
        let span = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let timing = CheckpointTiming {
            response: span(s.asked, s.all_parked),
            capture: span(s.all_parked, s.complete),
        };
        let saved = std::mem::take(&mut s.saved);
        Ok((snap, timing, s.kind, saved))
    }

    /// Another thread, after its unwind: whether the program goes on (a
    /// checkpoint-and-continue once the first thread has handed the
    /// snapshot over, a pause that was resumed) or not (a stop, a pause
    /// whose cell was released, or the program was ended).
    pub(crate) fn resumes(&self, shared: &Shared) -> bool {
        let s = self.lock();
        let ready = |s: &State| {
            s.phase == Phase::Rewinding
                || (s.phase == Phase::Stopped && s.kind == CheckpointKind::Stop)
        };
        match self.wait_for(s, shared, ready) {
            Ok(s) => s.phase == Phase::Rewinding,
            Err(_) => false,
        }
    }

    /// After a checkpoint-and-continue was handed over, or a pause
    /// resumed: every thread that it held rewinds (`prefix`: the bytes
    /// their unwinds borrowed).
    pub(crate) fn resume(&self, shared: &Shared, prefix: Vec<u8>) {
        let mut s = self.lock();
        // This request is served; one of another kind that came meanwhile
        // is not.
        if let Some(r) = shared.control.take() {
            if r.kind != s.kind {
                shared.control.request(r);
            }
        }
        s.phase = Phase::Rewinding;
        s.to_rewind = s.held;
        s.rewound = 0;
        s.prefix = prefix;
        s.busy = None;
        s.taken = None;
        s.done = None;
        s.asked = None;
        s.all_parked = None;
        s.complete = None;
        self.cv.notify_all();
    }

    /// A restore of `threads` threads (the first included), whose rewinds
    /// borrow the bytes `prefix` holds.
    pub(crate) fn rewinding(&self, threads: usize, args: BTreeMap<u32, u32>, prefix: Vec<u8>) {
        let mut s = self.lock();
        s.phase = Phase::Rewinding;
        s.live = threads;
        s.args = args;
        s.to_rewind = threads;
        s.rewound = 0;
        s.prefix = prefix;
    }

    /// Wait for the buffer, to rewind thread `tid` through it.
    pub(crate) fn take_turn(&self, shared: &Shared, tid: u32) -> Result<(), Killed> {
        let s = self.lock();
        let mut s = self.wait_for(s, shared, |s| s.busy.is_none())?;
        s.busy = Some(tid);
        Ok(())
    }

    /// A thread is back at its site. The last one puts the borrowed bytes
    /// back and lets everyone run; the others wait for that.
    pub(crate) fn rewound(&self, shared: &Shared) -> Result<(), Killed> {
        let mut s = self.lock();
        s.rewound += 1;
        s.busy = None;
        let opened = s.opened;
        if s.rewound == s.to_rewind {
            shared.write_memory(0, &s.prefix);
            s.prefix = Vec::new();
            s.phase = Phase::Running;
            s.opened += 1;
        }
        self.cv.notify_all();
        let _s = self.wait_for(s, shared, |s| s.opened != opened)?;
        Ok(())
    }
}
