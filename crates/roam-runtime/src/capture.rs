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
use crate::memory::{host_page_size, LiveMemory};
use crate::module::LoadedModule;

/// What was read of linear memory before the unwind: enough to put back
/// the bytes the unwind borrows.
pub(crate) enum Saved {
    /// The whole memory, as a snapshot image (continue, stop).
    Image(MemoryImage),
    /// Only the prefix the unwind buffer covers (pause): the memory stays
    /// live in the cell.
    Prefix(Vec<u8>),
}

impl Saved {
    /// Put bytes `[start, end)` of `mem` back as they were when saved.
    pub(crate) fn put_back(
        &self,
        mem: &mut [u8],
        initial: &InitialImage,
        start: usize,
        end: usize,
    ) {
        match self {
            Saved::Image(image) => restore_range(mem, image, initial, start, end),
            Saved::Prefix(bytes) => {
                let end = end.min(bytes.len());
                if start < end {
                    mem[start..end].copy_from_slice(&bytes[start..end]);
                }
            }
        }
    }

    /// The image to put in the snapshot (empty for a prefix), and the
    /// prefix buffer to keep for the next pause.
    pub(crate) fn into_image(self) -> (MemoryImage, Vec<u8>) {
        match self {
            Saved::Image(image) => (image, Vec::new()),
            Saved::Prefix(prefix) => (MemoryImage::empty(), prefix),
        }
    }
}

/// The state read at a migration point, before the stack unwinds.
pub(crate) struct Captured {
    /// Linear memory, or the part of it the unwind borrows.
    pub memory: Saved,
    /// Everything else, with an empty memory and stack to be filled in.
    pub rest: Result<Snapshot, CheckpointError>,
}

/// Read memory, globals and the OS layer of a cell stopped at a migration
/// point. `spare` is a previous image's page buffer, reused. With
/// `prefix_only = Some(n)`, only the first `n` bytes of memory are copied.
pub(crate) fn capture(
    mut store: impl AsContextMut<Data = HostState>,
    h: &Hooks,
    reason: &str,
    spare: Vec<u8>,
    prefix_only: Option<usize>,
) -> Captured {
    let mut store = store.as_context_mut();
    let memory = match prefix_only {
        Some(n) => {
            // Reuse the previous pause's buffer: no page faults after the first.
            let mut prefix = std::mem::take(&mut store.data_mut().pause_spare);
            let mem = h.memory.data(&store);
            prefix.clear();
            prefix.extend_from_slice(&mem[..n.min(mem.len())]);
            Saved::Prefix(prefix)
        }
        None => Saved::Image(MemoryImage::capture_reusing(
            h.memory.data(&store),
            h.module.initial_image(),
            spare,
        )),
    };
    // A pause carries no files: its caller reads them from the sandbox
    // directories itself (a migration streams them, mostly before the pause).
    let rest = capture_rest(&mut store, h, reason, prefix_only.is_none());
    Captured { memory, rest }
}

fn capture_rest(
    store: &mut StoreContextMut<'_, HostState>,
    h: &Hooks,
    reason: &str,
    with_files: bool,
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
    let files = if h.with_files && with_files {
        Some(crate::files::capture(wasi.preopens(), &h.files_limits)?)
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
        threads: Vec::new(),
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

/// Grow a fresh instance's memory to `want` bytes.
pub(crate) fn grow_to(
    store: &mut Store<HostState>,
    memory: Memory,
    want: u64,
) -> Result<(), RestoreError> {
    let have = memory.data_size(&mut *store) as u64;
    if want < have || !want.is_multiple_of(WASM_PAGE_SIZE) {
        return Err(RestoreError::Memory(format!(
            "memory of {want} bytes requested, the module starts with {have}"
        )));
    }
    memory
        .grow(&mut *store, (want - have) / WASM_PAGE_SIZE)
        .map_err(|e| RestoreError::Memory(format!("cannot grow memory to {want} bytes: {e}")))?;
    Ok(())
}

/// Runs of at least this many stored pages are mapped; shorter ones are
/// copied (a mapping costs a system call and a kernel VMA).
const MAP_MIN_PAGES: u64 = 16;
/// At most this many mappings per restore: the kernel limits VMAs per
/// process (`vm.max_map_count`, 65530 by default).
const MAX_MAPPINGS: usize = 4096;

/// Whether restore maps snapshot pages instead of copying them (default
/// yes; `ROAM_RESTORE_MAP=0` copies, for comparison).
fn map_restore_enabled() -> bool {
    std::env::var("ROAM_RESTORE_MAP").map_or(true, |v| v != "0")
}

/// Write the memory image of `snapshot` into a fresh instance (grown to its
/// size first). An image whose pages are in a page file (format v2) is
/// mapped copy-on-write run by run, so restoring costs nothing per page
/// until the program writes it; other images are copied.
pub(crate) fn restore_memory(
    store: &mut Store<HostState>,
    memory: Memory,
    live: &LiveMemory,
    snapshot: &Snapshot,
    module: &LoadedModule,
    paged: bool,
) -> Result<(), RestoreError> {
    let image = &snapshot.memory;
    grow_to(store, memory, image.byte_len())?;
    let err = |e: roam_snapshot::RestoreError| RestoreError::Memory(e.to_string());
    let initial = module.initial_image();
    // Memory that roam pages itself (far memory) is written page by page
    // through its fault handler: mapping a file over it would drop the
    // handler's registration, and populating it would fault it all in.
    let fd = match image.stored_data_fd() {
        Some(fd) if !paged && map_restore_enabled() && host_page_size() == PAGE_SIZE => fd,
        _ => {
            for (page, _, n) in image.data_runs() {
                if n >= MAP_MIN_PAGES && !paged {
                    live.map
                        .populate(page as usize * PAGE_SIZE, n as usize * PAGE_SIZE);
                }
            }
            return image
                .restore_into(memory.data_mut(&mut *store), initial, true)
                .map_err(err);
        }
    };
    image
        .restore_except_data(memory.data_mut(&mut *store), initial)
        .map_err(err)?;
    let data = image.stored_data();
    let mut maps = 0;
    for (page, stored, n) in image.data_runs() {
        let (at, from, len) = (
            page as usize * PAGE_SIZE,
            stored as usize * PAGE_SIZE,
            n as usize * PAGE_SIZE,
        );
        if n >= MAP_MIN_PAGES && maps < MAX_MAPPINGS {
            match live.map.map_private(at, len, fd, from as u64) {
                Ok(()) => {
                    maps += 1;
                    continue;
                }
                Err(e) => tracing::debug!("restore copies pages it could not map: {e}"),
            }
        }
        memory.data_mut(&mut *store)[at..at + len].copy_from_slice(&data[from..from + len]);
    }
    Ok(())
}

/// Set each of `values` in the exported global of its name (`globals`):
/// a name the module does not export is refused.
pub(crate) fn write_globals(
    mut store: impl AsContextMut,
    globals: &[(String, Global)],
    values: &[GlobalValue],
) -> Result<(), RestoreError> {
    for gv in values {
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
        g.set(&mut store, val).map_err(|e| RestoreError::Global {
            name: gv.name.clone(),
            detail: e.to_string(),
        })?;
    }
    Ok(())
}

/// Write the globals of `snapshot` into an instance whose memory already
/// holds the snapshot's memory. Returns the unwind buffer recorded in the
/// snapshot, checked against the memory.
pub(crate) fn restore_state(
    store: &mut Store<HostState>,
    memory: Memory,
    globals: &[(String, Global)],
    snapshot: &Snapshot,
) -> Result<Buffer, RestoreError> {
    let want = memory.data_size(&mut *store) as u64;
    write_globals(&mut *store, globals, &snapshot.globals)?;
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
