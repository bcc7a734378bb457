//! Files written by earlier releases must keep loading (accept N and N-1).

use crate::testutil::sample_snapshot;
use crate::*;

/// A v1.0 file written by the v1 encoder of roam 0.1 from
/// `sample_snapshot(2, 77)`, committed as it was written.
const V1_SAMPLE: &[u8] = include_bytes!("data/v1-sample.roam");

#[test]
fn a_v1_file_written_before_v2_still_decodes_to_the_same_snapshot() {
    let (initial, mem, snap) = sample_snapshot(2, 77);
    let (back, header) = Snapshot::decode_with_header(V1_SAMPLE).unwrap();
    assert_eq!(header.version, Version::V1);
    assert_eq!(back, snap);
    let mut out = vec![0u8; mem.len()];
    back.memory.restore_into(&mut out, &initial, false).unwrap();
    assert_eq!(out, mem);
    // The v1 encoder still writes exactly these bytes.
    let v1 = EncodeOptions {
        format: Format::V1,
        ..Default::default()
    };
    assert_eq!(snap.encode(&v1).unwrap(), V1_SAMPLE);
}

#[test]
fn a_v1_file_on_disk_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.roam");
    std::fs::write(&path, V1_SAMPLE).unwrap();
    let (back, header) = Snapshot::read_file_with_header(&path).unwrap();
    assert_eq!(header.version, Version::V1);
    assert_eq!(back, sample_snapshot(2, 77).2);
    assert!(back.memory.stored_data_fd().is_none());
}

#[test]
fn v2_is_written_by_default_and_decodes_into_a_mappable_page_file() {
    let (initial, mem, snap) = sample_snapshot(2, 77);
    let opts = EncodeOptions {
        format: Format::V2,
        ..Default::default()
    };
    let bytes = snap.encode(&opts).unwrap();
    assert_eq!(peek_header(&bytes).unwrap().version, Version::V2);
    let back = Snapshot::decode(&bytes).unwrap();
    assert_eq!(back, snap);
    assert!(back.memory.stored_data_fd().is_some());
    let mut out = vec![0u8; mem.len()];
    back.memory.restore_into(&mut out, &initial, false).unwrap();
    assert_eq!(out, mem);
}

/// A v2.0 file written by the first v2 encoder from `sample_snapshot(2, 77)`.
const V2_SAMPLE: &[u8] = include_bytes!("data/v2-sample.roam");

#[test]
fn the_first_v2_file_still_decodes_to_the_same_snapshot() {
    let (initial, mem, snap) = sample_snapshot(2, 77);
    let (back, header) = Snapshot::decode_with_header(V2_SAMPLE).unwrap();
    assert_eq!(header.version, Version::V2);
    assert_eq!(back, snap);
    let mut out = vec![0u8; mem.len()];
    back.memory.restore_into(&mut out, &initial, false).unwrap();
    assert_eq!(out, mem);
}
