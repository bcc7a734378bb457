//! Byte I/O on fds: read, write, positional I/O, seek, close, renumber, sync.
//!
//! Exists to route guest I/O to the right host object (stdio or a file in a
//! preopen) and to implement the one blocking read (stdin) so that it never
//! consumes input when it hands over to a checkpoint.

use super::{Outcome, Round, Wait, MAX_FDS};
use crate::ctx::{Handle, Sink, WasiCtx};
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::{fdflags, rights};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::SeekFrom;
use std::io::Write;
use std::sync::PoisonError;
use std::time::Duration;

/// How long one blocking slice lasts before the interrupt is re-checked.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// Whether stdin has data (or EOF/error) within `timeout`.
pub(crate) fn stdin_ready(timeout: Duration) -> bool {
    let fd = rustix::stdio::stdin();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
}

fn write_sink(sink: &Sink, stderr: bool, data: &[u8]) -> Result<(), Errno> {
    match sink {
        Sink::Buffer(b) => b
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(data),
        Sink::Shared(s) => s.write(stderr, data),
        Sink::Inherit if stderr => std::io::stderr().lock().write_all(data)?,
        Sink::Inherit => {
            let mut out = std::io::stdout().lock();
            out.write_all(data)?;
            out.flush()?;
        }
    }
    Ok(())
}

impl WasiCtx {
    #[cfg(test)]
    /// `fd_write`, waiting in place if a socket's window is full.
    pub(crate) fn fd_write(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
    ) -> Result<(), Errno> {
        self.in_place(|x, r| x.fd_write_round(mem, fd, iovs, n, out, r))
            .written()
    }

    /// One round of `fd_write`: only a socket with a full window waits.
    pub(crate) fn fd_write_round(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
        round: Round,
    ) -> Outcome {
        match self.with_right(fd, rights::FD_WRITE) {
            Ok(e) if matches!(e.handle, Handle::Socket(_)) => {
                self.sock_send_round(mem, fd, iovs, n, out, round)
            }
            Ok(_) => self.write_plain(mem, fd, iovs, n, out).into(),
            Err(e) => Outcome::Done(e),
        }
    }

    fn write_plain(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
    ) -> Result<(), Errno> {
        let e = self.with_right(fd, rights::FD_WRITE)?;
        let iovs = mem.iovecs(iovs, n)?;
        let total: u64 = match &e.handle {
            Handle::Stdout | Handle::Stderr => {
                let mut data = Vec::new();
                for (buf, len) in iovs {
                    data.extend_from_slice(mem.slice(buf, len)?);
                }
                let is_err = matches!(e.handle, Handle::Stderr);
                write_sink(
                    if is_err { &self.stderr } else { &self.stdout },
                    is_err,
                    &data,
                )?;
                data.len() as u64
            }
            Handle::File(f) => {
                let len: u64 = iovs.iter().map(|&(_, l)| u64::from(l)).sum();
                let append = e.fdflags & fdflags::APPEND != 0;
                let want = |size: u64| {
                    let at = if append {
                        size
                    } else {
                        rustix::fs::seek(f, SeekFrom::Current(0))?
                    };
                    at.checked_add(len).ok_or(Errno::FBIG)
                };
                self.sized(f, want, || {
                    let mut total = 0u64;
                    for &(buf, len) in &iovs {
                        let w = rustix::io::write(f, mem.slice(buf, len)?)?;
                        total += w as u64;
                        if w < len as usize {
                            break;
                        }
                    }
                    Ok(total)
                })?
            }
            Handle::Dir(_) => return Err(Errno::ISDIR),
            Handle::Stdin => return Err(Errno::BADF),
            Handle::Listener(_) | Handle::Socket(_) => return Err(Errno::NOTCONN),
        };
        mem.put_u32(out, total as u32)
    }

    #[cfg(test)]
    /// fd_read, waiting in place; only stdin and sockets can block (and
    /// then may ask to suspend).
    pub(crate) fn fd_read(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
    ) -> Outcome {
        self.in_place(|x, r| x.fd_read_round(mem, fd, iovs, n, out, r))
    }

    /// One round of `fd_read`.
    pub(crate) fn fd_read_round(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
        round: Round,
    ) -> Outcome {
        match self.fd_read_inner(mem, fd, iovs, n, out, round) {
            Ok(o) => o,
            Err(e) => Outcome::Done(e),
        }
    }

    fn fd_read_inner(
        &mut self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        out: u32,
        round: Round,
    ) -> Result<Outcome, Errno> {
        let e = self.with_right(fd, rights::FD_READ)?;
        if matches!(e.handle, Handle::Socket(_)) {
            let a = super::sock::RecvArgs {
                fd,
                iovs,
                n,
                flags: 0,
                out_len: out,
                out_flags: None,
            };
            return Ok(self.sock_recv_round(mem, a, round));
        }
        let iovs = mem.iovecs(iovs, n)?;
        mem.slice(out, 4)?;
        let mut total = 0usize;
        match &e.handle {
            Handle::Stdin => {
                if !stdin_ready(Duration::ZERO) {
                    if e.fdflags & fdflags::NONBLOCK != 0 {
                        return Err(Errno::AGAIN);
                    }
                    if self.interrupt.is_requested() || (round.first && self.interrupt.on_block()) {
                        return Ok(Outcome::Suspend);
                    }
                    return Ok(Outcome::Wait(Wait::Stdin(SLICE)));
                }
                // One read(2) into the first non-empty buffer: nothing is
                // taken from stdin that the guest does not receive.
                if let Some(&(buf, len)) = iovs.iter().find(|(_, l)| *l > 0) {
                    total = rustix::io::read(rustix::stdio::stdin(), mem.slice_mut(buf, len)?)?;
                }
            }
            Handle::File(f) => {
                for (buf, len) in iovs {
                    let r = rustix::io::read(f, mem.slice_mut(buf, len)?)?;
                    total += r;
                    if r < len as usize {
                        break;
                    }
                }
            }
            Handle::Dir(_) => return Err(Errno::ISDIR),
            Handle::Stdout | Handle::Stderr => return Err(Errno::BADF),
            Handle::Listener(_) | Handle::Socket(_) => return Err(Errno::NOTCONN),
        }
        mem.put_u32(out, total as u32)?;
        Ok(Outcome::Done(Errno::SUCCESS))
    }

    pub(crate) fn fd_pread(
        &self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        off: u64,
        out: u32,
    ) -> Result<(), Errno> {
        let f = self.file(fd, rights::FD_READ | rights::FD_SEEK)?;
        let iovs = mem.iovecs(iovs, n)?;
        let mut total = 0u64;
        for (buf, len) in iovs {
            let at = off.checked_add(total).ok_or(Errno::OVERFLOW)?;
            let r = rustix::io::pread(f, mem.slice_mut(buf, len)?, at)?;
            total += r as u64;
            if r < len as usize {
                break;
            }
        }
        mem.put_u32(out, total as u32)
    }

    pub(crate) fn fd_pwrite(
        &self,
        mem: &mut Mem,
        fd: u32,
        iovs: u32,
        n: u32,
        off: u64,
        out: u32,
    ) -> Result<(), Errno> {
        let f = self.file(fd, rights::FD_WRITE | rights::FD_SEEK)?;
        let iovs = mem.iovecs(iovs, n)?;
        let len: u64 = iovs.iter().map(|&(_, l)| u64::from(l)).sum();
        let want = |_| off.checked_add(len).ok_or(Errno::FBIG);
        let total = self.sized(f, want, || {
            let mut total = 0u64;
            for &(buf, len) in &iovs {
                let at = off.checked_add(total).ok_or(Errno::OVERFLOW)?;
                let w = rustix::io::pwrite(f, mem.slice(buf, len)?, at)?;
                total += w as u64;
                if w < len as usize {
                    break;
                }
            }
            Ok(total)
        })?;
        mem.put_u32(out, total as u32)
    }

    pub(crate) fn fd_seek(
        &self,
        mem: &mut Mem,
        fd: u32,
        off: i64,
        whence: u8,
        out: u32,
    ) -> Result<(), Errno> {
        let e = self.entry(fd)?;
        let f = match &e.handle {
            Handle::File(f) => f,
            Handle::Dir(_) => return Err(Errno::ISDIR),
            _ => return Err(Errno::SPIPE),
        };
        let tell_only = off == 0 && whence == 1;
        let allowed = e.rights_base & rights::FD_SEEK != 0
            || (tell_only && e.rights_base & rights::FD_TELL != 0);
        if !allowed {
            return Err(Errno::NOTCAPABLE);
        }
        let pos = match whence {
            0 => SeekFrom::Start(u64::try_from(off).map_err(|_| Errno::INVAL)?),
            1 => SeekFrom::Current(off),
            2 => SeekFrom::End(off),
            _ => return Err(Errno::INVAL),
        };
        let new = rustix::fs::seek(f, pos)?;
        mem.put_u64(out, new)
    }

    pub(crate) fn fd_tell(&self, mem: &mut Mem, fd: u32, out: u32) -> Result<(), Errno> {
        self.fd_seek(mem, fd, 0, 1, out)
    }

    pub(crate) fn fd_close(&mut self, fd: u32) -> Result<(), Errno> {
        let e = self.fds.remove(&fd).ok_or(Errno::BADF)?;
        self.close_socket(&e.handle);
        Ok(())
    }

    pub(crate) fn fd_renumber(&mut self, from: u32, to: u32) -> Result<(), Errno> {
        if !self.fds.contains_key(&to) {
            return Err(Errno::BADF);
        }
        let e = self.fds.remove(&from).ok_or(Errno::BADF)?;
        // The fd replaced at `to` is closed, sockets included.
        if let Some(old) = self.fds.insert(to, e) {
            self.close_socket(&old.handle);
        }
        Ok(())
    }

    pub(crate) fn fd_sync(&self, fd: u32, data_only: bool) -> Result<(), Errno> {
        let right = if data_only {
            rights::FD_DATASYNC
        } else {
            rights::FD_SYNC
        };
        match &self.with_right(fd, right)?.handle {
            Handle::File(f) if data_only => f.sync_data()?,
            Handle::File(f) => f.sync_all()?,
            Handle::Dir(d) => rustix::fs::fsync(d)?,
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn fd_advise(&self, fd: u32, advice: u8) -> Result<(), Errno> {
        self.file(fd, rights::FD_ADVISE)?;
        if advice > 5 {
            return Err(Errno::INVAL);
        }
        Ok(())
    }

    pub(crate) fn fd_allocate(&self, fd: u32, off: u64, len: u64) -> Result<(), Errno> {
        let f = self.file(fd, rights::FD_ALLOCATE)?;
        let end = off.checked_add(len).ok_or(Errno::FBIG)?;
        self.sized(
            f,
            |_| Ok(end),
            || {
                if end > f.metadata()?.len() {
                    f.set_len(end)?;
                }
                Ok(())
            },
        )
    }

    /// Guard against a guest exhausting host fds.
    pub(crate) fn check_fd_room(&self) -> Result<u32, Errno> {
        if self.fds.len() >= MAX_FDS {
            return Err(Errno::MFILE);
        }
        self.alloc_fd().ok_or(Errno::MFILE)
    }
}
