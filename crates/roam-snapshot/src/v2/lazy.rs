//! A v2 file whose pages are read when they are wanted, chunk by chunk.
//!
//! Why: restoring a large memory by reading the whole file first copies
//! every byte before the program runs again (about 170 ms for 256 MiB on
//! the reference machine, more than the copy of the memory itself). The
//! runtime can instead start the program at once and fill its memory as the
//! program touches it, while a background thread reads the rest in order.
//! [`PageFile`] is the reading half of that: the file stays open, its
//! header, metadata and chunk table are checked exactly as a full read
//! checks them, and a chunk is read with a positioned read and its CRC
//! checked before any of its pages is handed out. A file truncated or
//! rewritten after opening therefore gives an error, never wrong pages.

use std::sync::Arc;

use super::decode::{decode_chunk, decode_memory, FileSource, Parsed};
use super::Chunk;
use crate::memory::PageKind;
use crate::{DecodeError, MemoryImage, PAGE_SIZE};

/// The pages of an opened v2 snapshot file, read on demand. Cheap to
/// clone (the clones share the open file); reads from several threads at
/// once are fine.
#[derive(Clone)]
pub struct PageFile(Arc<Inner>);

struct Inner {
    src: FileSource,
    area: u64,
    chunks: Vec<Chunk>,
    /// Index in `data_pages` of each chunk's first page, then the total.
    chunk_start: Vec<usize>,
    /// The memory page index of every stored page, in order.
    data_pages: Vec<u32>,
    kinds: Vec<PageKind>,
    byte_len: u64,
    initial_digest: [u8; 32],
}

impl PageFile {
    /// Build from a checked parse; the table covers exactly the stored pages.
    pub(super) fn new(p: &mut Parsed, src: FileSource) -> PageFile {
        let kinds = std::mem::take(&mut p.kinds);
        let data_pages: Vec<u32> = kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == PageKind::Data)
            .map(|(i, _)| i as u32)
            .collect();
        let mut chunk_start = Vec::with_capacity(p.table.chunks.len() + 1);
        let mut at = 0usize;
        for c in &p.table.chunks {
            chunk_start.push(at);
            at += c.pages as usize;
        }
        chunk_start.push(at);
        debug_assert_eq!(at, data_pages.len(), "checked by check_table");
        PageFile(Arc::new(Inner {
            src,
            area: p.area,
            chunks: std::mem::take(&mut p.table.chunks),
            chunk_start,
            data_pages,
            kinds,
            byte_len: p.meta.memory.byte_len,
            initial_digest: p.meta.memory.initial_digest,
        }))
    }

    /// The kind of every 4 KiB page of the memory.
    pub fn kinds(&self) -> &[PageKind] {
        &self.0.kinds
    }

    /// Size of the memory in bytes.
    pub fn byte_len(&self) -> u64 {
        self.0.byte_len
    }

    /// Digest of the module's initial memory image the pages were captured
    /// against (see [`crate::MemoryImage::initial_digest`]).
    pub fn initial_digest(&self) -> [u8; 32] {
        self.0.initial_digest
    }

    /// Number of stored (Data) pages.
    pub fn stored_pages(&self) -> usize {
        self.0.data_pages.len()
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.0.chunks.len()
    }

    /// The chunk holding memory page `page`, or `None` when that page is
    /// not stored (Zero or Initial) or outside the memory.
    pub fn chunk_of(&self, page: u32) -> Option<usize> {
        let i = self.0.data_pages.binary_search(&page).ok()?;
        // The last chunk whose first page is at or before `i`.
        Some(self.0.chunk_start.partition_point(|&s| s <= i) - 1)
    }

    /// The memory pages chunk `i` holds, in increasing order.
    ///
    /// # Panics
    /// If `i >= self.chunk_count()`.
    pub fn chunk_pages(&self, i: usize) -> &[u32] {
        &self.0.data_pages[self.0.chunk_start[i]..self.0.chunk_start[i + 1]]
    }

    /// Read every chunk (checking each CRC) into a complete memory image,
    /// as a full read of the file would have made it.
    pub fn read_memory(&self) -> Result<MemoryImage, DecodeError> {
        let s = &self.0;
        decode_memory(
            &s.src,
            s.area,
            &s.chunks,
            (s.byte_len, s.initial_digest),
            s.kinds.clone(),
        )
    }

    /// Read chunk `i` into `buf` (resized to its pages, 4 KiB each, in the
    /// order of [`PageFile::chunk_pages`]), checking its CRC first.
    ///
    /// # Panics
    /// If `i >= self.chunk_count()`.
    pub fn read_chunk(&self, i: usize, buf: &mut Vec<u8>) -> Result<(), DecodeError> {
        let c = &self.0.chunks[i];
        buf.resize(c.pages as usize * PAGE_SIZE, 0);
        decode_chunk(&self.0.src, self.0.area, i, c, buf)
    }
}

impl std::fmt::Debug for PageFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageFile")
            .field("byte_len", &self.0.byte_len)
            .field("stored_pages", &self.0.data_pages.len())
            .field("chunks", &self.0.chunks.len())
            .finish()
    }
}
