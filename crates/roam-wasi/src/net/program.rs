//! The program's side of a [`NetHub`], for backends' tests.
//!
//! Why public: a backend (the gateway link, a standalone listener) must be
//! tested against the real hub with something playing the program, and a
//! wasm program is heavy for that. These calls are the same rules the WASI
//! socket calls use (`ops/sock.rs`), without blocking and without guest
//! memory. Not for production code: programs use the WASI calls.

use super::{ConnId, NetHub, Recv};
use crate::errno::Errno;

/// Accept the oldest waiting connection on listener `index` (in the order
/// of `WasiConfig::listeners`), if any.
pub fn accept(hub: &NetHub, index: u32) -> Result<Option<ConnId>, Errno> {
    hub.accept(index)
}

/// Read up to `max` bytes: `Ok(None)` when nothing is there yet,
/// `Ok(Some(empty))` at the end of the client's stream.
pub fn recv(hub: &NetHub, conn: ConnId, max: usize) -> Result<Option<Vec<u8>>, Errno> {
    Ok(match hub.recv(conn, max, false)? {
        Recv::Data(d) => Some(d),
        Recv::Eof => Some(Vec::new()),
        Recv::WouldBlock => None,
    })
}

/// Queue what the window allows of `data`; how many bytes (0: full).
pub fn send(hub: &NetHub, conn: ConnId, data: &[u8]) -> Result<usize, Errno> {
    Ok(hub.send(conn, data, false)?.unwrap_or(0))
}

/// Shut the write side.
pub fn shutdown_write(hub: &NetHub, conn: ConnId) -> Result<(), Errno> {
    hub.shutdown(conn, false, true)
}

/// Close the connection's fd.
pub fn close(hub: &NetHub, conn: ConnId) {
    hub.close(conn)
}
