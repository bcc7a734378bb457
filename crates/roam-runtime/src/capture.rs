//! Reading a paused cell into a [`Snapshot`], and writing one back.

use std::time::{SystemTime, UNIX_EPOCH};

use roam_snapshot::{
    GlobalVal, GlobalValue, MemoryImage, ModuleRef, Origin, Snapshot, UnwoundStack,
    WASM_PAGE_SIZE,
};
use wasmtime::{Global, Memory, Store, Val};

use crate::asyncify::{Buffer, HEADER};
use crate::error::{boxed, CheckpointError, RestoreError};
use crate::host::{Hooks, HostState};
use crate::module::LoadedModule;

pub(crate) struct CaptureOptions<'a> {
    pub embed_module: bool,
    pub with_files: bool,
    pub reason: &'a str,
}

/// Finish the unwind and read everything. Returns the snapshot and the
/// unwound stack (needed again to rewind after checkpoint-and-continue).
pub(crate) fn capture(
    store: &mut Store<HostState>,
    hooks: &Hooks,
    globals: &[(String, Global)],
    module: &LoadedModule,
    opts: &CaptureOptions<'_>,
) -> Result<(Snapshot, Vec<u8>), CheckpointError> {
    hooks
        .asyncify
        .stop_unwind(&mut *store)
        .map_err(|e| CheckpointError::Engine(boxed(e)))?;
    let b = hooks.buffer;
    let mem = hooks.memory.data_mut(&mut *store);
    let stack = b.data(mem).map_err(CheckpointError::Stack)?.to_vec();
    b.clear(mem, HEADER + stack.len() as u32);
    let memory = MemoryImage::capture(mem, module.initial_image());

    let mut values = Vec::with_capacity(globals.len());
    for (name, g) in globals {
        let value = match g.get(&mut *store) {
            Val::I32(v) => GlobalVal::I32(v),
            Val::I64(v) => GlobalVal::I64(v),
            Val::F32(v) => GlobalVal::F32(v),
            Val::F64(v) => GlobalVal::F64(v),
            Val::V128(v) => GlobalVal::V128(v.as_u128()),
            other => {
                return Err(CheckpointError::Stack(format!(
                    "global `{name}` has a reference type ({:?}), which snapshots cannot carry",
                    other.ty(&*store)
                )))
            }
        };
        values.push(GlobalValue {
            name: name.clone(),
            value,
        });
    }
    let wasi = &store.data().wasi;
    let os_state = wasi.save()?.encode();
    let files = if opts.with_files {
        Some(crate::files::capture(wasi.preopens())?)
    } else {
        None
    };
    let snapshot = Snapshot {
        module: ModuleRef {
            hash: *module.hash(),
            embedded: opts.embed_module.then(|| module.bytes().to_vec()),
        },
        origin: Origin {
            isa: crate::host_isa().to_string(),
            roam_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            reason: opts.reason.to_string(),
        },
        memory,
        globals: values,
        stack: UnwoundStack {
            buffer_offset: b.offset,
            capacity: b.capacity,
            data: stack.clone(),
        },
        os_state,
        files,
    };
    Ok((snapshot, stack))
}

/// Write memory and globals of `snapshot` into a fresh instance. Returns the
/// unwind buffer recorded in the snapshot, checked against the memory.
pub(crate) fn restore_state(
    store: &mut Store<HostState>,
    memory: Memory,
    globals: &[(String, Global)],
    snapshot: &Snapshot,
    module: &LoadedModule,
) -> Result<Buffer, RestoreError> {
    let want = snapshot.memory.byte_len();
    let have = memory.data_size(&mut *store) as u64;
    if want < have || want % WASM_PAGE_SIZE != 0 {
        return Err(RestoreError::Memory(format!(
            "snapshot memory is {want} bytes, the module starts with {have}"
        )));
    }
    memory
        .grow(&mut *store, (want - have) / WASM_PAGE_SIZE)
        .map_err(|e| RestoreError::Memory(format!("cannot grow memory to {want} bytes: {e}")))?;
    snapshot
        .memory
        .restore_into(memory.data_mut(&mut *store), module.initial_image(), true)
        .map_err(|e| RestoreError::Memory(e.to_string()))?;

    for gv in &snapshot.globals {
        let Some((_, g)) = globals.iter().find(|(n, _)| *n == gv.name) else {
            return Err(RestoreError::Global {
                name: gv.name.clone(),
                detail: "the module exports no such global".into(),
            });
        };
        let val = match gv.value {
            GlobalVal::I32(v) => Val::I32(v),
            GlobalVal::I64(v) => Val::I64(v),
            GlobalVal::F32(v) => Val::F32(v),
            GlobalVal::F64(v) => Val::F64(v),
            GlobalVal::V128(v) => Val::V128(v.into()),
        };
        g.set(&mut *store, val).map_err(|e| RestoreError::Global {
            name: gv.name.clone(),
            detail: e.to_string(),
        })?;
    }
    if let Some((name, _)) = globals
        .iter()
        .find(|(n, _)| !snapshot.globals.iter().any(|gv| gv.name == *n))
    {
        return Err(RestoreError::Global {
            name: name.clone(),
            detail: "missing from the snapshot".into(),
        });
    }

    let s = &snapshot.stack;
    let end = u64::from(s.buffer_offset) + u64::from(s.capacity);
    if end > want || s.capacity < HEADER {
        return Err(RestoreError::Stack(format!(
            "buffer [{:#x}, {end:#x}) lies outside the {want}-byte memory",
            s.buffer_offset
        )));
    }
    Ok(Buffer {
        offset: s.buffer_offset,
        capacity: s.capacity,
    })
}
