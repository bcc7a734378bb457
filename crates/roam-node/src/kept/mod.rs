//! Kept checkpoints: a cell's owner checkpoints it without stopping it and
//! sends it to another node, the holder; if the owner dies, any node
//! restores the cell from it (`docs/control-plane.md`, "Kept checkpoints").
//!
//! [`store`] is the format, [`file`] reads and writes it a page at a time,
//! [`holder`] keeps the holder's files (which node may store or
//! read which cell's is [`crate::grants`]); [`ops`] the operations of the
//! owner, the holder and the restoring node.

pub(crate) mod file;
pub(crate) mod holder;
pub(crate) mod ops;
pub(crate) mod store;

/// Give the heap's free memory back to the system, after a holder stored
/// or listed a checkpoint.
///
/// Why: a holder parses manifests, builds maps of every page's hash and
/// frees them, on whichever blocking thread ran the request. glibc keeps
/// what a thread freed in that thread's arena for reuse, so a holder's
/// resident memory grew with each checkpoint it took to about 0.4× the
/// checkpoint's size (`roam-bench kept`), memory no cell uses. Trimming
/// returns the free pages of every arena; it costs a walk of the heap,
/// once per checkpoint.
pub(crate) fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory of the allocator's
    // own arenas; it takes no pointer and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Store `upload` as a kept checkpoint of a cell in `state_dir`, as a
/// holder stores a `PUT`'s body: for the fuzz target of this parser.
#[doc(hidden)]
pub fn fuzz_upload(
    state_dir: &std::path::Path,
    upload: &std::fs::File,
    max_memory: u64,
) -> Result<(), String> {
    holder::Holder::new(state_dir)
        .put("fuzz", upload, max_memory)
        .map(drop)
        .map_err(|e| e.to_string())
}
