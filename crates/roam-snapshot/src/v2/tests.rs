//! Format v2: layout, round trips, and hostile files refused precisely.

use super::*;
use crate::header::{Header, Version};
use crate::testutil::{sample_snapshot, Rng};
use crate::*;

fn v2() -> EncodeOptions {
    EncodeOptions {
        format: Format::V2,
        ..Default::default()
    }
}

/// A snapshot of `wasm_pages` 64 KiB pages, most of them stored: random
/// (raw chunks) in the first half, compressible in the second.
fn big_snapshot(wasm_pages: u64) -> (InitialImage, Vec<u8>, Snapshot) {
    let (initial, mut mem, mut snap) = sample_snapshot(wasm_pages, 3);
    let half = mem.len() / 2;
    Rng::new(9).fill(&mut mem[PAGE_SIZE * 16..half]);
    for (i, b) in mem[half..].iter_mut().enumerate() {
        *b = (i / 64) as u8 | 1;
    }
    snap.memory = MemoryImage::capture(&mem, &initial);
    (initial, mem, snap)
}

/// The parts of a valid v2 file.
struct Split {
    header: Header,
    sections: Vec<Vec<u8>>,
    table: ChunkTable,
    area: Vec<u8>,
}

fn split(bytes: &[u8]) -> Split {
    let header = peek_header(bytes).unwrap();
    let meta_len = u64::from_le_bytes(bytes[80..88].try_into().unwrap()) as usize;
    let raw = zstd::decode_all(&bytes[88..88 + meta_len]).unwrap();
    let mut at = 0;
    let mut sections = Vec::new();
    while at < raw.len() {
        let len = u64::from_le_bytes(raw[at..at + 8].try_into().unwrap()) as usize;
        sections.push(raw[at + 8..at + 8 + len].to_vec());
        at += 8 + len;
    }
    let table = postcard::from_bytes(&sections[4]).unwrap();
    let area = bytes[area_start(meta_len as u64) as usize..].to_vec();
    Split {
        header,
        sections,
        table,
        area,
    }
}

/// Reassemble a file with valid header and metadata hashes.
fn forge(s: &Split) -> Vec<u8> {
    let mut sections = s.sections.clone();
    sections[4] = postcard::to_allocvec(&s.table).unwrap();
    let mut raw = Vec::new();
    for x in &sections {
        raw.extend_from_slice(&(x.len() as u64).to_le_bytes());
        raw.extend_from_slice(x);
    }
    let block = zstd::encode_all(&raw[..], 3).unwrap();
    let mut out = vec![0u8; 80];
    out.extend_from_slice(&(block.len() as u64).to_le_bytes());
    out.extend_from_slice(&block);
    let area = area_start(block.len() as u64) as usize;
    out.resize(area, 0);
    let hash = *blake3::hash(&out[80..area]).as_bytes();
    out.extend_from_slice(&s.area);
    let h = Header {
        version: Version::V2,
        flags: s.header.flags,
        compressed_len: out.len() as u64 - 80,
        uncompressed_len: raw.len() as u64,
        payload_hash: hash,
    };
    out[..80].copy_from_slice(&h.to_bytes());
    out
}

fn err(bytes: &[u8]) -> DecodeError {
    Snapshot::decode(bytes).expect_err("must be refused")
}

fn malformed(bytes: &[u8], needle: &str) {
    match err(bytes) {
        DecodeError::Malformed { detail, .. } => {
            assert!(detail.contains(needle), "{detail:?} lacks {needle:?}")
        }
        e => panic!("expected malformed ({needle}), got {e:?}"),
    }
}

#[test]
fn layout_has_page_aligned_raw_chunks_and_compressed_ones() {
    let (_, _, snap) = big_snapshot(48);
    let bytes = snap.encode(&v2()).unwrap();
    let s = split(&bytes);
    let area = area_start(u64::from_le_bytes(bytes[80..88].try_into().unwrap()));
    assert!(area.is_multiple_of(4096));
    let codecs: Vec<_> = s.table.chunks.iter().map(|c| c.codec).collect();
    assert!(codecs.contains(&Codec::Raw) && codecs.contains(&Codec::Zstd));
    let data = snap.memory.stored_data();
    let mut page = 0usize;
    for c in &s.table.chunks {
        let at = (area + c.offset) as usize;
        let raw = &data[page * PAGE_SIZE..(page + c.pages as usize) * PAGE_SIZE];
        if c.codec == Codec::Raw {
            assert_eq!(at % 4096, 0);
            assert_eq!(&bytes[at..at + raw.len()], raw);
        }
        page += c.pages as usize;
    }
    assert_eq!(page, snap.memory.stored_pages());
    assert_eq!(bytes.len() as u64, area + s.table.area_len);
    assert!(
        Snapshot::decode(&forge(&s)).unwrap() == snap,
        "forge reproduces a valid file"
    );
}

#[test]
fn round_trips_in_memory_and_from_a_file() {
    let (initial, mem, snap) = big_snapshot(48);
    let bytes = snap.encode(&v2()).unwrap();
    assert_eq!(Snapshot::decode(&bytes).unwrap(), snap);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.roam");
    snap.write_file_with(&path, &v2()).unwrap();
    let (back, h) = Snapshot::read_file_with_header(&path).unwrap();
    assert_eq!(h.version, Version::V2);
    assert_eq!(back, snap);
    let mut out = vec![0u8; mem.len()];
    back.memory.restore_into(&mut out, &initial, false).unwrap();
    assert_eq!(out, mem);
    // Restoring all but the data pages, then the data runs by hand.
    let mut fresh = vec![0u8; mem.len()];
    for (k, &p) in initial.indices().iter().enumerate() {
        let p = p as usize * PAGE_SIZE;
        fresh[p..p + PAGE_SIZE].copy_from_slice(initial.page_at_slot(k));
    }
    back.memory
        .restore_except_data(&mut fresh, &initial)
        .unwrap();
    let data = back.memory.stored_data();
    for (page, stored, n) in back.memory.data_runs() {
        let (p, s, n) = (page as usize, stored as usize, n as usize);
        fresh[p * PAGE_SIZE..(p + n) * PAGE_SIZE]
            .copy_from_slice(&data[s * PAGE_SIZE..(s + n) * PAGE_SIZE]);
    }
    assert_eq!(fresh, mem);
}

#[test]
fn empty_memory_round_trips() {
    let (_, _, mut snap) = sample_snapshot(1, 5);
    snap.memory = MemoryImage::empty();
    snap.stack = UnwoundStack::default();
    let bytes = snap.encode(&v2()).unwrap();
    assert_eq!(Snapshot::decode(&bytes).unwrap(), snap);
}

#[test]
fn truncated_files_are_refused_at_every_length() {
    let (_, _, snap) = big_snapshot(4);
    let bytes = snap.encode(&v2()).unwrap();
    for n in (0..bytes.len()).step_by(509).chain([bytes.len() - 1]) {
        let e = err(&bytes[..n]);
        assert!(
            matches!(
                e,
                DecodeError::Truncated { .. } | DecodeError::BadMagic { .. }
            ),
            "{n}: {e:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.roam");
    std::fs::write(&path, &bytes[..bytes.len() - 4096]).unwrap();
    assert!(matches!(
        Snapshot::read_file(&path),
        Err(ReadFileError::Decode {
            source: DecodeError::Truncated { .. },
            ..
        })
    ));
}

#[test]
fn overlapping_misplaced_and_oversized_chunks_are_refused() {
    let (_, _, snap) = big_snapshot(32);
    let good = split(&snap.encode(&v2()).unwrap());
    let edit = |f: &dyn Fn(&mut Split)| {
        let mut s = Split {
            header: good.header,
            sections: good.sections.clone(),
            table: good.table.clone(),
            area: good.area.clone(),
        };
        f(&mut s);
        forge(&s)
    };
    malformed(
        &edit(&|s| s.table.chunks[1].offset = s.table.chunks[0].offset),
        "overlaps",
    );
    malformed(
        &edit(&|s| {
            let c = s.table.chunks.last_mut().unwrap();
            c.offset = s.table.area_len;
        }),
        "past the end",
    );
    malformed(&edit(&|s| s.table.chunks[0].len = u64::MAX), "bytes for");
    malformed(
        &edit(&|s| {
            let c = s.table.chunks.last_mut().unwrap();
            c.offset = u64::MAX - 3;
        }),
        "",
    );
    malformed(&edit(&|s| s.table.chunks[0].pages = 0), "pages");
    malformed(
        &edit(&|s| s.table.chunks[0].pages = MAX_CHUNK_PAGES + 1),
        "pages",
    );
    malformed(
        &edit(&|s| {
            s.table.chunks.pop();
        }),
        "the page map stores",
    );
    malformed(
        &edit(&|s| {
            let c = *s.table.chunks.last().unwrap();
            s.table.chunks.push(c);
        }),
        "",
    );
    // More chunks than stored pages: refused before any chunk is looked at.
    malformed(
        &edit(&|s| {
            let c = s.table.chunks[0];
            s.table.chunks = vec![c; 100_000];
        }),
        "100000 chunks",
    );
    let raw = good
        .table
        .chunks
        .iter()
        .position(|c| c.codec == Codec::Raw)
        .unwrap();
    malformed(&edit(&|s| s.table.chunks[raw].offset += 8), "");
    // Area length disagreeing with the file.
    assert!(matches!(
        err(&edit(&|s| s.table.area_len += 1)),
        DecodeError::Truncated { .. }
    ));
    assert!(matches!(
        err(&edit(&|s| s.area.push(0))),
        DecodeError::Truncated { .. }
    ));
}

#[test]
fn corrupt_chunks_and_padding_are_refused() {
    let (_, _, snap) = big_snapshot(32);
    let good = snap.encode(&v2()).unwrap();
    let s = split(&good);
    let area = good.len() - s.area.len();
    for c in &s.table.chunks {
        let mut b = good.clone();
        b[area + c.offset as usize + c.len as usize / 2] ^= 4;
        assert_eq!(
            err(&b),
            DecodeError::ChecksumMismatch {
                what: "memory chunk"
            },
            "{c:?}"
        );
    }
    let mut b = good.clone();
    b[area - 1] = 1;
    assert_eq!(
        err(&b),
        DecodeError::ChecksumMismatch {
            what: "metadata block"
        }
    );
    let mut b = good.clone();
    b[100] ^= 1;
    assert_eq!(
        err(&b),
        DecodeError::ChecksumMismatch {
            what: "metadata block"
        }
    );
    let mut b = good;
    b[80..88].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err(&b), DecodeError::TooLarge { .. }));
}

#[test]
fn an_opened_file_reads_each_chunk_on_demand_as_decoding_would() {
    let (_, _, snap) = big_snapshot(48);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.roam");
    snap.write_file_with(&path, &v2()).unwrap();
    let (opened, h) = Snapshot::open_file(&path).unwrap();
    assert_eq!(h.version, Version::V2);
    let Opened::Lazy { snapshot, pages } = opened else {
        panic!("a v2 file opens lazily");
    };
    // Everything but the pages is there; the memory is a placeholder.
    assert_eq!(snapshot.globals, snap.globals);
    assert_eq!(snapshot.stack, snap.stack);
    assert_eq!(snapshot.memory.byte_len(), snap.memory.byte_len());
    assert_eq!(snapshot.memory.stored_pages(), 0);
    assert_eq!(pages.kinds(), snap.memory.page_kinds());
    assert_eq!(pages.initial_digest(), snap.memory.initial_digest());
    assert!(pages.chunk_count() > 2);
    // Chunks in order hold the stored pages in order, each page in the
    // chunk `chunk_of` names.
    let mut all = Vec::new();
    let mut held = Vec::new();
    let mut buf = Vec::new();
    for i in 0..pages.chunk_count() {
        pages.read_chunk(i, &mut buf).unwrap();
        assert_eq!(buf.len(), pages.chunk_pages(i).len() * PAGE_SIZE);
        all.extend_from_slice(&buf);
        for &p in pages.chunk_pages(i) {
            assert_eq!(pages.chunk_of(p), Some(i));
            held.push(p);
        }
    }
    assert_eq!(all, snap.memory.stored_data());
    // Read whole (the restore without userfaultfd): the decoded image.
    assert_eq!(pages.read_memory().unwrap(), snap.memory);
    let data: Vec<u32> = (0..pages.kinds().len() as u32)
        .filter(|&p| pages.kinds()[p as usize] == PageKind::Data)
        .collect();
    assert_eq!(held, data);
    let not_stored = (0..pages.kinds().len() as u32)
        .find(|&p| pages.kinds()[p as usize] != PageKind::Data)
        .unwrap();
    assert_eq!(pages.chunk_of(not_stored), None);
    assert_eq!(pages.chunk_of(u32::MAX), None);
}

#[test]
fn an_opened_file_damaged_later_gives_errors_not_pages() {
    use std::os::unix::fs::FileExt;
    let (_, _, snap) = big_snapshot(32);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.roam");
    snap.write_file_with(&path, &v2()).unwrap();
    let good = std::fs::read(&path).unwrap();
    let s = split(&good);
    let area = (good.len() - s.area.len()) as u64;
    let (Opened::Lazy { pages, .. }, _) = Snapshot::open_file(&path).unwrap() else {
        panic!("a v2 file opens lazily");
    };
    // The same file (inode) changed in place: chunk 0 fails its CRC, the
    // others still read.
    assert!(pages.chunk_count() >= 2);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let c0 = &s.table.chunks[0];
    f.write_all_at(
        &[good[(area + c0.offset + 7) as usize] ^ 0x5a],
        area + c0.offset + 7,
    )
    .unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        pages.read_chunk(0, &mut buf).unwrap_err(),
        DecodeError::ChecksumMismatch {
            what: "memory chunk"
        }
    );
    assert_eq!(
        pages.read_memory().unwrap_err(),
        DecodeError::ChecksumMismatch {
            what: "memory chunk"
        }
    );
    let last = pages.chunk_count() - 1;
    pages.read_chunk(last, &mut buf).unwrap();
    // Cut short inside the last chunk: it cannot be read any more.
    let cl = &s.table.chunks[last];
    f.set_len(area + cl.offset + cl.len / 2).unwrap();
    assert!(matches!(
        pages.read_chunk(last, &mut buf),
        Err(DecodeError::Read { .. })
    ));
    // Opening it now is refused as a full read refuses it.
    assert!(Snapshot::open_file(&path).is_err());
}

#[test]
fn a_v1_file_opens_whole() {
    let (_, _, snap) = big_snapshot(4);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.roam");
    let v1 = EncodeOptions {
        format: Format::V1,
        ..Default::default()
    };
    snap.write_file_with(&path, &v1).unwrap();
    match Snapshot::open_file(&path).unwrap() {
        (Opened::Whole(s), h) => {
            assert_eq!(s, snap);
            assert_eq!(h.version.major, 1);
        }
        (o, _) => panic!("expected a whole snapshot, got {o:?}"),
    }
}
