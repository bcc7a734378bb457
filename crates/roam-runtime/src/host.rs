//! The store's host state, and the host side of a migration point.
//!
//! Both ways into an unwind meet here: the `roam.migration_point` import that
//! `roam prepare` calls when the flag is raised, and the OS layer's
//! [`WasiView::suspend`] when a blocking call is interrupted. Both ways out of
//! a rewind meet here too: the re-entered import finishes the rewind before
//! doing anything else.
//!
//! The state is read *before* the stack unwinds, at the migration point
//! itself, so that the unwind may borrow program memory for its buffer (see
//! [`crate::asyncify`]) and the bytes it overwrites can be put back.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use roam_wasi::{WasiCtx, WasiView};
use wasmtime::{Caller, Global, Linker, Memory, UpdateDeadline};

use crate::asyncify::{Buffer, NORMAL, REWINDING};
use crate::capture::{self, Captured};
use crate::control::{CheckpointKind, Control, Killed, Request, Trigger};
use crate::module::LoadedModule;
use crate::unwind::Unwinder;

/// Most bytes from address 0 that the unwound stack may borrow during a
/// [`CheckpointKind::Pause`] (all of memory if smaller). These bytes, and
/// only these, are copied aside before the unwind, which keeps a pause well
/// under a millisecond whatever the memory size. 1 MiB of unwound stack is
/// far more than the workloads need (their stacks unwind to a few KiB); a
/// deeper stack makes the unwind trap and loses the program, as a stack
/// deeper than memory does for the other kinds.
pub const PAUSE_BUFFER_MAX: usize = 1 << 20;

/// Handles into one instance, set once it exists.
#[derive(Clone)]
pub(crate) struct Hooks {
    pub unwinder: Unwinder,
    pub memory: Memory,
    pub globals: Arc<[(String, Global)]>,
    pub module: Arc<LoadedModule>,
    pub embed_module: bool,
    pub with_files: bool,
    pub files_limits: crate::files::FileTreeLimits,
}

/// An unwind in progress, with the state read at the migration point.
pub(crate) struct Unwinding {
    pub req: Request,
    /// When the migration point was reached.
    pub point_at: Instant,
    pub buffer: Buffer,
    pub captured: Captured,
}

/// Data of a cell's store.
pub(crate) struct HostState {
    pub wasi: WasiCtx,
    pub control: Arc<Control>,
    pub hooks: Option<Hooks>,
    /// A rewind in progress: its buffer and the program bytes it overwrote.
    pub rewinding: Option<(Buffer, Vec<u8>)>,
    pub unwinding: Option<Unwinding>,
    /// From the start of an unwind until `Cell::run` calls `_start` again:
    /// a kill then waits, so that it never spoils a checkpoint under way.
    pub checkpointing: bool,
    /// `--checkpoint-at-point N`: stop at the Nth migration point reached.
    pub stop_at_point: Option<u64>,
    /// Checkpoint-and-continue at every Nth migration point.
    pub continue_every: Option<u64>,
    /// Migration points reached while counting.
    pub points_seen: u64,
    /// The previous snapshot's page buffer, reused to avoid page faults.
    pub spare: Vec<u8>,
    /// The previous pause's prefix buffer, reused likewise.
    pub pause_spare: Vec<u8>,
    /// Set when lazily fetched memory pages are lost: the guest must stop.
    pub lost: Arc<OnceLock<String>>,
    /// The cell's resource limits, consulted by wasmtime on every growth.
    pub limiter: crate::limits::Limiter,
    /// A checkpoint was postponed for want of linear memory, and the log
    /// said so (once per cell).
    pub told_no_memory: bool,
}

impl HostState {
    pub(crate) fn new(
        wasi: WasiCtx,
        control: Arc<Control>,
        stop_at_point: Option<u64>,
        continue_every: Option<u64>,
        limits: crate::limits::CellLimits,
    ) -> Self {
        HostState {
            wasi,
            control,
            hooks: None,
            rewinding: None,
            unwinding: None,
            checkpointing: false,
            stop_at_point,
            continue_every,
            points_seen: 0,
            spare: Vec::new(),
            pause_spare: Vec::new(),
            lost: Arc::new(OnceLock::new()),
            limiter: crate::limits::Limiter::new(limits),
            told_no_memory: false,
        }
    }

    /// Why the memory is unusable, if lazily fetched pages were lost.
    pub(crate) fn pages_lost(&self) -> Option<String> {
        self.lost.get().cloned()
    }

    fn flag_wanted(&self) -> bool {
        self.stop_at_point.is_some()
            || self.continue_every.is_some()
            || self.control.pending().is_some()
    }

    /// Clear the flag, then raise it again if a point must still call the
    /// host. In this order, a request made by another thread meanwhile is
    /// either seen here or raises the flag after the clear: never lost.
    fn rearm(&self) {
        self.control.set_flag(false);
        if self.flag_wanted() {
            self.control.set_flag(true);
        }
    }
}

fn hooks(caller: &Caller<'_, HostState>) -> wasmtime::Result<Hooks> {
    caller
        .data()
        .hooks
        .clone()
        .ok_or_else(|| wasmtime::format_err!("roam import called before the instance was ready"))
}

/// Finish the rewind in progress: the re-entered import was reached.
fn finish_rewind(caller: &mut Caller<'_, HostState>, h: &Hooks) -> wasmtime::Result<()> {
    h.unwinder.stop_rewind(&mut *caller)?;
    if let Some((buffer, saved)) = caller.data_mut().rewinding.take() {
        buffer.unload(h.memory.data_mut(&mut *caller), &saved);
    }
    caller.data().rearm();
    tracing::debug!("rewind complete; program resumes");
    Ok(())
}

/// Read the state, then start unwinding the guest's stack.
fn begin_unwind(caller: &mut Caller<'_, HostState>, req: Request) -> wasmtime::Result<()> {
    let point_at = Instant::now();
    let h = hooks(caller)?;
    if h.memory.data_size(&*caller) < crate::asyncify::HEADER as usize {
        wasmtime::bail!("cannot checkpoint a program whose linear memory is empty");
    }
    let spare = std::mem::take(&mut caller.data_mut().spare);
    let len = h.memory.data_size(&*caller);
    // A pause copies no memory: the buffer is capped so that only its
    // prefix needs saving.
    let cap = (req.kind == CheckpointKind::Pause).then(|| len.min(PAUSE_BUFFER_MAX));
    let captured = capture::capture(&mut *caller, &h, req.trigger.as_str(), spare, cap);
    let mem = h.memory.data_mut(&mut *caller);
    let buffer = Buffer::over(cap.unwrap_or(mem.len()));
    buffer.reset_header(mem);
    h.unwinder.start_unwind(&mut *caller, buffer)?;
    caller.data_mut().checkpointing = true;
    caller.data().control.set_flag(false);
    caller.data_mut().unwinding = Some(Unwinding {
        req,
        point_at,
        buffer,
        captured,
    });
    tracing::debug!(?req, "unwinding for a checkpoint");
    Ok(())
}

/// `roam.migration_point`: called when the flag is up (or unconditionally,
/// by a program's own manual points). A call without a pending request (a
/// program calling the import itself) checkpoints nothing and returns.
///
/// The common calls return without entering the guest again: a manual
/// point with nothing asked, and each point counted towards
/// `--checkpoint-at-point` (a call per point the program reaches, tens of
/// millions for an interpreter). Only a rewind in progress, which the host
/// started and so knows of, needs Asyncify's state read from the guest.
fn migration_point(mut caller: Caller<'_, HostState>) -> wasmtime::Result<()> {
    if let Some(reason) = caller.data().pages_lost() {
        wasmtime::bail!("memory pages lost: {reason}");
    }
    if caller.data().control.killed() {
        return Err(Killed.into());
    }
    if caller.data().rewinding.is_some() {
        let h = hooks(&caller)?;
        return match h.unwinder.state(&mut caller)? {
            REWINDING => finish_rewind(&mut caller, &h),
            state => {
                wasmtime::bail!("migration point reached in capture state {state} during a restore")
            }
        };
    }
    let counting = caller.data().stop_at_point.is_some() || caller.data().continue_every.is_some();
    if counting {
        caller.data_mut().points_seen += 1;
    }
    let seen = caller.data().points_seen;
    if let Some(k) = caller.data().continue_every {
        if seen.is_multiple_of(k) {
            let req = Request {
                kind: CheckpointKind::Continue,
                trigger: Trigger::PointCount,
                at: Instant::now(),
            };
            return unwind_from_point(&mut caller, req);
        }
    }
    if let Some(n) = caller.data().stop_at_point {
        if seen >= n {
            // Kept until it can be taken.
            let h = hooks(&caller)?;
            if no_memory_yet(&mut caller, &h) {
                return Ok(());
            }
            caller.data_mut().stop_at_point = None;
            let req = Request {
                kind: CheckpointKind::Stop,
                trigger: Trigger::PointCount,
                at: Instant::now(),
            };
            return unwind_from_point(&mut caller, req);
        }
    }
    match caller.data().control.pending() {
        Some(req) => unwind_from_point(&mut caller, req),
        // While counting, the flag stays up.
        None if counting => Ok(()),
        None => {
            caller.data().rearm();
            Ok(())
        }
    }
}

/// The capture borrows linear memory: with none yet, a checkpoint waits
/// (the request stays pending and the flag up) for a point after the
/// program grows its memory, and the log says so once. Found by the
/// generated-program tests; a compiled program always has memory for its
/// stack, so in practice this is a hand-made module.
fn no_memory_yet(caller: &mut Caller<'_, HostState>, h: &Hooks) -> bool {
    if h.memory.data_size(&*caller) >= crate::asyncify::HEADER as usize {
        return false;
    }
    if !caller.data().told_no_memory {
        caller.data_mut().told_no_memory = true;
        tracing::warn!(
            "checkpoint postponed: the program has no linear memory yet; \
             it is taken at the first migration point after the memory grows"
        );
    }
    true
}

/// Begin an unwind at a migration point, which only a program running
/// normally may reach (not one that is unwinding already).
fn unwind_from_point(caller: &mut Caller<'_, HostState>, req: Request) -> wasmtime::Result<()> {
    let h = hooks(caller)?;
    if no_memory_yet(caller, &h) {
        return Ok(());
    }
    match h.unwinder.state(&mut *caller)? {
        NORMAL => begin_unwind(caller, req),
        state => wasmtime::bail!("migration point reached in capture state {state}"),
    }
}

impl WasiView for HostState {
    type Guard<'a> = &'a mut WasiCtx;

    fn wasi(&mut self) -> &mut WasiCtx {
        &mut self.wasi
    }

    fn check_memory(&self) -> wasmtime::Result<()> {
        match self.pages_lost() {
            Some(reason) => wasmtime::bail!("memory pages lost: {reason}"),
            None => Ok(()),
        }
    }

    fn enter_blocking(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        let h = hooks(caller)?;
        if h.unwinder.state(&mut *caller)? == REWINDING {
            finish_rewind(caller, &h)?;
        }
        Ok(())
    }

    fn suspend(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        if caller.data().control.killed() {
            return Err(Killed.into());
        }
        let req = caller.data().control.pending().unwrap_or(Request {
            kind: CheckpointKind::Stop,
            trigger: Trigger::Blocked,
            at: Instant::now(),
        });
        begin_unwind(caller, req)
    }
}

/// Register roam's own import next to WASI.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    roam_wasi::add_to_linker(linker)?;
    linker.func_wrap(
        roam_prepare::POINT_MODULE,
        roam_prepare::POINT_FUNC,
        migration_point,
    )?;
    Ok(())
}

/// With epoch interruption: keep the store's epoch deadline one tick ahead,
/// so that the next bump of the engine's epoch (by a kill of any cell of
/// this runtime, or lost memory) makes this cell call back once, at its next
/// loop header or function entry. Until then the checks never call out.
/// The callback traps a killed program, unless it is unwinding for a
/// checkpoint (which then finishes: a kill never spoils a snapshot), and a
/// program whose lazily received memory was lost.
pub(crate) fn arm_stop(store: &mut wasmtime::Store<HostState>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        if let Some(reason) = ctx.data().pages_lost() {
            wasmtime::bail!("memory pages lost: {reason}");
        }
        if ctx.data().control.killed() && !ctx.data().checkpointing {
            return Err(Killed.into());
        }
        Ok(UpdateDeadline::Continue(1))
    });
}
