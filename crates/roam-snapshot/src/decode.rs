//! Turning untrusted bytes back into a [`Snapshot`].
//!
//! Snapshots travel between machines and may be truncated, corrupted or
//! crafted. Decoding therefore checks the header, then the payload hash, and
//! only then decompresses, section by section, checking every declared length
//! against the caps and the remaining declared payload before reading it.
//! Buffers grow with the data actually decompressed, never with a declared
//! length alone.

use std::io::{self, Read};

use crate::header::{peek_header, Header, Version, FLAG_FILES, FLAG_MODULE_EMBEDDED, HEADER_LEN};
use crate::memory::PageKind;
use crate::payload::{expand_runs, Meta, SECTIONS};
use crate::{
    validate, FileTree, MemoryImage, ModuleRef, Snapshot, MAX_MEMORY_BYTES, MAX_METADATA_BYTES,
    PAGE_SIZE,
};

/// Why bytes could not be decoded as a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input does not start with `ROAMSNAP`.
    #[error(
        "not a roam snapshot (magic bytes {found:02x?}); pass a file written by `roam checkpoint`"
    )]
    BadMagic {
        /// The first (up to) 8 bytes found, zero-padded.
        found: [u8; 8],
    },
    /// The format version is not one this build reads.
    #[error(
        "snapshot format version {found} is not supported (this roam reads {supported} and older \
         minor versions of the same major); use a roam release that supports format {found}"
    )]
    UnsupportedVersion {
        /// The file's version.
        found: Version,
        /// The newest version this build reads.
        supported: Version,
    },
    /// The input ends before a part it declares.
    #[error(
        "snapshot is truncated: {what} needs {expected} bytes, only {got} present; the file was \
         cut short (interrupted copy or write), copy it again from its source"
    )]
    Truncated {
        /// Which part is cut short.
        what: &'static str,
        /// Bytes required.
        expected: u64,
        /// Bytes available.
        got: u64,
    },
    /// A checksum or hash does not match.
    #[error("snapshot is corrupt: {what} checksum mismatch; copy the file again from its source")]
    ChecksumMismatch {
        /// Which part failed its check.
        what: &'static str,
    },
    /// A declared size exceeds the format's caps.
    #[error(
        "snapshot declares a {what} of {len} bytes, above the limit of {max}; the file is corrupt \
         or not a roam snapshot"
    )]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// The declared size.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// The content is structurally or semantically invalid.
    #[error(
        "snapshot is malformed: {what}: {detail}; the file is corrupt or was written by an \
         incompatible tool, re-create it with `roam checkpoint`"
    )]
    Malformed {
        /// Which part.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
}

impl DecodeError {
    pub(crate) fn truncated(what: &'static str, expected: usize, got: usize) -> Self {
        DecodeError::Truncated {
            what,
            expected: expected as u64,
            got: got as u64,
        }
    }

    fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        DecodeError::Malformed {
            what,
            detail: detail.into(),
        }
    }
}

impl Snapshot {
    /// Decode and fully validate a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, DecodeError> {
        Self::decode_with_header(bytes).map(|(s, _)| s)
    }

    /// Like [`Snapshot::decode`], also returning the file header.
    pub fn decode_with_header(bytes: &[u8]) -> Result<(Snapshot, Header), DecodeError> {
        let header = peek_header(bytes)?;
        let payload = &bytes[HEADER_LEN..];
        if (payload.len() as u64) < header.compressed_len {
            return Err(DecodeError::Truncated {
                what: "compressed payload",
                expected: header.compressed_len,
                got: payload.len() as u64,
            });
        }
        if payload.len() as u64 > header.compressed_len {
            let extra = payload.len() as u64 - header.compressed_len;
            return Err(DecodeError::malformed(
                "file",
                format!("{extra} bytes after the payload"),
            ));
        }
        if !cfg!(fuzzing) && blake3::hash(payload).as_bytes() != &header.payload_hash {
            return Err(DecodeError::ChecksumMismatch { what: "payload" });
        }
        let snap = decode_payload(payload, &header)?;
        Ok((snap, header))
    }
}

fn decode_payload(payload: &[u8], header: &Header) -> Result<Snapshot, DecodeError> {
    let mut r = Sections::new(payload, header.uncompressed_len)?;
    let mut budget = MAX_METADATA_BYTES;
    let mut next = |r: &mut Sections, i: usize| -> Result<Vec<u8>, DecodeError> {
        let s = r.section(SECTIONS[i], budget)?;
        budget -= s.len() as u64;
        Ok(s)
    };
    let meta_bytes = next(&mut r, 0)?;
    let module_bytes = next(&mut r, 1)?;
    let os_state = next(&mut r, 2)?;
    let files_bytes = next(&mut r, 3)?;

    let meta: Meta = postcard_exact(&meta_bytes, "metadata section")?;
    drop(meta_bytes);
    let m = &meta.memory;
    if m.byte_len > MAX_MEMORY_BYTES {
        return Err(DecodeError::TooLarge {
            what: "memory",
            len: m.byte_len,
            max: MAX_MEMORY_BYTES,
        });
    }
    let kinds = expand_runs(&m.runs, m.byte_len / PAGE_SIZE as u64)
        .map_err(|d| DecodeError::malformed("memory page map", d))?;
    let stored = kinds.iter().filter(|k| **k == PageKind::Data).count() as u64;
    let data = r.section(SECTIONS[4], stored * PAGE_SIZE as u64)?;
    if data.len() as u64 != stored * PAGE_SIZE as u64 {
        return Err(DecodeError::malformed(
            "memory section",
            format!("{} bytes for {stored} stored pages", data.len()),
        ));
    }
    r.finish()?;
    let memory = MemoryImage::from_parts(m.byte_len, m.initial_digest, kinds, data)
        .map_err(|d| DecodeError::malformed("memory", d))?;

    let flag = |f| header.flags & f != 0;
    let embedded = match (flag(FLAG_MODULE_EMBEDDED), module_bytes.is_empty()) {
        (true, _) => Some(module_bytes),
        (false, true) => None,
        (false, false) => return Err(unflagged("module section")),
    };
    let files = match (flag(FLAG_FILES), files_bytes.is_empty()) {
        (true, _) => Some(postcard_exact::<FileTree>(&files_bytes, "files section")?),
        (false, true) => None,
        (false, false) => return Err(unflagged("files section")),
    };
    let snap = Snapshot {
        module: ModuleRef {
            hash: meta.module_hash,
            embedded,
        },
        origin: meta.origin,
        memory,
        globals: meta.globals,
        stack: meta.stack,
        os_state,
        files,
    };
    if validate::module(&snap.module).is_err() {
        return Err(DecodeError::ChecksumMismatch {
            what: "embedded module",
        });
    }
    validate::snapshot(&snap).map_err(|(what, detail)| DecodeError::Malformed { what, detail })?;
    Ok(snap)
}

fn unflagged(what: &'static str) -> DecodeError {
    DecodeError::malformed(what, "present although the header flags say it is absent")
}

/// Decode a postcard value that must use every byte of `bytes`.
fn postcard_exact<'a, T: serde::Deserialize<'a>>(
    bytes: &'a [u8],
    what: &'static str,
) -> Result<T, DecodeError> {
    let (v, rest) = postcard::take_from_bytes(bytes)
        .map_err(|e| DecodeError::malformed(what, e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::malformed(
            what,
            format!("{} trailing bytes", rest.len()),
        ));
    }
    Ok(v)
}

/// Reads length-prefixed sections from the decompressed stream, never past
/// the declared uncompressed length.
struct Sections<'a> {
    dec: zstd::stream::read::Decoder<'static, &'a [u8]>,
    remaining: u64,
}

impl<'a> Sections<'a> {
    fn new(payload: &'a [u8], uncompressed_len: u64) -> Result<Self, DecodeError> {
        let dec = zstd::stream::read::Decoder::with_buffer(payload)
            .map_err(|e| DecodeError::malformed("compressed payload", e.to_string()))?;
        Ok(Sections {
            dec,
            remaining: uncompressed_len,
        })
    }

    /// Read one section of at most `max` bytes.
    fn section(&mut self, what: &'static str, max: u64) -> Result<Vec<u8>, DecodeError> {
        let mut len = [0u8; 8];
        self.read_exact(what, &mut len)?;
        let len = u64::from_le_bytes(len);
        if len > max {
            return Err(DecodeError::TooLarge { what, len, max });
        }
        if len > self.remaining {
            return Err(DecodeError::malformed(
                what,
                format!(
                    "{len} bytes declared, only {} left in the payload",
                    self.remaining
                ),
            ));
        }
        // Start small and let the buffer grow with real data (realloc of large
        // buffers is a page remap, not a copy, on common allocators).
        let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
        (&mut self.dec)
            .take(len)
            .read_to_end(&mut out)
            .map_err(|e| stream_error(what, e))?;
        if (out.len() as u64) < len {
            return Err(ended_early(what, len, out.len() as u64));
        }
        self.remaining -= len;
        Ok(out)
    }

    fn read_exact(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), DecodeError> {
        if (buf.len() as u64) > self.remaining {
            return Err(DecodeError::malformed(
                what,
                "length prefix lies past the declared uncompressed length",
            ));
        }
        self.dec.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => ended_early(what, buf.len() as u64, 0),
            _ => stream_error(what, e),
        })?;
        self.remaining -= buf.len() as u64;
        Ok(())
    }

    /// Check that the declared length and the stream both end here.
    fn finish(mut self) -> Result<(), DecodeError> {
        if self.remaining != 0 {
            return Err(DecodeError::malformed(
                "payload",
                format!("{} declared bytes follow the last section", self.remaining),
            ));
        }
        let mut probe = [0u8; 1];
        match self.dec.read(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(DecodeError::malformed(
                "payload",
                "decompresses to more bytes than the header declares",
            )),
            Err(e) => Err(stream_error("payload", e)),
        }
    }
}

fn ended_early(what: &'static str, expected: u64, got: u64) -> DecodeError {
    DecodeError::malformed(
        what,
        format!("decompressed data ends after {got} of {expected} bytes"),
    )
}

fn stream_error(what: &'static str, e: io::Error) -> DecodeError {
    DecodeError::malformed(what, format!("zstd: {e}"))
}
