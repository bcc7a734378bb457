//! Format v2: a compressed metadata block, then the memory pages in
//! independently decodable chunks, the uncompressed ones page-aligned.
//!
//! Why a new major version: v1 keeps everything in one zstd stream, so a
//! restore must decompress the stream from its start, on one thread, into
//! a heap buffer, and then copy that buffer into linear memory. v2 splits
//! the pages into chunks that decode in parallel straight into a memfd
//! ([`crate::pages`]), which the runtime maps copy-on-write into linear
//! memory instead of copying. Incompressible chunks are stored raw, so
//! decoding them is one copy and no decompression.
//!
//! ```text
//! 0        80       88             88+M        A = align_up(88+M, 4096)        end
//! | header | M (u64)| meta block   | zero pad  | chunk area: chunk, chunk, ... |
//!                    zstd: 4 sections + chunk table
//! ```
//!
//! See `docs/snapshot-format.md` for the byte-level description.

mod decode;
mod encode;
mod lazy;

pub(crate) use decode::{decode, read_file};
pub(crate) use encode::encode;
pub use lazy::PageFile;

/// Open a v2 file of `len` bytes without reading its pages: the snapshot
/// (its memory a [`MemoryImage::placeholder`] of the right size) and the
/// pages, to read on demand.
pub(crate) fn open_file(
    header: &Header,
    file: std::fs::File,
    len: u64,
) -> Result<(Snapshot, PageFile), DecodeError> {
    let (mut p, src) = decode::parse_file(header, file, len)?;
    MemoryImage::check_shape(p.meta.memory.byte_len, p.kinds.len())
        .map_err(|d| DecodeError::malformed("memory", d))?;
    let pages = PageFile::new(&mut p, src);
    let memory = MemoryImage::placeholder_with_digest(pages.byte_len(), pages.initial_digest());
    let snapshot = assemble(header, p.meta, p.sections, memory)?;
    Ok((snapshot, pages))
}

use serde::{Deserialize, Serialize};

use crate::decode::assemble;
use crate::header::Header;
use crate::{DecodeError, MemoryImage, Snapshot, HEADER_LEN, MAX_METADATA_BYTES, PAGE_SIZE};

/// Stored pages per chunk written (1 MiB).
pub(crate) const CHUNK_PAGES: usize = 256;
/// Most pages a chunk may hold when read (16 MiB): bounds one decode step.
pub(crate) const MAX_CHUNK_PAGES: u32 = 4096;
/// Where the metadata block starts: after the header and its length.
pub(crate) const META_AT: u64 = HEADER_LEN as u64 + 8;
/// Cap on the chunk table section (a 4 GiB memory in 4 KiB chunks needs
/// about 30 MiB).
pub(crate) const MAX_TABLE_BYTES: u64 = 64 << 20;
/// Cap on the compressed metadata block.
pub(crate) const MAX_META_BLOCK: u64 =
    MAX_METADATA_BYTES + MAX_TABLE_BYTES + (MAX_METADATA_BYTES + MAX_TABLE_BYTES) / 128 + (1 << 20);

/// How a chunk's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Codec {
    /// The pages themselves; `offset` is a multiple of 4096.
    Raw,
    /// One or more zstd frames decompressing to exactly the pages.
    Zstd,
}

/// `pages` consecutive stored pages, kept at `[offset, offset + len)` of
/// the chunk area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Chunk {
    pub pages: u32,
    pub codec: Codec,
    pub offset: u64,
    pub len: u64,
    /// CRC-32 (IEEE) of the stored bytes.
    pub crc32: u32,
}

/// The memory section of a v2 metadata block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChunkTable {
    /// Bytes of the chunk area: the file ends there.
    pub area_len: u64,
    pub chunks: Vec<Chunk>,
}

/// Where the chunk area starts for a metadata block of `meta_len` bytes.
pub(crate) fn area_start(meta_len: u64) -> u64 {
    (META_AT + meta_len).next_multiple_of(PAGE_SIZE as u64)
}

/// Largest valid compressed length of a zstd chunk of `pages` pages.
pub(crate) fn max_zstd_len(pages: u32) -> u64 {
    let raw = u64::from(pages) * PAGE_SIZE as u64;
    raw + raw / 128 + 1024
}

#[cfg(test)]
mod tests;
