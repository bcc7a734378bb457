//! save → encode → decode → restore round trips on real files.

use super::*;
use crate::ops::tests::{ctx_with, open, read, write};
use crate::types::oflags;

fn restore_at(state: OsState, host: &std::path::Path) -> Result<WasiCtx, RestoreError> {
    let pre = vec![Preopen {
        host: host.to_path_buf(),
        guest: "/sb".into(),
    }];
    WasiCtx::restore(state, pre, Interrupt::new())
}

#[test]
fn round_trip_continues_reading_at_saved_offset() {
    let a = tempfile::tempdir().unwrap();
    std::fs::write(a.path().join("data"), b"0123456789").unwrap();
    let mut c = ctx_with(a.path());
    let r = open(&mut c, "data", 0, false).unwrap();
    assert_eq!(read(&mut c, r, 4), b"0123");
    let w = open(&mut c, "out", oflags::CREAT | oflags::TRUNC, true).unwrap();
    write(&mut c, w, b"abc");
    c.fd_close(1).unwrap();
    let bytes = c.save().unwrap().encode();
    let state = OsState::decode(&bytes).unwrap();

    // "Another machine": a different host directory with the same contents.
    let b = tempfile::tempdir().unwrap();
    std::fs::copy(a.path().join("data"), b.path().join("data")).unwrap();
    std::fs::copy(a.path().join("out"), b.path().join("out")).unwrap();
    let mut d = restore_at(state.clone(), b.path()).unwrap();
    assert_eq!(d.preopens()[0].host, b.path());
    assert_eq!(read(&mut d, r, 3), b"456");
    write(&mut d, w, b"def");
    assert_eq!(std::fs::read(b.path().join("out")).unwrap(), b"abcdef");
    // The restore did not re-truncate (TRUNC was in the original oflags).
    assert!(d.entry(1).is_err(), "closed stdout stays closed");
    assert_eq!(d.save().unwrap().fds.len(), state.fds.len());
}

#[test]
fn restored_clock_never_goes_backwards() {
    let a = tempfile::tempdir().unwrap();
    let c = ctx_with(a.path());
    let mut st = c.save().unwrap();
    // Pretend the source machine had been up far longer than this one.
    st.monotonic_ns += 10_000 * 1_000_000_000;
    let saved = st.monotonic_ns;
    let d = restore_at(st, a.path()).unwrap();
    assert!(d.monotonic_ns() >= saved);
    let again = d.save().unwrap();
    assert!(again.monotonic_ns >= saved);
}

#[test]
fn restore_errors_are_precise() {
    let a = tempfile::tempdir().unwrap();
    let mut c = ctx_with(a.path());
    open(&mut c, "gone", oflags::CREAT, true).unwrap();
    c.path_unlink_file(3, "gone").unwrap();
    let st = c.save().unwrap();
    let e = WasiCtx::restore(st.clone(), vec![], Interrupt::new()).unwrap_err();
    assert!(
        matches!(&e, RestoreError::MissingPreopen { guest } if guest == "/sb"),
        "{e}"
    );
    assert!(e.to_string().contains("/sb"));
    let e = restore_at(st.clone(), a.path()).unwrap_err();
    assert!(
        matches!(&e, RestoreError::Reopen { fd: 4, path, .. } if path == "gone"),
        "{e}"
    );
    let e = restore_at(st, &a.path().join("missing")).unwrap_err();
    assert!(matches!(e, RestoreError::OpenPreopen { .. }));
}

#[test]
fn a_hard_linked_file_open_through_two_fds_survives_a_round_trip() {
    let a = tempfile::tempdir().unwrap();
    let mut c = ctx_with(a.path());
    let w = open(&mut c, "a", oflags::CREAT, true).unwrap();
    c.path_link(3, 0, "a", 3, "b").unwrap();
    let r = open(&mut c, "b", 0, false).unwrap();
    write(&mut c, w, b"shared");
    assert_eq!(read(&mut c, r, 3), b"sha");
    let state = OsState::decode(&c.save().unwrap().encode()).unwrap();

    // Restored in place, both names still reach the same file.
    let mut d = restore_at(state, a.path()).unwrap();
    write(&mut d, w, b"!");
    assert_eq!(read(&mut d, r, 10), b"red!");
    assert_eq!(std::fs::read(a.path().join("b")).unwrap(), b"shared!");
}
