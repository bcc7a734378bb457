//! Hostile or damaged batches are rejected precisely and change nothing.

mod common;
use common::*;
use roam_transfer::*;
use std::sync::Arc;

/// A batch with a valid checksum around arbitrary body bytes.
fn seal(body: &[u8], count: u32) -> Vec<u8> {
    let mut b = vec![BATCH_VERSION];
    b.extend_from_slice(body);
    b.extend_from_slice(&count.to_le_bytes());
    let h = blake3::hash(&b);
    b.extend_from_slice(&h.as_bytes()[..8]);
    b
}

fn good_batch() -> Vec<u8> {
    let mut w = BatchWriter::default();
    w.push(&Record::Zero { index: 1 });
    w.push(&Record::Raw {
        index: 0,
        codec: 0,
        data: &[7u8; PS],
    });
    w.take()
}

#[test]
fn structural_errors_are_precise() {
    assert_eq!(
        decode_batch(&[1, 2, 3]),
        Err(BatchError::TooShort { len: 3 })
    );
    let mut b = good_batch();
    b[5] ^= 1;
    assert_eq!(decode_batch(&b), Err(BatchError::ChecksumMismatch));
    let b = good_batch();
    assert_eq!(
        decode_batch(&b[..b.len() - 1]),
        Err(BatchError::ChecksumMismatch)
    );
    let mut v = seal(&[], 0);
    v[0] = 9;
    let h = blake3::hash(&v[..v.len() - 8]);
    let n = v.len();
    v[n - 8..].copy_from_slice(&h.as_bytes()[..8]);
    assert_eq!(
        decode_batch(&v),
        Err(BatchError::UnsupportedVersion { found: 9 })
    );
    assert!(matches!(
        decode_batch(&seal(&[9, 0], 1)),
        Err(BatchError::UnknownTag {
            record: 0,
            offset: 1,
            tag: 9
        })
    ));
    assert!(matches!(
        decode_batch(&seal(&[0, 0x80, 0x80, 0x80, 0x80, 0x10], 1)),
        Err(BatchError::BadVarint {
            record: 0,
            what: "page index",
            ..
        })
    ));
    assert!(matches!(
        decode_batch(&seal(&[0, 0x81, 0x00], 1)),
        Err(BatchError::BadVarint {
            record: 0,
            offset: 2,
            what: "page index"
        })
    ));
    assert!(matches!(
        decode_batch(&seal(&[3, 1, 0, 0], 1)),
        Err(BatchError::Truncated {
            record: 0,
            what: "chunk hash",
            need: 32,
            have: 2,
            ..
        })
    ));
    assert!(matches!(
        decode_batch(&seal(&[0, 1, 4, 2, 1, 0x81, 0x20], 2)),
        Err(BatchError::PayloadTooLarge {
            record: 1,
            len: 4097
        })
    ));
    assert!(matches!(
        decode_batch(&seal(&[4, 2, 1, 10, 1, 2], 1)),
        Err(BatchError::Truncated {
            record: 0,
            what: "payload",
            need: 10,
            have: 2,
            ..
        })
    ));
    assert_eq!(
        decode_batch(&seal(&[0, 1, 0, 2], 3)),
        Err(BatchError::CountMismatch {
            declared: 3,
            found: 2
        })
    );
    assert_eq!(decode_batch(&good_batch()).unwrap().len(), 2);
}

#[test]
fn out_of_range_pages_apply_nothing() {
    let initial = roam_snapshot::InitialImage::empty();
    let mut mem = vec![5u8; 2 * PS];
    let mut w = BatchWriter::default();
    w.push(&Record::Zero { index: 0 });
    w.push(&Record::Copy { index: 1, from: 2 });
    let e = Decoder::new()
        .apply(&w.take(), &mut MemoryTarget::new(&mut mem, &initial))
        .unwrap_err();
    assert_eq!(
        e,
        ApplyError::PageOutOfRange {
            record: 1,
            page: 2,
            pages: 2
        }
    );
    assert!(mem.iter().all(|&b| b == 5), "nothing may be applied");
}

#[test]
fn bad_codec_data_and_unknown_chunks_leave_the_page_untouched() {
    let initial = roam_snapshot::InitialImage::empty();
    let mut mem = vec![5u8; 3 * PS];
    let mut w = BatchWriter::default();
    w.push(&Record::Zero { index: 0 });
    w.push(&Record::Raw {
        index: 1,
        codec: 1,
        data: &[0xff; 20],
    });
    let e = Decoder::new()
        .apply(&w.take(), &mut MemoryTarget::new(&mut mem, &initial))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ApplyError::Codec {
                record: 1,
                page: 1,
                applied: 1,
                source: CodecError::Corrupt { codec: "lz4", .. }
            }
        ),
        "{e}"
    );
    assert!(mem[..PS].iter().all(|&b| b == 0), "earlier record applied");
    assert!(
        mem[PS..].iter().all(|&b| b == 5),
        "failed record left its page"
    );

    let small = zstd::bulk::compress(&[1u8; 100], 3).unwrap();
    let mut w = BatchWriter::default();
    w.push(&Record::Delta {
        index: 2,
        codec: 2,
        data: &small,
    });
    let e = Decoder::new()
        .apply(&w.take(), &mut MemoryTarget::new(&mut mem, &initial))
        .unwrap_err();
    assert!(
        matches!(
            e,
            ApplyError::Codec {
                source: CodecError::WrongSize { got: 100, .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(mem[2 * PS..].iter().all(|&b| b == 5));

    let store = Arc::new(ChunkStore::new(1 << 20));
    let mut w = BatchWriter::default();
    w.push(&Record::Stored {
        index: 2,
        hash: [0xab; 32],
    });
    let e = Decoder::with_store(store, true)
        .apply(&w.take(), &mut MemoryTarget::new(&mut mem, &initial))
        .unwrap_err();
    assert!(
        matches!(&e, ApplyError::UnknownChunk { record: 0, page: 2, applied: 0, hash } if hash.starts_with("abab")),
        "{e}"
    );
    assert!(e.to_string().contains("does not hold"));
    assert!(mem[2 * PS..].iter().all(|&b| b == 5));
}

#[test]
fn every_truncation_of_a_real_stream_is_rejected() {
    let (initial, mem) = mixed_memory(24, 11);
    let mut dst = vec![0u8; mem.len()];
    let (_, batches) = run_stream(
        static_cfg(Mode::new(false, Codec::Zstd(3))),
        &initial,
        None,
        vec![pages_of(&mem)],
        &mut dst,
    );
    let b = &batches[0];
    for cut in 0..b.len() {
        assert!(decode_batch(&b[..cut]).is_err(), "cut at {cut}");
    }
    for i in (0..b.len()).step_by(7) {
        let mut c = b.clone();
        c[i] ^= 0x40;
        assert!(decode_batch(&c).is_err(), "flip at {i}");
    }
}
