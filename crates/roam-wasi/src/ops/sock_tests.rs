//! The socket calls and poll on sockets, driven through guest memory, with
//! hostile arguments (no wasm engine involved).

use super::sock::{RecvArgs, RECV_PEEK};
use super::Outcome;
use crate::ctx::{WasiConfig, WasiCtx};
use crate::errno::Errno;
use crate::interrupt::Interrupt;
use crate::mem::Mem;
use crate::net::{NetHub, NetOut};
use crate::state::OsState;
use crate::types::{fdflags, filetype};
use std::sync::Arc;

const DONE: Outcome = Outcome::Done(Errno::SUCCESS);

/// A context with one listener (fd 3) and its hub.
fn ctx() -> (WasiCtx, Arc<NetHub>) {
    let cfg = WasiConfig {
        args: vec!["t".into()],
        listeners: vec!["127.0.0.1:1".into()],
        ..WasiConfig::default()
    };
    let c = WasiCtx::new(cfg, Interrupt::new()).unwrap();
    let h = c.net().unwrap();
    (c, h)
}

/// A context with an accepted connection 5 on fd 4.
fn connected() -> (WasiCtx, Arc<NetHub>, Vec<u8>) {
    let (mut c, h) = ctx();
    h.open("127.0.0.1:1", 5, "peer").unwrap();
    let mut mem = vec![0u8; 4096];
    assert_eq!(c.sock_accept(&mut Mem(&mut mem), 3, 0, 100), DONE);
    assert_eq!(Mem(&mut mem).u32(100), Ok(4));
    h.take_outgoing();
    (c, h, mem)
}

/// One iovec at 0 pointing at (buf, len).
fn iov(mem: &mut [u8], buf: u32, len: u32) {
    let mut m = Mem(mem);
    m.put_u32(0, buf).unwrap();
    m.put_u32(4, len).unwrap();
}

fn recv(c: &mut WasiCtx, mem: &mut [u8], fd: u32, flags: u16) -> Outcome {
    let a = RecvArgs {
        fd,
        iovs: 0,
        n: 1,
        flags,
        out_len: 200,
        out_flags: Some(204),
    };
    c.sock_recv(&mut Mem(mem), a)
}

#[test]
fn listeners_follow_the_preopens_and_are_sockets() {
    let (c, _) = ctx();
    let mut mem = vec![0u8; 64];
    let mut m = Mem(&mut mem);
    c.fd_fdstat_get(&mut m, 3, 0).unwrap();
    assert_eq!(m.u8(0), Ok(filetype::SOCKET_STREAM));
    // libc's preopen scan stops at the first EBADF.
    assert_eq!(c.fd_prestat_get(&mut m, 3, 0), Err(Errno::BADF));
    c.fd_filestat_get(&mut m, 3, 0).unwrap();
    assert_eq!(m.u8(16), Ok(filetype::SOCKET_STREAM));
    let bad = WasiConfig {
        listeners: vec!["a".into(), "a".into()],
        ..WasiConfig::default()
    };
    assert!(WasiCtx::new(bad, Interrupt::new()).is_err());
}

#[test]
fn accept_validates_before_taking_a_connection() {
    let (mut c, h) = ctx();
    let mut mem = vec![0u8; 64];
    c.fd_fdstat_set_flags(3, fdflags::NONBLOCK).unwrap();
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 3, 0, 0),
        Outcome::Done(Errno::AGAIN)
    );
    h.open("127.0.0.1:1", 9, "p").unwrap();
    // Out-of-bounds result pointer, bad flags, wrong fds: nothing is taken.
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 3, 0, 62),
        Outcome::Done(Errno::FAULT)
    );
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 3, 1 << 9, 0),
        Outcome::Done(Errno::INVAL)
    );
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 1, 0, 0),
        Outcome::Done(Errno::NOTSOCK)
    );
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 77, 0, 0),
        Outcome::Done(Errno::BADF)
    );
    assert!(h.listener_ready(0));
    assert_eq!(
        c.sock_accept(&mut Mem(&mut mem), 3, fdflags::NONBLOCK, 0),
        DONE
    );
    let fd = Mem(&mut mem).u32(0).unwrap();
    assert_eq!(fd, 4);
    assert_eq!(c.entry(fd).unwrap().fdflags, fdflags::NONBLOCK);
}

#[test]
fn a_blocked_accept_suspends_without_side_effects() {
    let (mut c, h) = ctx();
    let mut mem = vec![0u8; 4096];
    c.interrupt.set_on_block(true);
    assert_eq!(c.sock_accept(&mut Mem(&mut mem), 3, 0, 0), Outcome::Suspend);
    c.interrupt.set_on_block(false);
    c.interrupt.request();
    assert_eq!(
        recv_after_open(&mut c, &h, &mut mem),
        Outcome::Suspend,
        "a requested checkpoint suspends a recv with nothing to read"
    );
    assert_eq!(h.state().conns[0].rx_offset, 0);
}

fn recv_after_open(c: &mut WasiCtx, h: &NetHub, mem: &mut [u8]) -> Outcome {
    h.open("127.0.0.1:1", 1, "p").unwrap();
    assert_eq!(c.sock_accept(&mut Mem(mem), 3, 0, 100), DONE);
    iov(mem, 300, 10);
    recv(c, mem, 4, 0)
}

#[test]
fn recv_scatters_peeks_and_reports_eof_and_reset() {
    let (mut c, h, mut mem) = connected();
    h.deliver(5, 0, b"hello world").unwrap();
    // Two iovecs: 4 bytes at 300, 100 at 400.
    {
        let mut m = Mem(&mut mem);
        m.put_u32(0, 300).unwrap();
        m.put_u32(4, 4).unwrap();
        m.put_u32(8, 400).unwrap();
        m.put_u32(12, 100).unwrap();
    }
    let a = RecvArgs {
        fd: 4,
        iovs: 0,
        n: 2,
        flags: RECV_PEEK,
        out_len: 200,
        out_flags: Some(204),
    };
    assert_eq!(c.sock_recv(&mut Mem(&mut mem), a), DONE);
    assert_eq!(Mem(&mut mem).u32(200), Ok(11));
    assert_eq!(&mem[300..304], b"hell");
    assert_eq!(&mem[400..407], b"o world");
    let a = RecvArgs { flags: 0, ..a };
    assert_eq!(c.sock_recv(&mut Mem(&mut mem), a), DONE);
    assert_eq!(Mem(&mut mem).u32(200), Ok(11));
    assert_eq!(Mem(&mut mem).u16(204), Ok(0));
    h.peer_eof(5, 11).unwrap();
    iov(&mut mem, 300, 10);
    assert_eq!(recv(&mut c, &mut mem, 4, 0), DONE);
    assert_eq!(Mem(&mut mem).u32(200), Ok(0), "0 at end of stream");
    h.peer_reset(5);
    assert_eq!(
        recv(&mut c, &mut mem, 4, 0),
        Outcome::Done(Errno::CONNRESET)
    );
}

#[test]
fn hostile_recv_and_send_arguments_change_nothing() {
    let (mut c, h, mut mem) = connected();
    h.deliver(5, 0, b"abc").unwrap();
    // An iovec reaching past memory.
    iov(&mut mem, 4090, 10);
    assert_eq!(recv(&mut c, &mut mem, 4, 0), Outcome::Done(Errno::FAULT));
    // An iovec array past memory.
    let a = RecvArgs {
        fd: 4,
        iovs: 4092,
        n: 2,
        flags: 0,
        out_len: 200,
        out_flags: Some(204),
    };
    assert_eq!(
        c.sock_recv(&mut Mem(&mut mem), a),
        Outcome::Done(Errno::FAULT)
    );
    // Result pointers past memory.
    iov(&mut mem, 300, 10);
    let a = RecvArgs {
        iovs: 0,
        n: 1,
        out_len: 4094,
        ..a
    };
    assert_eq!(
        c.sock_recv(&mut Mem(&mut mem), a),
        Outcome::Done(Errno::FAULT)
    );
    let a = RecvArgs {
        out_len: 200,
        out_flags: Some(u32::MAX),
        ..a
    };
    assert_eq!(
        c.sock_recv(&mut Mem(&mut mem), a),
        Outcome::Done(Errno::FAULT)
    );
    assert_eq!(
        recv(&mut c, &mut mem, 4, 1 << 5),
        Outcome::Done(Errno::INVAL)
    );
    assert_eq!(recv(&mut c, &mut mem, 3, 0), Outcome::Done(Errno::NOTCONN));
    assert_eq!(recv(&mut c, &mut mem, 1, 0), Outcome::Done(Errno::NOTSOCK));
    assert_eq!(recv(&mut c, &mut mem, 99, 0), Outcome::Done(Errno::BADF));
    assert_eq!(h.state().conns[0].rx, b"abc", "nothing was consumed");
    // Sends: bad iovecs and result pointers queue nothing.
    iov(&mut mem, 4000, 200);
    assert_eq!(
        c.sock_send(&mut Mem(&mut mem), 4, 0, 1, 200),
        Err(Errno::FAULT)
    );
    iov(&mut mem, 300, 3);
    assert_eq!(
        c.sock_send(&mut Mem(&mut mem), 4, 0, 1, 4093),
        Err(Errno::FAULT)
    );
    assert_eq!(
        c.sock_send(&mut Mem(&mut mem), 4, 0, u32::MAX, 200),
        Err(Errno::FAULT)
    );
    assert_eq!(
        c.sock_send(&mut Mem(&mut mem), 3, 0, 1, 200),
        Err(Errno::NOTCONN)
    );
    assert!(h.state().conns[0].tx.is_empty());
    assert_eq!(c.sock_shutdown(4, 0), Err(Errno::INVAL));
    assert_eq!(c.sock_shutdown(4, 4), Err(Errno::INVAL));
    assert_eq!(c.sock_shutdown(2, 3), Err(Errno::NOTSOCK));
}

#[test]
fn fd_read_and_fd_write_work_on_sockets() {
    let (mut c, h, mut mem) = connected();
    mem[300..305].copy_from_slice(b"reply");
    iov(&mut mem, 300, 5);
    c.fd_write(&mut Mem(&mut mem), 4, 0, 1, 200).unwrap();
    assert_eq!(Mem(&mut mem).u32(200), Ok(5));
    assert_eq!(
        h.take_outgoing(),
        vec![NetOut::Data {
            conn: 5,
            offset: 0,
            bytes: b"reply".to_vec()
        }]
    );
    h.deliver(5, 0, b"req").unwrap();
    iov(&mut mem, 500, 64);
    assert_eq!(c.fd_read(&mut Mem(&mut mem), 4, 0, 1, 200), DONE);
    assert_eq!(Mem(&mut mem).u32(200), Ok(3));
    assert_eq!(&mem[500..503], b"req");
    // Non-blocking: an empty socket and a full window give EAGAIN.
    c.fd_fdstat_set_flags(4, fdflags::NONBLOCK).unwrap();
    assert_eq!(
        c.fd_read(&mut Mem(&mut mem), 4, 0, 1, 200),
        Outcome::Done(Errno::AGAIN)
    );
    let w = h.window() as usize;
    let mut big = vec![0u8; w + 64];
    {
        let mut m = Mem(&mut big);
        m.put_u32(0, 64).unwrap();
        m.put_u32(4, w as u32).unwrap();
    }
    c.fd_write(&mut Mem(&mut big), 4, 0, 1, 8).unwrap();
    assert_eq!(Mem(&mut big).u32(8), Ok(w as u32 - 5));
    assert_eq!(
        c.fd_write(&mut Mem(&mut big), 4, 0, 1, 8),
        Err(Errno::AGAIN)
    );
    // Shut for writing: EPIPE.
    h.delivered(5, w as u64).unwrap();
    c.sock_shutdown(4, 2).unwrap();
    assert_eq!(
        c.fd_write(&mut Mem(&mut mem), 4, 0, 1, 200),
        Err(Errno::PIPE)
    );
}

/// One subscription at `at`: fd_read/fd_write (tag 1/2) on `fd`, or a
/// relative clock (tag 0) of `ns`.
fn sub(mem: &mut [u8], at: u32, userdata: u64, tag: u8, fd_or_ns: u64) {
    let mut m = Mem(mem);
    m.put_u64(at, userdata).unwrap();
    m.write(at + 8, &[tag]).unwrap();
    if tag == 0 {
        m.put_u32(at + 16, 1).unwrap();
        m.put_u64(at + 24, fd_or_ns).unwrap();
        m.write(at + 40, &[0, 0]).unwrap();
    } else {
        m.put_u32(at + 16, fd_or_ns as u32).unwrap();
    }
}

/// (userdata, errno, type, nbytes, flags) of the events written at 1024.
fn events(mem: &mut [u8]) -> Vec<(u64, u16, u8, u64, u16)> {
    let m = Mem(mem);
    let n = m.u32(2000).unwrap();
    (0..n)
        .map(|i| {
            let at = 1024 + i * 32;
            (
                m.u64(at).unwrap(),
                m.u16(at + 8).unwrap(),
                m.u8(at + 10).unwrap(),
                m.u64(at + 16).unwrap(),
                m.u16(at + 24).unwrap(),
            )
        })
        .collect()
}

#[test]
fn poll_reports_socket_readiness_mixed_with_clocks() {
    let (mut c, h, mut mem) = connected();
    let w = h.window();
    // Nothing to read, room to write, no client waiting; a 0 ns clock.
    sub(&mut mem, 0, 1, 1, 4);
    sub(&mut mem, 48, 2, 2, 4);
    sub(&mut mem, 96, 3, 1, 3);
    sub(&mut mem, 144, 4, 0, 0);
    assert_eq!(c.poll_oneoff(&mut Mem(&mut mem), 0, 1024, 4, 2000), DONE);
    assert_eq!(
        events(&mut mem),
        vec![(2, 0, 2, w, 0), (4, 0, 0, 0, 0)],
        "only the writable socket and the clock"
    );
    h.deliver(5, 0, b"xyz").unwrap();
    h.open("127.0.0.1:1", 6, "p").unwrap();
    h.peer_eof(5, 3).unwrap();
    assert_eq!(c.poll_oneoff(&mut Mem(&mut mem), 0, 1024, 3, 2000), DONE);
    assert_eq!(
        events(&mut mem),
        vec![(1, 0, 1, 3, 0), (2, 0, 2, w, 0), (3, 0, 1, 1, 0)]
    );
    iov(&mut mem, 300, 10);
    assert_eq!(recv(&mut c, &mut mem, 4, 0), DONE);
    sub(&mut mem, 0, 1, 1, 4);
    // Drained and ended: readable with no bytes, still writable, no HANGUP
    // (wasi-libc would turn HANGUP into POLLHUP and hide POLLOUT).
    assert_eq!(c.poll_oneoff(&mut Mem(&mut mem), 0, 1024, 2, 2000), DONE);
    assert_eq!(events(&mut mem), vec![(1, 0, 1, 0, 0), (2, 0, 2, w, 0)]);
    // Reset: HANGUP on both.
    h.peer_reset(5);
    assert_eq!(c.poll_oneoff(&mut Mem(&mut mem), 0, 1024, 2, 2000), DONE);
    assert_eq!(events(&mut mem), vec![(1, 0, 1, 0, 1), (2, 0, 2, w, 1)]);
}

#[test]
fn a_poll_waiting_on_a_socket_wakes_when_the_backend_delivers() {
    let (mut c, h, mut mem) = connected();
    sub(&mut mem, 0, 7, 1, 4);
    // A one-hour clock, so only the delivery can end the poll.
    sub(&mut mem, 48, 8, 0, 3_600_000_000_000);
    let b = h.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(30));
        b.deliver(5, 0, b"late").unwrap();
    });
    assert_eq!(c.poll_oneoff(&mut Mem(&mut mem), 0, 1024, 2, 2000), DONE);
    t.join().unwrap();
    assert_eq!(events(&mut mem), vec![(7, 0, 1, 4, 0)]);
    // A requested checkpoint suspends a waiting poll, writing no event.
    Mem(&mut mem).put_u32(2000, 99).unwrap();
    c.interrupt.request();
    let mut m2 = mem.clone();
    sub(&mut m2, 0, 7, 2, 3);
    assert_eq!(
        c.poll_oneoff(&mut Mem(&mut m2), 0, 1024, 1, 2000),
        Outcome::Suspend
    );
    assert_eq!(Mem(&mut m2).u32(2000), Ok(99));
}

#[test]
fn close_tells_the_backend_and_sockets_survive_save_and_restore() {
    let (mut c, h, mut mem) = connected();
    h.deliver(5, 0, b"unread").unwrap();
    h.open("127.0.0.1:1", 6, "waiting").unwrap();
    iov(&mut mem, 300, 2);
    assert_eq!(recv(&mut c, &mut mem, 4, 0), DONE);
    let state = OsState::decode(&c.save().unwrap().encode()).unwrap();
    let mut d = WasiCtx::restore(state, vec![], Interrupt::new()).unwrap();
    let dh = d.net().unwrap();
    assert_eq!(dh.listeners(), vec!["127.0.0.1:1".to_string()]);
    // The restored program reads on where it stopped, and accepts the
    // client that was waiting.
    iov(&mut mem, 300, 10);
    assert_eq!(recv(&mut d, &mut mem, 4, 0), DONE);
    assert_eq!(&mem[300..304], b"read");
    assert_eq!(d.sock_accept(&mut Mem(&mut mem), 3, 0, 100), DONE);
    assert_eq!(Mem(&mut mem).u32(100), Ok(5));
    d.fd_close(4).unwrap();
    let out = dh.take_outgoing();
    assert!(out.contains(&NetOut::Closed { conn: 5 }), "{out:?}");
    d.fd_close(3).unwrap();
    assert!(dh.listeners().is_empty());
    // The saved state stays consistent after the closes.
    OsState::decode(&d.save().unwrap().encode()).unwrap();
}

#[test]
fn renumbering_over_a_listener_closes_it() {
    let (mut c, h, _mem) = connected();
    c.fd_renumber(4, 3).unwrap();
    assert!(h.listeners().is_empty());
    let st = OsState::decode(&c.save().unwrap().encode()).unwrap();
    assert_eq!(st.net.conns.len(), 1);
    assert!(c.fd_close(4).is_err());
    c.fd_close(3).unwrap();
    assert_eq!(h.take_outgoing(), vec![NetOut::Closed { conn: 5 }]);
}
