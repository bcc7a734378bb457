//! How a threaded program is rebuilt: from a snapshot (a restore), or
//! arriving by migration. An arrival's shared memory is made first and
//! filled page by page as the pages come; its threads are made only when
//! the final state (their stacks and the OS layer) is in. A restore goes
//! the same way with the whole snapshot at hand.
//!
//! Why the memory comes first: an arrival has it long before the rest
//! (pre-copy rounds), and no instance may exist before the OS layer does,
//! because every thread's instance shares the one WASI context the
//! snapshot describes.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use roam_snapshot::{Snapshot, PAGE_SIZE};
use roam_wasi::{Preopen, WasiCtx};
use wasmtime::SharedMemory;

use super::life::{instantiate, set_globals, start_os_thread};
use super::{live_memory_of, new_memory, ThreadedCell};
use crate::asyncify::HEADER;
use crate::control::Control;
use crate::error::RestoreError;
use crate::limits::CellLimits;
use crate::memory::Creator;
use crate::module::LoadedModule;
use crate::runtime::Runtime;
use crate::{CellOptions, LiveMemory};

/// The memory of an arriving threaded program, before any thread exists
/// ([`ThreadedCell::incoming`]).
pub struct ThreadedIncoming {
    memories: Arc<Creator>,
    pub(super) module: Arc<LoadedModule>,
    memory: SharedMemory,
    opts: CellOptions,
}

impl ThreadedCell {
    /// A shared memory for a threaded `module` to receive a migrating
    /// program into. It holds the module's initial image, as an
    /// instantiated memory would, so pages equal to it need not come.
    pub fn incoming(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        opts: CellOptions,
    ) -> Result<ThreadedIncoming, RestoreError> {
        CellLimits::of(&opts).check_memory(module.initial_image().min_bytes())?;
        let memory = new_memory(&module, 0, opts.max_memory).map_err(RestoreError::Instantiate)?;
        let mut incoming = ThreadedIncoming {
            memories: rt.memory_creator(),
            module,
            memory,
            opts,
        };
        let module = incoming.module.clone();
        let initial = module.initial_image();
        incoming.grow_to(initial.min_bytes())?;
        for (i, page) in incoming
            .memory_mut()
            .chunks_exact_mut(PAGE_SIZE)
            .enumerate()
        {
            if let Some(data) = initial.page(i as u64) {
                page.copy_from_slice(data);
            }
        }
        Ok(incoming)
    }

    /// Rebuild a threaded program from a snapshot: every thread is made,
    /// and each rewinds into its site when [`ThreadedCell::run`] is called.
    pub fn restore(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        opts: CellOptions,
    ) -> Result<ThreadedCell, RestoreError> {
        crate::cell::check_module(snapshot, &module)?;
        let mut incoming = ThreadedCell::incoming(rt, module, opts)?;
        incoming.grow_to(snapshot.memory.byte_len())?;
        let module = incoming.module.clone();
        // The new memory holds exactly the initial image and zeroes
        // elsewhere: only the pages that differ are written.
        snapshot
            .memory
            .restore_into(incoming.memory_mut(), module.initial_image(), true)
            .map_err(|e| RestoreError::Memory(e.to_string()))?;
        incoming.finish(snapshot, preopens)
    }

    /// Make every thread of `snapshot` over `memory`, which already holds
    /// the snapshot's memory, ready to rewind.
    fn rebuild(
        memories: Arc<Creator>,
        module: Arc<LoadedModule>,
        memory: SharedMemory,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        opts: &CellOptions,
    ) -> Result<ThreadedCell, RestoreError> {
        crate::cell::check_module(snapshot, &module)?;
        if let Some(files) = &snapshot.files {
            crate::files::materialize(files, &preopens)?;
        }
        let control = Control::new(module.epoch_engine());
        let state = roam_wasi::OsState::decode(&snapshot.os_state)?;
        let mut ctx = WasiCtx::restore(state, preopens, control.interrupt.clone())?;
        if let Some(q) = opts.disk_quota {
            ctx.set_disk_quota(q);
        }
        // An arrival's snapshot has an empty image: its pages came apart.
        let want = snapshot.memory.byte_len();
        if want != 0 && memory.data_size() as u64 != want {
            return Err(RestoreError::Memory(format!(
                "the snapshot's memory is {want} bytes, the new memory {}",
                memory.data_size()
            )));
        }
        let mut cell = ThreadedCell::new(memories, module, ctx, control, memory, opts)
            .map_err(RestoreError::Instantiate)?;
        let shared = cell.shared.clone();
        // SAFETY: no thread has started yet.
        let mem = unsafe { shared.bytes() };
        // Every stack goes through the buffer at address 0; what the
        // program has there comes back when all have rewound.
        let longest = std::iter::once(&snapshot.stack)
            .chain(snapshot.threads.iter().map(|t| &t.stack))
            .map(|s| s.data.len())
            .max()
            .unwrap_or(0);
        let borrowed = (HEADER as usize + longest).min(mem.len());
        let args: BTreeMap<u32, u32> = snapshot
            .threads
            .iter()
            .map(|t| (t.tid, t.start_arg))
            .collect();
        shared
            .gate
            .rewinding(1 + snapshot.threads.len(), args, mem[..borrowed].to_vec());
        set_globals(&mut cell.main.store, &snapshot.globals)?;
        // Every instance first, so that no start function runs while a
        // rewind borrows the buffer.
        let mut made = Vec::with_capacity(snapshot.threads.len());
        for t in &snapshot.threads {
            let mut thread = instantiate(&shared, t.tid).map_err(RestoreError::Instantiate)?;
            set_globals(&mut thread.store, &t.globals)?;
            made.push((thread, t));
        }
        // Ids are at most `MAX_TID` (the snapshot was checked).
        let next = snapshot
            .threads
            .iter()
            .map(|t| t.tid)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        shared.next_tid.store(next, Ordering::SeqCst);
        for (thread, t) in made {
            start_os_thread(
                &shared,
                thread,
                t.tid,
                t.start_arg,
                Some(t.stack.data.clone()),
            )
            .map_err(RestoreError::Stack)?;
        }
        cell.rewind = Some(snapshot.stack.data.clone());
        Ok(cell)
    }
}

impl ThreadedIncoming {
    /// Grow the memory to `bytes`, refused past the cell's limit
    /// ([`CellOptions::max_memory`]) before anything is allocated.
    pub fn grow_to(&mut self, bytes: u64) -> Result<(), RestoreError> {
        CellLimits::of(&self.opts).check_memory(bytes)?;
        let have = self.memory.data_size() as u64;
        if bytes <= have {
            return Ok(());
        }
        let pages = (bytes - have).div_ceil(roam_snapshot::WASM_PAGE_SIZE);
        self.memory.grow(pages).map(|_| ()).map_err(|e| {
            RestoreError::Memory(format!("cannot grow the memory to {bytes} bytes: {e}"))
        })
    }

    /// The memory, to write pages into as they arrive.
    pub fn memory_mut(&mut self) -> &mut [u8] {
        let cells = self.memory.data();
        // SAFETY: no instance over this memory exists yet and this value
        // holds the only handle that can make one, so nothing else reads
        // or writes it while the slice lives (`&mut self`). The bytes are
        // mapped as long as `self.memory` lives.
        unsafe { std::slice::from_raw_parts_mut(cells.as_ptr() as *mut u8, cells.len()) }
    }

    /// A handle to the memory (see [`LiveMemory`]).
    pub fn live_memory(&self) -> LiveMemory {
        live_memory_of(&self.memory)
    }

    /// Make the threads of `snapshot` over the memory received, ready to
    /// rewind: its OS layer (with `preopens` for its directories), its
    /// files if it carries them, and every thread's globals and stack. The
    /// snapshot's own memory image must be empty or match what arrived.
    pub fn finish(
        self,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
    ) -> Result<ThreadedCell, RestoreError> {
        ThreadedCell::rebuild(
            self.memories,
            self.module,
            self.memory,
            snapshot,
            preopens,
            &self.opts,
        )
    }
}
