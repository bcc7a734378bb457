//! The program's side of a cell's sockets, for backends' tests.
//!
//! Why public: a backend (the gateway link, a standalone listener) must be
//! tested against the real hub and fd table with something playing the
//! program, and a wasm program is heavy for that. These calls follow the
//! rules of the WASI socket calls (`ops/sock.rs`) without blocking and
//! without guest memory, and keep the fd table consistent, so the context
//! still saves and restores. Not for production code: programs use the
//! WASI calls.

use super::{ConnId, Recv};
use crate::ctx::{FdEntry, Handle, WasiCtx};
use crate::errno::Errno;

/// Accept the oldest waiting connection on listener `index` (in the order
/// of `WasiConfig::listeners`), giving it an fd; `None` if none waits.
pub fn accept(ctx: &mut WasiCtx, index: u32) -> Result<Option<ConnId>, Errno> {
    let hub = ctx.net.clone().ok_or(Errno::BADF)?;
    let fd = ctx.check_fd_room()?;
    let Some(id) = hub.accept(index)? else {
        return Ok(None);
    };
    ctx.fds.insert(fd, FdEntry::socket(id));
    Ok(Some(id))
}

/// Read up to `max` bytes: `Ok(None)` when nothing is there yet,
/// `Ok(Some(empty))` at the end of the client's stream.
pub fn recv(ctx: &WasiCtx, conn: ConnId, max: usize) -> Result<Option<Vec<u8>>, Errno> {
    let hub = ctx.net.as_ref().ok_or(Errno::BADF)?;
    Ok(match hub.recv(conn, max, false)? {
        Recv::Data(d) => Some(d),
        Recv::Eof => Some(Vec::new()),
        Recv::WouldBlock => None,
    })
}

/// Queue what the window allows of `data`; how many bytes (0: full).
pub fn send(ctx: &WasiCtx, conn: ConnId, data: &[u8]) -> Result<usize, Errno> {
    let hub = ctx.net.as_ref().ok_or(Errno::BADF)?;
    Ok(hub.send(conn, data, false)?.unwrap_or(0))
}

/// Shut the write side.
pub fn shutdown_write(ctx: &WasiCtx, conn: ConnId) -> Result<(), Errno> {
    let hub = ctx.net.as_ref().ok_or(Errno::BADF)?;
    hub.shutdown(conn, false, true)
}

/// Close the connection's fd.
pub fn close(ctx: &mut WasiCtx, conn: ConnId) {
    ctx.fds
        .retain(|_, e| !matches!(e.handle, Handle::Socket(id) if id == conn));
    if let Some(hub) = &ctx.net {
        hub.close(conn);
    }
}
