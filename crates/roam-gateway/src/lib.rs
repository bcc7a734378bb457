//! The gateway: clients connect to it, it keeps their TCP connections, and
//! routes each one to the node that runs the service's cell now.
//!
//! Why: a cell's connections are virtual (plain data in its OS state, see
//! `roam_wasi::net`), so they can move with the cell, but a client's TCP
//! connection cannot. The gateway is the fixed point between the two: it
//! numbers every byte in both directions, keeps what the program has not
//! consumed yet, and after a move resends from where the restored cell
//! stands. Clients see a pause, never a reset.
//!
//! - [`proto`]: the framed, versioned, multiplexed gateway–node protocol.
//! - [`server`]: the gateway itself (`roam gateway`).
//! - [`link`]: the node side, bridging the protocol to cells' `NetHub`s.
//!
//! `docs/gateway.md` has the diagrams, limits and failure rules.
#![deny(missing_docs)]

pub mod link;
pub mod proto;
pub mod server;

/// ALPN of the gateway's control port under TLS: a node cannot reach a
/// node's control API or migration port with it by mistake, nor the reverse.
pub const ALPN_GATEWAY: &[u8] = b"roam-gateway/1";
