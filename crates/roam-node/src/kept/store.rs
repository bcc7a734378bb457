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
    /// Every non-zero page: its index and hash, in index order.
    pub pages: Vec<(u32, PageHash)>,
    /// The hashes whose pages follow the state, in this order (in a `PUT`:
    /// those the holder lacked; in a stored file: every page of `pages`).
    pub sent: Vec<PageHash>,
}

/// A page's BLAKE3 hash: 32 bytes in memory, 64 lowercase hex digits in
/// JSON (so manifests read and write as before).
///
/// Why not the hex `String`: a manifest names every page of a cell, a
/// million for 4 GiB, and a holder has several manifests and sets of them
/// in memory while it stores one. As strings each took about 100 bytes of
/// heap; as this, 32 and no allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PageHash(pub [u8; 32]);

impl PageHash {
    /// The hash of `page`.
    pub(crate) fn of(page: &[u8]) -> PageHash {
        PageHash(*blake3::hash(page).as_bytes())
    }

    /// As 64 hex digits, without allocating.
    pub(crate) fn hex_bytes(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 64];
        for (o, b) in out.chunks_exact_mut(2).zip(self.0) {
            o[0] = DIGITS[usize::from(b >> 4)];
            o[1] = DIGITS[usize::from(b & 15)];
        }
        out
    }
}

impl std::fmt::Display for PageHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = self.hex_bytes();
        f.write_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"))
    }
}

impl std::fmt::Debug for PageHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for PageHash {
    type Err = String;
    fn from_str(s: &str) -> Result<PageHash, String> {
        roam_wire::ident::parse_module_hash(s)
            .map(PageHash)
            .map_err(|_| format!("`{s}` is not a BLAKE3 hash in hex"))
    }
}

impl Serialize for PageHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let hex = self.hex_bytes();
        s.serialize_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"))
    }
}

impl<'de> Deserialize<'de> for PageHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PageHash, D::Error> {
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = PageHash;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a BLAKE3 hash in 64 lowercase hex digits")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PageHash, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Hex)
    }
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
        // The hash as text, as names were made when it was a string.
        h.update(&p.hex_bytes());
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
    pub pages: Vec<(u32, PageHash)>,
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
        .map(|(i, p)| (i as u32, PageHash::of(p)))
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
        threads: snap.threads.clone(),
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
