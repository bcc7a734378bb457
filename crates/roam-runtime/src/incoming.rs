//! A cell being received: instantiated at once, filled page by page, then
//! finished into a [`Cell`] that rewinds into the migration point.
//!
//! Why a separate step before the snapshot is complete: in stop-and-copy
//! and pre-copy migration the memory arrives over the network in pages,
//! possibly in several rounds, and the rest of the state (globals, stack,
//! OS layer) comes last. Instantiating first lets the pages be written
//! straight into the final linear memory as they arrive, and compilation or
//! instantiation errors show before anything is sent.

use std::sync::Arc;

use roam_snapshot::Snapshot;
use roam_wasi::Preopen;

use crate::capture;
use crate::cell::{Cell, CellOptions, Parts};
use crate::control::Control;
use crate::error::RestoreError;
use crate::memory::LiveMemory;
use crate::module::LoadedModule;

/// A receiving cell: the module is instantiated (its memory holds the
/// initial image), nothing runs. Made by [`Cell::incoming`].
pub struct Incoming {
    pub(crate) parts: Parts,
    pub(crate) module: Arc<LoadedModule>,
    pub(crate) opts: CellOptions,
    pub(crate) control: Arc<Control>,
    /// Far memory attached before the pages arrive.
    pub(crate) far: Option<crate::far::Owner>,
}

impl Incoming {
    /// Grow the memory to `bytes` (a multiple of 64 KiB, not smaller than
    /// the current size).
    /// A size over the cell's memory limit is refused before growing.
    pub fn grow_to(&mut self, bytes: u64) -> Result<(), RestoreError> {
        self.check_memory(bytes)?;
        capture::grow_to(&mut self.parts.store, self.parts.memory, bytes)
    }

    /// Refuse a memory of `bytes` if it is over this cell's limit
    /// ([`crate::CellOptions::max_memory`]), before anything is allocated.
    pub fn check_memory(&self, bytes: u64) -> Result<(), RestoreError> {
        self.parts.store.data().limiter.limits().check_memory(bytes)
    }

    /// The memory, to write pages into as they arrive.
    pub fn memory_mut(&mut self) -> &mut [u8] {
        self.parts.memory.data_mut(&mut self.parts.store)
    }

    /// A handle to the memory (see [`LiveMemory`]).
    pub fn live_memory(&self) -> LiveMemory {
        self.parts.live.clone()
    }

    /// Page this memory from now on: at most `opts.local_pages` stay
    /// resident and the rest goes to `store` as it is written (see
    /// [`crate::FarMemory`]). Call before the pages arrive, so that a cell
    /// bigger than its node's budget never has all of its memory here,
    /// even while it arrives; the finished cell keeps paging.
    pub fn attach_far(
        &mut self,
        opts: crate::FarOptions,
        store: Box<dyn crate::PageStore>,
    ) -> Result<crate::FarMemory, crate::FarError> {
        let lost = self.parts.store.data().lost.clone();
        crate::far::attach_into(
            &mut self.far,
            self.parts.live.clone(),
            opts,
            store,
            lost,
            self.control.clone(),
        )
    }

    /// The module being received.
    pub fn module(&self) -> &Arc<LoadedModule> {
        &self.module
    }

    /// Write `snapshot`'s memory image (growing to its size first).
    pub(crate) fn write_image(&mut self, snapshot: &Snapshot) -> Result<(), RestoreError> {
        self.check_memory(snapshot.memory.byte_len())?;
        capture::restore_memory(
            &mut self.parts.store,
            self.parts.memory,
            &self.parts.live,
            snapshot,
            &self.module,
            self.far.is_some(),
        )
    }

    /// Apply the rest of `snapshot` and prepare the rewind: globals, OS
    /// layer (with `preopens` mapping its directories), files if carried.
    /// The memory is the one the caller filled; if `snapshot.memory` is not
    /// empty it is written first (so a complete snapshot also works), and
    /// otherwise it is left as it is.
    pub fn finish(
        mut self,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
    ) -> Result<Cell, RestoreError> {
        if snapshot.memory.byte_len() != 0 {
            self.write_image(snapshot)?;
        }
        Cell::finish_incoming(self, snapshot, preopens)
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("memory", &self.parts.live)
            .finish_non_exhaustive()
    }
}
