//! The destination side: applying batches to a memory.
//!
//! A batch is verified (checksum, structure, page bounds) as a whole before
//! any record is applied, so a corrupt batch changes nothing. Each record is
//! then fully resolved into a page buffer (chunk lookup, decompression, XOR)
//! before the target is written, so a record that fails leaves its page as it
//! was; records before it in the same batch stay applied, and the error says
//! how many.

use crate::codec::{decompress_page, CodecError};
use crate::record::{decode_batch, BatchError, Record};
use crate::store::{ChunkStore, Page};
use crate::target::PageTarget;
use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Why a batch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The batch bytes are malformed; nothing was applied.
    #[error("batch rejected, nothing applied: {0}")]
    Batch(#[from] BatchError),
    /// A record names a page beyond the memory; nothing was applied.
    #[error("record {record} names page {page} but the memory has {pages} pages; nothing applied")]
    PageOutOfRange {
        /// Record number.
        record: usize,
        /// The page (or copy source) named.
        page: u32,
        /// Pages in the target.
        pages: u32,
    },
    /// A `Stored` record names a chunk the store does not hold.
    #[error(
        "record {record} (page {page}) needs stored chunk {hash} which this node does not hold \
         (evicted, or no store); {applied} earlier records applied, request the page again"
    )]
    UnknownChunk {
        /// Record number.
        record: usize,
        /// Page index.
        page: u32,
        /// Hex of the chunk hash.
        hash: String,
        /// Records of this batch applied before it.
        applied: usize,
    },
    /// A payload failed to decompress.
    #[error("record {record} (page {page}): {source}; {applied} earlier records applied")]
    Codec {
        /// Record number.
        record: usize,
        /// Page index.
        page: u32,
        /// What went wrong.
        source: CodecError,
        /// Records of this batch applied before it.
        applied: usize,
    },
}

/// Counts of what the decoder applied, by record kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeStats {
    /// Batches fully applied.
    pub batches: u64,
    /// Bytes of batches fully applied.
    pub bytes: u64,
    /// `Zero` records.
    pub zero: u64,
    /// `Initial` records.
    pub initial: u64,
    /// `Copy` records.
    pub copy: u64,
    /// `Stored` records.
    pub stored: u64,
    /// `Raw` records.
    pub raw: u64,
    /// `Delta` records.
    pub delta: u64,
}

/// Applies batches, in the order the encoder produced them, to a target.
#[derive(Debug)]
pub struct Decoder {
    store: Option<Arc<ChunkStore>>,
    learn: bool,
    stats: DecodeStats,
    buf: Box<Page>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            store: None,
            learn: false,
            stats: DecodeStats::default(),
            buf: Box::new([0; PAGE_SIZE]),
        }
    }
}

impl Decoder {
    /// A decoder without a chunk store (`Stored` records fail).
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolve `Stored` records from `store`. With `learn`, every page that
    /// arrives as `Raw` or `Delta` is also inserted into the store, so a
    /// later migration to this node can refer to it.
    pub fn with_store(store: Arc<ChunkStore>, learn: bool) -> Self {
        Decoder {
            store: Some(store),
            learn,
            ..Self::default()
        }
    }

    /// What has been applied so far.
    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Apply one batch. Returns the number of records applied.
    pub fn apply<T: PageTarget + ?Sized>(
        &mut self,
        batch: &[u8],
        target: &mut T,
    ) -> Result<usize, ApplyError> {
        let records = decode_batch(batch)?;
        let pages = target.page_count();
        for (record, r) in records.iter().enumerate() {
            let from = if let Record::Copy { from, .. } = r {
                *from
            } else {
                0
            };
            for page in [r.index(), from] {
                if page >= pages {
                    return Err(ApplyError::PageOutOfRange {
                        record,
                        page,
                        pages,
                    });
                }
            }
        }
        let mut learned = Vec::new();
        for (record, r) in records.iter().enumerate() {
            let codec_err = |source, page| ApplyError::Codec {
                record,
                page,
                source,
                applied: record,
            };
            match *r {
                Record::Zero { index } => {
                    target.zero(index);
                    self.stats.zero += 1;
                }
                Record::Initial { index } => {
                    target.initial(index);
                    self.stats.initial += 1;
                }
                Record::Copy { index, from } => {
                    if index != from {
                        self.buf.copy_from_slice(target.page(from));
                        target.write(index, &self.buf[..]);
                    }
                    self.stats.copy += 1;
                }
                Record::Stored { index, hash } => {
                    let chunk =
                        self.store
                            .as_ref()
                            .and_then(|s| s.get(&hash))
                            .ok_or_else(|| ApplyError::UnknownChunk {
                                record,
                                page: index,
                                hash: hex(&hash),
                                applied: record,
                            })?;
                    target.write(index, &chunk[..]);
                    self.stats.stored += 1;
                }
                Record::Raw { index, codec, data } => {
                    decompress_page(codec, data, &mut self.buf).map_err(|e| codec_err(e, index))?;
                    target.write(index, &self.buf[..]);
                    self.stats.raw += 1;
                    if self.learn {
                        learned.push(self.hashed());
                    }
                }
                Record::Delta { index, codec, data } => {
                    decompress_page(codec, data, &mut self.buf).map_err(|e| codec_err(e, index))?;
                    let cur = target.page(index);
                    for (b, c) in self.buf.iter_mut().zip(cur.iter()) {
                        *b ^= c;
                    }
                    target.write(index, &self.buf[..]);
                    self.stats.delta += 1;
                    if self.learn {
                        learned.push(self.hashed());
                    }
                }
            }
        }
        if let Some(store) = &self.store {
            if !learned.is_empty() {
                store.insert_hashed(learned);
            }
        }
        self.stats.batches += 1;
        self.stats.bytes += batch.len() as u64;
        Ok(records.len())
    }

    fn hashed(&self) -> ([u8; 32], Arc<Page>) {
        (*blake3::hash(&self.buf[..]).as_bytes(), Arc::new(*self.buf))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
