//! The program's side of a [`NetHub`]: accept, receive, send, shut down,
//! close and readiness, as the WASI calls in `ops/sock.rs` need them.
//!
//! Exists to keep the connection rules in one place, next to the state they
//! change. Nothing here blocks: a call that cannot proceed says so and the
//! caller waits (or suspends for a checkpoint) before asking again, so a
//! call that hands over to a checkpoint has changed nothing.

use super::{ConnId, NetHub};
use crate::errno::Errno;

/// Result of a receive attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recv {
    /// Bytes (possibly none if the caller asked for none).
    Data(Vec<u8>),
    /// The client's stream ended (or the program shut its read side).
    Eof,
    /// Nothing yet.
    WouldBlock,
}

/// What `poll_oneoff` may report for a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Readiness {
    /// Readable: bytes buffered, end of stream, reset or shut for reading.
    pub(crate) readable: bool,
    /// Bytes a read would return now.
    pub(crate) nbytes: u64,
    /// Writable: room in the window, or a send would fail at once.
    pub(crate) writable: bool,
    /// Room in the window.
    pub(crate) room: u64,
    /// The connection was reset, or both directions have ended.
    pub(crate) hangup: bool,
}

impl NetHub {
    /// Take the oldest waiting connection of listener `li`, if any.
    pub(crate) fn accept(&self, li: u32) -> Result<Option<ConnId>, Errno> {
        self.guest(|g| {
            let l = g.st.listeners.get_mut(li as usize).ok_or(Errno::BADF)?;
            if !l.open {
                return Err(Errno::BADF);
            }
            if l.backlog.is_empty() {
                return Ok(None);
            }
            let id = l.backlog.remove(0);
            if let Some(at) = g.st.find(id) {
                g.st.conns[at].accepted = true;
            }
            Ok(Some(id))
        })
    }

    /// Whether `accept` on listener `li` would return a connection now.
    pub(crate) fn listener_ready(&self, li: u32) -> bool {
        self.lock()
            .st
            .listeners
            .get(li as usize)
            .is_some_and(|l| !l.backlog.is_empty())
    }

    /// Read up to `max` bytes; `peek` leaves them buffered.
    pub(crate) fn recv(&self, conn: ConnId, max: usize, peek: bool) -> Result<Recv, Errno> {
        self.guest(|g| {
            let at = g.st.find(conn).ok_or(Errno::BADF)?;
            let c = &mut g.st.conns[at];
            if c.shut_rd {
                return Ok(Recv::Eof);
            }
            if !c.rx.is_empty() {
                let n = max.min(c.rx.len());
                if peek {
                    return Ok(Recv::Data(c.rx[..n].to_vec()));
                }
                let data: Vec<u8> = c.rx.drain(..n).collect();
                c.rx_offset += n as u64;
                if n > 0 {
                    g.touch();
                }
                return Ok(Recv::Data(data));
            }
            if c.reset {
                return Err(Errno::CONNRESET);
            }
            if max == 0 {
                return Ok(Recv::Data(Vec::new()));
            }
            if c.rx_eof == Some(c.rx_offset) {
                return Ok(Recv::Eof);
            }
            Ok(Recv::WouldBlock)
        })
    }

    /// Queue as much of `data` as the window allows; `None` if it is full.
    /// With `overdraft` (a checkpoint waits on this send), a full window
    /// takes all of `data` (at most one window) once, so output never
    /// exceeds two windows.
    pub(crate) fn send(
        &self,
        conn: ConnId,
        data: &[u8],
        overdraft: bool,
    ) -> Result<Option<usize>, Errno> {
        self.guest(|g| {
            let window = g.st.window;
            let at = g.st.find(conn).ok_or(Errno::BADF)?;
            let c = &mut g.st.conns[at];
            if c.reset {
                return Err(Errno::CONNRESET);
            }
            if c.shut_wr {
                return Err(Errno::PIPE);
            }
            if data.is_empty() {
                return Ok(Some(0));
            }
            let mut room = window.saturating_sub(c.tx.len() as u64) as usize;
            if room == 0 && overdraft && c.tx.len() as u64 == window {
                room = window as usize;
            }
            if room == 0 {
                return Ok(None);
            }
            let n = room.min(data.len());
            c.tx.extend_from_slice(&data[..n]);
            g.touch();
            Ok(Some(n))
        })
    }

    /// Shut the read side, the write side, or both.
    pub(crate) fn shutdown(&self, conn: ConnId, rd: bool, wr: bool) -> Result<(), Errno> {
        self.guest(|g| {
            let at = g.st.find(conn).ok_or(Errno::BADF)?;
            let c = &mut g.st.conns[at];
            if c.reset {
                return Err(Errno::NOTCONN);
            }
            let mut changed = false;
            if rd && !c.shut_rd {
                c.shut_rd = true;
                c.rx_offset = c.rx_end();
                c.rx.clear();
                changed = true;
            }
            if wr && !c.shut_wr {
                c.shut_wr = true;
                changed = true;
            }
            if changed {
                g.touch();
            }
            Ok(())
        })
    }

    /// The program closed its fd for `conn`: unread input is discarded,
    /// written output is still delivered, then the backend is told.
    pub(crate) fn close(&self, conn: ConnId) {
        self.guest(|g| {
            let Some(at) = g.st.find(conn) else {
                return;
            };
            let c = &mut g.st.conns[at];
            c.closed = true;
            c.rx_offset = c.rx_end();
            c.rx.clear();
            g.touch();
        });
    }

    /// The program closed listener `li`: waiting connections are closed.
    pub(crate) fn close_listener(&self, li: u32) {
        self.guest(|g| {
            let Some(l) = g.st.listeners.get_mut(li as usize) else {
                return;
            };
            l.open = false;
            let waiting = std::mem::take(&mut l.backlog);
            for id in waiting {
                if let Some(at) = g.st.find(id) {
                    g.st.conns[at].closed = true;
                }
            }
            g.touch();
        });
    }

    /// What a poll on `conn` would see now.
    pub(crate) fn readiness(&self, conn: ConnId) -> Readiness {
        let g = self.lock();
        let window = g.st.window;
        let Some(at) = g.st.find(conn) else {
            return Readiness::default();
        };
        let c = &g.st.conns[at];
        let eof = c.rx.is_empty() && c.rx_eof == Some(c.rx_offset);
        let room = window.saturating_sub(c.tx.len() as u64);
        Readiness {
            readable: !c.rx.is_empty() || eof || c.reset || c.shut_rd,
            nbytes: c.rx.len() as u64,
            writable: room > 0 || c.reset || c.shut_wr,
            room,
            // Linux's POLLHUP: both directions are over. A client's end of
            // stream alone is not a hangup (wasi-libc's poll would then
            // hide POLLOUT, and the program could not answer it).
            hangup: c.reset || (eof && c.shut_wr),
        }
    }
}
