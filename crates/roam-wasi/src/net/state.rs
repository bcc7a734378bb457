//! The network part of a cell's OS state, as plain data.
//!
//! Exists because a cell's connections must travel inside its snapshot: the
//! cell never owns a host socket, so everything the program can observe of a
//! connection (unread input, undelivered output, stream offsets, half-close
//! and reset flags, the accept backlog) is recorded here and nowhere else.
//! [`NetState::validate`] treats a decoded state as hostile.

use serde::{Deserialize, Serialize};

/// A connection's identifier, chosen by the backend (a gateway-wide id, or
/// a local counter when a cell serves clients directly).
pub type ConnId = u64;

/// Default flow-control window: the most client-to-cell bytes the program
/// has not read yet, and the most cell-to-client bytes not yet confirmed
/// delivered, per connection.
pub const DEFAULT_WINDOW: u64 = 256 * 1024;

/// Largest window a state may declare.
pub const MAX_WINDOW: u64 = 1 << 20;

/// Most listeners a cell may have.
pub const MAX_LISTENERS: usize = 64;

/// Most connections (accepted or waiting in a backlog) a cell may hold.
pub const MAX_CONNS: usize = 1024;

/// Most connections waiting to be accepted on one listener.
pub const MAX_BACKLOG: usize = 512;

/// Most bytes all connections of a state may buffer together: every
/// connection full at the default window (input, output and an overdraft).
pub const MAX_BUFFERED: u64 = 3 * MAX_CONNS as u64 * DEFAULT_WINDOW;

/// Longest listener label or peer description, in bytes.
pub const MAX_LABEL_LEN: usize = 256;

/// Every listener and connection of a cell.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NetState {
    /// The flow-control window of every connection (bytes).
    pub window: u64,
    /// The listeners, in the order they were given; fds refer to them by index.
    pub listeners: Vec<ListenerState>,
    /// The connections, sorted by id.
    pub conns: Vec<ConnState>,
}

impl Default for NetState {
    fn default() -> NetState {
        NetState {
            window: DEFAULT_WINDOW,
            listeners: Vec::new(),
            conns: Vec::new(),
        }
    }
}

/// One listening socket.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ListenerState {
    /// Its label: a service name behind a gateway, the address standalone.
    pub label: String,
    /// False once the program closed its fd; the index stays taken.
    pub open: bool,
    /// Connections waiting for `sock_accept`, oldest first.
    pub backlog: Vec<ConnId>,
}

/// One connection.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ConnState {
    /// Its id.
    pub conn: ConnId,
    /// Index of the listener it arrived on.
    pub listener: u32,
    /// Who connected, as the backend described it (informational).
    pub peer: String,
    /// The program accepted it (an fd refers to it unless `closed`).
    pub accepted: bool,
    /// Stream offset of `rx[0]`: the program has read everything before it.
    pub rx_offset: u64,
    /// Client-to-cell bytes received but not yet read by the program.
    pub rx: Vec<u8>,
    /// The client's stream ends at this offset (it shut its write side).
    pub rx_eof: Option<u64>,
    /// Stream offset of `tx[0]`: everything before it reached the client.
    pub tx_offset: u64,
    /// Cell-to-client bytes written by the program, not yet confirmed
    /// delivered: at most one window, or two after a checkpoint overdraft.
    pub tx: Vec<u8>,
    /// The program shut its read side: input is discarded as it arrives.
    pub shut_rd: bool,
    /// The program shut its write side: its stream ends at `tx_offset + tx.len()`.
    pub shut_wr: bool,
    /// The connection was reset (client gone, or restored without a gateway).
    pub reset: bool,
    /// The program closed its fd; the entry lives on until the backend has
    /// been told and the remaining output is delivered.
    pub closed: bool,
}

impl ConnState {
    /// Offset just past the last client-to-cell byte received.
    pub fn rx_end(&self) -> u64 {
        self.rx_offset.saturating_add(self.rx.len() as u64)
    }

    /// Offset just past the last cell-to-client byte written.
    pub fn tx_end(&self) -> u64 {
        self.tx_offset.saturating_add(self.tx.len() as u64)
    }
}

impl NetState {
    /// Index of the open listener labelled `label`.
    pub(crate) fn listener_index(&self, label: &str) -> Option<usize> {
        self.listeners
            .iter()
            .position(|l| l.open && l.label == label)
    }

    /// Position of connection `conn` in `conns`.
    pub(crate) fn find(&self, conn: ConnId) -> Option<usize> {
        self.conns.binary_search_by_key(&conn, |c| c.conn).ok()
    }

    /// Check every invariant the hub relies on; the reason names the fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.window == 0 || self.window > MAX_WINDOW {
            return Err(format!(
                "network window {} is outside 1..={MAX_WINDOW}",
                self.window
            ));
        }
        if self.listeners.len() > MAX_LISTENERS {
            return Err(format!(
                "{} listeners, over the limit of {MAX_LISTENERS}",
                self.listeners.len()
            ));
        }
        if self.conns.len() > MAX_CONNS {
            return Err(format!(
                "{} connections, over the limit of {MAX_CONNS}",
                self.conns.len()
            ));
        }
        for w in self.conns.windows(2) {
            if w[0].conn >= w[1].conn {
                return Err(format!(
                    "connection {} listed out of order or twice",
                    w[1].conn
                ));
            }
        }
        let buffered: u64 = self
            .conns
            .iter()
            .map(|c| c.rx.len() as u64 + c.tx.len() as u64)
            .sum();
        if buffered > MAX_BUFFERED {
            return Err(format!(
                "connections buffer {buffered} bytes, over the limit of {MAX_BUFFERED}"
            ));
        }
        let mut queued = vec![false; self.conns.len()];
        for (i, l) in self.listeners.iter().enumerate() {
            check_label("listener label", &l.label, false)?;
            if l.backlog.len() > MAX_BACKLOG {
                return Err(format!(
                    "listener {i} has {} waiting connections, over the limit of {MAX_BACKLOG}",
                    l.backlog.len()
                ));
            }
            if !l.open && !l.backlog.is_empty() {
                return Err(format!("closed listener {i} has waiting connections"));
            }
            for &id in &l.backlog {
                let Some(at) = self.find(id) else {
                    return Err(format!(
                        "listener {i} queues connection {id}, which does not exist"
                    ));
                };
                let c = &self.conns[at];
                if c.accepted || c.closed || c.listener as usize != i || queued[at] {
                    return Err(format!(
                        "connection {id} is queued on listener {i} but is not a fresh connection of it"
                    ));
                }
                queued[at] = true;
            }
        }
        for (at, c) in self.conns.iter().enumerate() {
            let id = c.conn;
            if c.listener as usize >= self.listeners.len() {
                return Err(format!(
                    "connection {id} refers to listener {}, which does not exist",
                    c.listener
                ));
            }
            check_label("peer", &c.peer, true)?;
            // Output may hold one window of overdraft (see `NetHub::send`).
            if c.rx.len() as u64 > self.window || c.tx.len() as u64 > 2 * self.window {
                return Err(format!(
                    "connection {id} buffers more than its {}-byte window allows",
                    self.window
                ));
            }
            if c.rx_offset.checked_add(c.rx.len() as u64).is_none()
                || c.tx_offset.checked_add(c.tx.len() as u64).is_none()
            {
                return Err(format!("connection {id} has overflowing stream offsets"));
            }
            if matches!(c.rx_eof, Some(e) if e < c.rx_end()) {
                return Err(format!(
                    "connection {id} holds input beyond its end of stream"
                ));
            }
            if !c.accepted && !c.closed && !queued[at] {
                return Err(format!(
                    "connection {id} was never accepted and waits on no listener"
                ));
            }
            if c.reset && !c.tx.is_empty() {
                return Err(format!("reset connection {id} still holds output"));
            }
        }
        Ok(())
    }
}

/// A label or peer string: bounded, no NUL, non-empty unless `may_be_empty`.
pub(crate) fn check_label(what: &str, s: &str, may_be_empty: bool) -> Result<(), String> {
    if (s.is_empty() && !may_be_empty) || s.len() > MAX_LABEL_LEN || s.contains('\0') {
        return Err(format!(
            "{what} {:?} must be at most {MAX_LABEL_LEN} bytes without NUL (and a label not empty)",
            s.chars().take(40).collect::<String>()
        ));
    }
    Ok(())
}
