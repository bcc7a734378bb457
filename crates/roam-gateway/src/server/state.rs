//! The gateway's routing state and its rules, in one place under one lock:
//! which node serves each service, and where every client's two byte
//! streams stand.
//!
//! Per connection, client->cell bytes are kept from the last `Consumed`
//! offset (`up_base`) to what the client has sent (`up_end`); `up_sent` is
//! how far the current cell was sent. Cell->client bytes are kept from
//! what the client has been written (`down_base`) to what the cell has
//! sent. Offsets never go back except `up_sent`, which a `Serve` resets to
//! the cell's `rx_next`: that is the replay.
//!
//! `Delivered` is sent lazily: when the client has been written half a
//! window (at most [`ACK_EVERY`]) beyond the last one, when either stream
//! ends (the client's Eof, the cell's shutdown or close: a node keeps a
//! closed connection until its output is confirmed), and on the
//! gateway's periodic tick ([`State::flush_acks`]). Each `Delivered` only
//! opens the window and lets the node drop bytes it keeps for a replay,
//! so one per small reply was a frame each way and a wake of the cell
//! for nothing; the cell's sends never block on a lazy one (it is sent by
//! half a window at the latest).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::outq::LinkOut;
use crate::proto::{ConnId, ToNode, MAX_DATA};

/// Most client-written bytes a `Delivered` waits for (see the module doc).
pub(crate) const ACK_EVERY: u64 = 16 << 10;

/// A node link's id, local to this gateway.
pub(crate) type LinkId = u64;

/// Wakes a client's two tasks.
#[derive(Default)]
pub(crate) struct ConnWake {
    /// The reader: room in the buffers, or the connection ended.
    pub read: Notify,
    /// The writer: bytes for the client, a shutdown, a close or an error.
    pub write: Notify,
}

/// A client connection.
pub(crate) struct Conn {
    pub service: String,
    pub peer: String,
    pub wake: Arc<ConnWake>,
    /// Waiting for its first `Open` since this instant.
    pub waiting_since: Option<Instant>,
    /// The current cell knows it (sent `Open`, or listed it in `Serve`).
    pub opened: bool,
    /// Some cell has seen it: it can never again be opened from offset 0.
    pub seen: bool,
    pub up: VecDeque<u8>,
    pub up_base: u64,
    pub up_sent: u64,
    pub up_eof: Option<u64>,
    pub eof_sent: bool,
    /// Room promised to the reader's current read (counted in the total).
    pub reserved: usize,
    pub down: VecDeque<u8>,
    pub down_base: u64,
    /// The offset of the last `Delivered` sent (or resumed from).
    pub acked: u64,
    pub down_shut: Option<u64>,
    pub cell_closed: bool,
    /// Bytes to write to the client before closing it (the wait-timeout
    /// error), or an empty vector: close now.
    pub fail: Option<Vec<u8>>,
    /// The kernel's smoothed round trip to the client, sampled by its
    /// writer (`report.rs`).
    pub rtt: Option<std::time::Duration>,
}

impl Conn {
    pub fn up_end(&self) -> u64 {
        self.up_base + self.up.len() as u64
    }
    pub fn down_end(&self) -> u64 {
        self.down_base + self.down.len() as u64
    }
}

/// Where a service's cell runs.
pub(crate) struct Route {
    /// The node link, or `None` while the link is down.
    pub link: Option<LinkId>,
    pub node: String,
    pub cell: String,
    pub generation: u64,
}

/// A service the gateway serves.
pub(crate) struct Service {
    pub resp: bool,
    pub route: Option<Route>,
    pub held: bool,
    /// The serving node's link dropped at this instant.
    pub detached_since: Option<Instant>,
    /// Its clients and their bytes since the gateway started.
    pub traffic: super::report::Traffic,
}

/// A node's link, as the state sees it.
pub(crate) struct LinkHandle {
    pub node: String,
    /// The protocol version the session speaks.
    pub version: u16,
    pub window: u64,
    /// Frames for the node, bounded by [`Limits::link_queue`]; past it
    /// the queue tells the link's task, which closes the link.
    pub out: Arc<LinkOut>,
    /// The kernel's smoothed round trip to the node (`report.rs`).
    pub rtt: Option<std::time::Duration>,
}

/// Limits of the gateway's buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub conn_buffer: usize,
    pub total_buffer: usize,
    /// Most bytes queued to one node link.
    pub link_queue: usize,
}

/// A node broke the protocol: the gateway refuses it and closes its link.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Violation {
    #[error("connection {conn}: Data at offset {offset} leaves a gap; the gateway has cell bytes up to {have}")]
    Gap {
        conn: ConnId,
        offset: u64,
        have: u64,
    },
    #[error(
        "connection {conn}: Data up to offset {end} exceeds the window, which ends at {limit}"
    )]
    OverWindow { conn: ConnId, end: u64, limit: u64 },
    #[error("connection {conn}: Data up to offset {end} after the cell's Shutdown at {shut}")]
    AfterShutdown { conn: ConnId, end: u64, shut: u64 },
    #[error("connection {conn}: Consumed up to {offset}, but only {sent} bytes were sent")]
    OverConsumed {
        conn: ConnId,
        offset: u64,
        sent: u64,
    },
    #[error(
        "connection {conn}: Shutdown at {offset}, before the {have} bytes the cell already sent"
    )]
    ShutdownBack {
        conn: ConnId,
        offset: u64,
        have: u64,
    },
}

/// The whole routing state.
pub(crate) struct State {
    pub limits: Limits,
    pub services: HashMap<String, Service>,
    pub conns: HashMap<ConnId, Conn>,
    pub links: HashMap<LinkId, LinkHandle>,
    /// Client->cell bytes buffered, all connections.
    pub total_up: usize,
    /// Room promised to reads in progress; `total_up + reserved` never
    /// exceeds the total buffer.
    pub reserved: usize,
    /// Readers waiting for room under the total cap.
    pub blocked_total: HashSet<ConnId>,
    next_conn: u64,
    next_link: LinkId,
}

impl State {
    pub fn new(limits: Limits, services: impl IntoIterator<Item = (String, bool)>) -> State {
        // A random high half: ids of an earlier gateway's connections,
        // still held by cells, do not collide with new ones.
        let base = getrandom::u32().unwrap_or(0x5eed);
        State {
            limits,
            services: services
                .into_iter()
                .map(|(name, resp)| {
                    let s = Service {
                        resp,
                        route: None,
                        held: false,
                        detached_since: None,
                        traffic: Default::default(),
                    };
                    (name, s)
                })
                .collect(),
            conns: HashMap::new(),
            links: HashMap::new(),
            total_up: 0,
            reserved: 0,
            blocked_total: HashSet::new(),
            next_conn: u64::from(base) << 32 | 1,
            next_link: 1,
        }
    }

    pub fn add_link(&mut self, h: LinkHandle) -> LinkId {
        let id = self.next_link;
        self.next_link += 1;
        self.links.insert(id, h);
        id
    }

    pub(super) fn send(&self, link: LinkId, m: &ToNode) {
        let Some(l) = self.links.get(&link) else {
            return;
        };
        if let Err(e) = l.out.push(|b| m.encode(b)) {
            tracing::error!("cannot encode {}: {e}", m.name());
        }
    }

    /// The link to forward a service's traffic to, if it is attached and
    /// not held.
    pub(super) fn attached(&self, service: &str) -> Option<LinkId> {
        let s = self.services.get(service)?;
        if s.held {
            return None;
        }
        s.route.as_ref()?.link
    }

    fn window(&self, link: LinkId) -> u64 {
        self.links.get(&link).map_or(0, |l| l.window)
    }

    /// A new client of `service`.
    pub fn new_conn(&mut self, service: &str, peer: String) -> (ConnId, Arc<ConnWake>) {
        let id = self.next_conn;
        self.next_conn = self.next_conn.wrapping_add(1);
        let wake = Arc::new(ConnWake::default());
        let c = Conn {
            service: service.to_string(),
            peer,
            wake: wake.clone(),
            waiting_since: Some(Instant::now()),
            opened: false,
            seen: false,
            up: VecDeque::new(),
            up_base: 0,
            up_sent: 0,
            up_eof: None,
            eof_sent: false,
            reserved: 0,
            down: VecDeque::new(),
            down_base: 0,
            acked: 0,
            down_shut: None,
            cell_closed: false,
            fail: None,
            rtt: None,
        };
        if let Some(s) = self.services.get_mut(service) {
            s.traffic.accepted += 1;
        }
        self.conns.insert(id, c);
        self.open_if_attached(id);
        (id, wake)
    }

    pub(super) fn open_if_attached(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.opened {
            return;
        }
        let Some(link) = self.attached(&c.service) else {
            return;
        };
        let m = ToNode::Open {
            service: c.service.clone(),
            conn: id,
            peer: c.peer.clone(),
        };
        self.send(link, &m);
        let c = self.conns.get_mut(&id).expect("checked above");
        c.opened = true;
        c.waiting_since = None;
        c.up_sent = c.up_base;
        c.eof_sent = false;
        self.pump(id);
    }

    /// Send what the window allows of a connection's client->cell bytes,
    /// then its end of stream.
    pub fn pump(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if !c.opened || c.cell_closed {
            return;
        }
        let Some(link) = self.attached(&c.service) else {
            return;
        };
        let limit = c.up_base.saturating_add(self.window(link)).min(c.up_end());
        let Some(out) = self.links.get(&link).map(|l| &l.out) else {
            return;
        };
        let mut at = c.up_sent;
        while at < limit {
            let n = ((limit - at) as usize).min(MAX_DATA);
            let skip = (at - c.up_base) as usize;
            // The bytes go from the buffer into the frame: no copy between.
            let (a, b) = c.up.as_slices();
            let (a, b) = if skip >= a.len() {
                (&b[skip - a.len()..skip - a.len() + n], &b[..0])
            } else {
                let from_a = n.min(a.len() - skip);
                (&a[skip..skip + from_a], &b[..n - from_a])
            };
            match out.push(|buf| ToNode::encode_data(buf, id, at, a, b)) {
                Ok(true) => at += n as u64,
                Ok(false) => break,
                Err(e) => {
                    tracing::error!("cannot encode Data: {e}");
                    break;
                }
            }
        }
        let eof = match c.up_eof {
            Some(e) if e == at && !c.eof_sent => Some(e),
            _ => None,
        };
        if let Some(offset) = eof {
            self.send(link, &ToNode::Eof { conn: id, offset });
        }
        let c = self.conns.get_mut(&id).expect("checked above");
        c.up_sent = at;
        c.eof_sent |= eof.is_some();
    }

    fn unreserve(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.reserved -= c.reserved;
            c.reserved = 0;
        }
    }

    /// Bytes from the client (at most what [`State::read_room`] promised).
    pub fn client_data(&mut self, id: ConnId, bytes: &[u8]) {
        self.unreserve(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.up.extend(bytes);
        self.total_up += bytes.len();
        if let Some(s) = self.services.get_mut(&c.service) {
            s.traffic.to_cell += bytes.len() as u64;
        }
        self.pump(id);
    }

    /// Room for the client's next read (0: wait), promised to it until
    /// its bytes arrive: concurrent reads cannot overshoot the total.
    pub fn read_room(&mut self, id: ConnId) -> usize {
        self.unreserve(id);
        let Some(c) = self.conns.get_mut(&id) else {
            return 0;
        };
        let own = self.limits.conn_buffer.saturating_sub(c.up.len());
        let total = self
            .limits
            .total_buffer
            .saturating_sub(self.total_up + self.reserved);
        if total == 0 {
            self.blocked_total.insert(id);
        }
        let room = own.min(total).min(MAX_DATA);
        c.reserved = room;
        self.reserved += room;
        room
    }

    /// The client shut its write side.
    pub fn client_eof(&mut self, id: ConnId) {
        self.unreserve(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.up_eof = Some(c.up_end());
            // Before the Eof: a cell that closes on it then has nothing
            // left unconfirmed, and its node can forget the connection.
            self.ack(id);
            self.pump(id);
        }
    }

    /// Forget a connection; tell its cell when the client went away.
    pub fn remove(&mut self, id: ConnId, tell_cell: bool) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.total_up -= c.up.len();
        self.reserved -= c.reserved;
        self.blocked_total.remove(&id);
        c.wake.read.notify_one();
        c.wake.write.notify_one();
        // Also after the cell closed: a node keeps a closed connection
        // until its output is confirmed, and `Gone` lets it forget it.
        if tell_cell && c.opened {
            if let Some(link) = self.attached(&c.service) {
                self.send(link, &ToNode::Gone { conn: id });
            }
        }
        self.release_total();
    }

    fn release_total(&mut self) {
        if self.total_up + self.reserved < self.limits.total_buffer {
            for id in self.blocked_total.drain() {
                if let Some(c) = self.conns.get(&id) {
                    c.wake.read.notify_one();
                }
            }
        }
    }

    /// `n` bytes of cell->client data were written to the client.
    pub fn written(&mut self, id: ConnId, n: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.down.drain(..n);
        c.down_base += n as u64;
        if let Some(s) = self.services.get_mut(&c.service) {
            s.traffic.to_client += n as u64;
        }
        let link = match self.route_link(&self.conns[&id].service) {
            Some(l) => l,
            None => return,
        };
        let every = ACK_EVERY.min(self.window(link) / 2);
        let c = &self.conns[&id];
        if c.down_base - c.acked >= every || c.down_shut.is_some() || c.cell_closed {
            self.ack(id);
        }
    }

    /// Send `Delivered` for what the client has been written, if the
    /// current cell has not been told yet.
    fn ack(&mut self, id: ConnId) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if !c.opened || c.down_base <= c.acked {
            return;
        }
        let Some(link) = self.route_link(&c.service) else {
            return;
        };
        let m = ToNode::Delivered {
            conn: id,
            offset: c.down_base,
        };
        self.send(link, &m);
        if let Some(c) = self.conns.get_mut(&id) {
            c.acked = c.down_base;
        }
    }

    /// Send every `Delivered` held back (the gateway's periodic tick): a
    /// connection that goes quiet does not leave its last replies in the
    /// cell's buffers, and snapshots, for longer than a tick.
    pub fn flush_acks(&mut self) {
        let due: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.opened && c.down_base > c.acked)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            self.ack(id);
        }
    }

    pub(super) fn route_link(&self, service: &str) -> Option<LinkId> {
        self.services.get(service)?.route.as_ref()?.link
    }

    /// The connection, if `link` is the one its service is routed to:
    /// frames about other connections are stale (from a node the service
    /// has left) and ignored.
    fn conn_from(&mut self, link: LinkId, id: ConnId) -> Option<&mut Conn> {
        let service = &self.conns.get(&id)?.service;
        if self.route_link(service) != Some(link) {
            tracing::debug!(
                conn = id,
                "ignoring a frame from a node the service has left"
            );
            return None;
        }
        self.conns.get_mut(&id)
    }

    /// Cell->client bytes from `link`.
    pub fn cell_data(
        &mut self,
        link: LinkId,
        id: ConnId,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Violation> {
        let window = self.window(link);
        let Some(c) = self.conn_from(link, id) else {
            return Ok(());
        };
        let have = c.down_end();
        let end = offset + bytes.len() as u64; // checked by the decoder
        if offset > have {
            return Err(Violation::Gap {
                conn: id,
                offset,
                have,
            });
        }
        let limit = c.down_base + window;
        if end > limit {
            return Err(Violation::OverWindow {
                conn: id,
                end,
                limit,
            });
        }
        if let Some(shut) = c.down_shut.filter(|s| end > *s) {
            return Err(Violation::AfterShutdown {
                conn: id,
                end,
                shut,
            });
        }
        c.seen = true;
        if end > have {
            c.down.extend(&bytes[(have - offset) as usize..]);
            c.wake.write.notify_one();
        }
        Ok(())
    }

    /// The program read client->cell bytes up to `offset`.
    pub fn consumed(&mut self, link: LinkId, id: ConnId, offset: u64) -> Result<(), Violation> {
        let Some(c) = self.conn_from(link, id) else {
            return Ok(());
        };
        if offset > c.up_sent.max(c.up_base) {
            return Err(Violation::OverConsumed {
                conn: id,
                offset,
                sent: c.up_sent,
            });
        }
        c.seen = true;
        if offset > c.up_base {
            let n = (offset - c.up_base) as usize;
            c.up.drain(..n);
            c.up_base = offset;
            c.wake.read.notify_one();
            self.total_up -= n;
            self.release_total();
            self.pump(id);
        }
        Ok(())
    }

    /// The program shut its write side at `offset`.
    pub fn cell_shutdown(
        &mut self,
        link: LinkId,
        id: ConnId,
        offset: u64,
    ) -> Result<(), Violation> {
        let Some(c) = self.conn_from(link, id) else {
            return Ok(());
        };
        if offset < c.down_end() {
            return Err(Violation::ShutdownBack {
                conn: id,
                offset,
                have: c.down_end(),
            });
        }
        c.seen = true;
        c.down_shut = Some(offset);
        c.wake.write.notify_one();
        // The stream ends: nothing more will trigger a lazy Delivered.
        self.ack(id);
        Ok(())
    }

    /// The program closed the connection.
    pub fn cell_closed(&mut self, link: LinkId, id: ConnId) {
        if let Some(c) = self.conn_from(link, id) {
            c.seen = true;
            c.cell_closed = true;
            c.wake.write.notify_one();
            c.wake.read.notify_one();
            self.ack(id);
        }
    }
}
