//! `path_link` and `O_TRUNC` on existing files, sandboxed.

use super::tests::{ctx_with, open, read, write};
use crate::errno::Errno;
use crate::types::{oflags, rights, LOOKUP_SYMLINK_FOLLOW};
use std::fs;
use std::os::unix::fs::MetadataExt;

#[test]
fn hard_link_shares_the_file_and_does_not_follow_a_symlink_source() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("a"), b"one").unwrap();
    let c = ctx_with(t.path());
    c.path_link(3, 0, "a", 3, "b").unwrap();
    let (ma, mb) = (
        fs::metadata(t.path().join("a")).unwrap(),
        fs::metadata(t.path().join("b")).unwrap(),
    );
    assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2));
    assert_eq!(c.path_link(3, 0, "a", 3, "b"), Err(Errno::EXIST));
    assert_eq!(c.path_link(3, 0, "nope", 3, "c"), Err(Errno::NOENT));
    fs::create_dir(t.path().join("d")).unwrap();
    assert_eq!(c.path_link(3, 0, "d", 3, "d2"), Err(Errno::PERM));

    std::os::unix::fs::symlink("a", t.path().join("s")).unwrap();
    c.path_link(3, 0, "s", 3, "s2").unwrap();
    let s2 = fs::symlink_metadata(t.path().join("s2")).unwrap();
    assert!(s2.file_type().is_symlink(), "the link itself was linked");
    c.path_link(3, LOOKUP_SYMLINK_FOLLOW, "s", 3, "f").unwrap();
    let f = fs::symlink_metadata(t.path().join("f")).unwrap();
    assert!(f.is_file());
    assert_eq!(f.ino(), ma.ino(), "following links the target");
    assert_eq!(c.path_link(3, 1 << 5, "a", 3, "x"), Err(Errno::INVAL));
}

#[test]
fn hard_links_never_leave_the_sandbox() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"s").unwrap();
    let t = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), t.path().join("abs")).unwrap();
    std::os::unix::fs::symlink("../../../../../../etc/passwd", t.path().join("rel")).unwrap();
    let c = ctx_with(t.path());
    for src in ["abs", "rel"] {
        assert_eq!(
            c.path_link(3, LOOKUP_SYMLINK_FOLLOW, src, 3, "stolen"),
            Err(Errno::NOTCAPABLE),
            "{src}"
        );
    }
    assert_eq!(c.path_link(3, 0, "../x", 3, "y"), Err(Errno::NOTCAPABLE));
    assert_eq!(
        c.path_link(3, 0, "abs", 3, "/tmp/y"),
        Err(Errno::NOTCAPABLE)
    );
    assert!(!t.path().join("stolen").exists());
    assert_eq!(
        fs::metadata(outside.path().join("secret")).unwrap().nlink(),
        1
    );
}

#[test]
fn linking_needs_both_rights() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("a"), b"x").unwrap();
    let mut c = ctx_with(t.path());
    c.fds.get_mut(&3).unwrap().rights_base &= !rights::PATH_LINK_TARGET;
    assert_eq!(c.path_link(3, 0, "a", 3, "b"), Err(Errno::NOTCAPABLE));
    c.fds.get_mut(&3).unwrap().rights_base |= rights::PATH_LINK_TARGET;
    c.fds.get_mut(&3).unwrap().rights_base &= !rights::PATH_LINK_SOURCE;
    assert_eq!(c.path_link(3, 0, "a", 3, "b"), Err(Errno::NOTCAPABLE));
}

#[test]
fn o_trunc_truncates_an_existing_file_read_only_too() {
    let t = tempfile::tempdir().unwrap();
    fs::write(t.path().join("f"), b"hello").unwrap();
    let mut c = ctx_with(t.path());
    // Read-only + O_TRUNC used to fail with EINVAL; Linux truncates.
    let r = open(&mut c, "f", oflags::TRUNC, false).unwrap();
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"");
    assert_eq!(read(&mut c, r, 10), b"");
    fs::write(t.path().join("f"), b"again").unwrap();
    let w = open(&mut c, "f", oflags::TRUNC, true).unwrap();
    write(&mut c, w, b"new");
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"new");
    let n = open(&mut c, "g", oflags::CREAT | oflags::TRUNC, false).unwrap();
    assert!(t.path().join("g").exists());
    c.fd_close(n).unwrap();
    assert_eq!(open(&mut c, "sub", oflags::TRUNC, false), Err(Errno::NOENT));
    // O_TRUNC needs `path_filestat_set_size` on the directory (witx).
    c.fds.get_mut(&3).unwrap().rights_base &= !rights::PATH_FILESTAT_SET_SIZE;
    assert_eq!(
        open(&mut c, "f", oflags::TRUNC, true),
        Err(Errno::NOTCAPABLE)
    );
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"new");
}
