//! The batch wire format: records for pages, packed into checksummed batches.
//!
//! The format is deliberately small and self-delimiting so that the transport
//! can frame batches however it likes. Decoding treats input as hostile: every
//! length is checked against what remains before it is used, nothing is
//! allocated from a declared size, and corruption is caught by a checksum
//! before any record is interpreted. See `docs/transfer.md` for the layout.

mod decode;

pub use decode::{decode_batch, BatchError};

/// Version byte that starts every batch.
pub const BATCH_VERSION: u8 = 1;
/// Bytes after the records: record count (u32 LE) and an 8-byte checksum.
pub const TRAILER_LEN: usize = 12;

pub(crate) const TAG_ZERO: u8 = 0;
pub(crate) const TAG_INITIAL: u8 = 1;
pub(crate) const TAG_COPY: u8 = 2;
pub(crate) const TAG_STORED: u8 = 3;
pub(crate) const TAG_RAW: u8 = 4;
pub(crate) const TAG_DELTA: u8 = 5;

/// How page `index` gets its new contents at the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// The page is all zeros.
    Zero {
        /// Page index.
        index: u32,
    },
    /// The page equals the module's initial image page at the same index.
    Initial {
        /// Page index.
        index: u32,
    },
    /// The page equals what page `from` holds at the destination right now.
    Copy {
        /// Page index.
        index: u32,
        /// Source page at the destination.
        from: u32,
    },
    /// The page is the chunk with this BLAKE3 hash in the destination's store.
    Stored {
        /// Page index.
        index: u32,
        /// Full BLAKE3 hash of the page.
        hash: [u8; 32],
    },
    /// The page, compressed.
    Raw {
        /// Page index.
        index: u32,
        /// Codec wire id.
        codec: u8,
        /// Compressed bytes.
        data: &'a [u8],
    },
    /// The XOR of the new page with the destination's current page, compressed.
    Delta {
        /// Page index.
        index: u32,
        /// Codec wire id.
        codec: u8,
        /// Compressed bytes.
        data: &'a [u8],
    },
}

impl Record<'_> {
    /// The page this record writes.
    pub fn index(&self) -> u32 {
        match *self {
            Record::Zero { index }
            | Record::Initial { index }
            | Record::Copy { index, .. }
            | Record::Stored { index, .. }
            | Record::Raw { index, .. }
            | Record::Delta { index, .. } => index,
        }
    }

    /// Append this record's encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match *self {
            Record::Zero { index } => head(out, TAG_ZERO, index),
            Record::Initial { index } => head(out, TAG_INITIAL, index),
            Record::Copy { index, from } => {
                head(out, TAG_COPY, index);
                put_varint(out, from);
            }
            Record::Stored { index, hash } => {
                head(out, TAG_STORED, index);
                out.extend_from_slice(&hash);
            }
            Record::Raw { index, codec, data } | Record::Delta { index, codec, data } => {
                let tag = if matches!(self, Record::Raw { .. }) {
                    TAG_RAW
                } else {
                    TAG_DELTA
                };
                head(out, tag, index);
                out.push(codec);
                put_varint(out, data.len() as u32);
                out.extend_from_slice(data);
            }
        }
    }
}

fn head(out: &mut Vec<u8>, tag: u8, index: u32) {
    out.push(tag);
    put_varint(out, index);
}

/// LEB128, at most 5 bytes for a `u32`.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Checksum of a batch (everything before the checksum itself): the first 8
/// bytes of its BLAKE3 hash.
pub fn batch_checksum(bytes: &[u8]) -> [u8; 8] {
    let h = blake3::hash(bytes);
    let mut c = [0u8; 8];
    c.copy_from_slice(&h.as_bytes()[..8]);
    c
}

/// Accumulates encoded records into one batch.
#[derive(Debug)]
pub struct BatchWriter {
    buf: Vec<u8>,
    count: u32,
}

impl Default for BatchWriter {
    fn default() -> Self {
        BatchWriter {
            buf: vec![BATCH_VERSION],
            count: 0,
        }
    }
}

impl BatchWriter {
    /// Append an already-encoded record (from [`Record::encode_into`]).
    pub fn push_encoded(&mut self, record: &[u8]) {
        self.buf.extend_from_slice(record);
        self.count += 1;
    }

    /// Append a record.
    pub fn push(&mut self, record: &Record<'_>) {
        record.encode_into(&mut self.buf);
        self.count += 1;
    }

    /// Records so far.
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Whether no record was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes the finished batch will have.
    pub fn encoded_len(&self) -> usize {
        self.buf.len() + TRAILER_LEN
    }

    /// Finish the batch and start a new one.
    pub fn take(&mut self) -> Vec<u8> {
        let mut out = std::mem::replace(&mut self.buf, vec![BATCH_VERSION]);
        out.extend_from_slice(&self.count.to_le_bytes());
        let c = batch_checksum(&out);
        out.extend_from_slice(&c);
        self.count = 0;
        out
    }
}
