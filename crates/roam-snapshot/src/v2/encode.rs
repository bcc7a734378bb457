//! Writing format v2: chunks compressed in parallel, stored raw where
//! compression does not pay, raw chunks page-aligned.

use super::{area_start, Chunk, ChunkTable, Codec, CHUNK_PAGES, META_AT};
use crate::encode::Parts;
use crate::header::{Header, Version};
use crate::payload::SECTION_COUNT;
use crate::{EncodeError, EncodeOptions, Snapshot, HEADER_LEN, PAGE_SIZE};

/// A chunk is stored compressed only if that saves at least 1/16 of it.
fn worth_compressing(raw: usize, compressed: usize) -> bool {
    compressed + raw / 16 < raw
}

/// Compress each chunk of `data`, or keep it raw. `None` for a raw chunk.
fn compress_chunks(data: &[u8], level: i32) -> Result<Vec<Option<Vec<u8>>>, EncodeError> {
    let chunks: Vec<&[u8]> = data.chunks(CHUNK_PAGES * PAGE_SIZE).collect();
    let one = |c: &[u8]| -> Result<Option<Vec<u8>>, EncodeError> {
        let z = zstd::bulk::compress(c, level).map_err(EncodeError::Compress)?;
        Ok(worth_compressing(c.len(), z.len()).then_some(z))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    if threads < 2 || chunks.len() < 2 {
        return chunks.into_iter().map(one).collect();
    }
    let per = chunks.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .chunks(per)
            .map(|group| s.spawn(move || group.iter().map(|c| one(c)).collect::<Vec<_>>()))
            .collect();
        let mut out = Vec::with_capacity(chunks.len());
        for h in handles {
            for r in h.join().expect("compression thread panicked") {
                out.push(r?);
            }
        }
        Ok(out)
    })
}

/// Encode `snap` (already validated into `parts`) as a v2 file.
pub(crate) fn encode(
    snap: &Snapshot,
    parts: Parts,
    opts: &EncodeOptions,
) -> Result<Vec<u8>, EncodeError> {
    let data = snap.memory.stored_data();
    let compressed = compress_chunks(data, opts.level)?;
    let mut chunks = Vec::with_capacity(compressed.len());
    let mut at = 0u64;
    for (raw, z) in data.chunks(CHUNK_PAGES * PAGE_SIZE).zip(&compressed) {
        let (codec, bytes) = match z {
            Some(z) => (Codec::Zstd, &z[..]),
            None => {
                at = at.next_multiple_of(PAGE_SIZE as u64);
                (Codec::Raw, raw)
            }
        };
        chunks.push(Chunk {
            pages: (raw.len() / PAGE_SIZE) as u32,
            codec,
            offset: at,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        });
        at += bytes.len() as u64;
    }
    let table = postcard::to_allocvec(&ChunkTable {
        area_len: at,
        chunks: chunks.clone(),
    })?;

    let module: &[u8] = snap.module.embedded.as_deref().unwrap_or_default();
    let sections: [&[u8]; SECTION_COUNT] =
        [&parts.meta, module, &snap.os_state, &parts.files, &table];
    let raw_len: u64 = sections.iter().map(|s| 8 + s.len() as u64).sum();
    let mut enc =
        zstd::Encoder::new(Vec::with_capacity(4096), opts.level).map_err(EncodeError::Compress)?;
    enc.set_pledged_src_size(Some(raw_len))
        .map_err(EncodeError::Compress)?;
    enc.include_contentsize(true)
        .map_err(EncodeError::Compress)?;
    crate::encode::write_sections(&mut enc, &sections)?;
    let block = enc.finish().map_err(EncodeError::Compress)?;

    let area = area_start(block.len() as u64) as usize;
    let total = area + at as usize;
    let mut out = Vec::with_capacity(total);
    out.resize(HEADER_LEN, 0);
    out.extend_from_slice(&(block.len() as u64).to_le_bytes());
    out.extend_from_slice(&block);
    debug_assert_eq!(out.len() as u64, META_AT + block.len() as u64);
    for ((chunk, raw), z) in chunks
        .iter()
        .zip(data.chunks(CHUNK_PAGES * PAGE_SIZE))
        .zip(&compressed)
    {
        out.resize(area + chunk.offset as usize, 0);
        out.extend_from_slice(z.as_deref().unwrap_or(raw));
    }
    out.resize(total, 0);
    let header = Header {
        // A snapshot of one thread stays 2.0, readable by every 2.x reader.
        version: match snap.threads.is_empty() {
            true => Version::V2,
            false => Version::V2_1,
        },
        flags: snap.flags(),
        compressed_len: (total - HEADER_LEN) as u64,
        uncompressed_len: raw_len,
        payload_hash: *blake3::hash(&out[HEADER_LEN..area]).as_bytes(),
    };
    out[..HEADER_LEN].copy_from_slice(&header.to_bytes());
    Ok(out)
}
