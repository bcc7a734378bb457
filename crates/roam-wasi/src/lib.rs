//! roam's own WASI preview 1 implementation, whose OS state is plain data.
//!
//! roam checkpoints running programs and restores them on other machines,
//! possibly of another CPU architecture and with other host paths. Existing
//! WASI hosts keep their state in live host objects that cannot be written
//! out; this crate keeps every piece of guest-visible OS state (args, env,
//! the fd table with offsets and rights, the monotonic clock) in a form that
//! [`WasiCtx::save`] turns into an [`OsState`] and [`WasiCtx::restore`]
//! rebuilds, re-resolving files through the new machine's preopens.
//!
//! Blocking calls ([`BLOCKING_IMPORTS`]) cooperate with checkpointing: they
//! wait in short slices watching an [`Interrupt`], and when a checkpoint is
//! requested they return through [`WasiView::suspend`] without side effects,
//! so the embedder can unwind the guest and the call is simply repeated after
//! a restore.
//!
//! Sockets are virtual ([`net`]): a cell's listeners and connections are
//! plain data in its OS state, fed and drained by a host-side backend
//! through a [`net::NetHub`], so a server moves with its clients' bytes.
#![deny(missing_docs)]

mod budget;
mod ctx;
mod errno;
mod interrupt;
mod linker;
mod mem;
pub mod net;
mod ops;
mod quota;
mod snapshot;
mod state;
mod types;

pub use budget::FdBudget;
pub use ctx::{CapturedOutput, OutputSink, Preopen, SetupError, WasiConfig, WasiCtx};
pub use errno::Errno;
pub use interrupt::Interrupt;
pub use linker::add_to_linker;
pub use snapshot::{RestoreError, SaveError};
pub use state::{FdKind, FdState, OsState, StateDecodeError, MAX_ENCODED_LEN, OS_STATE_VERSION};

use wasmtime::Caller;

/// Imports that may suspend for a checkpoint, and therefore call
/// `enter_blocking`/`suspend`; `roam_prepare::ASYNC_IMPORTS` must list them.
/// `sock_send` and `fd_write` may wait on a full socket window but never
/// suspend (they take an overdraft instead, see `docs/os-layer.md`), so they
/// are not here.
pub const BLOCKING_IMPORTS: &[&str] = &["poll_oneoff", "fd_read", "sock_accept", "sock_recv"];

/// The embedder's store data implements this.
pub trait WasiView: Sized + 'static {
    /// How the store holds the context: `&mut WasiCtx` for a program of
    /// one thread; a lock guard when the threads of one program, each in
    /// a store of its own, share one context.
    type Guard<'a>: std::ops::DerefMut<Target = WasiCtx>
    where
        Self: 'a;

    /// The WASI context of the program.
    fn wasi(&mut self) -> Self::Guard<'_>;

    /// Called before every call that reads or writes guest memory, before
    /// it does anything. The runtime refuses here once the memory can no
    /// longer be trusted (lazily read pages were lost), so that the program
    /// has no effect outside based on it.
    fn check_memory(&self) -> wasmtime::Result<()> {
        Ok(())
    }

    /// Called at the start of every import in [`BLOCKING_IMPORTS`], before it
    /// does anything. The runtime uses it to finish an Asyncify rewind (the
    /// call being re-entered after a restore).
    fn enter_blocking(_caller: &mut Caller<'_, Self>) -> wasmtime::Result<()> {
        Ok(())
    }

    /// Called when a blocking call is interrupted (checkpoint requested, or
    /// on-block armed and the call would block). The runtime starts an
    /// Asyncify unwind here. The import then returns at once; its return
    /// value is ignored and it has had no side effect.
    fn suspend(_caller: &mut Caller<'_, Self>) -> wasmtime::Result<()>;
}

/// Returned as the trap error by `proc_exit`; the runtime downcasts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcExit(pub i32);

impl std::fmt::Display for ProcExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "program exited with status {}", self.0)
    }
}

impl std::error::Error for ProcExit {}
