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

use roam_snapshot::{MemoryImage, Snapshot, PAGE_SIZE};
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

/// A checkpoint split for keeping: its state, and its non-zero pages.
pub(crate) struct Split {
    pub state: Vec<u8>,
    pub memory_bytes: u64,
    /// (index, hash, page) of every non-zero page.
    pub pages: Vec<(u32, [u8; 32], Box<[u8]>)>,
}

/// Split a checkpoint taken on this node.
pub(crate) fn split(
    snap: &Snapshot,
    initial: &roam_snapshot::InitialImage,
) -> Result<Split, String> {
    let memory_bytes = snap.memory.byte_len();
    let len = usize::try_from(memory_bytes).map_err(|e| e.to_string())?;
    let mut mem = vec![0u8; len];
    snap.memory
        .restore_into(&mut mem, initial, false)
        .map_err(|e| format!("cannot read the checkpoint's memory: {e}"))?;
    let pages = mem
        .chunks(PAGE_SIZE)
        .enumerate()
        .filter(|(_, p)| p.iter().any(|&b| b != 0))
        .map(|(i, p)| (i as u32, *blake3::hash(p).as_bytes(), Box::from(p)))
        .collect();
    let mut state = snap.clone();
    state.memory = MemoryImage::placeholder(memory_bytes, initial);
    let state = state
        .encode(&roam_snapshot::EncodeOptions::default())
        .map_err(|e| format!("cannot encode the checkpoint's state: {e}"))?;
    Ok(Split {
        state,
        memory_bytes,
        pages,
    })
}

/// A kept checkpoint's parts, borrowed from its bytes.
pub(crate) struct Framed<'a> {
    pub m: Manifest,
    pub state: &'a [u8],
    pub log: &'a [u8],
    pub pages: Vec<&'a [u8]>,
}

/// Body layout shared by `PUT /v1/kept/{cell}` and the stored file.
pub(crate) fn frame(m: &Manifest, state: &[u8], log: &[u8], pages: &[&[u8]]) -> Vec<u8> {
    let json = serde_json::to_vec(m).expect("a manifest serializes");
    let mut out =
        Vec::with_capacity(4 + json.len() + state.len() + log.len() + pages.len() * PAGE_SIZE);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(state);
    out.extend_from_slice(log);
    for p in pages {
        out.extend_from_slice(p);
    }
    out
}

/// Most bytes of a manifest (a 4 GiB memory has a million pages of about
/// 70 bytes of JSON each).
const MAX_MANIFEST: usize = 96 << 20;

/// Read a framed body: the manifest, the state and the pages that follow,
/// each length checked before use, each page's hash and the state's hash
/// verified.
pub(crate) fn unframe(b: &[u8], max_memory: u64) -> Result<Framed<'_>, KeptError> {
    let bad = |m: &str| KeptError::Malformed(m.to_string());
    let len = b
        .get(..4)
        .map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize)
        .ok_or_else(|| bad("shorter than its length prefix"))?;
    if len > MAX_MANIFEST || 4 + len > b.len() {
        return Err(bad("manifest length past the end"));
    }
    let m: Manifest =
        serde_json::from_slice(&b[4..4 + len]).map_err(|e| KeptError::Malformed(e.to_string()))?;
    if m.memory_bytes > max_memory || !m.memory_bytes.is_multiple_of(65536) {
        return Err(KeptError::Malformed(format!(
            "memory of {} bytes: not whole wasm pages, or over this node's limit of {max_memory}",
            m.memory_bytes
        )));
    }
    let page_count = m.memory_bytes / PAGE_SIZE as u64;
    let mut last = None;
    for (i, _) in &m.pages {
        if u64::from(*i) >= page_count || last.is_some_and(|l| l >= *i) {
            return Err(bad("page indices out of range or out of order"));
        }
        last = Some(*i);
    }
    let rest = &b[4 + len..];
    let state_len = usize::try_from(m.state_len).map_err(|_| bad("state length"))?;
    let log_len = usize::try_from(m.log_len).map_err(|_| bad("log length"))?;
    let want = m
        .sent
        .len()
        .checked_mul(PAGE_SIZE)
        .and_then(|p| p.checked_add(state_len))
        .and_then(|p| p.checked_add(log_len))
        .ok_or_else(|| bad("lengths overflow"))?;
    if rest.len() != want {
        return Err(KeptError::Malformed(format!(
            "{} bytes after the manifest, {want} announced",
            rest.len()
        )));
    }
    let (state, rest) = rest.split_at(state_len);
    let (log, pages) = rest.split_at(log_len);
    if hex(blake3::hash(state).as_bytes()) != m.state_hash {
        return Err(KeptError::Mismatch("the state's hash".into()));
    }
    if hex(blake3::hash(log).as_bytes()) != m.log_hash {
        return Err(KeptError::Mismatch("the log's hash".into()));
    }
    let pages: Vec<&[u8]> = pages.chunks(PAGE_SIZE).collect();
    for (p, h) in pages.iter().zip(&m.sent) {
        if hex(blake3::hash(p).as_bytes()) != *h {
            return Err(KeptError::Mismatch(format!("page {h}")));
        }
    }
    if digest(&m) != m.snapshot {
        return Err(KeptError::Mismatch(format!(
            "the manifest does not name snapshot {}",
            m.snapshot
        )));
    }
    Ok(Framed {
        m,
        state,
        log,
        pages,
    })
}

/// Rebuild the snapshot of a verified kept checkpoint, for `initial` (the
/// module's initial image on the restoring node).
pub(crate) fn rebuild(
    f: &Framed<'_>,
    initial: &roam_snapshot::InitialImage,
) -> Result<Snapshot, String> {
    let (m, state, pages) = (&f.m, f.state, &f.pages);
    if pages.len() != m.pages.len() {
        return Err("a stored kept checkpoint lacks pages".into());
    }
    let mut snap = Snapshot::decode_state(state).map_err(|e| format!("the kept state: {e}"))?;
    if snap.memory.byte_len() != m.memory_bytes {
        return Err("the kept state's memory size differs from its manifest's".into());
    }
    let len = usize::try_from(m.memory_bytes).map_err(|e| e.to_string())?;
    let mut mem = vec![0u8; len];
    for ((i, _), p) in m.pages.iter().zip(pages) {
        let at = *i as usize * PAGE_SIZE;
        mem[at..at + PAGE_SIZE].copy_from_slice(p);
    }
    snap.memory = MemoryImage::capture(&mem, initial);
    Ok(snap)
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
