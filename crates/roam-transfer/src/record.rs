//! The batch wire format: records for pages, packed into checksummed batches.
//!
//! The format is deliberately small and self-delimiting so that the transport
//! can frame batches however it likes. Decoding treats input as hostile: every
//! length is checked against what remains before it is used, nothing is
//! allocated from a declared size, and corruption is caught by a checksum
//! before any record is interpreted. See `docs/transfer.md` for the layout.

use crate::PAGE_SIZE;

/// Version byte that starts every batch.
pub const BATCH_VERSION: u8 = 1;
/// Bytes after the records: record count (u32 LE) and an 8-byte checksum.
pub const TRAILER_LEN: usize = 12;

const TAG_ZERO: u8 = 0;
const TAG_INITIAL: u8 = 1;
const TAG_COPY: u8 = 2;
const TAG_STORED: u8 = 3;
const TAG_RAW: u8 = 4;
const TAG_DELTA: u8 = 5;

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

/// Why a batch could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Shorter than the fixed parts of a batch.
    #[error("batch of {len} bytes is shorter than the minimum of 13 (version + trailer)")]
    TooShort {
        /// Bytes received.
        len: usize,
    },
    /// Unknown version byte.
    #[error("batch version {found} is not supported (this build reads version 1)")]
    UnsupportedVersion {
        /// Version byte found.
        found: u8,
    },
    /// The checksum over the batch does not match.
    #[error("batch checksum mismatch: the batch was corrupted or truncated in transit")]
    ChecksumMismatch,
    /// A record extends beyond the end of the batch body.
    #[error(
        "record {record} at byte {offset} is truncated: {what} needs {need} bytes, {have} left"
    )]
    Truncated {
        /// Record number in the batch.
        record: usize,
        /// Byte offset of the field.
        offset: usize,
        /// Which field.
        what: &'static str,
        /// Bytes the field needs.
        need: usize,
        /// Bytes remaining.
        have: usize,
    },
    /// A record tag is unknown.
    #[error("record {record} at byte {offset} has unknown tag {tag} (known: 0..=5)")]
    UnknownTag {
        /// Record number.
        record: usize,
        /// Byte offset.
        offset: usize,
        /// Tag found.
        tag: u8,
    },
    /// A varint is longer than 5 bytes, overlong, or overflows `u32`.
    #[error("record {record} at byte {offset}: {what} is not a valid u32 varint")]
    BadVarint {
        /// Record number.
        record: usize,
        /// Byte offset.
        offset: usize,
        /// Which field.
        what: &'static str,
    },
    /// A compressed payload is longer than any valid page encoding.
    #[error("record {record}: payload of {len} bytes exceeds the 4096-byte maximum")]
    PayloadTooLarge {
        /// Record number.
        record: usize,
        /// Declared length.
        len: u32,
    },
    /// The trailer's record count disagrees with the records present.
    #[error("batch declares {declared} records but contains {found}")]
    CountMismatch {
        /// Count in the trailer.
        declared: u32,
        /// Records parsed.
        found: usize,
    },
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

/// Decode a batch into its records, borrowing payloads from `bytes`.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<Record<'_>>, BatchError> {
    if bytes.len() < 1 + TRAILER_LEN {
        return Err(BatchError::TooShort { len: bytes.len() });
    }
    let (covered, sum) = bytes.split_at(bytes.len() - 8);
    if batch_checksum(covered) != sum {
        return Err(BatchError::ChecksumMismatch);
    }
    if bytes[0] != BATCH_VERSION {
        return Err(BatchError::UnsupportedVersion { found: bytes[0] });
    }
    let body_end = covered.len() - 4;
    let mut cnt = [0u8; 4];
    cnt.copy_from_slice(&covered[body_end..]);
    let declared = u32::from_le_bytes(cnt);
    let body = &bytes[..body_end];
    // Every record takes at least 2 bytes, so this bounds the allocation by
    // the input size whatever the trailer claims.
    let mut records = Vec::with_capacity((declared as usize).min(body.len() / 2));
    let mut r = Reader { body, pos: 1 };
    while r.pos < body.len() {
        let n = records.len();
        records.push(r.record(n)?);
    }
    if records.len() != declared as usize {
        return Err(BatchError::CountMismatch {
            declared,
            found: records.len(),
        });
    }
    Ok(records)
}

struct Reader<'a> {
    body: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(
        &mut self,
        record: usize,
        what: &'static str,
        n: usize,
    ) -> Result<&'a [u8], BatchError> {
        let have = self.body.len() - self.pos;
        if have < n {
            return Err(BatchError::Truncated {
                record,
                offset: self.pos,
                what,
                need: n,
                have,
            });
        }
        let s = &self.body[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn varint(&mut self, record: usize, what: &'static str) -> Result<u32, BatchError> {
        let start = self.pos;
        let mut v: u64 = 0;
        for i in 0..5 {
            let b = self.take(record, what, 1)?[0];
            v |= u64::from(b & 0x7f) << (7 * i);
            // A zero final byte after the first is an overlong encoding;
            // refusing it keeps every value's encoding unique.
            if b & 0x80 == 0 {
                let canonical = b != 0 || i == 0;
                return u32::try_from(v)
                    .ok()
                    .filter(|_| canonical)
                    .ok_or(BatchError::BadVarint {
                        record,
                        offset: start,
                        what,
                    });
            }
        }
        Err(BatchError::BadVarint {
            record,
            offset: start,
            what,
        })
    }

    fn record(&mut self, n: usize) -> Result<Record<'a>, BatchError> {
        let offset = self.pos;
        let tag = self.take(n, "tag", 1)?[0];
        let index = self.varint(n, "page index")?;
        Ok(match tag {
            TAG_ZERO => Record::Zero { index },
            TAG_INITIAL => Record::Initial { index },
            TAG_COPY => Record::Copy {
                index,
                from: self.varint(n, "copy source")?,
            },
            TAG_STORED => {
                let mut hash = [0u8; 32];
                hash.copy_from_slice(self.take(n, "chunk hash", 32)?);
                Record::Stored { index, hash }
            }
            TAG_RAW | TAG_DELTA => {
                let codec = self.take(n, "codec", 1)?[0];
                let len = self.varint(n, "payload length")?;
                if len as usize > PAGE_SIZE {
                    return Err(BatchError::PayloadTooLarge { record: n, len });
                }
                let data = self.take(n, "payload", len as usize)?;
                if tag == TAG_RAW {
                    Record::Raw { index, codec, data }
                } else {
                    Record::Delta { index, codec, data }
                }
            }
            tag => {
                return Err(BatchError::UnknownTag {
                    record: n,
                    offset,
                    tag,
                })
            }
        })
    }
}
