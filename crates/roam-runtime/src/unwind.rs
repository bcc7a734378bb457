//! One interface over the two ways a prepared module captures its stack.
//!
//! A module prepared with Asyncify (the default) is driven through
//! Asyncify's exports: its state lives in the guest and is read by a call.
//! A module prepared with `--capture eh` throws a Wasm exception instead:
//! its state is an exported global that only the host writes, its records
//! go to the same borrowed buffer ([`crate::asyncify::Buffer`]), and a
//! restore calls its rewind copy of `_start` rather than `_start`.
//!
//! Both keep the buffer's header (`current`, `end`), so the rest of the
//! runtime reads and writes the captured stack the same way for both.

use wasmtime::{AsContextMut, Global, Instance, Memory, TypedFunc, Val};

use crate::asyncify::{Asyncify, Buffer, HEADER};
use crate::error::LoadError;

/// The exception-based capture's handles into one instance.
#[derive(Clone)]
pub(crate) struct Eh {
    state: Global,
    cursor: Global,
    end: Global,
    rewind: TypedFunc<(), ()>,
    memory: Memory,
}

/// How this instance unwinds and rewinds.
#[derive(Clone)]
pub(crate) enum Unwinder {
    Asyncify(Asyncify),
    Eh(Eh),
}

fn get_i32(store: impl AsContextMut, g: &Global) -> i32 {
    match g.get(store) {
        Val::I32(v) => v,
        _ => 0,
    }
}

impl Unwinder {
    /// The handles of `instance`, for a module whose capture is `eh`.
    pub(crate) fn new(
        instance: &Instance,
        mut store: impl AsContextMut,
        eh: bool,
        memory: Memory,
    ) -> Result<Self, LoadError> {
        if !eh {
            return Ok(Unwinder::Asyncify(Asyncify::new(instance, store)?));
        }
        let mut store = store.as_context_mut();
        let missing = |name: &str| LoadError::MissingExport(name.to_string());
        let mut global = |name: &str| {
            instance
                .get_global(&mut store, name)
                .ok_or_else(|| missing(name))
        };
        let state = global(roam_prepare::STATE_EXPORT)?;
        let cursor = global(roam_prepare::CAPTURE_GLOBAL_EXPORT)?;
        let end = global(roam_prepare::CAPTURE_END_EXPORT)?;
        let rewind = instance
            .get_typed_func(&mut store, roam_prepare::REWIND_EXPORT)
            .map_err(|_| missing(roam_prepare::REWIND_EXPORT))?;
        Ok(Unwinder::Eh(Eh {
            state,
            cursor,
            end,
            rewind,
            memory,
        }))
    }

    /// `NORMAL`, `UNWINDING` or `REWINDING` (the same numbers for both).
    pub(crate) fn state(&self, store: impl AsContextMut) -> wasmtime::Result<i32> {
        match self {
            Unwinder::Asyncify(a) => a.state(store),
            Unwinder::Eh(e) => Ok(get_i32(store, &e.state)),
        }
    }

    /// Begin an unwind into `b`; the program unwinds when the host
    /// returns to it.
    pub(crate) fn start_unwind(
        &self,
        mut store: impl AsContextMut,
        b: Buffer,
    ) -> wasmtime::Result<()> {
        match self {
            Unwinder::Asyncify(a) => a.start_unwind(store, b),
            Unwinder::Eh(e) => {
                let mut store = store.as_context_mut();
                e.cursor
                    .set(&mut store, Val::I32((b.offset + HEADER) as i32))?;
                e.end
                    .set(&mut store, Val::I32((b.offset + b.capacity) as i32))?;
                e.state.set(&mut store, Val::I32(roam_prepare::UNWINDING))
            }
        }
    }

    /// End a completed unwind into `b`: its header then says where the
    /// captured stack ends.
    pub(crate) fn stop_unwind(
        &self,
        mut store: impl AsContextMut,
        b: Buffer,
    ) -> wasmtime::Result<()> {
        match self {
            Unwinder::Asyncify(a) => a.stop_unwind(store),
            Unwinder::Eh(e) => {
                let mut store = store.as_context_mut();
                let current = get_i32(&mut store, &e.cursor) as u32;
                e.state.set(&mut store, Val::I32(roam_prepare::NORMAL))?;
                let mem = e.memory.data_mut(&mut store);
                b.set_current(mem, current);
                Ok(())
            }
        }
    }

    /// Begin a rewind from `b`, whose header says where its stack ends.
    pub(crate) fn start_rewind(
        &self,
        mut store: impl AsContextMut,
        b: Buffer,
    ) -> wasmtime::Result<()> {
        match self {
            Unwinder::Asyncify(a) => a.start_rewind(store, b),
            Unwinder::Eh(e) => {
                let mut store = store.as_context_mut();
                let current = b.current(e.memory.data(&store));
                e.cursor.set(&mut store, Val::I32(current as i32))?;
                e.end
                    .set(&mut store, Val::I32((b.offset + b.capacity) as i32))?;
                e.state.set(&mut store, Val::I32(roam_prepare::REWINDING))
            }
        }
    }

    /// The rewind reached the site it was going to.
    pub(crate) fn stop_rewind(&self, store: impl AsContextMut) -> wasmtime::Result<()> {
        match self {
            Unwinder::Asyncify(a) => a.stop_rewind(store),
            Unwinder::Eh(e) => e.state.set(store, Val::I32(roam_prepare::NORMAL)),
        }
    }

    /// What to call to rebuild the stack: `None` for `_start` itself.
    pub(crate) fn rewind_entry(&self) -> Option<TypedFunc<(), ()>> {
        match self {
            Unwinder::Asyncify(_) => None,
            Unwinder::Eh(e) => Some(e.rewind.clone()),
        }
    }
}
