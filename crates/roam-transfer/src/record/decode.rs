//! Decoding batches from untrusted bytes.
//!
//! The checksum is verified before any record is looked at, every length is
//! compared with what remains before it is used, and the record vector is
//! sized from the input length, never from the declared count.

use super::*;
use crate::PAGE_SIZE;

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
