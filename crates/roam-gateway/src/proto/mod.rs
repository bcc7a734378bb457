//! The gateway protocol: one framed, versioned, multiplexed connection per
//! node, opened by the node to the gateway's control address.
//!
//! Why a protocol of its own rather than proxying each client connection:
//! a cell's connections are virtual (plain data in its OS state), so they
//! outlive the node they run on. The gateway keeps the clients' TCP
//! connections and numbers the bytes of every stream; the cell keeps the
//! matching offsets in its snapshot. After a move, the destination says
//! where each stream stands (`Serve` with resume points) and the gateway
//! resends from there. Nothing is reset, lost or duplicated.
//!
//! ```text
//!  node                                   gateway
//!   │ ── Hello{version, node, window} ──────► │   version and node name checked
//!   │ ◄───────────── Welcome{version, window} │   (or Refused{reason}, then close)
//!   │ ── Serve{service, cell, gen, conns} ──► │   route the service here
//!   │ ◄──────────── Open{service, conn, peer} │   a client connected
//!   │ ◄─────────── Data{conn, offset, bytes}  │   client -> cell, offset-numbered
//!   │ ── Consumed{conn, offset} ────────────► │   the program read that far: drop
//!   │ ── Data{conn, offset, bytes} ─────────► │   cell -> client
//!   │ ◄──────────────── Delivered{conn, off}  │   written to the client: window opens
//!   │ ◄──────────────────── Eof{conn, offset} │   the client shut its write side
//!   │ ── Shutdown / Closed{conn} ───────────► │   the program shut or closed it
//!   │ ◄─────────────────────────── Gone{conn} │   the client is gone
//!   │ ── Hold{service, cell, gen} ──────────► │   pausing to move: buffer, queue
//!   │ ── Unserve{service, cell, gen} ───────► │   the cell exited
//!   │ ── Ping{nonce} ───────────────────────► │   (protocol 3) the node times
//!   │ ◄────────────── Pong{nonce, gateway}    │   its path to the gateway
//! ```
//!
//! Every frame is a fixed 12-byte header and a payload (see [`frame`]);
//! every message is a fixed sequence of little-endian fields (see
//! [`ToGateway`], [`ToNode`]). Decoding is total: any byte string gives a
//! message or a precise [`DecodeError`], never a panic, and no allocation
//! is larger than the frame that carries it. `docs/gateway.md` has the
//! sequence diagrams of a move, a failed move and a gateway death.

mod codec;
pub mod frame;
mod reader;

pub use codec::{DecodeError, EncodeError};
pub use frame::{
    put_frame, put_frame_parts, read_frame, write_frame, FrameError, Header, FRAME_HEADER,
    MAX_FRAME,
};
pub use reader::FrameReader;

/// A connection's id, chosen by the gateway, unique across the gateway's
/// life (and, with a random high half, across its restarts).
pub type ConnId = u64;

/// The protocol version this build speaks. Version 2 adds [`ToNode::Stale`];
/// the gateway sends it only on links that speak 2. Version 3 adds
/// [`ToGateway::Ping`] and [`ToNode::Pong`]; a node sends `Ping` only on a
/// link that speaks 3.
pub const PROTOCOL_VERSION: u16 = 3;
/// The first version with [`ToNode::Stale`].
pub const STALE_VERSION: u16 = 2;
/// The first version with [`ToGateway::Ping`] and [`ToNode::Pong`].
pub const PING_VERSION: u16 = 3;
/// The oldest version this build accepts from a peer.
pub const MIN_PROTOCOL_VERSION: u16 = 1;

/// Largest payload of one `Data` message: 64 KiB. Larger writes are cut.
pub const MAX_DATA: usize = 64 << 10;
/// Most resume points in one `Serve` (each is 24 bytes on the wire).
pub const MAX_RESUME: usize = 16 << 10;
/// Longest peer address text in `Open`.
pub const MAX_PEER_LEN: usize = 256;
/// Longest reason in `Refused`.
pub const MAX_REASON_LEN: usize = 1024;
/// Smallest flow-control window either side may announce.
pub const MIN_WINDOW: u64 = 4 << 10;
/// Longest gateway id in `Pong`.
pub const MAX_GATEWAY_ID_LEN: usize = 64;
/// Largest flow-control window either side may announce.
pub const MAX_WINDOW: u64 = 64 << 20;

/// Where one connection stands in a cell that (re)starts serving: the
/// next client->cell byte it wants and its first undelivered cell->client
/// byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnResume {
    /// The connection.
    pub conn: ConnId,
    /// Next client->cell stream offset the cell wants.
    pub rx_next: u64,
    /// Stream offset of the first cell->client byte not yet confirmed
    /// delivered.
    pub tx_from: u64,
}

/// A node's first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Highest protocol version the node speaks.
    pub version: u16,
    /// The node's name (checked against its certificate under TLS).
    pub node: String,
    /// The node's flow-control window per connection and direction.
    pub window: u64,
}

/// Messages from a node to the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToGateway {
    /// Opens the session.
    Hello(Hello),
    /// This node now runs `service`'s cell. `generation` is the cell's
    /// migration count (`CellSpec.hops`); the gateway accepts a `Serve`
    /// whose generation is at least the current one. `conns` are the
    /// connections the cell already has.
    Serve {
        /// The service.
        service: String,
        /// The cell's id.
        cell: String,
        /// The cell's migration count.
        generation: u64,
        /// Where each connection the cell knows stands.
        conns: Vec<ConnResume>,
    },
    /// The cell is pausing to move: stop forwarding, buffer, queue new
    /// clients.
    Hold {
        /// The service.
        service: String,
        /// The cell's id.
        cell: String,
        /// The cell's migration count.
        generation: u64,
    },
    /// The cell exited: the service has no cell until the next `Serve`.
    Unserve {
        /// The service.
        service: String,
        /// The cell's id.
        cell: String,
        /// The cell's migration count.
        generation: u64,
    },
    /// Cell->client bytes at stream offset `offset`.
    Data {
        /// The connection.
        conn: ConnId,
        /// Stream offset of the first byte.
        offset: u64,
        /// At most [`MAX_DATA`] bytes.
        bytes: Vec<u8>,
    },
    /// The program has read client->cell bytes up to `offset`.
    Consumed {
        /// The connection.
        conn: ConnId,
        /// Stream offset.
        offset: u64,
    },
    /// The program shut its write side; its stream ends at `offset`.
    Shutdown {
        /// The connection.
        conn: ConnId,
        /// Stream offset of the end.
        offset: u64,
    },
    /// The program closed the connection.
    Closed {
        /// The connection.
        conn: ConnId,
    },
    /// Answer with `Pong { nonce }` at once (protocol 3): the node measures
    /// the round-trip time of its path to the gateway, the part of a
    /// client's request path that depends on where the cell runs.
    Ping {
        /// Chosen by the node; echoed.
        nonce: u64,
    },
}

/// Messages from the gateway to a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToNode {
    /// The session is open at `version` with `window`.
    Welcome {
        /// The version both sides speak from now on.
        version: u16,
        /// The window per connection and direction.
        window: u64,
    },
    /// The session is refused; the gateway closes it.
    Refused {
        /// Why, and what to do.
        reason: String,
    },
    /// The gateway ignored a `Serve` (or `Hold`) from this node: `service`
    /// runs at a later generation elsewhere. The node's copy of `cell` is
    /// not the one clients reach (protocol 2).
    Stale {
        /// The service.
        service: String,
        /// The cell the node served.
        cell: String,
        /// The generation it served at.
        generation: u64,
        /// The service's current generation.
        current: u64,
    },
    /// A client connected to `service`.
    Open {
        /// The service.
        service: String,
        /// The new connection.
        conn: ConnId,
        /// The client's address, as text.
        peer: String,
    },
    /// Client->cell bytes at stream offset `offset`.
    Data {
        /// The connection.
        conn: ConnId,
        /// Stream offset of the first byte.
        offset: u64,
        /// At most [`MAX_DATA`] bytes.
        bytes: Vec<u8>,
    },
    /// The client shut its write side; its stream ends at `offset`.
    Eof {
        /// The connection.
        conn: ConnId,
        /// Stream offset of the end.
        offset: u64,
    },
    /// The client is gone (reset, or closed both ways), or the connection
    /// is unknown to the gateway.
    Gone {
        /// The connection.
        conn: ConnId,
    },
    /// Cell->client bytes through `offset` reached the client.
    Delivered {
        /// The connection.
        conn: ConnId,
        /// Stream offset.
        offset: u64,
    },
    /// The answer to `Ping` (protocol 3).
    Pong {
        /// The ping's nonce.
        nonce: u64,
        /// Which gateway answers: an id drawn when the gateway process
        /// started. Nodes that reach the same gateway by different
        /// addresses (a proxy, a NAT, another interface) report the same
        /// id, so the planner knows they serve the same clients.
        gateway: String,
    },
}
