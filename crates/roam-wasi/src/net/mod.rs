//! Virtual connections: the cell side of every socket a program uses.
//!
//! A cell never owns a host socket, because a host socket cannot move to
//! another machine. Its listeners and connections are plain data
//! ([`NetState`]) inside its OS state, so they travel in every snapshot. A
//! host-side *backend* (a gateway link, or `roam run --listen` serving real
//! TCP clients) feeds and drains them through a shared [`NetHub`]:
//!
//! - client-to-cell bytes arrive with [`NetHub::deliver`] at a stream
//!   offset; bytes the cell already has are dropped, so a backend can replay
//!   from an older offset after a move without duplicating anything;
//! - cell-to-client bytes leave through [`NetHub::take_outgoing`] and stay
//!   buffered until [`NetHub::delivered`] confirms them, so they can be sent
//!   again after a restore ([`NetHub::resume_points`]);
//! - both directions are bounded by a per-connection window, so neither a
//!   fast client nor a chatty program can grow memory without bound.
//!
//! This crate stays synchronous and does no socket I/O; the guest-side calls
//! live in `guest.rs` and the WASI glue in `ops/sock.rs`.

mod error;
mod guest;
#[doc(hidden)]
pub mod program;
mod state;

#[cfg(test)]
pub(crate) mod tests;

pub use state::{
    ConnId, ConnState, ListenerState, NetState, DEFAULT_WINDOW, MAX_BACKLOG, MAX_BUFFERED,
    MAX_CONNS, MAX_LABEL_LEN, MAX_LISTENERS, MAX_WINDOW,
};

pub use error::NetError;
pub(crate) use guest::Recv;
pub(crate) use state::check_label;

use crate::interrupt::Interrupt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Something the cell has for its backend ([`NetHub::take_outgoing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetOut {
    /// Cell-to-client bytes starting at stream offset `offset`.
    Data {
        /// The connection.
        conn: ConnId,
        /// Stream offset of `bytes[0]`.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The program has read client-to-cell bytes up to `offset`; the sender
    /// may drop them.
    Consumed {
        /// The connection.
        conn: ConnId,
        /// Everything before this offset was read.
        offset: u64,
    },
    /// The program shut its write side; its stream ends at `offset`.
    Shutdown {
        /// The connection.
        conn: ConnId,
        /// Where the cell-to-client stream ends.
        offset: u64,
    },
    /// The program closed the fd; nothing more will come or be read.
    Closed {
        /// The connection.
        conn: ConnId,
    },
}

/// Where a connection stands, for re-attaching it after a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The connection.
    pub conn: ConnId,
    /// Label of the listener it arrived on.
    pub listener: String,
    /// The next client-to-cell offset the cell wants.
    pub rx_next: u64,
    /// Offset of the first cell-to-client byte not confirmed delivered.
    pub tx_from: u64,
}

/// What the backend has been told since the last [`NetHub::resume_points`];
/// never part of a snapshot.
#[derive(Debug, Default, Clone)]
struct Progress {
    /// Cell-to-client bytes before this offset were handed out.
    sent: u64,
    /// The last `Consumed` offset handed out.
    consumed: u64,
    shutdown: bool,
    closed: bool,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) st: NetState,
    progress: BTreeMap<ConnId, Progress>,
    /// Something new for `take_outgoing` since the last call.
    dirty: bool,
}

type Notify = Arc<dyn Fn() + Send + Sync>;

/// The shared handle between a cell's WASI context (guest thread) and
/// exactly one backend. `Send + Sync`; use it as `Arc<NetHub>`.
pub struct NetHub {
    inner: Mutex<Inner>,
    notify: Mutex<Option<Notify>>,
    waker: Mutex<Option<Arc<Interrupt>>>,
}

impl std::fmt::Debug for NetHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetHub")
            .field("listeners", &self.listeners())
            .finish_non_exhaustive()
    }
}

impl NetHub {
    /// A hub with `listeners` (labels) and no connections, window
    /// [`DEFAULT_WINDOW`]. A [`crate::WasiCtx`] makes its own from
    /// [`crate::WasiConfig::listeners`]; this is for backends' tests.
    pub fn new(listeners: &[String]) -> Arc<NetHub> {
        let st = NetState {
            window: DEFAULT_WINDOW,
            listeners: listeners
                .iter()
                .map(|l| ListenerState {
                    label: l.clone(),
                    open: true,
                    backlog: Vec::new(),
                })
                .collect(),
            conns: Vec::new(),
        };
        NetHub::from_state(st)
    }

    /// A hub continuing from saved state (already validated).
    pub(crate) fn from_state(st: NetState) -> Arc<NetHub> {
        let progress = st
            .conns
            .iter()
            .map(|c| {
                let p = Progress {
                    sent: c.tx_offset,
                    ..Progress::default()
                };
                (c.conn, p)
            })
            .collect();
        Arc::new(NetHub {
            inner: Mutex::new(Inner {
                st,
                progress,
                dirty: true,
            }),
            notify: Mutex::new(None),
            waker: Mutex::new(None),
        })
    }

    /// The guest's interrupt, kicked whenever the backend brings something new.
    pub(crate) fn attach(&self, interrupt: Arc<Interrupt>) {
        *self.waker.lock().unwrap_or_else(PoisonError::into_inner) = Some(interrupt);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A copy of the state, for a snapshot.
    pub fn state(&self) -> NetState {
        self.lock().st.clone()
    }

    fn kick(&self) {
        let w = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(w) = w {
            w.kick();
        }
    }

    /// Run a guest-side change; tell the backend if it made new output.
    pub(crate) fn guest<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let (r, fresh) = {
            let mut g = self.lock();
            let was = g.dirty;
            let r = f(&mut g);
            (r, g.dirty && !was)
        };
        if fresh {
            let n = self
                .notify
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(n) = n {
                n();
            }
        }
        r
    }

    /// Run a backend-side change; wake the guest if it succeeded.
    fn backend<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R, NetError>) -> Result<R, NetError> {
        let r = f(&mut self.lock());
        if r.is_ok() {
            self.kick();
        }
        r
    }

    // ---- backend -> cell

    /// A client connected to `listener` (a label: the service name behind a
    /// gateway, the address standalone). It waits in the listener's backlog
    /// until the program accepts it.
    pub fn open(&self, listener: &str, conn: ConnId, peer: &str) -> Result<(), NetError> {
        state::check_label("peer", peer, true).map_err(|_| NetError::BadPeer)?;
        self.backend(|g| {
            let li =
                g.st.listener_index(listener)
                    .ok_or_else(|| NetError::NoListener(listener.to_owned()))?;
            let at = match g.st.conns.binary_search_by_key(&conn, |c| c.conn) {
                Ok(_) => return Err(NetError::DuplicateConn(conn)),
                Err(at) => at,
            };
            if g.st.conns.len() >= MAX_CONNS {
                return Err(NetError::TooManyConns);
            }
            if g.st.listeners[li].backlog.len() >= MAX_BACKLOG {
                return Err(NetError::BacklogFull(listener.to_owned()));
            }
            g.st.listeners[li].backlog.push(conn);
            g.st.conns.insert(
                at,
                ConnState {
                    conn,
                    listener: li as u32,
                    peer: peer.to_owned(),
                    accepted: false,
                    rx_offset: 0,
                    rx: Vec::new(),
                    rx_eof: None,
                    tx_offset: 0,
                    tx: Vec::new(),
                    shut_rd: false,
                    shut_wr: false,
                    reset: false,
                    closed: false,
                },
            );
            g.progress.insert(conn, Progress::default());
            Ok(())
        })
    }

    /// Client-to-cell bytes starting at stream offset `offset`. Bytes before
    /// what the cell already has are dropped (replay dedup); a gap, data
    /// beyond read offset + window, or data past the client's end of stream
    /// is an error and changes nothing. Data for a reset connection is dropped.
    pub fn deliver(&self, conn: ConnId, offset: u64, data: &[u8]) -> Result<(), NetError> {
        self.backend(|g| {
            let window = g.st.window;
            let at = g.st.find(conn).ok_or(NetError::UnknownConn(conn))?;
            let c = &mut g.st.conns[at];
            let end = offset
                .checked_add(data.len() as u64)
                .ok_or(NetError::OffsetOverflow(conn))?;
            if c.reset {
                return Ok(());
            }
            let have = c.rx_end();
            if offset > have {
                return Err(NetError::Gap {
                    conn,
                    expected: have,
                    offset,
                });
            }
            if let Some(eof) = c.rx_eof {
                if end > eof {
                    return Err(NetError::AfterEof {
                        conn,
                        eof,
                        offset: end,
                    });
                }
            }
            if end <= have {
                return Ok(());
            }
            let limit = c.rx_offset.saturating_add(window);
            if end > limit {
                return Err(NetError::OverWindow { conn, end, limit });
            }
            let fresh = &data[(have - offset) as usize..];
            if c.shut_rd || c.closed {
                // Nobody will read it: consumed on arrival.
                c.rx_offset = end;
                g.dirty = true;
            } else {
                c.rx.extend_from_slice(fresh);
            }
            Ok(())
        })
    }

    /// The client closed its write side; its stream ends at `offset`.
    pub fn peer_eof(&self, conn: ConnId, offset: u64) -> Result<(), NetError> {
        self.backend(|g| {
            let at = g.st.find(conn).ok_or(NetError::UnknownConn(conn))?;
            let c = &mut g.st.conns[at];
            match c.rx_eof {
                Some(eof) if eof != offset => return Err(NetError::AfterEof { conn, eof, offset }),
                _ => {}
            }
            if offset < c.rx_end() {
                return Err(NetError::EofBeforeData {
                    conn,
                    offset,
                    have: c.rx_end(),
                });
            }
            c.rx_eof = Some(offset);
            Ok(())
        })
    }

    /// The client's connection is gone. The program reads what is already
    /// buffered, then `ECONNRESET`; sends fail with `ECONNRESET`; output not
    /// yet delivered is discarded. A connection still waiting to be accepted
    /// disappears from the backlog.
    pub fn peer_reset(&self, conn: ConnId) {
        let _ = self.backend(|g| {
            g.reset(conn);
            Ok(())
        });
    }

    /// Cell-to-client bytes before `offset` reached the client: they are
    /// dropped and the window opens. Call [`NetHub::take_outgoing`]
    /// afterwards: output held back by the window may now go.
    pub fn delivered(&self, conn: ConnId, offset: u64) -> Result<(), NetError> {
        self.backend(|g| {
            let window = g.st.window;
            let at = g.st.find(conn).ok_or(NetError::UnknownConn(conn))?;
            let c = &mut g.st.conns[at];
            if offset > c.tx_end() {
                return Err(NetError::BeyondWritten {
                    conn,
                    offset,
                    written: c.tx_end(),
                });
            }
            if offset > c.tx_offset {
                let n = (offset - c.tx_offset) as usize;
                let held_back = c.tx.len() as u64 > window;
                c.tx.drain(..n);
                c.tx_offset = offset;
                if held_back {
                    g.dirty = true;
                }
            }
            g.forget_if_done(at);
            Ok(())
        })
    }

    // ---- cell -> backend

    /// Everything new since the last call, per connection in id order: data
    /// to send (never beyond delivered + window), the consumed offset, a
    /// shutdown, a close.
    pub fn take_outgoing(&self) -> Vec<NetOut> {
        let mut g = self.lock();
        g.dirty = false;
        let mut out = Vec::new();
        let mut done = Vec::new();
        let Inner { st, progress, .. } = &mut *g;
        for (at, c) in st.conns.iter().enumerate() {
            let p = progress.entry(c.conn).or_default();
            let from = p.sent.max(c.tx_offset);
            let upto = c.tx_end().min(c.tx_offset.saturating_add(st.window));
            if from < upto {
                let skip = (from - c.tx_offset) as usize;
                let until = (upto - c.tx_offset) as usize;
                out.push(NetOut::Data {
                    conn: c.conn,
                    offset: from,
                    bytes: c.tx[skip..until].to_vec(),
                });
                p.sent = upto;
            }
            if c.rx_offset > p.consumed {
                out.push(NetOut::Consumed {
                    conn: c.conn,
                    offset: c.rx_offset,
                });
                p.consumed = c.rx_offset;
            }
            if c.shut_wr && !c.reset && !p.shutdown && p.sent >= c.tx_end() {
                out.push(NetOut::Shutdown {
                    conn: c.conn,
                    offset: c.tx_end(),
                });
                p.shutdown = true;
            }
            // Closed goes only after every byte the program wrote has been
            // sent (a checkpoint overdraft can leave output past the window):
            // the receiver drops data that arrives after Closed.
            if c.closed && !p.closed && (c.reset || p.sent.max(c.tx_offset) >= c.tx_end()) {
                out.push(NetOut::Closed { conn: c.conn });
                p.closed = true;
            }
            if c.closed && p.closed && c.tx.is_empty() {
                done.push(at);
            }
        }
        for at in done.into_iter().rev() {
            let id = g.st.conns.remove(at).conn;
            g.progress.remove(&id);
        }
        out
    }

    /// `f` is called (from the guest thread, never while the hub is locked)
    /// whenever [`NetHub::take_outgoing`] would return something new.
    pub fn set_notify(&self, f: Arc<dyn Fn() + Send + Sync>) {
        *self.notify.lock().unwrap_or_else(PoisonError::into_inner) = Some(f);
    }

    /// Where every connection stands, after a restore or to re-attach after
    /// a failed migration. Marks all undelivered output as not yet sent, so
    /// [`NetHub::take_outgoing`] sends it again (the receiver drops what it
    /// already has, by offset), and repeats shutdowns, closes and the
    /// consumed offsets.
    pub fn resume_points(&self) -> Vec<Resume> {
        let mut g = self.lock();
        let Inner { st, progress, .. } = &mut *g;
        progress.clear();
        let mut out = Vec::with_capacity(st.conns.len());
        for c in &st.conns {
            progress.insert(
                c.conn,
                Progress {
                    sent: c.tx_offset,
                    ..Progress::default()
                },
            );
            out.push(Resume {
                conn: c.conn,
                listener: st
                    .listeners
                    .get(c.listener as usize)
                    .map(|l| l.label.clone())
                    .unwrap_or_default(),
                rx_next: c.rx_end(),
                tx_from: c.tx_offset,
            });
        }
        g.dirty = true;
        out
    }

    /// The standalone restore rule: every connection restored without a
    /// gateway is reported to the program as reset (see `docs/os-layer.md`).
    pub fn reset_all(&self) {
        let _ = self.backend(|g| {
            let ids: Vec<ConnId> = g.st.conns.iter().map(|c| c.conn).collect();
            for id in ids {
                g.reset(id);
            }
            Ok(())
        });
    }

    /// Labels of the cell's open listeners, in fd order.
    pub fn listeners(&self) -> Vec<String> {
        self.lock()
            .st
            .listeners
            .iter()
            .filter(|l| l.open)
            .map(|l| l.label.clone())
            .collect()
    }

    /// Whether the hub still has `conn`: a closed connection stays until
    /// the backend has confirmed every byte of its output delivered.
    pub fn has_conn(&self, conn: ConnId) -> bool {
        self.lock().st.find(conn).is_some()
    }

    /// The window of every connection (bytes).
    pub fn window(&self) -> u64 {
        self.lock().st.window
    }
}

impl Inner {
    /// Mark `conn` reset (see [`NetHub::peer_reset`]).
    fn reset(&mut self, conn: ConnId) {
        let Some(at) = self.st.find(conn) else {
            return;
        };
        let c = &mut self.st.conns[at];
        if !c.accepted && !c.closed {
            let li = c.listener as usize;
            if let Some(l) = self.st.listeners.get_mut(li) {
                l.backlog.retain(|&id| id != conn);
            }
            self.st.conns.remove(at);
            self.progress.remove(&conn);
            return;
        }
        c.reset = true;
        c.tx_offset = c.tx_end();
        c.tx.clear();
        self.forget_if_done(at);
    }

    /// Drop a closed connection once the backend knows and nothing is left
    /// to deliver.
    pub(crate) fn forget_if_done(&mut self, at: usize) {
        let c = &self.st.conns[at];
        let told = self.progress.get(&c.conn).is_some_and(|p| p.closed);
        if c.closed && told && c.tx.is_empty() {
            let id = c.conn;
            self.st.conns.remove(at);
            self.progress.remove(&id);
        }
    }

    /// Mark that `take_outgoing` has something new.
    pub(crate) fn touch(&mut self) {
        self.dirty = true;
    }
}
