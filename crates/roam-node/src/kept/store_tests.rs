use super::*;
use crate::kept::file::{self, Head};
use crate::kept::holder::Holder;

/// A body: its head, then the pages.
fn frame(m: &Manifest, state: &[u8], log: &[u8], pages: &[&[u8]]) -> Vec<u8> {
    let mut b = file::head_bytes(m, state, log);
    for p in pages {
        b.extend_from_slice(p);
    }
    b
}

/// What a PUT of `body` does: the body goes to a file, then to the holder.
fn put(h: &Holder, id: &str, body: &[u8], max: u64) -> Result<Manifest, KeptError> {
    use std::io::Write;
    let mut tmp = tempfile::tempfile().unwrap();
    tmp.write_all(body).unwrap();
    h.put(id, &tmp, max)
}

/// A stored version, read back and checked.
struct Read {
    m: Manifest,
    state: Vec<u8>,
    log: Vec<u8>,
    pages: Vec<Vec<u8>>,
}

fn read(h: &Holder, id: &str, snapshot: Option<&str>) -> Option<Result<Read, KeptError>> {
    let f = h.open(id, snapshot).unwrap()?;
    let len = f.metadata().unwrap().len();
    let check = |f: &std::fs::File| -> Result<Read, KeptError> {
        let head: Head = file::read_head(f, len, 1 << 30)?;
        file::verify(f, &head)?;
        let (state, log) = file::state_and_log(f, &head)?;
        let mut pages = Vec::new();
        for k in 0..head.m.sent.len() {
            let mut p = vec![0u8; PAGE_SIZE];
            file::page(f, &head, k, &mut p)?;
            pages.push(p);
        }
        Ok(Read {
            m: head.m,
            state,
            log,
            pages,
        })
    };
    Some(check(&f))
}

fn page(b: u8) -> Vec<u8> {
    vec![b; PAGE_SIZE]
}

const LOG: &[u8] = b"output before the checkpoint\n";

fn manifest(state: &[u8], pages: &[(u32, &[u8])], sent: &[&[u8]]) -> Manifest {
    manifest_at(1, state, pages, sent)
}

fn manifest_at(taken_ms: u64, state: &[u8], pages: &[(u32, &[u8])], sent: &[&[u8]]) -> Manifest {
    let hash = |p: &[u8]| hex(blake3::hash(p).as_bytes());
    let pages: Vec<(u32, PageHash)> = pages.iter().map(|(i, p)| (*i, PageHash::of(p))).collect();
    let mut m = Manifest {
        snapshot: String::new(),
        taken_ms,
        generation: Some(1),
        memory_bytes: 65536,
        state_len: state.len() as u64,
        state_hash: hash(state),
        log_len: LOG.len() as u64,
        log_hash: hash(LOG),
        log_dropped: 0,
        pages,
        sent: sent.iter().map(|p| PageHash::of(p)).collect(),
    };
    m.snapshot = digest(&m);
    m
}

#[test]
fn a_second_put_needs_only_the_new_pages_and_rebuilds_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let (a, b, c) = (page(1), page(2), page(3));
    let m1 = manifest(b"state1", &[(0, &a), (3, &b)], &[&a, &b]);
    put(&h, "c-1", &frame(&m1, b"state1", LOG, &[&a, &b]), 1 << 30).unwrap();
    // The second checkpoint: page 0 unchanged, page 3 rewritten.
    let m2 = manifest_at(2, b"state2", &[(0, &a), (3, &c)], &[]);
    let all: Vec<PageHash> = m2.pages.iter().map(|(_, h)| *h).collect();
    let missing = h.missing("c-1", &all, 1 << 30).unwrap();
    assert_eq!(missing, vec![m2.pages[1].1]);
    let m2 = manifest_at(2, b"state2", &[(0, &a), (3, &c)], &[&c]);
    put(&h, "c-1", &frame(&m2, b"state2", LOG, &[&c]), 1 << 30).unwrap();
    let f = read(&h, "c-1", None).unwrap().unwrap();
    assert_eq!(f.m.snapshot, m2.snapshot);
    assert_eq!(f.state, b"state2");
    assert_eq!(f.log, LOG);
    assert_eq!(f.pages, vec![a.clone(), c.clone()]);
}

#[test]
fn a_put_lacking_a_page_or_with_a_bad_page_keeps_the_old_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let (a, b) = (page(1), page(2));
    let m1 = manifest(b"s", &[(0, &a)], &[&a]);
    put(&h, "c-1", &frame(&m1, b"s", LOG, &[&a]), 1 << 30).unwrap();
    let lacking = manifest(b"s", &[(0, &a), (1, &b)], &[]);
    assert!(put(&h, "c-1", &frame(&lacking, b"s", LOG, &[]), 1 << 30).is_err());
    let mut forged = manifest(b"s", &[(0, &a), (1, &b)], &[&b]);
    forged.sent = vec![forged.pages[0].1];
    assert!(matches!(
        put(&h, "c-1", &frame(&forged, b"s", LOG, &[&b]), 1 << 30),
        Err(KeptError::Mismatch(_))
    ));
    let truncated = frame(&m1, b"s", LOG, &[&a]);
    assert!(put(&h, "c-1", &truncated[..truncated.len() - 1], 1 << 30).is_err());
    let f = read(&h, "c-1", None).unwrap().unwrap();
    assert_eq!(f.m.snapshot, m1.snapshot);
}

/// Store `state` with one page as the checkpoint taken at `taken_ms`.
fn put_one(h: &Holder, taken_ms: u64, state: &[u8]) -> Manifest {
    let a = page(taken_ms as u8);
    let m = manifest_at(taken_ms, state, &[(0, &a)], &[&a]);
    put(h, "c-1", &frame(&m, state, LOG, &[&a]), 1 << 30).unwrap();
    m
}

fn stored(h: &Holder, snapshot: Option<&str>) -> Option<String> {
    Some(read(h, "c-1", snapshot)?.unwrap().m.snapshot)
}

#[test]
fn a_newer_checkpoint_keeps_the_older_until_the_planner_commits_it() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let m1 = put_one(&h, 1, b"one");
    h.commit("c-1", &m1.snapshot).unwrap();
    // The next checkpoint arrives, but the planner's record still
    // names the first (its compare-and-swap failed): both are there.
    let m2 = put_one(&h, 2, b"two");
    assert_eq!(stored(&h, Some(&m1.snapshot)), Some(m1.snapshot.clone()));
    assert_eq!(stored(&h, Some(&m2.snapshot)), Some(m2.snapshot.clone()));
    // Without a name, the committed one.
    assert_eq!(stored(&h, None), Some(m1.snapshot.clone()));
    // Unconfirmed versions are bounded; the committed one stays.
    let m3 = put_one(&h, 3, b"three");
    let m4 = put_one(&h, 4, b"four");
    assert_eq!(
        stored(&h, Some(&m2.snapshot)),
        None,
        "the oldest unconfirmed stays"
    );
    assert!(stored(&h, Some(&m1.snapshot)).is_some());
    assert!(stored(&h, Some(&m3.snapshot)).is_some());
    // A commit removes what is older than it.
    h.commit("c-1", &m4.snapshot).unwrap();
    assert_eq!(stored(&h, Some(&m1.snapshot)), None);
    assert_eq!(stored(&h, Some(&m3.snapshot)), None);
    assert_eq!(stored(&h, None), Some(m4.snapshot.clone()));
    assert!(matches!(
        h.commit("c-1", &m1.snapshot),
        Err(KeptError::Unknown(_))
    ));
}

#[test]
fn an_older_checkpoint_than_the_newest_held_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let m2 = put_one(&h, 2, b"two");
    let a = page(1);
    let m1 = manifest_at(1, b"one", &[(0, &a)], &[&a]);
    let e = put(&h, "c-1", &frame(&m1, b"one", LOG, &[&a]), 1 << 30).unwrap_err();
    assert!(matches!(e, KeptError::Stale(_)), "{e}");
    assert_eq!(stored(&h, None), Some(m2.snapshot.clone()));
    // The same checkpoint again is not older: it is a retry.
    put_one(&h, 2, b"two");
}

#[test]
fn a_page_damaged_on_disk_is_not_carried_into_the_next_version() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let (a, b, c) = (page(1), page(2), page(3));
    let m1 = manifest(b"s", &[(0, &a), (1, &b)], &[&a, &b]);
    put(&h, "c-1", &frame(&m1, b"s", LOG, &[&a, &b]), 1 << 30).unwrap();
    // One byte of the stored page 1 changes behind the holder's back.
    let path = std::fs::read_dir(dir.path().join("kept"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "kept"))
        .unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[9], len - 1).unwrap();
    assert!(matches!(
        read(&h, "c-1", None).unwrap(),
        Err(KeptError::Mismatch(_))
    ));
    // The next checkpoint reuses page 1 from the stored version: refused.
    let m2 = manifest_at(2, b"s2", &[(0, &c), (1, &b)], &[&c]);
    let e = put(&h, "c-1", &frame(&m2, b"s2", LOG, &[&c]), 1 << 30).unwrap_err();
    assert!(matches!(e, KeptError::Mismatch(_)), "{e}");
    assert_eq!(stored_versions(dir.path()), 1, "no version was added");
    // Sent whole, it is stored.
    let m2 = manifest_at(2, b"s2", &[(0, &c), (1, &b)], &[&c, &b]);
    put(&h, "c-1", &frame(&m2, b"s2", LOG, &[&c, &b]), 1 << 30).unwrap();
    assert_eq!(
        read(&h, "c-1", Some(&m2.snapshot)).unwrap().unwrap().pages,
        vec![c, b]
    );
}

#[test]
fn a_body_announcing_more_than_it_holds_is_refused_before_any_page_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    let a = page(1);
    let m = manifest(b"s", &[(0, &a)], &[&a]);
    let mut body = frame(&m, b"s", LOG, &[&a]);
    body.extend_from_slice(&page(2));
    let e = put(&h, "c-1", &body, 1 << 30).unwrap_err();
    assert!(matches!(e, KeptError::Malformed(_)), "{e}");
    // A manifest length past the end.
    let e = put(&h, "c-1", &[0xff, 0xff, 0xff, 0x00, b'{'], 1 << 30).unwrap_err();
    assert!(matches!(e, KeptError::Malformed(_)), "{e}");
    // A memory over the node's limit.
    let e = put(&h, "c-1", &frame(&m, b"s", LOG, &[&a]), 0).unwrap_err();
    assert!(matches!(e, KeptError::Malformed(_)), "{e}");
    assert_eq!(stored_versions(dir.path()), 0);
}

/// Versions stored, and no temporary file left behind.
fn stored_versions(dir: &std::path::Path) -> usize {
    let names: Vec<String> = match std::fs::read_dir(dir.join("kept")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => return 0,
    };
    assert!(
        !names.iter().any(|n| n.ends_with(".tmp")),
        "temporary files left: {names:?}"
    );
    names.iter().filter(|n| n.ends_with(".kept")).count()
}

#[test]
fn a_checkpoint_kept_by_an_older_holder_is_read_and_replaced_in_turn() {
    let dir = tempfile::tempdir().unwrap();
    let h = Holder::new(dir.path());
    // An older holder kept one file per cell, `{cell}.kept`, in the same
    // layout, every page in it.
    let a = page(1);
    let m1 = manifest(b"one", &[(0, &a)], &[&a]);
    std::fs::create_dir_all(dir.path().join("kept")).unwrap();
    std::fs::write(
        dir.path().join("kept/c-1.kept"),
        frame(&m1, b"one", LOG, &[&a]),
    )
    .unwrap();
    assert_eq!(stored(&h, Some(&m1.snapshot)), Some(m1.snapshot.clone()));
    assert_eq!(stored(&h, None), Some(m1.snapshot.clone()));
    // The next checkpoint needs only its new pages, and a commit of it
    // removes the old file.
    let b = page(2);
    let m2 = manifest_at(2, b"two", &[(0, &a), (1, &b)], &[]);
    let all: Vec<PageHash> = m2.pages.iter().map(|(_, h)| *h).collect();
    assert_eq!(h.missing("c-1", &all, 1 << 30).unwrap(), vec![all[1]]);
    let m2 = manifest_at(2, b"two", &[(0, &a), (1, &b)], &[&b]);
    put(&h, "c-1", &frame(&m2, b"two", LOG, &[&b]), 1 << 30).unwrap();
    h.commit("c-1", &m2.snapshot).unwrap();
    assert!(!dir.path().join("kept/c-1.kept").exists());
    assert_eq!(stored(&h, None), Some(m2.snapshot));
}

/// A manifest reads and writes as it did when hashes were strings, and
/// names the same checkpoint: stored checkpoints keep their names.
#[test]
fn page_hashes_read_and_write_as_hex_text() {
    let a = page(7);
    let m = manifest(b"s", &[(2, &a)], &[&a]);
    let hex_a = hex(blake3::hash(&a).as_bytes());
    let json: serde_json::Value = serde_json::to_value(&m).unwrap();
    assert_eq!(json["pages"], serde_json::json!([[2, hex_a]]));
    assert_eq!(json["sent"], serde_json::json!([hex_a]));
    // The name as the string form made it.
    let mut h = blake3::Hasher::new();
    h.update(b"roam kept checkpoint v1\0");
    h.update(m.state_hash.as_bytes());
    h.update(m.log_hash.as_bytes());
    h.update(&0u64.to_le_bytes());
    h.update(&65536u64.to_le_bytes());
    h.update(&2u32.to_le_bytes());
    h.update(hex_a.as_bytes());
    assert_eq!(m.snapshot, hex(h.finalize().as_bytes()));
    let back: Manifest = serde_json::from_value(json).unwrap();
    assert_eq!(back.pages, m.pages);
    // Anything but 64 lowercase hex digits is refused.
    for bad in ["ab", &"AB".repeat(32), &"zz".repeat(32), ""] {
        let e = serde_json::from_value::<PageHash>(serde_json::json!(bad)).unwrap_err();
        assert!(e.to_string().contains("not a BLAKE3 hash"), "{e}");
    }
    assert!(serde_json::from_value::<PageHash>(serde_json::json!(7)).is_err());
}
