//! Error types, one per operation, so callers can tell what failed and what
//! to do about it.

use std::path::PathBuf;

/// A boxed error from a lower layer (wasmtime, I/O, the OS layer).
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

pub(crate) fn boxed(e: wasmtime::Error) -> Source {
    anyhow::Error::from(e).into()
}

/// Loading, preparing or compiling a module failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading the module file failed.
    #[error("cannot read module {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `roam prepare` refused or failed on the module.
    #[error("cannot prepare the module")]
    Prepare(#[from] roam_prepare::PrepareError),
    /// The prepared module's `roam` section is unreadable.
    #[error("cannot read the module's roam section")]
    Section(#[from] roam_prepare::SectionError),
    /// The module's data segments could not be read.
    #[error("cannot read the module's initial memory image")]
    InitialImage(#[from] roam_prepare::ValidateError),
    /// The migration flag could not be moved into roam's flag memory.
    #[error("cannot rewrite the module's migration points for this runtime; prepare the original module again")]
    Lower(#[from] crate::flag::LowerError),
    /// Cranelift failed to compile the module.
    #[error("cannot compile the module for {isa}")]
    Compile {
        /// The target ISA.
        isa: String,
        /// Why.
        #[source]
        source: Source,
    },
    /// No module with this hash is embedded, given, or in the cache.
    #[error(
        "module {hash} is not in the cache ({dir}); pass it with --module, or take the snapshot with --embed-module"
    )]
    NotFound {
        /// Hex hash of the prepared module.
        hash: String,
        /// The cache directory that was searched.
        dir: PathBuf,
    },
    /// A module was given but is not the one the snapshot was taken from.
    #[error("module mismatch: the snapshot needs prepared module {expected}, but {path} prepares to {found}")]
    WrongModule {
        /// Hash recorded in the snapshot.
        expected: String,
        /// Hash of the module given.
        found: String,
        /// The module given.
        path: PathBuf,
    },
    /// The cache directory could not be used.
    #[error("cache directory {dir} is unusable; set ROAM_CACHE_DIR to a writable directory")]
    Cache {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The prepared module lacks an export roam needs.
    #[error(
        "the prepared module lacks the export `{0}`; prepare it again with this version of roam"
    )]
    MissingExport(String),
}

/// Instantiating a module for a fresh run failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The OS layer could not be set up (e.g. a `--dir` does not exist).
    #[error("cannot set up the OS layer")]
    Wasi(#[from] roam_wasi::SetupError),
    /// wasmtime refused to instantiate the module.
    #[error("cannot instantiate the module")]
    Instantiate(#[source] Source),
}

/// Rebuilding a cell from a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The snapshot belongs to another module.
    #[error("the snapshot was taken from module {expected}, not {found}")]
    ModuleMismatch {
        /// Hash in the snapshot.
        expected: String,
        /// Hash of the loaded module.
        found: String,
    },
    /// The OS-layer state in the snapshot is unreadable.
    #[error("the snapshot's OS-layer state is corrupt")]
    OsState(#[from] roam_wasi::StateDecodeError),
    /// The OS layer could not be rebuilt (missing preopen, missing file...).
    #[error("cannot rebuild the OS layer")]
    Wasi(#[from] roam_wasi::RestoreError),
    /// Writing the snapshot's sandbox files failed.
    #[error("cannot write the snapshot's files into the sandbox directories")]
    Files(#[from] crate::files::FilesError),
    /// wasmtime refused to instantiate the module.
    #[error("cannot instantiate the module")]
    Instantiate(#[source] Source),
    /// The snapshot's memory image does not fit this module.
    #[error("the snapshot's memory image is invalid for this module: {0}")]
    Memory(String),
    /// The memory to restore or receive is larger than the cell's limit.
    #[error(
        "the cell's memory is {bytes} bytes, more than its limit of {limit} bytes; \
         raise the limit (roam run/restore --max-memory, roam node --max-cell-memory)"
    )]
    OverLimit {
        /// Size of the memory image.
        bytes: u64,
        /// The cell's limit.
        limit: u64,
    },
    /// A global in the snapshot does not exist in the module or has another type.
    #[error("global `{name}` in the snapshot does not match the module: {detail}")]
    Global {
        /// Export name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The unwound stack does not fit the buffer it claims to live in.
    #[error("the snapshot's unwound stack is invalid: {0}")]
    Stack(String),
    /// [`crate::Cell::resume`] on a cell that is not stopped at a checkpoint.
    #[error("the cell is not stopped or paused at a checkpoint; nothing to resume")]
    NotStopped,
    /// Post-copy needs userfaultfd, which this host does not provide.
    #[error("post-copy (lazy memory) needs userfaultfd on the destination: {0}")]
    NoUserfaultfd(String),
    /// Setting up lazy memory failed.
    #[error("cannot set up lazy memory: {0}")]
    Lazy(String),
}

/// Running a cell failed (not the program's own exit status).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program trapped.
    #[error("the program trapped")]
    Trap(#[source] Source),
    /// The unwound call stack did not fit in linear memory.
    #[error(
        "the unwound call stack did not fit the program's {capacity}-byte memory; the program was lost at this checkpoint"
    )]
    UnwindOverflow {
        /// Capacity of the buffer.
        capacity: u32,
    },
    /// Taking a checkpoint failed.
    #[error("checkpoint failed")]
    Checkpoint(#[from] CheckpointError),
    /// The checkpoint sink (e.g. writing the snapshot file) failed.
    #[error("could not store the checkpoint")]
    Sink(#[source] Source),
    /// The cell stopped or paused at a checkpoint and was not resumed.
    #[error("the cell stopped at a checkpoint; call Cell::resume before running it again")]
    Stopped,
    /// Post-copy: the pages of memory still at the source cannot be fetched
    /// any more ([`crate::LazyMemory::fail`]). The program was stopped at
    /// once and is lost on this node.
    #[error("memory pages could not be fetched (from the migration source or the memory server), the program was stopped: {0}")]
    PagesLost(String),
    /// [`crate::Controller::kill`] ended the program: no checkpoint was
    /// taken, and it cannot be resumed.
    #[error("the program was killed without a checkpoint")]
    Killed,
}

/// Capturing a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The OS layer could not describe its state.
    #[error("cannot save the OS-layer state")]
    Wasi(#[from] roam_wasi::SaveError),
    /// The Asyncify buffer header is inconsistent.
    #[error("the unwound stack is inconsistent: {0}")]
    Stack(String),
    /// Reading the sandbox files failed.
    #[error("cannot read the sandbox files")]
    Files(#[from] crate::files::FilesError),
    /// wasmtime failed while reading state or calling Asyncify.
    #[error("engine error while checkpointing")]
    Engine(#[source] Source),
}
