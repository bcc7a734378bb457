//! Kept checkpoints (`docs/control-plane.md`, "Kept checkpoints"): a cell's
//! owner checkpoints it without stopping it and sends the snapshot to
//! another node, the holder, which keeps the newest one per cell on disk;
//! if the owner dies, any node restores the cell from it.
//!
//! Why pages and hashes rather than the snapshot file: the n-th checkpoint
//! of a cell differs from the previous one by what the program wrote
//! meanwhile, but an encoded (compressed) snapshot shifts and changes
//! everywhere. So a kept checkpoint travels as its *state* (the snapshot
//! with a placeholder memory, as in a migration's final state) and its
//! non-zero memory pages, each named by its BLAKE3 hash, the transfer
//! pipeline's chunk hash. The holder says which hashes it lacks, and only
//! those pages go.
//!
//! A kept checkpoint is named by the BLAKE3 of its [`Manifest`]'s digest
//! input: the state's hash, the memory size, and every page's index and
//! hash. Whoever reads one back recomputes all of them.
//!
//! The cell's log as it was at the checkpoint travels along, so that a
//! restored cell's log holds its output before the checkpoint once, and
//! what it writes again after it.
//!
//! A stored version (see `holder`) is a 4-byte little-endian manifest
//! length, the manifest (JSON), the state, the log, then the pages in the
//! manifest's order, the same layout as a `PUT` body.

use std::path::PathBuf;

use roam_snapshot::{MemoryImage, PageBuilder, Snapshot, PAGE_SIZE};

use super::file;
use serde::{Deserialize, Serialize};

/// What a kept checkpoint holds besides its bytes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// The kept checkpoint's name (see the module docs), hex.
    pub snapshot: String,
    /// When the owner took it, Unix milliseconds.
    pub taken_ms: u64,
    /// The generation of the owner that took it.
    #[serde(default)]
    pub generation: Option<u64>,
    /// Linear memory size, bytes.
    pub memory_bytes: u64,
    /// The state's length and hash (hex).
    pub state_len: u64,
    /// BLAKE3 of the state, hex.
    pub state_hash: String,
    /// The cell's output before the checkpoint: its length.
    #[serde(default)]
    pub log_len: u64,
    /// BLAKE3 of the log, hex.
    #[serde(default)]
    pub log_hash: String,
    /// Bytes of output the log had dropped before.
    #[serde(default)]
    pub log_dropped: u64,
    /// Every non-zero page: its index and hash (hex), in index order.
    pub pages: Vec<(u32, String)>,
    /// The hashes whose pages follow the state, in this order (in a `PUT`:
    /// those the holder lacked; in a stored file: every page of `pages`).
    pub sent: Vec<String>,
}

/// Why a kept checkpoint is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeptError {
    #[error("malformed kept checkpoint: {0}")]
    Malformed(String),
    #[error("kept checkpoint does not verify: {0}")]
    Mismatch(String),
    #[error("{0}")]
    Stale(String),
    #[error("{0}")]
    Unknown(String),
    #[error("cannot store the kept checkpoint in {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn hex(h: &[u8; 32]) -> String {
    roam_runtime::cache::hex(h)
}

/// The name of a kept checkpoint, from its manifest's contents.
pub(crate) fn digest(m: &Manifest) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"roam kept checkpoint v1\0");
    h.update(m.state_hash.as_bytes());
    h.update(m.log_hash.as_bytes());
    h.update(&m.log_dropped.to_le_bytes());
    h.update(&m.memory_bytes.to_le_bytes());
    let pages = &m.pages;
    for (i, p) in pages {
        h.update(&i.to_le_bytes());
        h.update(p.as_bytes());
    }
    hex(h.finalize().as_bytes())
}

/// A checkpoint split for keeping: its state, and the hash of each of its
/// non-zero pages. The pages stay in the snapshot, read again as they are
/// sent ([`send_pages`]).
pub(crate) struct Split {
    pub state: Vec<u8>,
    pub memory_bytes: u64,
    /// (index, hash) of every non-zero page.
    pub pages: Vec<(u32, [u8; 32])>,
}

/// Split a checkpoint taken on this node.
pub(crate) fn split(
    snap: &Snapshot,
    initial: &roam_snapshot::InitialImage,
) -> Result<Split, String> {
    let memory_bytes = snap.memory.byte_len();
    let pages = snap
        .memory
        .nonzero_pages(initial)
        .map_err(|e| format!("cannot read the checkpoint's memory: {e}"))?
        .map(|(i, p)| (i as u32, *blake3::hash(p).as_bytes()))
        .collect();
    // Field by field: a clone of the snapshot would copy its memory.
    let state = Snapshot {
        module: snap.module.clone(),
        origin: snap.origin.clone(),
        memory: MemoryImage::placeholder(memory_bytes, initial),
        globals: snap.globals.clone(),
        stack: snap.stack.clone(),
        os_state: snap.os_state.clone(),
        files: snap.files.clone(),
    };
    let state = state
        .encode(&roam_snapshot::EncodeOptions::default())
        .map_err(|e| format!("cannot encode the checkpoint's state: {e}"))?;
    Ok(Split {
        state,
        memory_bytes,
        pages,
    })
}

/// Pages per chunk of a streamed body.
const CHUNK_PAGES: usize = 64;

/// Send the pages of `snap` whose indices are in `send` (increasing) to
/// `tx`, in chunks of [`CHUNK_PAGES`]: the tail of a `PUT` body. Runs on a
/// blocking thread; the channel's bound keeps a few chunks in memory.
pub(crate) fn send_pages(
    snap: &Snapshot,
    initial: &roam_snapshot::InitialImage,
    send: &[u32],
    tx: &tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
) -> Result<(), String> {
    let mut want = send.iter().copied().peekable();
    let mut chunk = Vec::with_capacity(CHUNK_PAGES * PAGE_SIZE);
    let pages = snap
        .memory
        .nonzero_pages(initial)
        .map_err(|e| format!("cannot read the checkpoint's memory: {e}"))?;
    let gone = || "the holder stopped reading the checkpoint".to_string();
    for (i, p) in pages {
        if want.peek() != Some(&(i as u32)) {
            continue;
        }
        want.next();
        chunk.extend_from_slice(p);
        if chunk.len() == CHUNK_PAGES * PAGE_SIZE {
            let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK_PAGES * PAGE_SIZE));
            tx.blocking_send(Ok(full.into())).map_err(|_| gone())?;
        }
    }
    if let Some(i) = want.next() {
        return Err(format!("page {i} is not in the checkpoint"));
    }
    if !chunk.is_empty() {
        tx.blocking_send(Ok(chunk.into())).map_err(|_| gone())?;
    }
    Ok(())
}

/// Rebuild the snapshot of a stored kept checkpoint (its head read by
/// [`file::read_head`]), for `initial` (the module's initial image on the
/// restoring node). Every hash is checked as its bytes are read, and the
/// memory is built page by page, never whole.
pub(crate) fn rebuild(
    f: &std::fs::File,
    head: &file::Head,
    initial: &roam_snapshot::InitialImage,
) -> Result<(Snapshot, Vec<u8>), KeptError> {
    let m = &head.m;
    if m.sent.len() != m.pages.len() || m.sent.iter().zip(&m.pages).any(|(s, (_, p))| s != p) {
        return Err(KeptError::Malformed(
            "a stored kept checkpoint lacks pages".into(),
        ));
    }
    let (state, log) = file::state_and_log(f, head)?;
    let mut snap = Snapshot::decode_state(&state)
        .map_err(|e| KeptError::Malformed(format!("the kept state: {e}")))?;
    if snap.memory.byte_len() != m.memory_bytes {
        return Err(KeptError::Malformed(
            "the kept state's memory size differs from its manifest's".into(),
        ));
    }
    let mut b =
        PageBuilder::new(m.memory_bytes, initial, m.pages.len()).map_err(KeptError::Malformed)?;
    let mut page = vec![0u8; PAGE_SIZE];
    for (k, (i, _)) in m.pages.iter().enumerate() {
        file::page(f, head, k, &mut page)?;
        b.add(u64::from(*i), &page).map_err(KeptError::Malformed)?;
    }
    snap.memory = b.finish();
    Ok((snap, log))
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
