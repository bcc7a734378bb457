//! Socket calls: `sock_accept`, `sock_recv`, `sock_send`, `sock_shutdown`,
//! and `fd_read`/`fd_write` on sockets.
//!
//! Exists to give programs ordinary stream-socket semantics over the
//! virtual connections of [`crate::net`]. Calls that would block wait in
//! slices on the interrupt (which the backend kicks when it brings
//! something), and hand over to a checkpoint before changing anything, so
//! the call is simply repeated after a restore.

use super::fd::SLICE;
use super::{Outcome, Round, Wait};
use crate::ctx::{FdEntry, Handle, WasiCtx};
use crate::errno::Errno;
use crate::mem::Mem;
use crate::net::{ConnId, NetHub, Recv};
use crate::types::{fdflags, rights};
use std::sync::Arc;

/// `riflags::recv_peek`.
pub(crate) const RECV_PEEK: u16 = 1 << 0;
/// `riflags::recv_waitall`.
pub(crate) const RECV_WAITALL: u16 = 1 << 1;
/// `sdflags::rd`.
const SHUT_RD: u8 = 1 << 0;
/// `sdflags::wr`.
const SHUT_WR: u8 = 1 << 1;

/// The outcome of one non-blocking attempt.
enum Try<T> {
    Done(T),
    Wait,
}

impl WasiCtx {
    fn hub(&self) -> Result<Arc<NetHub>, Errno> {
        // An fd names a socket only if the context has a hub.
        self.net.clone().ok_or(Errno::BADF)
    }

    /// The connection behind `fd`, which must carry `right`.
    fn conn(&self, fd: u32, right: u64) -> Result<(ConnId, bool, Arc<NetHub>), Errno> {
        let e = self.entry(fd)?;
        let Handle::Socket(id) = e.handle else {
            return Err(match e.handle {
                Handle::Listener(_) => Errno::NOTCONN,
                _ => Errno::NOTSOCK,
            });
        };
        if e.rights_base & right != right {
            return Err(Errno::NOTCAPABLE);
        }
        Ok((id, e.fdflags & fdflags::NONBLOCK != 0, self.hub()?))
    }

    /// One round of a blocking call: `attempt`, and if it has nothing yet,
    /// `AGAIN` if non-blocking, `Suspend` (nothing changed) if a checkpoint
    /// is due, else a wait for the next round.
    fn block_on<T>(
        &self,
        nonblock: bool,
        round: Round,
        attempt: impl FnOnce() -> Result<Try<T>, Errno>,
    ) -> Result<Result<T, Outcome>, Errno> {
        let seen = self.interrupt.kicks();
        if let Try::Done(v) = attempt()? {
            return Ok(Ok(v));
        }
        if nonblock {
            return Err(Errno::AGAIN);
        }
        if self.interrupt.is_requested() || (round.first && self.interrupt.on_block()) {
            return Ok(Err(Outcome::Suspend));
        }
        Ok(Err(Outcome::Wait(Wait::Kick { seen, slice: SLICE })))
    }

    #[cfg(test)]
    /// `sock_accept`, waiting in place.
    pub(crate) fn sock_accept(&mut self, mem: &mut Mem, fd: u32, flags: u16, out: u32) -> Outcome {
        self.in_place(|x, r| x.sock_accept_round(mem, fd, flags, out, r))
    }

    /// One round of `sock_accept`.
    pub(crate) fn sock_accept_round(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        flags: u16,
        out: u32,
        round: Round,
    ) -> Outcome {
        match self.sock_accept_inner(mem, fd, flags, out, round) {
            Ok(o) => o,
            Err(e) => Outcome::Done(e),
        }
    }

    fn sock_accept_inner(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        flags: u16,
        out: u32,
        round: Round,
    ) -> Result<Outcome, Errno> {
        let e = self.entry(fd)?;
        let Handle::Listener(li) = e.handle else {
            return Err(Errno::NOTSOCK);
        };
        if e.rights_base & rights::SOCK_ACCEPT == 0 {
            return Err(Errno::NOTCAPABLE);
        }
        if flags & !fdflags::NONBLOCK != 0 {
            return Err(Errno::INVAL);
        }
        let nonblock = e.fdflags & fdflags::NONBLOCK != 0;
        mem.slice(out, 4)?;
        let newfd = self.check_fd_room()?;
        let hub = self.hub()?;
        let got = self.block_on(nonblock, round, || {
            Ok(match hub.accept(li)? {
                Some(id) => Try::Done(id),
                None => Try::Wait,
            })
        })?;
        let id = match got {
            Ok(id) => id,
            Err(o) => return Ok(o),
        };
        let mut entry = FdEntry::socket(id);
        entry.fdflags = flags & fdflags::NONBLOCK;
        self.fds.insert(newfd, entry);
        mem.put_u32(out, newfd)?;
        Ok(Outcome::Done(Errno::SUCCESS))
    }

    #[cfg(test)]
    /// `sock_recv`, waiting in place.
    pub(crate) fn sock_recv(&mut self, mem: &mut Mem, a: RecvArgs) -> Outcome {
        self.in_place(|x, r| x.sock_recv_round(mem, a, r))
    }

    /// One round of `sock_recv`; also of `fd_read` on a socket (no flags,
    /// no `ro_flags`).
    pub(crate) fn sock_recv_round(&mut self, mem: &mut Mem, a: RecvArgs, round: Round) -> Outcome {
        match self.sock_recv_inner(mem, a, round) {
            Ok(o) => o,
            Err(e) => Outcome::Done(e),
        }
    }

    fn sock_recv_inner(
        &mut self,
        mem: &mut Mem,
        a: RecvArgs,
        round: Round,
    ) -> Result<Outcome, Errno> {
        let (id, nonblock, hub) = self.conn(a.fd, rights::FD_READ)?;
        if a.flags & !(RECV_PEEK | RECV_WAITALL) != 0 {
            return Err(Errno::INVAL);
        }
        let iovs = mem.iovecs(a.iovs, a.n)?;
        mem.slice(a.out_len, 4)?;
        if let Some(p) = a.out_flags {
            mem.slice(p, 2)?;
        }
        let want: usize = iovs.iter().map(|&(_, l)| l as usize).sum();
        let peek = a.flags & RECV_PEEK != 0;
        let waitall = a.flags & RECV_WAITALL != 0 && !peek;
        let got = self.block_on(nonblock, round, || {
            if waitall {
                let r = hub.readiness(id);
                if (r.nbytes as usize) < want && !r.hangup && !(r.readable && r.nbytes == 0) {
                    return Ok(Try::Wait);
                }
            }
            Ok(match hub.recv(id, want, peek)? {
                Recv::Data(d) => Try::Done(d),
                Recv::Eof => Try::Done(Vec::new()),
                Recv::WouldBlock => Try::Wait,
            })
        })?;
        let data = match got {
            Ok(d) => d,
            Err(o) => return Ok(o),
        };
        let mut at = 0usize;
        for (buf, len) in iovs {
            if at == data.len() {
                break;
            }
            let n = (len as usize).min(data.len() - at);
            mem.slice_mut(buf, n as u32)?
                .copy_from_slice(&data[at..at + n]);
            at += n;
        }
        mem.put_u32(a.out_len, data.len() as u32)?;
        if let Some(p) = a.out_flags {
            // A stream socket never truncates: ro_flags is always 0.
            mem.write(p, &0u16.to_le_bytes())?;
        }
        Ok(Outcome::Done(Errno::SUCCESS))
    }

    #[cfg(test)]
    /// `sock_send`; also `fd_write` on a socket. A full window blocks
    /// (`AGAIN` if non-blocking). This call is not an unwind point, so it
    /// never suspends: if a checkpoint is requested while it waits, it takes
    /// the bytes as an overdraft of at most one window, which the snapshot
    /// records and the backend drains as the window opens.
    pub(crate) fn sock_send(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
    ) -> Result<(), Errno> {
        self.in_place(|x, r| x.sock_send_round(mem, fd, iovs, n, out, r))
            .written()
    }

    /// One round of `sock_send`: `Done` or `Wait`, never `Suspend`.
    pub(crate) fn sock_send_round(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
        _round: Round,
    ) -> Outcome {
        match self.send_inner(mem, fd, iovs, n, out) {
            Ok(Ok(())) => Outcome::Done(Errno::SUCCESS),
            Ok(Err(seen)) => Outcome::Wait(Wait::Kick { seen, slice: SLICE }),
            Err(e) => Outcome::Done(e),
        }
    }

    /// `Ok(Err(kicks))`: the window is full and nothing was taken; wait for
    /// a kick after `kicks`.
    fn send_inner(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
    ) -> Result<Result<(), u64>, Errno> {
        let (id, nonblock, hub) = self.conn(fd, rights::FD_WRITE)?;
        let iovs = mem.iovecs(iovs, n)?;
        mem.slice(out, 4)?;
        // Never copy more than one window: the rest would not fit anyway.
        let cap = hub.window() as usize;
        let mut data = Vec::new();
        for (buf, len) in iovs {
            let take = (len as usize).min(cap - data.len());
            data.extend_from_slice(mem.slice(buf, take as u32)?);
            if data.len() == cap {
                break;
            }
        }
        // Read before the window is asked, so a kick in between is not lost.
        let seen = self.interrupt.kicks();
        let sent = match hub.send(id, &data, false)? {
            Some(n) => n,
            None if nonblock => return Err(Errno::AGAIN),
            None if self.interrupt.is_requested() => match hub.send(id, &data, true)? {
                Some(n) => n,
                None => return Ok(Err(seen)),
            },
            None => return Ok(Err(seen)),
        };
        mem.put_u32(out, sent as u32)?;
        Ok(Ok(()))
    }

    pub(crate) fn sock_shutdown(&mut self, fd: u32, how: u8) -> Result<(), Errno> {
        let (id, _, hub) = self.conn(fd, rights::SOCK_SHUTDOWN)?;
        if how == 0 || how & !(SHUT_RD | SHUT_WR) != 0 {
            return Err(Errno::INVAL);
        }
        hub.shutdown(id, how & SHUT_RD != 0, how & SHUT_WR != 0)
    }

    /// Tell the hub an fd went away (called by `fd_close`).
    pub(crate) fn close_socket(&self, handle: &Handle) {
        let Some(hub) = &self.net else { return };
        match *handle {
            Handle::Socket(id) => hub.close(id),
            Handle::Listener(li) => hub.close_listener(li),
            _ => {}
        }
    }
}

/// Arguments of `sock_recv` / `fd_read` on a socket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvArgs {
    pub(crate) fd: u32,
    pub(crate) iovs: u32,
    pub(crate) n: u32,
    pub(crate) flags: u16,
    pub(crate) out_len: u32,
    /// Where `ro_flags` goes (`sock_recv` only).
    pub(crate) out_flags: Option<u32>,
}
