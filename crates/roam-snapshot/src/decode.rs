//! Turning untrusted bytes back into a [`Snapshot`].
//!
//! Snapshots travel between machines and may be truncated, corrupted or
//! crafted. Decoding therefore checks the header, then the payload hash, and
//! only then decompresses, section by section, checking every declared length
//! against the caps and the remaining declared payload before reading it.
//! Buffers grow with the data actually decompressed, never with a declared
//! length alone.

pub(crate) mod sections;

use crate::header::{peek_header, Header, Version, FLAG_FILES, FLAG_MODULE_EMBEDDED, HEADER_LEN};
use crate::memory::PageKind;
use crate::pages::Store;
use crate::payload::{expand_runs, Meta, SECTIONS};
use crate::{
    validate, FileTree, MemoryImage, ModuleRef, Snapshot, MAX_MEMORY_BYTES, MAX_METADATA_BYTES,
    PAGE_SIZE,
};
use sections::Sections;

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
        "snapshot format version {found} is not supported (this roam reads {supported}, older \
         minor versions of the same major, and 1.0); use a roam release that supports format \
         {found}"
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
    /// The host refused the memory or file needed to hold a valid snapshot.
    #[error(
        "cannot decode the snapshot: {what} failed ({detail}); free memory on this machine or \
         raise its limits, then try again"
    )]
    Resources {
        /// What was being set up.
        what: &'static str,
        /// The system's answer.
        detail: String,
    },
    /// The snapshot file could not be read while decoding it.
    #[error(
        "cannot read the snapshot while decoding it: {detail}; check that the file is not \
         being modified, and copy it again"
    )]
    Read {
        /// The I/O failure.
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

    pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
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
        Self::decode_limited(bytes, u64::MAX)
    }

    /// Decode an execution state whose memory travelled on its own (a
    /// migration's final state, a kept checkpoint's state): it must store
    /// no page. A state that declares stored pages is refused after its
    /// metadata is read, before any memory is allocated or decompressed.
    pub fn decode_state(bytes: &[u8]) -> Result<Snapshot, DecodeError> {
        Self::decode_limited(bytes, 0).map(|(s, _)| s)
    }

    /// Decode, refusing more than `max_stored` bytes of stored pages
    /// before decompressing any.
    fn decode_limited(bytes: &[u8], max_stored: u64) -> Result<(Snapshot, Header), DecodeError> {
        let header = peek_header(bytes)?;
        if header.version.major == 2 {
            return crate::v2::decode(&header, bytes, max_stored).map(|s| (s, header));
        }
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
        let snap = decode_payload(payload, &header, max_stored)?;
        Ok((snap, header))
    }
}

/// The four sections every format starts with (metadata, module, OS state,
/// files), read within one budget of [`MAX_METADATA_BYTES`].
pub(crate) fn metadata_sections(r: &mut Sections) -> Result<[Vec<u8>; 4], DecodeError> {
    let mut budget = MAX_METADATA_BYTES;
    let mut next = |i: usize| -> Result<Vec<u8>, DecodeError> {
        let s = r.section(SECTIONS[i], budget)?;
        budget -= s.len() as u64;
        Ok(s)
    };
    Ok([next(0)?, next(1)?, next(2)?, next(3)?])
}

fn decode_payload(
    payload: &[u8],
    header: &Header,
    max_stored: u64,
) -> Result<Snapshot, DecodeError> {
    let mut r = Sections::new(payload, header.uncompressed_len)?;
    let [meta_bytes, module_bytes, os_state, files_bytes] = metadata_sections(&mut r)?;

    let meta = Meta::from_bytes(&meta_bytes, header.version.minor)?;
    drop(meta_bytes);
    let kinds = page_kinds(&meta)?;
    let m = &meta.memory;
    let stored = kinds.iter().filter(|k| **k == PageKind::Data).count() as u64;
    check_stored(stored, max_stored)?;
    let data = r.section(SECTIONS[4], stored * PAGE_SIZE as u64)?;
    if data.len() as u64 != stored * PAGE_SIZE as u64 {
        return Err(DecodeError::malformed(
            "memory section",
            format!("{} bytes for {stored} stored pages", data.len()),
        ));
    }
    r.finish()?;
    let memory = MemoryImage::from_parts(m.byte_len, m.initial_digest, kinds, Store::Heap(data))
        .map_err(|d| DecodeError::malformed("memory", d))?;
    assemble(header, meta, [module_bytes, os_state, files_bytes], memory)
}

/// Refuse `stored` pages when they are more than `max` bytes.
pub(crate) fn check_stored(stored: u64, max: u64) -> Result<(), DecodeError> {
    let len = stored.saturating_mul(PAGE_SIZE as u64);
    if len > max {
        return Err(DecodeError::TooLarge {
            what: "stored memory pages",
            len,
            max,
        });
    }
    Ok(())
}

/// Check the memory size and expand the page map of decoded metadata.
pub(crate) fn page_kinds(meta: &Meta) -> Result<Vec<PageKind>, DecodeError> {
    let m = &meta.memory;
    if m.byte_len > MAX_MEMORY_BYTES {
        return Err(DecodeError::TooLarge {
            what: "memory",
            len: m.byte_len,
            max: MAX_MEMORY_BYTES,
        });
    }
    expand_runs(&m.runs, m.byte_len / PAGE_SIZE as u64)
        .map_err(|d| DecodeError::malformed("memory page map", d))
}

/// Build and validate the snapshot from its decoded parts (both formats).
pub(crate) fn assemble(
    header: &Header,
    meta: Meta,
    [module_bytes, os_state, files_bytes]: [Vec<u8>; 3],
    memory: MemoryImage,
) -> Result<Snapshot, DecodeError> {
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
        threads: meta.threads,
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
pub(crate) fn postcard_exact<'a, T: serde::Deserialize<'a>>(
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
