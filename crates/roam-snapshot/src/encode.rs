//! Turning a [`Snapshot`] into bytes.
//!
//! Encoding validates the snapshot first (so a bad snapshot is never written),
//! then streams the sections through one zstd encoder directly behind a
//! reserved header, and finally fills in the header with the lengths and the
//! payload hash. The memory pages are written raw, never copied again.

use std::io::Write;

use crate::header::{Header, Version, FLAG_FILES, FLAG_MODULE_EMBEDDED, HEADER_LEN};
use crate::payload::{runs_of, MemoryMeta, Meta, SECTION_COUNT};
use crate::{validate, Snapshot, MAX_MEMORY_BYTES, MAX_METADATA_BYTES};

/// Options for [`Snapshot::encode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeOptions {
    /// zstd compression level (1..=22; negative levels trade ratio for speed).
    pub level: i32,
    /// Which format major version to write. Default [`Format::V2`], or
    /// [`Format::V1`] when the environment variable `ROAM_SNAPSHOT_FORMAT`
    /// is `1` (for comparing the two, and for readers that only know v1).
    pub format: Format,
}

/// A format major version this build writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One zstd stream holding everything; memory restores by copying.
    V1,
    /// Metadata block, then independently decodable chunks of pages,
    /// uncompressed ones page-aligned; memory restores by mapping.
    V2,
}

impl Format {
    /// The default: v2, unless `ROAM_SNAPSHOT_FORMAT=1`.
    pub fn from_env() -> Format {
        match std::env::var("ROAM_SNAPSHOT_FORMAT").as_deref() {
            Ok("1") => Format::V1,
            _ => Format::V2,
        }
    }
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            level: 3,
            format: Format::from_env(),
        }
    }
}

/// Why a snapshot could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The snapshot fails a semantic check.
    #[error(
        "cannot encode snapshot: invalid {what}: {detail}; fix the value before checkpointing"
    )]
    Invalid {
        /// Which part of the snapshot.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A part of the snapshot exceeds the format's caps.
    #[error(
        "cannot encode snapshot: {what} is {len} bytes, above the format limit of {max}; \
         checkpoint without embedding the module or without files"
    )]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Its size.
        len: u64,
        /// The cap.
        max: u64,
    },
    /// The metadata could not be serialized.
    #[error("cannot serialize snapshot metadata; this is a bug in roam, please report it")]
    Serialize(#[from] postcard::Error),
    /// The compressor failed (e.g. an invalid compression level).
    #[error("zstd compression failed; check the compression level (1..=22)")]
    Compress(#[source] std::io::Error),
}

impl Snapshot {
    /// Encode this snapshot into the file format `opts.format` names.
    pub fn encode(&self, opts: &EncodeOptions) -> Result<Vec<u8>, EncodeError> {
        let parts = self.parts()?;
        match opts.format {
            Format::V1 => self.encode_v1(parts, opts),
            Format::V2 => crate::v2::encode(self, parts, opts),
        }
    }

    /// Flag bits for this snapshot's optional parts.
    pub(crate) fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.module.embedded.is_some() {
            flags |= FLAG_MODULE_EMBEDDED;
        }
        if self.files.is_some() {
            flags |= FLAG_FILES;
        }
        flags
    }

    /// Validate and serialize everything but the memory pages.
    fn parts(&self) -> Result<Parts, EncodeError> {
        validate::snapshot(self).map_err(|(what, detail)| EncodeError::Invalid { what, detail })?;
        // Cheap pre-check on the big parts, before serializing copies of them.
        let big = self.module.embedded.as_ref().map_or(0, |m| m.len() as u64)
            + self.os_state.len() as u64
            + self.files.as_ref().map_or(0, |f| f.total_file_bytes());
        if big > MAX_METADATA_BYTES {
            return Err(EncodeError::TooLarge {
                what: "module, os state and files together",
                len: big,
                max: MAX_METADATA_BYTES,
            });
        }
        let meta = Meta {
            module_hash: self.module.hash,
            origin: self.origin.clone(),
            globals: self.globals.clone(),
            stack: self.stack.clone(),
            memory: MemoryMeta {
                byte_len: self.memory.byte_len(),
                initial_digest: self.memory.initial_digest(),
                runs: runs_of(self.memory.page_kinds()),
            },
            threads: self.threads.clone(),
        };
        let meta = meta.to_bytes()?;
        let files = match &self.files {
            Some(t) => postcard::to_allocvec(t)?,
            None => Vec::new(),
        };
        let module: &[u8] = self.module.embedded.as_deref().unwrap_or_default();
        let metadata_len = (meta.len() + module.len() + self.os_state.len() + files.len()) as u64;
        if metadata_len > MAX_METADATA_BYTES {
            return Err(EncodeError::TooLarge {
                what: "metadata, module, os state and files together",
                len: metadata_len,
                max: MAX_METADATA_BYTES,
            });
        }
        let memory = self.memory.stored_data();
        if memory.len() as u64 > MAX_MEMORY_BYTES {
            return Err(EncodeError::TooLarge {
                what: "memory",
                len: memory.len() as u64,
                max: MAX_MEMORY_BYTES,
            });
        }
        Ok(Parts { meta, files })
    }

    fn encode_v1(&self, parts: Parts, opts: &EncodeOptions) -> Result<Vec<u8>, EncodeError> {
        if !self.threads.is_empty() {
            return Err(EncodeError::Invalid {
                what: "threads",
                detail: "format 1.0 holds one thread; write format 2 (unset ROAM_SNAPSHOT_FORMAT)"
                    .into(),
            });
        }
        let module: &[u8] = self.module.embedded.as_deref().unwrap_or_default();
        let memory = self.memory.stored_data();
        let sections: [&[u8]; SECTION_COUNT] =
            [&parts.meta, module, &self.os_state, &parts.files, memory];
        let metadata_len: u64 = sections[..4].iter().map(|s| s.len() as u64).sum();
        let uncompressed_len = metadata_len + memory.len() as u64 + 8 * SECTION_COUNT as u64;

        let mut out = Vec::with_capacity(HEADER_LEN + 4096);
        out.resize(HEADER_LEN, 0);
        let mut enc = zstd::Encoder::new(out, opts.level).map_err(EncodeError::Compress)?;
        enc.set_pledged_src_size(Some(uncompressed_len))
            .map_err(EncodeError::Compress)?;
        enc.include_contentsize(true)
            .map_err(EncodeError::Compress)?;
        write_sections(&mut enc, &sections)?;
        let mut out = enc.finish().map_err(EncodeError::Compress)?;

        let header = Header {
            version: Version::V1,
            flags: self.flags(),
            compressed_len: (out.len() - HEADER_LEN) as u64,
            uncompressed_len,
            payload_hash: *blake3::hash(&out[HEADER_LEN..]).as_bytes(),
        };
        out[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        Ok(out)
    }
}

/// The serialized non-memory parts shared by both formats.
pub(crate) struct Parts {
    /// postcard of [`Meta`].
    pub meta: Vec<u8>,
    /// postcard of the file tree, or empty.
    pub files: Vec<u8>,
}

/// Each section as its little-endian `u64` length and its bytes: the
/// payload layout of v1 and the metadata block of v2.
pub(crate) fn write_sections(out: &mut impl Write, sections: &[&[u8]]) -> Result<(), EncodeError> {
    for s in sections {
        out.write_all(&(s.len() as u64).to_le_bytes())
            .map_err(EncodeError::Compress)?;
        out.write_all(s).map_err(EncodeError::Compress)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::sample_snapshot;
    use crate::{peek_header, FileKind, ModuleRef};

    const V1: EncodeOptions = EncodeOptions {
        level: 3,
        format: Format::V1,
    };

    #[test]
    fn header_describes_the_payload() {
        let (_, _, snap) = sample_snapshot(4, 10);
        let bytes = snap.encode(&V1).unwrap();
        let h = peek_header(&bytes).unwrap();
        assert_eq!(h.flags, FLAG_MODULE_EMBEDDED | FLAG_FILES);
        assert_eq!(h.compressed_len as usize, bytes.len() - HEADER_LEN);
        assert_eq!(
            &h.payload_hash,
            blake3::hash(&bytes[HEADER_LEN..]).as_bytes()
        );
        let raw = zstd::decode_all(&bytes[HEADER_LEN..]).unwrap();
        assert_eq!(raw.len() as u64, h.uncompressed_len);
        // Last section is the raw stored pages.
        let mem = snap.memory.stored_data();
        assert_eq!(&raw[raw.len() - mem.len()..], mem);
        let len_at = raw.len() - mem.len() - 8;
        assert_eq!(&raw[len_at..len_at + 8], &(mem.len() as u64).to_le_bytes());
    }

    #[test]
    fn flags_follow_optional_parts() {
        let (_, _, mut snap) = sample_snapshot(1, 11);
        snap.module = ModuleRef {
            hash: snap.module.hash,
            embedded: None,
        };
        snap.files = None;
        let bytes = snap.encode(&EncodeOptions::default()).unwrap();
        assert_eq!(peek_header(&bytes).unwrap().flags, 0);
    }

    #[test]
    fn refuses_invalid_snapshots() {
        let (_, _, snap) = sample_snapshot(1, 12);
        let mut bad = snap.clone();
        bad.module.embedded = Some(b"other".to_vec());
        let e = bad.encode(&EncodeOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                EncodeError::Invalid {
                    what: "embedded module",
                    ..
                }
            ),
            "{e}"
        );

        let mut bad = snap.clone();
        bad.files.as_mut().unwrap().entries[1].path = "../escape".into();
        let e = bad.encode(&EncodeOptions::default()).unwrap_err();
        assert!(
            matches!(
                e,
                EncodeError::Invalid {
                    what: "file tree",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("../escape"));

        let mut bad = snap.clone();
        bad.stack.buffer_offset = u32::MAX - 10;
        assert!(matches!(
            bad.encode(&EncodeOptions::default()),
            Err(EncodeError::Invalid {
                what: "unwound stack",
                ..
            })
        ));

        let mut bad = snap;
        bad.globals.push(bad.globals[0].clone());
        assert!(matches!(
            bad.encode(&EncodeOptions::default()),
            Err(EncodeError::Invalid {
                what: "globals",
                ..
            })
        ));
    }

    #[test]
    fn refuses_oversized_metadata() {
        let (_, _, mut snap) = sample_snapshot(1, 13);
        if let FileKind::File { data } = &mut snap.files.as_mut().unwrap().entries[1].kind {
            *data = vec![0; MAX_METADATA_BYTES as usize + 1];
        }
        assert!(matches!(
            snap.encode(&EncodeOptions::default()),
            Err(EncodeError::TooLarge {
                max: MAX_METADATA_BYTES,
                ..
            })
        ));
    }

    #[test]
    fn other_levels_round_trip() {
        let (_, _, snap) = sample_snapshot(1, 14);
        for format in [Format::V1, Format::V2] {
            for level in [1, 19] {
                let bytes = snap.encode(&EncodeOptions { level, format }).unwrap();
                assert_eq!(
                    Snapshot::decode(&bytes).unwrap(),
                    snap,
                    "{format:?} {level}"
                );
            }
        }
    }
}
