//! A content-addressed store of 4 KiB chunks at the destination.
//!
//! A node that has run (or received) a cell before often still holds many of
//! its pages: library code, shared data, a previous version of the heap. The
//! source cannot send "the chunk you already have" unless it knows what the
//! destination holds, so the store can describe itself compactly
//! ([`StoreSummary`]) for the handshake. The store is bounded by a byte budget
//! and evicts the least recently used chunks.

use crate::PAGE_SIZE;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

/// A BLAKE3 hash of one page.
pub type ChunkHash = [u8; 32];

/// One page of bytes.
pub type Page = [u8; PAGE_SIZE];

struct Entry {
    data: Arc<Page>,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<ChunkHash, Entry>,
    lru: BTreeMap<u64, ChunkHash>,
    tick: u64,
}

/// Thread-safe, byte-bounded, LRU-evicting chunk store keyed by BLAKE3.
pub struct ChunkStore {
    budget_chunks: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStore")
            .field("budget_chunks", &self.budget_chunks)
            .field("len", &self.len())
            .finish()
    }
}

impl ChunkStore {
    /// A store that keeps at most `budget_bytes` of chunk data (rounded down
    /// to whole chunks; bookkeeping adds roughly 100 bytes per chunk).
    pub fn new(budget_bytes: u64) -> Self {
        ChunkStore {
            budget_chunks: (budget_bytes / PAGE_SIZE as u64) as usize,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is always left consistent between statements, so a panic in
        // another thread does not invalidate it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of chunks held.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Insert pages (each exactly [`PAGE_SIZE`] bytes; others are ignored).
    /// Hashing happens before the lock is taken, and the lock is taken once.
    /// Returns the number of chunks that were new.
    pub fn insert_many<'a>(&self, pages: impl IntoIterator<Item = &'a [u8]>) -> usize {
        let hashed: Vec<(ChunkHash, Arc<Page>)> = pages
            .into_iter()
            .filter_map(|p| <&Page>::try_from(p).ok())
            .map(|p| (*blake3::hash(p).as_bytes(), Arc::new(*p)))
            .collect();
        self.insert_hashed(hashed)
    }

    /// Insert pages whose hashes the caller already computed (they must be
    /// BLAKE3 of the data; the decoder relies on it). Returns how many were new.
    pub fn insert_hashed(&self, chunks: Vec<(ChunkHash, Arc<Page>)>) -> usize {
        let mut g = self.lock();
        let inner = &mut *g;
        let mut new = 0;
        for (hash, data) in chunks {
            inner.tick += 1;
            let tick = inner.tick;
            if let Some(e) = inner.map.get_mut(&hash) {
                inner.lru.remove(&e.tick);
                e.tick = tick;
            } else {
                inner.map.insert(hash, Entry { data, tick });
                new += 1;
            }
            inner.lru.insert(tick, hash);
        }
        while inner.map.len() > self.budget_chunks {
            let Some((_, victim)) = inner.lru.pop_first() else {
                break;
            };
            inner.map.remove(&victim);
        }
        new
    }

    /// The chunk with this hash, marking it recently used.
    pub fn get(&self, hash: &ChunkHash) -> Option<Arc<Page>> {
        let mut g = self.lock();
        let inner = &mut *g;
        inner.tick += 1;
        let tick = inner.tick;
        let e = inner.map.get_mut(hash)?;
        inner.lru.remove(&e.tick);
        e.tick = tick;
        inner.lru.insert(tick, *hash);
        Some(e.data.clone())
    }

    /// Whether the chunk is present (does not touch recency).
    pub fn contains(&self, hash: &ChunkHash) -> bool {
        self.lock().map.contains_key(hash)
    }

    /// A compact description of the store's contents for the handshake.
    pub fn summary(&self) -> StoreSummary {
        let g = self.lock();
        let mut prefixes: Vec<u64> = g.map.keys().map(prefix).collect();
        drop(g);
        prefixes.sort_unstable();
        prefixes.dedup();
        StoreSummary { prefixes }
    }
}

fn prefix(hash: &ChunkHash) -> u64 {
    let mut p = [0u8; 8];
    p.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(p)
}

/// The set of chunks a destination holds, as sorted 8-byte hash prefixes.
///
/// Exact for the chunks present; a chunk that is absent matches only if its
/// 64-bit prefix collides with a present one (probability about n / 2^64 per
/// lookup for n chunks). A `Stored` record carries the full hash, so such a
/// collision is detected at the destination as an unknown chunk, never as
/// wrong memory. Encoded size: 4 + 8 bytes per chunk (8 MiB for 1M chunks).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSummary {
    prefixes: Vec<u64>,
}

/// Why a summary could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    /// The byte length disagrees with the declared count.
    #[error("store summary declares {declared} prefixes ({need} bytes) but has {len} bytes")]
    Length {
        /// Declared prefix count.
        declared: u32,
        /// Bytes that count needs.
        need: u64,
        /// Bytes present.
        len: usize,
    },
    /// Prefixes are not strictly increasing.
    #[error("store summary prefixes are not sorted and unique at position {0}")]
    Unsorted(usize),
}

impl StoreSummary {
    /// Whether a chunk with this hash is (probably) present.
    pub fn contains(&self, hash: &ChunkHash) -> bool {
        self.prefixes.binary_search(&prefix(hash)).is_ok()
    }

    /// Number of chunks described.
    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    /// Whether the summary is empty.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// Encode: `u32` LE count, then each prefix as `u64` LE, ascending.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + 8 * self.prefixes.len());
        out.extend_from_slice(&(self.prefixes.len() as u32).to_le_bytes());
        for p in &self.prefixes {
            out.extend_from_slice(&p.to_le_bytes());
        }
        out
    }

    /// Decode what [`StoreSummary::to_bytes`] produced.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SummaryError> {
        let declared = match bytes.get(..4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => {
                return Err(SummaryError::Length {
                    declared: 0,
                    need: 4,
                    len: bytes.len(),
                })
            }
        };
        let need = 4 + 8 * u64::from(declared);
        if need != bytes.len() as u64 {
            return Err(SummaryError::Length {
                declared,
                need,
                len: bytes.len(),
            });
        }
        let prefixes: Vec<u64> = bytes[4..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        if let Some(i) = prefixes.windows(2).position(|w| w[0] >= w[1]) {
            return Err(SummaryError::Unsorted(i + 1));
        }
        Ok(StoreSummary { prefixes })
    }
}
