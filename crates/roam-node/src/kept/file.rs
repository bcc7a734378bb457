//! Kept checkpoints on disk and on the wire, a page at a time.
//!
//! Why not in memory: a kept checkpoint is as large as its cell's memory.
//! Held whole, the owner's body, the holder's upload, the holder's old and
//! new versions and a restore's download each cost one more copy of it,
//! and a node near its memory cap was killed on a checkpoint tick. Here an
//! upload goes to a file as it arrives, is checked there (every hash), and
//! a new version is assembled from the upload and the previous version by
//! reading one page at a time. The memory used is the manifest's.
//!
//! The layout (see `store`): a 4-byte little-endian manifest length, the
//! manifest (JSON), the state, the log, then the pages named by the
//! manifest's `sent`, in that order.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use roam_snapshot::PAGE_SIZE;

use super::store::{digest, KeptError, Manifest, PageHash};

/// Most bytes of a manifest (a 4 GiB memory has a million pages of about
/// 70 bytes of JSON each).
pub(crate) const MAX_MANIFEST: usize = 96 << 20;

fn bad(m: impl Into<String>) -> KeptError {
    KeptError::Malformed(m.into())
}

fn hex(h: &blake3::Hash) -> String {
    roam_runtime::cache::hex(h.as_bytes())
}

/// A kept checkpoint's manifest, checked against the file it heads.
pub(crate) struct Head {
    pub m: Manifest,
    /// Where the state starts.
    state_at: u64,
}

impl Head {
    /// Where the log starts.
    fn log_at(&self) -> u64 {
        self.state_at + self.m.state_len
    }

    /// Where the `k`-th page of `sent` starts.
    pub(crate) fn page_at(&self, k: usize) -> u64 {
        self.log_at() + self.m.log_len + (k * PAGE_SIZE) as u64
    }
}

/// The first bytes of a body or file: the length prefix and the manifest.
pub(crate) fn head_bytes(m: &Manifest, state: &[u8], log: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(m).expect("a manifest serializes");
    let mut out = Vec::with_capacity(4 + json.len() + state.len() + log.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(state);
    out.extend_from_slice(log);
    out
}

/// Read and check the manifest of the `len`-byte kept checkpoint `f`:
/// every length before it is used, the page indices, that the file's
/// length is what the manifest announces, and that the manifest names
/// itself. The body's hashes are checked by [`verify`].
pub(crate) fn read_head(f: &File, len: u64, max_memory: u64) -> Result<Head, KeptError> {
    let mut prefix = [0u8; 4];
    f.read_exact_at(&mut prefix, 0)
        .map_err(|_| bad("shorter than its length prefix"))?;
    let json_len = u32::from_le_bytes(prefix) as usize;
    if json_len > MAX_MANIFEST || 4 + json_len as u64 > len {
        return Err(bad("manifest length past the end"));
    }
    let mut json = vec![0u8; json_len];
    f.read_exact_at(&mut json, 4)
        .map_err(|e| bad(e.to_string()))?;
    let m: Manifest = serde_json::from_slice(&json).map_err(|e| bad(e.to_string()))?;
    if m.memory_bytes > max_memory || !m.memory_bytes.is_multiple_of(65536) {
        return Err(bad(format!(
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
    if m.sent.len() > m.pages.len() {
        return Err(bad("more pages sent than the checkpoint has"));
    }
    let want = (m.sent.len() as u64)
        .checked_mul(PAGE_SIZE as u64)
        .and_then(|p| p.checked_add(m.state_len))
        .and_then(|p| p.checked_add(m.log_len))
        .ok_or_else(|| bad("lengths overflow"))?;
    let state_at = 4 + json_len as u64;
    if len - state_at != want {
        return Err(bad(format!(
            "{} bytes after the manifest, {want} announced",
            len - state_at
        )));
    }
    if digest(&m) != m.snapshot {
        return Err(KeptError::Mismatch(format!(
            "the manifest does not name snapshot {}",
            m.snapshot
        )));
    }
    Ok(Head { m, state_at })
}

/// Hash `len` bytes of `r`.
fn hash_of(r: &mut impl Read, len: u64) -> Result<blake3::Hash, KeptError> {
    let mut h = blake3::Hasher::new();
    let n = std::io::copy(&mut r.take(len), &mut h).map_err(|e| bad(e.to_string()))?;
    if n != len {
        return Err(bad("shorter than its manifest says"));
    }
    Ok(h.finalize())
}

/// Check every hash of the body of `f` against its manifest: the state,
/// the log and each page sent. Reads sequentially, a page at a time.
pub(crate) fn verify(f: &File, head: &Head) -> Result<(), KeptError> {
    let mut r = BufReader::with_capacity(1 << 16, f);
    r.seek(SeekFrom::Start(head.state_at))
        .map_err(|e| bad(e.to_string()))?;
    if hex(&hash_of(&mut r, head.m.state_len)?) != head.m.state_hash {
        return Err(KeptError::Mismatch("the state's hash".into()));
    }
    if hex(&hash_of(&mut r, head.m.log_len)?) != head.m.log_hash {
        return Err(KeptError::Mismatch("the log's hash".into()));
    }
    let mut page = vec![0u8; PAGE_SIZE];
    for h in &head.m.sent {
        r.read_exact(&mut page).map_err(|e| bad(e.to_string()))?;
        if PageHash::of(&page) != *h {
            return Err(KeptError::Mismatch(format!("page {h}")));
        }
    }
    Ok(())
}

/// The state and the log of a checked file, each checked against its hash.
pub(crate) fn state_and_log(f: &File, head: &Head) -> Result<(Vec<u8>, Vec<u8>), KeptError> {
    let read = |at: u64, len: u64, hash: &str, what: &str| {
        let len = usize::try_from(len).map_err(|_| bad(format!("{what} length")))?;
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, at)
            .map_err(|e| bad(e.to_string()))?;
        if hex(&blake3::hash(&b)) != hash {
            return Err(KeptError::Mismatch(format!("the {what}'s hash")));
        }
        Ok(b)
    };
    Ok((
        read(head.state_at, head.m.state_len, &head.m.state_hash, "state")?,
        read(head.log_at(), head.m.log_len, &head.m.log_hash, "log")?,
    ))
}

/// The `k`-th page sent in `f`, as it is (for a file [`verify`] checked).
pub(crate) fn read_page(f: &File, head: &Head, k: usize, buf: &mut [u8]) -> Result<(), KeptError> {
    if k >= head.m.sent.len() {
        return Err(bad(format!("no page {k}")));
    }
    f.read_exact_at(buf, head.page_at(k))
        .map_err(|e| bad(e.to_string()))
}

/// The `k`-th page sent in `f`, checked against its hash.
pub(crate) fn page(f: &File, head: &Head, k: usize, buf: &mut [u8]) -> Result<(), KeptError> {
    read_page(f, head, k, buf)?;
    if PageHash::of(buf) != head.m.sent[k] {
        return Err(KeptError::Mismatch(format!("page {}", head.m.sent[k])));
    }
    Ok(())
}
