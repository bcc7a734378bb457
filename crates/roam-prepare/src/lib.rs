//! `roam prepare`: turn an ordinary WASI command into one that roam can migrate.
//!
//! A running WebAssembly program can only be moved between machines if its
//! call stack can be captured as plain data. Wasmtime keeps the stack in
//! native frames, so this crate rewrites the module ahead of time:
//!
//! 1. **validate** — refuse features whose state roam cannot capture
//!    (threads, exceptions, memory64, multi-memory, run-time table mutation);
//! 2. **instrument** — insert cheap *migration points* (a flag test and a
//!    call to the `roam.migration_point` import) so a running program reaches
//!    a place where it can unwind within bounded time; before and after,
//!    move hot loops of large functions into functions of their own, which
//!    the register allocator handles far better once Asyncify has
//!    instrumented the large one (`outline.rs`);
//! 3. **export** all mutable state (globals, memory, tables) under stable
//!    names, so the host can read and restore it on any architecture;
//! 4. **capture**: by default `eh/` (one `wasm-opt` run, then records of
//!    each frame's live locals, written as the frame leaves by returning,
//!    or by an exception with `--capture eh`, and rewind copies that
//!    rebuild the stack on restore); or, as the fallback, **Asyncify** with
//!    Binaryen's `wasm-opt`, which lets the stack unwind
//!    into linear memory at the migration points and at blocking WASI calls,
//!    then (by default) **spill**: every local goes round a point's call
//!    through scratch globals, so that no value is live across that call
//!    (`spill.rs`), and `wasm-opt` optimises the result;
//! 5. **stamp** a versioned `roam` custom section recording what was done.
//!
//! The output is deterministic and preparing it again is a no-op, once
//! [`check_prepared`] has confirmed that the section matches the module (a
//! forged section is refused, not believed). See
//! `docs/prepare.md` for the pipeline and cost model.
#![deny(missing_docs)]

mod assign;
mod bulk;
mod callgraph;
mod compares;
mod counted;
mod eh;
mod hoist;
mod indirect;
mod instrument;
mod leave;
mod loop_io;
mod memory;
mod names;
mod nest;
mod ops;
mod options;
mod outline;
mod pipeline;
mod pure;
mod quiet;
mod rerun;
mod section;
mod spill;
mod unroll;
mod validate;
mod verify;
mod waits;
mod wasm_opt;

#[cfg(test)]
mod revision_tests;

pub use eh::{
    EhStats, CAPTURE_END_EXPORT, CAPTURE_GLOBAL_EXPORT, NORMAL, REWINDING, REWIND_EXPORT,
    REWIND_THREAD_EXPORT, STATE_EXPORT, TAG_EXPORT, THREAD_START_EXPORT, UNWINDING,
};
pub use leave::{EXIT_ARG_EXPORT_PREFIX, EXIT_GLOBAL_EXPORT};
pub use memory::{initial_memory, DataSegment, MemoryImage};
pub use options::{
    AsyncifyScope, BulkChunks, Capture, CountedLoops, CountedNests, EntryPoints, HoistCalls,
    LiftExits, LoopPoints, OptLevel, Outline, ParseOptionError, ParsePolicyError, PointCalls,
    PointPolicy, PrepareOptions, QuietIndirect, RerunCalls, TrimOutlined, TurnCompares,
    UnrollChecks, ENV_CAPTURE,
};
pub use outline::LOOP_EXPORT_PREFIX;
pub use pipeline::{prepare, PointStats, PrepareError, Prepared};
pub use pure::{ABORT_GLOBAL_EXPORT, BUDGET_GLOBAL_EXPORT, FAST_BUDGET};
pub use section::{read_section, RoamSection, SectionError};
pub use spill::SPILL_EXPORT_PREFIX;
pub use validate::{validate, ModuleInfo, ValidateError};
pub use verify::{check_prepared, CheckError, CHECK_REVISION};
pub use waits::{WAIT32_FUNC, WAIT64_FUNC};
pub use wasm_opt::FEATURE_FLAGS as WASM_OPT_FEATURES;

/// Revision of what [`prepare`] emits for a given input and options. It is
/// part of the key under which prepared modules are cached, so that a node
/// whose cache holds modules prepared by an earlier roam prepares them
/// again instead of serving the old output: otherwise two nodes may hold
/// different prepared modules for the same program and options, and a
/// checkpoint kept on one cannot be restored on the other. Bump it with
/// every change to the output (2: loops outlined, `outline.rs`; 3: no
/// entry point in a function whose every call is inside a loop; 4: inner
/// loops leave to their outer loop's point, `rerun.rs`; 5: pure recursion
/// gives up and runs again, `pure.rs`; indirect calls that reach only quiet
/// functions go through helpers Asyncify leaves alone, `indirect.rs`; 6:
/// short innermost loops check the flag at every other back-edge,
/// `unroll.rs`; 7: loops that make calls that may unwind get hoisted
/// points too, `hoist.rs`; 8: short runs of counted loops take a copy
/// without checks, `counted.rs`; 9: so do short runs of counted nests,
/// `nest.rs`, and loops that count down what is left of a slice; 10: long
/// `memory.fill` and `memory.copy` run in chunks with points, `bulk.rs`;
/// 11: loops that go on while `x < b` or `x > b` are counted too; 12: a
/// long run of a counted nest runs in its outer loop, with one check per
/// trip and none in its inner loops; 13: a short run skips that loop by a
/// branch instead of an `if`/`else`; 14: quiet indirect calls are the
/// default, and their helpers go back into their callers after Asyncify;
/// 15: moved loops pass only the locals that cross the call, `loop_io.rs`,
/// and float compares a `select` takes are turned round, `compares.rs`;
/// 16: calls that end the program are made by the caller's caller,
/// `leave.rs`; 17: a moved loop also takes in each output that some way
/// out of it leaves unset, `loop_io.rs`; 18: capture by exceptions,
/// `eh/`, is the default instead of Asyncify; 19: `--capture returns`,
/// frames that leave by returning instead of by an exception, is the
/// default; 20: the optimiser's run at `O2` leaves out Binaryen's Stack IR
/// passes; 21: the capture by records' run leaves out Binaryen's inlining,
/// `wasm_opt.rs`).
pub const OUTPUT_REVISION: u32 = 21;

/// Name of the exported mutable `i32` global that the host sets to 1 to ask
/// the program to stop at its next migration point.
pub const FLAG_GLOBAL_EXPORT: &str = "roam.flag";
/// Import module of the migration-point function.
pub const POINT_MODULE: &str = "roam";
/// Import name of the migration-point function, type `[] -> []`.
pub const POINT_FUNC: &str = "migration_point";
/// Export-name prefix of every mutable global, followed by the global's index
/// in the *input* module, e.g. `roam.global.0` for `__stack_pointer`.
pub const GLOBAL_EXPORT_PREFIX: &str = "roam.global.";
/// Export name of the module's (single) linear memory.
pub const MEMORY_EXPORT: &str = "roam.memory";
/// Export-name prefix of every table, followed by its index in the input.
pub const TABLE_EXPORT_PREFIX: &str = "roam.table.";
/// Name of the custom section stamped into prepared modules.
pub const SECTION_NAME: &str = "roam";
/// Version of the `roam` custom section encoding written by this crate.
pub const SECTION_VERSION: u32 = 1;
/// Imports at which the stack can unwind (passed to `asyncify-imports`, but
/// for the waits of threaded programs, which Asyncify never sees). The OS
/// layer and the runtime's waits call the suspend hook only inside these.
/// This list is the single source of truth.
pub const ASYNC_IMPORTS: &[(&str, &str)] = &[
    ("roam", "migration_point"),
    ("wasi_snapshot_preview1", "poll_oneoff"),
    ("wasi_snapshot_preview1", "fd_read"),
    ("wasi_snapshot_preview1", "sock_accept"),
    ("wasi_snapshot_preview1", "sock_recv"),
    ("roam", "wait32"),
    ("roam", "wait64"),
];
/// Exports that Asyncify adds and the runtime drives to unwind and rewind.
pub const ASYNCIFY_EXPORTS: &[&str] = &[
    "asyncify_start_unwind",
    "asyncify_stop_unwind",
    "asyncify_start_rewind",
    "asyncify_stop_rewind",
    "asyncify_get_state",
];
