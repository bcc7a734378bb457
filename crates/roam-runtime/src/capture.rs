//! Reading a paused cell into a [`Snapshot`], and writing one back.

use std::time::{SystemTime, UNIX_EPOCH};

use roam_snapshot::{
    GlobalVal, GlobalValue, InitialImage, MemoryImage, ModuleRef, Origin, PageKind, Snapshot,
    UnwoundStack, PAGE_SIZE, WASM_PAGE_SIZE,
};
use wasmtime::{AsContextMut, Global, Memory, Store, StoreContextMut, Val};

use crate::asyncify::{Buffer, HEADER};
use crate::error::{CheckpointError, RestoreError};
use crate::host::{Hooks, HostState};
use crate::module::LoadedModule;

/// The state read at a migration point, before the stack unwinds.
pub(crate) struct Captured {
    /// Linear memory; always captured, since the bytes the unwind borrows
    /// are put back from it.
    pub memory: MemoryImage,
    /// Everything else, with an empty memory and stack to be filled in.
    pub rest: Result<Snapshot, CheckpointError>,
}

/// Read memory, globals and the OS layer of a cell stopped at a migration
/// point. `spare` is a previous image's page buffer, reused.
pub(crate) fn capture(
    mut store: impl AsContextMut<Data = HostState>,
    h: &Hooks,
    reason: &str,
    spare: Vec<u8>,
) -> Captured {
    let mut store = store.as_context_mut();
    let memory =
        MemoryImage::capture_reusing(h.memory.data(&store), h.module.initial_image(), spare);
    let rest = capture_rest(&mut store, h, reason);
    Captured { memory, rest }
}

fn capture_rest(
    store: &mut StoreContextMut<'_, HostState>,
    h: &Hooks,
    reason: &str,
) -> Result<Snapshot, CheckpointError> {
    let mut values = Vec::with_capacity(h.globals.len());
    for (name, g) in h.globals.iter() {
        let value = match g.get(&mut *store) {
            Val::I32(v) => GlobalVal::I32(v),
            Val::I64(v) => GlobalVal::I64(v),
            Val::F32(v) => GlobalVal::F32(v),
            Val::F64(v) => GlobalVal::F64(v),
            Val::V128(v) => GlobalVal::V128(v.as_u128()),
            _ => {
                return Err(CheckpointError::Stack(format!(
                    "global `{name}` holds a reference, which snapshots cannot carry"
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
    let files = if h.with_files {
        Some(crate::files::capture(wasi.preopens())?)
    } else {
        None
    };
    let module = &h.module;
    Ok(Snapshot {
        module: ModuleRef {
            hash: *module.hash(),
            embedded: h.embed_module.then(|| module.bytes().to_vec()),
        },
        origin: Origin {
            isa: crate::host_isa().to_string(),
            roam_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            reason: reason.to_string(),
        },
        memory: MemoryImage::empty(),
        globals: values,
        stack: UnwoundStack {
            buffer_offset: 0,
            capacity: 0,
            data: Vec::new(),
        },
        os_state,
        files,
    })
}

/// Put bytes `[start, end)` of `mem` back as they were in `image`.
pub(crate) fn restore_range(
    mem: &mut [u8],
    image: &MemoryImage,
    initial: &InitialImage,
    start: usize,
    end: usize,
) {
    if start >= end {
        return;
    }
    let kinds = image.page_kinds();
    let (first, last) = (start / PAGE_SIZE, (end - 1) / PAGE_SIZE);
    let mut stored = kinds[..first]
        .iter()
        .filter(|k| **k == PageKind::Data)
        .count();
    for (p, kind) in kinds.iter().enumerate().take(last + 1).skip(first) {
        let (lo, hi) = (start.max(p * PAGE_SIZE), end.min((p + 1) * PAGE_SIZE));
        let (a, b) = (lo - p * PAGE_SIZE, hi - p * PAGE_SIZE);
        match kind {
            PageKind::Data => {
                let page = &image.stored_data()[stored * PAGE_SIZE..(stored + 1) * PAGE_SIZE];
                mem[lo..hi].copy_from_slice(&page[a..b]);
                stored += 1;
            }
            PageKind::Initial => {
                let page = initial
                    .page(p as u64)
                    .expect("initial page of a captured image");
                mem[lo..hi].copy_from_slice(&page[a..b]);
            }
            PageKind::Zero => mem[lo..hi].fill(0),
        }
    }
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
    if want < have || !want.is_multiple_of(WASM_PAGE_SIZE) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_range_puts_back_every_kind_of_page() {
        let initial = InitialImage::new(65536, vec![(4096, vec![7u8; 4096])]);
        let mut mem = vec![0u8; 65536];
        mem[4096..8192].fill(7); // Initial
        mem[8192..12288]
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8); // Data
        mem[20000] = 1; // Data
        let image = MemoryImage::capture(&mem, &initial);
        let original = mem.clone();
        mem[..24576].fill(0xee);
        restore_range(&mut mem, &image, &initial, 3, 24000);
        assert_eq!(&mem[3..24000], &original[3..24000]);
        assert_eq!(&mem[..3], &[0xee; 3]);
        assert!(mem[24000..24576].iter().all(|&b| b == 0xee));
    }
}
