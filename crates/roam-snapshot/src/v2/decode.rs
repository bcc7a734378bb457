//! Reading format v2 from bytes in memory or from a file, for hostile
//! input: every length, offset and count is checked against the caps and
//! the real size of the input before anything is allocated or read, and
//! chunks decode in parallel straight into a memfd.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{area_start, max_zstd_len, Chunk, ChunkTable, Codec, MAX_CHUNK_PAGES, MAX_META_BLOCK};
use super::{MAX_TABLE_BYTES, META_AT};
use crate::decode::sections::Sections;
use crate::decode::{assemble, metadata_sections, page_kinds, postcard_exact};
use crate::header::{Header, HEADER_LEN};
use crate::memory::PageKind;
use crate::pages::{SharedPages, Store};
use crate::payload::Meta;
use crate::{DecodeError, MemoryImage, Snapshot, PAGE_SIZE};

/// Random access to the input: a byte slice or a file.
pub(super) trait Source: Sync {
    fn len(&self) -> u64;
    /// Fill `dst` from `at`. The caller checked `at + dst.len() <= len()`.
    fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), DecodeError>;
    /// The bytes at `[at, at + len)` without a copy, if the source has them in memory.
    fn slice(&self, at: u64, len: usize) -> Option<&[u8]>;
}

impl Source for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), DecodeError> {
        let at = at as usize;
        dst.copy_from_slice(&self[at..at + dst.len()]);
        Ok(())
    }
    fn slice(&self, at: u64, len: usize) -> Option<&[u8]> {
        Some(&self[at as usize..at as usize + len])
    }
}

pub(super) struct FileSource {
    pub file: File,
    pub len: u64,
}

impl Source for FileSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, at: u64, dst: &mut [u8]) -> Result<(), DecodeError> {
        self.file
            .read_exact_at(dst, at)
            .map_err(|e| DecodeError::Read {
                detail: format!("{} bytes at offset {at}: {e}", dst.len()),
            })
    }
    fn slice(&self, _: u64, _: usize) -> Option<&[u8]> {
        None
    }
}

/// Decode a v2 snapshot held in memory; `header` was read from `bytes`.
pub(crate) fn decode(
    header: &Header,
    bytes: &[u8],
    max_stored: u64,
) -> Result<Snapshot, DecodeError> {
    decode_from(header, bytes, max_stored)
}

/// Decode a v2 snapshot file of `len` bytes, reading only what it declares.
pub(crate) fn read_file(header: &Header, file: File, len: u64) -> Result<Snapshot, DecodeError> {
    decode_from(header, &FileSource { file, len }, u64::MAX)
}

fn decode_from(
    header: &Header,
    src: &(impl Source + ?Sized),
    max_stored: u64,
) -> Result<Snapshot, DecodeError> {
    let p = parse(header, src)?;
    let stored = p.kinds.iter().filter(|k| **k == PageKind::Data).count() as u64;
    crate::decode::check_stored(stored, max_stored)?;
    let m = &p.meta.memory;
    let memory = decode_memory(
        src,
        p.area,
        &p.table.chunks,
        (m.byte_len, m.initial_digest),
        p.kinds,
    )?;
    assemble(header, p.meta, p.sections, memory)
}

/// Decode every chunk, in parallel, into a page file and make the memory
/// image of `byte_len` bytes and page map `kinds` from it.
pub(super) fn decode_memory(
    src: &(impl Source + ?Sized),
    area: u64,
    chunks: &[Chunk],
    (byte_len, initial_digest): (u64, [u8; 32]),
    kinds: Vec<PageKind>,
) -> Result<MemoryImage, DecodeError> {
    let stored = kinds.iter().filter(|k| **k == PageKind::Data).count();
    let mut pages = SharedPages::new(stored * PAGE_SIZE).map_err(|e| DecodeError::Resources {
        what: "creating the page file",
        detail: e.to_string(),
    })?;
    decode_chunks(src, area, chunks, pages.as_mut_slice())?;
    MemoryImage::from_parts(
        byte_len,
        initial_digest,
        kinds,
        Store::Shared(Arc::new(pages)),
    )
    .map_err(|d| DecodeError::malformed("memory", d))
}

/// Everything of a v2 input but its pages, checked: the metadata (hash
/// verified), the page map and the chunk table. The chunks themselves are
/// not read yet.
pub(super) struct Parsed {
    pub meta: Meta,
    /// Module, OS state and files sections.
    pub sections: [Vec<u8>; 3],
    pub kinds: Vec<PageKind>,
    pub table: ChunkTable,
    /// Offset of the chunk area in the input.
    pub area: u64,
}

/// Open a v2 snapshot file of `len` bytes for reading its pages on demand:
/// everything but the chunks is read and checked now.
pub(super) fn parse_file(
    header: &Header,
    file: File,
    len: u64,
) -> Result<(Parsed, FileSource), DecodeError> {
    let src = FileSource { file, len };
    let p = parse(header, &src)?;
    Ok((p, src))
}

fn parse(header: &Header, src: &(impl Source + ?Sized)) -> Result<Parsed, DecodeError> {
    let total = src.len();
    let after_header = total - HEADER_LEN as u64;
    if after_header < header.compressed_len {
        return Err(DecodeError::Truncated {
            what: "snapshot file",
            expected: HEADER_LEN as u64 + header.compressed_len,
            got: total,
        });
    }
    if after_header > header.compressed_len {
        return Err(DecodeError::malformed(
            "file",
            format!(
                "{} bytes after the declared end",
                after_header - header.compressed_len
            ),
        ));
    }
    if total < META_AT {
        return Err(DecodeError::Truncated {
            what: "metadata block length",
            expected: META_AT,
            got: total,
        });
    }
    let mut len = [0u8; 8];
    src.read_at(HEADER_LEN as u64, &mut len)?;
    let meta_len = u64::from_le_bytes(len);
    if meta_len > MAX_META_BLOCK {
        return Err(DecodeError::TooLarge {
            what: "metadata block",
            len: meta_len,
            max: MAX_META_BLOCK,
        });
    }
    if META_AT + meta_len > total {
        return Err(DecodeError::Truncated {
            what: "metadata block",
            expected: META_AT + meta_len,
            got: total,
        });
    }
    // The block exists in full in the input, so allocating it is bounded by the input.
    let mut block = vec![0u8; meta_len as usize];
    src.read_at(META_AT, &mut block)?;
    let area = area_start(meta_len);
    if area > total {
        return Err(DecodeError::Truncated {
            what: "padding before the chunk area",
            expected: area,
            got: total,
        });
    }
    let mut pad = vec![0u8; (area - META_AT - meta_len) as usize]; // < 4096
    src.read_at(META_AT + meta_len, &mut pad)?;
    let mut hasher = blake3::Hasher::new();
    hasher.update(&len);
    hasher.update(&block);
    hasher.update(&pad);
    if !cfg!(fuzzing) && hasher.finalize().as_bytes() != &header.payload_hash {
        return Err(DecodeError::ChecksumMismatch {
            what: "metadata block",
        });
    }

    let mut r = Sections::new(&block, header.uncompressed_len)?;
    let [meta_bytes, module, os_state, files] = metadata_sections(&mut r)?;
    let table_bytes = r.section("chunk table", MAX_TABLE_BYTES)?;
    r.finish()?;
    drop(block);

    let meta = Meta::from_bytes(&meta_bytes, header.version.minor)?;
    let kinds = page_kinds(&meta)?;
    let stored = kinds.iter().filter(|k| **k == PageKind::Data).count() as u64;
    let table: ChunkTable = postcard_exact(&table_bytes, "chunk table")?;
    check_table(&table, stored, area, total)?;
    if pad.iter().any(|&b| b != 0) {
        return Err(DecodeError::malformed(
            "padding",
            "non-zero bytes between the metadata block and the chunk area",
        ));
    }

    Ok(Parsed {
        meta,
        sections: [module, os_state, files],
        kinds,
        table,
        area,
    })
}

/// Chunks in order, not overlapping, inside the area, covering exactly the
/// `stored` pages; the area ends where the file does.
fn check_table(t: &ChunkTable, stored: u64, area: u64, total: u64) -> Result<(), DecodeError> {
    let bad = |detail: String| DecodeError::malformed("chunk table", detail);
    if area > total || total - area != t.area_len {
        return Err(DecodeError::Truncated {
            what: "chunk area",
            expected: area.saturating_add(t.area_len),
            got: total,
        });
    }
    if t.chunks.len() as u64 > stored {
        return Err(bad(format!(
            "{} chunks for {stored} stored pages",
            t.chunks.len()
        )));
    }
    let (mut pages, mut end) = (0u64, 0u64);
    for (i, c) in t.chunks.iter().enumerate() {
        if c.pages == 0 || c.pages > MAX_CHUNK_PAGES {
            return Err(bad(format!(
                "chunk {i} holds {} pages (1 to {MAX_CHUNK_PAGES} allowed)",
                c.pages
            )));
        }
        let raw = u64::from(c.pages) * PAGE_SIZE as u64;
        match c.codec {
            Codec::Raw if c.len != raw => {
                return Err(bad(format!(
                    "raw chunk {i} is {} bytes for {} pages",
                    c.len, c.pages
                )))
            }
            Codec::Raw if !c.offset.is_multiple_of(PAGE_SIZE as u64) => {
                return Err(bad(format!(
                    "raw chunk {i} at offset {} is not page-aligned",
                    c.offset
                )))
            }
            Codec::Zstd if c.len == 0 || c.len > max_zstd_len(c.pages) => {
                return Err(bad(format!(
                    "compressed chunk {i} is {} bytes for {} pages",
                    c.len, c.pages
                )))
            }
            _ => {}
        }
        if c.offset < end {
            return Err(bad(format!(
                "chunk {i} at offset {} overlaps the previous chunk, which ends at {end}",
                c.offset
            )));
        }
        if c.offset > t.area_len || c.len > t.area_len - c.offset {
            return Err(bad(format!(
                "chunk {i} at offset {} with {} bytes lies past the end of the {}-byte chunk \
                 area",
                c.offset, c.len, t.area_len
            )));
        }
        end = c.offset + c.len;
        pages += u64::from(c.pages);
        if pages > stored {
            return Err(bad(format!(
                "chunks hold more than the {stored} stored pages"
            )));
        }
    }
    if pages != stored {
        return Err(bad(format!(
            "chunks hold {pages} pages, the page map stores {stored}"
        )));
    }
    Ok(())
}

/// Decode every chunk into its pages of `dst`, on up to two threads.
fn decode_chunks(
    src: &(impl Source + ?Sized),
    area: u64,
    chunks: &[Chunk],
    dst: &mut [u8],
) -> Result<(), DecodeError> {
    let mut parts: Vec<(usize, &Chunk, &mut [u8])> = Vec::with_capacity(chunks.len());
    let mut rest = dst;
    for (i, c) in chunks.iter().enumerate() {
        let (here, tail) = rest.split_at_mut(c.pages as usize * PAGE_SIZE);
        parts.push((i, c, here));
        rest = tail;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || parts.len() < 2 {
        return parts
            .into_iter()
            .try_for_each(|(i, c, d)| decode_chunk(src, area, i, c, d));
    }
    let per = parts.len().div_ceil(threads);
    let mut groups = Vec::new();
    while !parts.is_empty() {
        let tail = parts.split_off(per.min(parts.len()));
        groups.push(std::mem::replace(&mut parts, tail));
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    g.into_iter()
                        .try_for_each(|(i, c, d)| decode_chunk(src, area, i, c, d))
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("chunk decoding thread panicked"))
    })
}

pub(super) fn decode_chunk(
    src: &(impl Source + ?Sized),
    area: u64,
    i: usize,
    c: &Chunk,
    dst: &mut [u8],
) -> Result<(), DecodeError> {
    let at = area + c.offset;
    let crc_ok = |bytes: &[u8]| cfg!(fuzzing) || crc32fast::hash(bytes) == c.crc32;
    let mismatch = || DecodeError::ChecksumMismatch {
        what: "memory chunk",
    };
    match c.codec {
        Codec::Raw => {
            src.read_at(at, dst)?;
            if !crc_ok(dst) {
                return Err(mismatch());
            }
        }
        Codec::Zstd => {
            let mut scratch = Vec::new();
            let z = match src.slice(at, c.len as usize) {
                Some(z) => z,
                None => {
                    scratch.resize(c.len as usize, 0);
                    src.read_at(at, &mut scratch)?;
                    &scratch
                }
            };
            if !crc_ok(z) {
                return Err(mismatch());
            }
            let n = zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(z, dst))
                .map_err(|e| {
                    DecodeError::malformed("memory chunk", format!("chunk {i}: zstd: {e}"))
                })?;
            if n != dst.len() {
                return Err(DecodeError::malformed(
                    "memory chunk",
                    format!("chunk {i} decompresses to {n} bytes, not {}", dst.len()),
                ));
            }
        }
    }
    Ok(())
}
