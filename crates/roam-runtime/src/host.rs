//! The store's host state, and the host side of a migration point.
//!
//! Both ways into an unwind meet here: the `roam.migration_point` import that
//! `roam prepare` calls when the flag is raised, and the OS layer's
//! [`WasiView::suspend`] when a blocking call is interrupted. Both ways out of
//! a rewind meet here too: the re-entered import finishes the rewind before
//! doing anything else.

use std::sync::Arc;

use roam_wasi::{WasiCtx, WasiView};
use wasmtime::{AsContextMut, Caller, Global, Linker, Memory, UpdateDeadline, Val};

use crate::asyncify::{Asyncify, Buffer, NORMAL, REWINDING};
use crate::control::{CheckpointKind, Control, Request, Trigger};

/// Handles into one instance, set once it exists.
#[derive(Clone)]
pub(crate) struct Hooks {
    pub asyncify: Asyncify,
    pub memory: Memory,
    pub flag: Global,
    pub buffer: Buffer,
}

/// Data of a cell's store.
pub(crate) struct HostState {
    pub wasi: WasiCtx,
    pub control: Arc<Control>,
    pub hooks: Option<Hooks>,
    /// Bytes of the buffer a pending rewind uses.
    pub rewinding: Option<u32>,
    /// Set when the host has started an unwind, with the request it serves.
    pub unwinding: Option<Request>,
    /// `--checkpoint-at-point N`: stop at the Nth migration point reached.
    pub stop_at_point: Option<u64>,
    /// Migration points reached while counting.
    pub points_seen: u64,
}

impl HostState {
    pub(crate) fn new(wasi: WasiCtx, control: Arc<Control>, stop_at_point: Option<u64>) -> Self {
        HostState {
            wasi,
            control,
            hooks: None,
            rewinding: None,
            unwinding: None,
            stop_at_point,
            points_seen: 0,
        }
    }

    fn flag_wanted(&self) -> bool {
        self.stop_at_point.is_some() || self.control.pending().is_some()
    }
}

fn hooks(caller: &Caller<'_, HostState>) -> wasmtime::Result<Hooks> {
    caller
        .data()
        .hooks
        .clone()
        .ok_or_else(|| wasmtime::format_err!("roam import called before the instance was ready"))
}

/// Finish a rewind if one is in progress. Returns whether it was.
fn finish_rewind_if_rewinding(caller: &mut Caller<'_, HostState>) -> wasmtime::Result<bool> {
    let h = hooks(caller)?;
    if h.asyncify.state(&mut *caller)? != REWINDING {
        return Ok(false);
    }
    h.asyncify.stop_rewind(&mut *caller)?;
    let used = caller.data_mut().rewinding.take().unwrap_or(h.buffer.capacity);
    h.buffer.clear(h.memory.data_mut(&mut *caller), used);
    let keep = caller.data().flag_wanted();
    h.flag.set(&mut *caller, Val::I32(keep as i32))?;
    tracing::debug!("rewind complete; program resumes");
    Ok(true)
}

/// Start unwinding the guest's stack into the buffer.
fn begin_unwind(caller: &mut Caller<'_, HostState>, req: Request) -> wasmtime::Result<()> {
    let h = hooks(caller)?;
    h.buffer.reset_header(h.memory.data_mut(&mut *caller));
    h.asyncify.start_unwind(&mut *caller, h.buffer)?;
    h.flag.set(&mut *caller, Val::I32(0))?;
    caller.data_mut().unwinding = Some(req);
    tracing::debug!(?req, "unwinding for a checkpoint");
    Ok(())
}

/// `roam.migration_point`: called when the flag is up (or unconditionally,
/// by a program's own manual points).
fn migration_point(mut caller: Caller<'_, HostState>) -> wasmtime::Result<()> {
    if finish_rewind_if_rewinding(&mut caller)? {
        return Ok(());
    }
    let h = hooks(&caller)?;
    let state = h.asyncify.state(&mut caller)?;
    if state != NORMAL {
        wasmtime::bail!("migration point reached in Asyncify state {state}");
    }
    if let Some(n) = caller.data().stop_at_point {
        caller.data_mut().points_seen += 1;
        if caller.data().points_seen >= n {
            caller.data_mut().stop_at_point = None;
            return begin_unwind(
                &mut caller,
                Request {
                    kind: CheckpointKind::Stop,
                    trigger: Trigger::PointCount,
                },
            );
        }
    }
    match caller.data().control.pending() {
        Some(req) => begin_unwind(&mut caller, req),
        None => {
            let keep = caller.data().flag_wanted();
            h.flag.set(&mut caller, Val::I32(keep as i32))
        }
    }
}

impl WasiView for HostState {
    fn wasi(&mut self) -> &mut WasiCtx {
        &mut self.wasi
    }

    fn enter_blocking(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        finish_rewind_if_rewinding(caller).map(|_| ())
    }

    fn suspend(caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        let req = caller.data().control.pending().unwrap_or(Request {
            kind: CheckpointKind::Stop,
            trigger: Trigger::Blocked,
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

/// Arm the epoch callback: on the guest's thread, raise the flag when a
/// checkpoint is pending.
pub(crate) fn arm_epoch(store: &mut wasmtime::Store<HostState>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|mut ctx| {
        if ctx.data().flag_wanted() {
            if let Some(h) = ctx.data().hooks.clone() {
                h.flag.set(ctx.as_context_mut(), Val::I32(1))?;
            }
        }
        Ok(UpdateDeadline::Continue(1))
    });
}
