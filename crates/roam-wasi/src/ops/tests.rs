//! Host-level tests of the fd and path calls (no wasm engine involved).

use super::path::OpenArgs;
use crate::ctx::{Preopen, WasiConfig, WasiCtx};
use crate::errno::Errno;
use crate::interrupt::Interrupt;
use crate::mem::Mem;
use crate::types::{fdflags, oflags, rights, LOOKUP_SYMLINK_FOLLOW};
use std::fs;

pub(crate) fn ctx_with(dir: &std::path::Path) -> WasiCtx {
    let cfg = WasiConfig {
        args: vec!["t".into()],
        env: vec![],
        preopens: vec![Preopen {
            host: dir.to_path_buf(),
            guest: "/sb".into(),
        }],
        listeners: vec![],
    };
    WasiCtx::new(cfg, Interrupt::new()).unwrap()
}

pub(crate) fn open(c: &mut WasiCtx, path: &str, of: u16, write: bool) -> Result<u32, Errno> {
    // Like wasi-libc: every right except those contradicting the mode.
    let base = if write { u64::MAX } else { !rights::WRITE_MODE };
    c.path_open(
        3,
        OpenArgs {
            dirflags: LOOKUP_SYMLINK_FOLLOW,
            path: path.into(),
            oflags: of,
            base,
            inheriting: u64::MAX,
            fdflags: 0,
        },
    )
}

/// Read up to `n` bytes from `fd` through guest memory.
pub(crate) fn read(c: &mut WasiCtx, fd: u32, n: u32) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + n as usize];
    let mut m = Mem(&mut buf);
    m.put_u32(0, 64).unwrap();
    m.put_u32(4, n).unwrap();
    assert_eq!(
        c.fd_read(&mut m, fd, 0, 1, 8),
        super::Outcome::Done(Errno::SUCCESS)
    );
    let got = m.u32(8).unwrap();
    m.slice(64, got).unwrap().to_vec()
}

pub(crate) fn write(c: &mut WasiCtx, fd: u32, data: &[u8]) {
    let mut buf = vec![0u8; 64 + data.len()];
    let mut m = Mem(&mut buf);
    m.put_u32(0, 64).unwrap();
    m.put_u32(4, data.len() as u32).unwrap();
    m.write(64, data).unwrap();
    c.fd_write(&mut m, fd, 0, 1, 8).unwrap();
    assert_eq!(m.u32(8).unwrap() as usize, data.len());
}

#[test]
fn sandbox_refuses_escapes() {
    let outer = tempfile::tempdir().unwrap();
    let sb = outer.path().join("sb");
    fs::create_dir(&sb).unwrap();
    fs::write(outer.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink("../secret", sb.join("up")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", sb.join("abs")).unwrap();
    fs::create_dir(sb.join("d")).unwrap();
    let mut c = ctx_with(&sb);
    assert_eq!(open(&mut c, "../secret", 0, false), Err(Errno::NOTCAPABLE));
    assert_eq!(
        open(&mut c, "d/../../secret", 0, false),
        Err(Errno::NOTCAPABLE)
    );
    assert_eq!(
        open(&mut c, "/etc/passwd", 0, false),
        Err(Errno::NOTCAPABLE)
    );
    assert_eq!(open(&mut c, "up", 0, false), Err(Errno::NOTCAPABLE));
    assert_eq!(open(&mut c, "abs", 0, false), Err(Errno::NOTCAPABLE));
    assert_eq!(c.path_create_directory(3, "../x"), Err(Errno::NOTCAPABLE));
    assert_eq!(c.path_unlink_file(3, "../secret"), Err(Errno::NOTCAPABLE));
    assert_eq!(c.path_symlink("/etc", 3, "l"), Err(Errno::NOTCAPABLE));
    assert_eq!(c.path_rename(3, "d", 3, "../moved"), Err(Errno::NOTCAPABLE));
    assert!(outer.path().join("secret").exists());
    assert!(!outer.path().join("x").exists() && !outer.path().join("moved").exists());
    // Staying inside via `..` is fine.
    assert!(open(&mut c, "d/../up", 0, false).is_err());
    fs::write(sb.join("ok"), "ok").unwrap();
    let fd = open(&mut c, "d/../ok", 0, false).unwrap();
    assert_eq!(read(&mut c, fd, 10), b"ok");
}

#[test]
fn open_flags_and_errors() {
    let t = tempfile::tempdir().unwrap();
    let mut c = ctx_with(t.path());
    assert_eq!(open(&mut c, "nope", 0, false), Err(Errno::NOENT));
    let fd = open(&mut c, "f", oflags::CREAT, true).unwrap();
    assert_eq!(fd, 4);
    write(&mut c, fd, b"hello");
    assert_eq!(
        open(&mut c, "f", oflags::CREAT | oflags::EXCL, true),
        Err(Errno::EXIST)
    );
    let ro = open(&mut c, "f", 0, false).unwrap();
    assert_eq!(read(&mut c, ro, 100), b"hello");
    // A read-only fd has no write right.
    let mut buf = vec![0u8; 16];
    assert_eq!(
        c.fd_write(&mut Mem(&mut buf), ro, 0, 0, 8),
        Err(Errno::NOTCAPABLE)
    );
    let tr = open(&mut c, "f", oflags::TRUNC, true).unwrap();
    assert_eq!(fs::read(t.path().join("f")).unwrap(), b"");
    assert_eq!(
        open(&mut c, "f", oflags::DIRECTORY, false),
        Err(Errno::NOTDIR)
    );
    c.path_create_directory(3, "sub").unwrap();
    assert_eq!(c.path_create_directory(3, "sub"), Err(Errno::EXIST));
    let d = open(&mut c, "sub", oflags::DIRECTORY, false).unwrap();
    assert_eq!(c.path_remove_directory(3, "f"), Err(Errno::NOTDIR));
    fs::write(t.path().join("sub/x"), "x").unwrap();
    assert_eq!(c.path_remove_directory(3, "sub"), Err(Errno::NOTEMPTY));
    c.fd_close(tr).unwrap();
    assert_eq!(c.fd_close(tr), Err(Errno::BADF));
    // Lowest free fd is reused.
    assert_eq!(open(&mut c, "f", 0, false).unwrap(), tr);
    // Rights only narrow.
    assert_eq!(
        c.fd_fdstat_set_rights(d, rights::FD_READDIR | rights::PATH_OPEN, 0),
        Ok(())
    );
    assert_eq!(
        c.fd_fdstat_set_rights(d, rights::FD_WRITE, 0),
        Err(Errno::NOTCAPABLE)
    );
    assert_eq!(c.path_create_directory(d, "y"), Err(Errno::NOTCAPABLE));
}

#[test]
fn rename_keeps_open_fd_paths_current() {
    let t = tempfile::tempdir().unwrap();
    let mut c = ctx_with(t.path());
    c.path_create_directory(3, "a").unwrap();
    let fd = open(&mut c, "a/f", oflags::CREAT, true).unwrap();
    c.path_rename(3, "a", 3, "b").unwrap();
    let st = c.save().unwrap();
    let f = st.fds.iter().find(|f| f.fd == fd).unwrap();
    assert!(matches!(&f.kind, crate::FdKind::File { path, .. } if path == "b/f"));
}

#[test]
fn truncate_with_append_truncates_then_appends() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("j.log"), b"old contents").unwrap();
    let mut c = ctx_with(dir.path());
    let fd = c
        .path_open(
            3,
            OpenArgs {
                dirflags: LOOKUP_SYMLINK_FOLLOW,
                path: "j.log".into(),
                oflags: oflags::CREAT | oflags::TRUNC,
                base: u64::MAX,
                inheriting: u64::MAX,
                fdflags: fdflags::APPEND,
            },
        )
        .expect("O_TRUNC|O_APPEND is valid POSIX");
    write(&mut c, fd, b"ab");
    write(&mut c, fd, b"cd");
    assert_eq!(std::fs::read(dir.path().join("j.log")).unwrap(), b"abcd");
}

/// Host fds held by guests are counted over every context sharing a
/// budget (a node's cells share the process's): past it, opens fail with
/// `ENFILE`, and closing gives the room back.
#[test]
fn guests_share_one_budget_of_host_fds() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("f"), b"x").unwrap();
    let budget = crate::FdBudget::new(4);
    let cfg = || WasiConfig {
        args: vec!["t".into()],
        preopens: vec![Preopen {
            host: dir.path().to_path_buf(),
            guest: "/sb".into(),
        }],
        ..Default::default()
    };
    let mut a = WasiCtx::new_in(cfg(), Interrupt::new(), budget.clone()).unwrap();
    let mut b = WasiCtx::new_in(cfg(), Interrupt::new(), budget.clone()).unwrap();
    assert_eq!(budget.held(), 2, "each preopen holds one");
    let fa = open(&mut a, "f", 0, false).unwrap();
    let _fb = open(&mut b, "f", 0, false).unwrap();
    assert_eq!(open(&mut a, "f", 0, false), Err(Errno::NFILE));
    assert_eq!(open(&mut b, "f", 0, false), Err(Errno::NFILE));
    // A third context cannot even get its preopen.
    assert!(matches!(
        WasiCtx::new_in(cfg(), Interrupt::new(), budget.clone()),
        Err(crate::SetupError::FdBudget { limit: 4 })
    ));
    a.fd_close(fa).unwrap();
    let _again = open(&mut b, "f", 0, false).unwrap();
    drop(a);
    assert_eq!(budget.held(), 3, "a's preopen came back");
}

/// `fd_write` through guest memory; the errno.
fn try_write(c: &mut WasiCtx, fd: u32, data: &[u8]) -> Result<(), Errno> {
    let mut buf = vec![0u8; 64 + data.len()];
    let mut m = Mem(&mut buf);
    m.put_u32(0, 64).unwrap();
    m.put_u32(4, data.len() as u32).unwrap();
    m.write(64, data).unwrap();
    c.fd_write(&mut m, fd, 0, 1, 8)
}

#[test]
fn a_disk_quota_refuses_growth_past_it_and_counts_what_is_given_back() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("old"), [7u8; 1000]).unwrap();
    let mut c = ctx_with(dir.path());
    c.set_disk_quota(4096);
    assert_eq!(c.disk_quota(), Some((4096, 1000)));
    let f = open(&mut c, "f", oflags::CREAT, true).unwrap();
    write(&mut c, f, &[1u8; 3000]);
    assert_eq!(c.disk_quota(), Some((4096, 4000)));
    // Writing over what is there takes no room; past the end does.
    c.fd_seek(&mut Mem(&mut [0u8; 8]), f, 0, 0, 0).unwrap();
    write(&mut c, f, &[2u8; 3000]);
    assert_eq!(try_write(&mut c, f, &[3u8; 97]), Err(Errno::DQUOT));
    write(&mut c, f, &[3u8; 96]);
    // A 1 TiB sparse file costs no disk, but counts whole.
    assert_eq!(c.fd_filestat_set_size(f, 1 << 40), Err(Errno::DQUOT));
    assert_eq!(c.fd_allocate(f, 0, 1 << 40), Err(Errno::DQUOT));
    assert_eq!(fs::metadata(dir.path().join("f")).unwrap().len(), 3096);
    // Shrinking, truncating at open and removing give room back.
    c.fd_filestat_set_size(f, 96).unwrap();
    assert_eq!(c.disk_quota(), Some((4096, 1096)));
    let g = open(&mut c, "old", oflags::TRUNC, true).unwrap();
    assert_eq!(c.disk_quota(), Some((4096, 96)));
    c.fd_close(g).unwrap();
    c.path_unlink_file(3, "f").unwrap();
    assert_eq!(c.disk_quota(), Some((4096, 0)));
    // A rename over a file gives the replaced one's bytes back.
    let h = open(&mut c, "h", oflags::CREAT, true).unwrap();
    write(&mut c, h, &[4u8; 100]);
    let k = open(&mut c, "k", oflags::CREAT, true).unwrap();
    write(&mut c, k, &[5u8; 50]);
    c.path_rename(3, "k", 3, "h").unwrap();
    assert_eq!(c.disk_quota(), Some((4096, 50)));
}
