//! Byte-level checks of the witx struct layouts written into guest memory.

use super::tests::{ctx_with, open, write};
use super::Outcome;
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::{filetype, oflags, rights};

#[test]
fn fdstat_prestat_filestat_layouts() {
    let t = tempfile::tempdir().unwrap();
    let mut c = ctx_with(t.path());
    let fd = open(&mut c, "f", oflags::CREAT, true).unwrap();
    write(&mut c, fd, b"12345");
    let mut buf = vec![0xAAu8; 256];
    let mut m = Mem(&mut buf);

    c.fd_fdstat_get(&mut m, fd, 8).unwrap();
    assert_eq!(m.u8(8).unwrap(), filetype::REGULAR_FILE);
    assert_eq!(m.u8(9).unwrap(), 0, "padding is zeroed");
    assert_eq!(m.u16(10).unwrap(), 0);
    assert_eq!(m.u64(16).unwrap() & rights::FD_WRITE, rights::FD_WRITE);
    assert_eq!(m.u64(16).unwrap() & !rights::FILE, 0);

    c.fd_prestat_get(&mut m, 3, 40).unwrap();
    assert_eq!(m.u8(40).unwrap(), 0);
    assert_eq!(m.u32(44).unwrap(), 3);
    c.fd_prestat_dir_name(&mut m, 3, 48, 3).unwrap();
    assert_eq!(m.slice(48, 3).unwrap(), b"/sb");
    assert_eq!(c.fd_prestat_get(&mut m, fd, 40), Err(Errno::BADF));
    assert_eq!(
        c.fd_prestat_dir_name(&mut m, 3, 48, 2),
        Err(Errno::NAMETOOLONG)
    );

    c.fd_filestat_get(&mut m, fd, 64).unwrap();
    assert_eq!(m.u8(64 + 16).unwrap(), filetype::REGULAR_FILE);
    assert_eq!(m.u64(64 + 24).unwrap(), 1, "nlink");
    assert_eq!(m.u64(64 + 32).unwrap(), 5, "size");
    assert!(
        m.u64(64 + 48).unwrap() > 1_500_000_000 * 1_000_000_000,
        "mtim in ns"
    );
    c.path_filestat_get(&mut m, 3, 1, "f", 128).unwrap();
    assert_eq!(
        m.slice(128, 64).unwrap()[..40],
        m.slice(64, 64).unwrap()[..40]
    );
    assert_eq!(c.fd_filestat_get(&mut m, fd, 250), Err(Errno::FAULT));
}

#[test]
fn seek_tell_renumber() {
    let t = tempfile::tempdir().unwrap();
    let mut c = ctx_with(t.path());
    let fd = open(&mut c, "f", oflags::CREAT, true).unwrap();
    write(&mut c, fd, b"0123456789");
    let mut buf = vec![0u8; 64];
    let mut m = Mem(&mut buf);
    c.fd_seek(&mut m, fd, -3, 2, 0).unwrap();
    assert_eq!(m.u64(0).unwrap(), 7);
    c.fd_tell(&mut m, fd, 8).unwrap();
    assert_eq!(m.u64(8).unwrap(), 7);
    assert_eq!(c.fd_seek(&mut m, fd, -1, 0, 0), Err(Errno::INVAL));
    assert_eq!(c.fd_seek(&mut m, fd, 0, 7, 0), Err(Errno::INVAL));
    assert_eq!(c.fd_seek(&mut m, 1, 0, 0, 0), Err(Errno::SPIPE));
    assert_eq!(c.fd_seek(&mut m, 3, 0, 0, 0), Err(Errno::ISDIR));
    assert_eq!(c.fd_renumber(fd, 40), Err(Errno::BADF));
    c.fd_renumber(fd, 1).unwrap();
    c.fd_tell(&mut m, 1, 8).unwrap();
    assert_eq!(m.u64(8).unwrap(), 7);
    assert_eq!(c.fd_close(fd), Err(Errno::BADF));
}

#[test]
fn poll_reports_file_readiness_and_bad_fds() {
    let t = tempfile::tempdir().unwrap();
    let mut c = ctx_with(t.path());
    let fd = open(&mut c, "f", oflags::CREAT, true).unwrap();
    write(&mut c, fd, b"abc");
    let mut buf = vec![0u8; 512];
    let mut m = Mem(&mut buf);
    // sub 0: fd_read on fd (at offset 3 of 3 bytes); sub 1: fd_write on 77.
    m.put_u64(0, 1).unwrap();
    m.write(8, &[1]).unwrap();
    m.put_u32(16, fd).unwrap();
    m.put_u64(48, 2).unwrap();
    m.write(56, &[2]).unwrap();
    m.put_u32(64, 77).unwrap();
    assert_eq!(
        c.poll_oneoff(&mut m, 0, 200, 2, 300),
        Outcome::Done(Errno::SUCCESS)
    );
    assert_eq!(m.u32(300).unwrap(), 2);
    assert_eq!(
        (m.u64(200).unwrap(), m.u16(208).unwrap(), m.u8(210).unwrap()),
        (1, 0, 1)
    );
    assert_eq!(m.u64(216).unwrap(), 0, "no bytes left to read");
    assert_eq!(
        (m.u64(232).unwrap(), m.u16(240).unwrap(), m.u8(242).unwrap()),
        (2, 8, 2)
    );
    assert_eq!(
        c.poll_oneoff(&mut m, 0, 200, 0, 300),
        Outcome::Done(Errno::INVAL)
    );
}

#[test]
fn context_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<crate::WasiCtx>();
}

#[test]
fn a_sleep_asked_for_is_a_block_even_if_it_ran_out_before_it_was_looked_at() {
    let (mut c, interrupt) = bare_ctx();
    let mut buf = vec![0u8; 512];
    let mut m = Mem(&mut buf);
    // One relative clock subscription (monotonic) of `ns`.
    let mut sleep = |c: &mut crate::ctx::WasiCtx, ns: u64| {
        m.put_u64(0, 9).unwrap();
        m.write(8, &[0]).unwrap();
        m.put_u32(16, 1).unwrap();
        m.put_u64(24, ns).unwrap();
        m.put_u64(32, 0).unwrap();
        m.write(40, &[0, 0]).unwrap();
        c.poll_oneoff(&mut m, 0, 200, 1, 300)
    };
    interrupt.set_on_block(true);
    // 1 ns has run out before the call looks at its deadline; it still
    // asked to wait, so a checkpoint on block takes it.
    assert_eq!(sleep(&mut c, 1), Outcome::Suspend);
    assert_eq!(sleep(&mut c, 1_000_000), Outcome::Suspend);
    // A zero timeout asks for no wait.
    assert_eq!(sleep(&mut c, 0), Outcome::Done(Errno::SUCCESS));
    interrupt.set_on_block(false);
    assert_eq!(sleep(&mut c, 1_000_000), Outcome::Done(Errno::SUCCESS));
}

#[test]
fn an_absolute_time_already_past_asks_for_no_wait() {
    let (mut c, interrupt) = bare_ctx();
    let mut buf = vec![0u8; 512];
    let mut m = Mem(&mut buf);
    // One absolute clock subscription (monotonic) at `at` ns.
    let mut until = |c: &mut crate::ctx::WasiCtx, at: u64| {
        m.put_u64(0, 9).unwrap();
        m.write(8, &[0]).unwrap();
        m.put_u32(16, 1).unwrap();
        m.put_u64(24, at).unwrap();
        m.put_u64(32, 0).unwrap();
        m.write(40, &[1, 0]).unwrap();
        c.poll_oneoff(&mut m, 0, 200, 1, 300)
    };
    interrupt.set_on_block(true);
    // A time long past (1 ns after the clock's origin) is due at once...
    assert_eq!(until(&mut c, 1), Outcome::Done(Errno::SUCCESS));
    // ...and one far ahead asks to block.
    assert_eq!(until(&mut c, u64::MAX / 2), Outcome::Suspend);
    interrupt.set_on_block(false);
}

/// A context with no files, and its interrupt.
fn bare_ctx() -> (
    crate::ctx::WasiCtx,
    std::sync::Arc<crate::interrupt::Interrupt>,
) {
    let interrupt = crate::interrupt::Interrupt::new();
    let cfg = crate::ctx::WasiConfig {
        args: vec!["t".into()],
        env: vec![],
        preopens: vec![],
        listeners: vec![],
    };
    let c = crate::ctx::WasiCtx::new(cfg, interrupt.clone()).unwrap();
    (c, interrupt)
}
