use crate::header::{Header, Version};
use crate::payload::{Meta, Run};
use crate::testutil::sample_snapshot;
use crate::*;

fn sample_bytes() -> Vec<u8> {
    let (_, _, snap) = sample_snapshot(4, 40);
    let v1 = EncodeOptions {
        format: Format::V1,
        ..Default::default()
    };
    snap.encode(&v1).unwrap()
}

/// Split a valid file into its header and decompressed sections.
fn split(bytes: &[u8]) -> (Header, Vec<Vec<u8>>) {
    let h = peek_header(bytes).unwrap();
    let raw = zstd::decode_all(&bytes[HEADER_LEN..]).unwrap();
    let mut at = 0;
    let mut sections = Vec::new();
    while at < raw.len() {
        let len = u64::from_le_bytes(raw[at..at + 8].try_into().unwrap()) as usize;
        sections.push(raw[at + 8..at + 8 + len].to_vec());
        at += 8 + len;
    }
    assert_eq!(sections.len(), 5);
    (h, sections)
}

/// Build a file with correct checksums around arbitrary section contents.
fn forge(flags: u32, raw: &[u8], declared: Option<u64>) -> Vec<u8> {
    let compressed = zstd::encode_all(raw, 3).unwrap();
    let h = Header {
        version: Version::V1,
        flags,
        compressed_len: compressed.len() as u64,
        uncompressed_len: declared.unwrap_or(raw.len() as u64),
        payload_hash: *blake3::hash(&compressed).as_bytes(),
    };
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(&compressed);
    out
}

fn join(sections: &[Vec<u8>]) -> Vec<u8> {
    let mut raw = Vec::new();
    for s in sections {
        raw.extend_from_slice(&(s.len() as u64).to_le_bytes());
        raw.extend_from_slice(s);
    }
    raw
}

fn err(bytes: &[u8]) -> DecodeError {
    Snapshot::decode(bytes).expect_err("must be refused")
}

#[test]
fn forge_reproduces_a_valid_file() {
    let bytes = sample_bytes();
    let (h, s) = split(&bytes);
    assert!(Snapshot::decode(&forge(h.flags, &join(&s), None)).is_ok());
}

#[test]
fn bad_magic() {
    let mut b = sample_bytes();
    b[0] = b'X';
    assert!(matches!(err(&b), DecodeError::BadMagic { found } if &found[1..] == b"OAMSNAP"));
    assert!(matches!(
        err(b"PK\x03\x04 zip file"),
        DecodeError::BadMagic { .. }
    ));
}

#[test]
fn versions() {
    let mut b = sample_bytes();
    b[8..10].copy_from_slice(&3u16.to_le_bytes());
    assert_eq!(
        err(&b),
        DecodeError::UnsupportedVersion {
            found: Version { major: 3, minor: 0 },
            supported: Version { major: 2, minor: 1 }
        }
    );
    let mut b = sample_bytes();
    b[10..12].copy_from_slice(&1u16.to_le_bytes());
    let e = err(&b);
    assert_eq!(
        e,
        DecodeError::UnsupportedVersion {
            found: Version { major: 1, minor: 1 },
            supported: Version { major: 2, minor: 1 }
        }
    );
    assert!(
        e.to_string().contains("1.1") && e.to_string().contains("reads 2.1"),
        "{e}"
    );
    let mut b = sample_bytes();
    b[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert!(matches!(err(&b), DecodeError::UnsupportedVersion { .. }));
}

#[test]
fn header_checksum() {
    let mut b = sample_bytes();
    b[20] ^= 0x80; // compressed_len
    assert_eq!(err(&b), DecodeError::ChecksumMismatch { what: "header" });
    let mut b = sample_bytes();
    b[70] ^= 0x01; // the checksum itself
    assert_eq!(err(&b), DecodeError::ChecksumMismatch { what: "header" });
}

#[test]
fn flipped_payload_bytes_fail_the_payload_hash() {
    let good = sample_bytes();
    for at in (HEADER_LEN..good.len()).step_by(97).chain([good.len() - 1]) {
        let mut b = good.clone();
        b[at] ^= 0x04;
        assert_eq!(
            err(&b),
            DecodeError::ChecksumMismatch { what: "payload" },
            "byte {at}"
        );
    }
}

#[test]
fn truncation_at_every_offset() {
    let good = sample_bytes();
    for n in 0..good.len() {
        let e = err(&good[..n]);
        match e {
            DecodeError::Truncated { expected, got, .. } => {
                assert_eq!(
                    got as usize,
                    n.saturating_sub(if n < HEADER_LEN { 0 } else { HEADER_LEN })
                );
                assert!(expected > got);
            }
            // Fewer than 8 bytes of a correct magic are reported as truncation too.
            other => panic!("prefix {n}: {other}"),
        }
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        err(&long),
        DecodeError::Malformed { what: "file", .. }
    ));
}

#[test]
fn oversized_declared_lengths() {
    let (h, s) = split(&sample_bytes());
    // Header declares more than the cap.
    let raw = join(&s);
    assert!(matches!(
        err(&forge(h.flags, &raw, Some(MAX_PAYLOAD_BYTES + 1))),
        DecodeError::TooLarge {
            what: "uncompressed payload",
            ..
        }
    ));
    // A section length above its cap, with the header and hash all valid.
    let mut raw2 = raw.clone();
    raw2[..8].copy_from_slice(&(MAX_METADATA_BYTES + 1).to_le_bytes());
    assert!(matches!(
        err(&forge(h.flags, &raw2, None)),
        DecodeError::TooLarge {
            what: "metadata section",
            ..
        }
    ));
    // A section length within the cap but past the declared payload.
    raw2[..8].copy_from_slice(&(raw.len() as u64).to_le_bytes());
    assert!(matches!(
        err(&forge(h.flags, &raw2, None)),
        DecodeError::Malformed { .. }
    ));
    // Declared uncompressed length larger / smaller than the actual payload.
    assert!(matches!(
        err(&forge(h.flags, &raw, Some(raw.len() as u64 + 5))),
        DecodeError::Malformed { .. }
    ));
    assert!(matches!(
        err(&forge(h.flags, &raw, Some(raw.len() as u64 - 1))),
        DecodeError::Malformed { .. }
    ));
    // Memory larger than 4 GiB in the metadata.
    let mut meta: Meta = postcard::from_bytes(&s[0]).unwrap();
    meta.memory.byte_len = MAX_MEMORY_BYTES + WASM_PAGE_SIZE;
    let mut s2 = s.clone();
    s2[0] = postcard::to_allocvec(&meta).unwrap();
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::TooLarge { what: "memory", .. }
    ));
}

#[test]
fn inconsistent_contents_are_malformed() {
    let (h, s) = split(&sample_bytes());
    let meta: Meta = postcard::from_bytes(&s[0]).unwrap();

    // Page map that does not cover memory.
    let mut m2: Meta = postcard::from_bytes(&s[0]).unwrap();
    m2.memory.runs.push(Run {
        kind: PageKind::Zero,
        pages: 1,
    });
    let mut s2 = s.clone();
    s2[0] = postcard::to_allocvec(&m2).unwrap();
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::Malformed {
            what: "memory page map",
            ..
        }
    ));

    // Memory section shorter than the stored pages.
    let mut s2 = s.clone();
    let n = s2[4].len() - PAGE_SIZE;
    s2[4].truncate(n);
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::Malformed { .. }
    ));

    // Trailing garbage inside the metadata section.
    let mut s2 = s.clone();
    s2[0].push(0);
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::Malformed {
            what: "metadata section",
            ..
        }
    ));

    // Module present but flag cleared; files present but flag cleared.
    assert!(matches!(
        err(&forge(FLAG_FILES, &join(&s), None)),
        DecodeError::Malformed {
            what: "module section",
            ..
        }
    ));
    assert!(matches!(
        err(&forge(FLAG_MODULE_EMBEDDED, &join(&s), None)),
        DecodeError::Malformed {
            what: "files section",
            ..
        }
    ));

    // Embedded module that does not match the hash.
    let mut s2 = s.clone();
    s2[1][0] ^= 1;
    assert_eq!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::ChecksumMismatch {
            what: "embedded module"
        }
    );

    // Stack outside memory.
    let mut m2: Meta = postcard::from_bytes(&s[0]).unwrap();
    m2.stack.buffer_offset = meta.memory.byte_len as u32;
    let mut s2 = s.clone();
    s2[0] = postcard::to_allocvec(&m2).unwrap();
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::Malformed {
            what: "unwound stack",
            ..
        }
    ));

    // A path escaping its preopen.
    let (_, _, mut snap) = sample_snapshot(4, 40);
    snap.files.as_mut().unwrap().entries[0].path = "../../etc".into();
    let mut s2 = s.clone();
    s2[3] = postcard::to_allocvec(snap.files.as_ref().unwrap()).unwrap();
    assert!(matches!(
        err(&forge(h.flags, &join(&s2), None)),
        DecodeError::Malformed {
            what: "file tree",
            ..
        }
    ));

    // Not zstd at all, with a valid hash.
    let junk = b"definitely not zstd".to_vec();
    let hdr = Header {
        version: Version::V1,
        flags: 0,
        compressed_len: junk.len() as u64,
        uncompressed_len: 100,
        payload_hash: *blake3::hash(&junk).as_bytes(),
    };
    let mut b = hdr.to_bytes().to_vec();
    b.extend_from_slice(&junk);
    assert!(matches!(err(&b), DecodeError::Malformed { .. }));
}

#[test]
fn a_state_that_stores_pages_is_refused_before_they_are_decompressed() {
    let (initial, _, snap) = sample_snapshot(4, 41);
    assert!(snap.memory.stored_pages() > 0, "the sample stores pages");
    for format in [Format::V1, Format::V2] {
        let opts = EncodeOptions {
            format,
            ..Default::default()
        };
        let bytes = snap.encode(&opts).unwrap();
        match Snapshot::decode_state(&bytes) {
            Err(DecodeError::TooLarge { what, max: 0, .. }) => {
                assert_eq!(what, "stored memory pages")
            }
            other => panic!("{format:?}: {other:?}"),
        }
        // The same snapshot with its memory as a placeholder is a state.
        let mut state = snap.clone();
        state.memory = MemoryImage::placeholder(snap.memory.byte_len(), &initial);
        let bytes = state.encode(&opts).unwrap();
        let back = Snapshot::decode_state(&bytes).unwrap();
        assert_eq!(back.memory.byte_len(), snap.memory.byte_len());
        assert_eq!(back.memory.stored_pages(), 0);
    }
}
