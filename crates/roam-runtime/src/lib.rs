//! The roam runtime: runs prepared WebAssembly programs on wasmtime, and
//! checkpoints and restores them.
//!
//! Why a crate of its own: this is where the three portable pieces of state
//! meet the one engine that executes them. A [`Cell`] owns a wasmtime store
//! with roam's WASI layer ([`roam_wasi`]) and drives the module's capture
//! (records that frames write on the way out, leaving by returns or by a
//! Wasm exception, or Binaryen Asyncify) through the exports that `roam prepare`
//! ([`roam_prepare`]) put in the module (`unwind.rs`). A checkpoint unwinds
//! the guest's call stack into linear memory at
//! a migration point, reads memory, mutable globals, the unwound stack and
//! the OS-layer state into a [`roam_snapshot::Snapshot`], and then either
//! rewinds (checkpoint-and-continue) or returns it (checkpoint-and-stop).
//! Restore instantiates the same module on whatever ISA this process runs
//! on, writes the state back and rewinds into the migration point.
//!
//! ```text
//!   request (any thread) ──► atomic store to the cell's flag word
//!                                   │
//!   guest loop header: if flag word { call roam.migration_point } ──► host starts unwind
//!                                   │
//!   `_start` returns with state=unwinding ──► capture snapshot ──► stop | rewind
//! ```
//!
//! Compiled machine code is cached on disk per module hash and target ISA
//! ([`cache`]), so restoring on a node that has seen the module before costs
//! no compilation.

#![deny(missing_docs)]

mod asyncify;
pub mod cache;
mod capture;
mod cell;
mod control;
mod dirty;
mod error;
mod far;
pub mod files;
mod flag;
mod from_file;
mod host;
mod incoming;
mod lazy;
mod limits;
mod memory;
mod module;
mod runtime;
mod threads;
mod uffd;
mod unwind;

pub use cell::{Cell, CellOptions, Outcome, Taken};
pub use control::{CheckpointKind, CheckpointTiming, Controller, Trigger, STOP_GRACE};
pub use dirty::{DirtyTracker, TrackError, TrackMethod};
pub use error::{CheckpointError, LoadError, RestoreError, RunError, StartError};
pub use far::{
    Eviction, FarError, FarMemory, FarOptions, FarStats, FileStore, MemStore, PageStore,
    MIN_LOCAL_PAGES,
};
pub use flag::LowerError;
pub use host::PAUSE_BUFFER_MAX;
pub use incoming::Incoming;
pub use lazy::{LazyError, LazyMemory, LazyStats, PageSource, DEFAULT_FETCH_BATCH};
pub use limits::{DEFAULT_MAX_MEMORY, DEFAULT_MAX_TABLE_ELEMENTS};
pub use memory::LiveMemory;
pub use module::LoadedModule;
pub use runtime::{
    host_isa, EpochInterrupt, Runtime, RuntimeConfig, DEFAULT_MAX_WASM_STACK, ENV_EPOCH_INTERRUPT,
    RUN_THREAD_STACK,
};
pub use threads::{is_threaded, AfterPause, ThreadedCell, ThreadedIncoming};
pub use uffd::userfaultfd_available;

#[cfg(test)]
mod tests;
