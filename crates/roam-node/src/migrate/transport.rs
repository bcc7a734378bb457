//! Migration connections: where a socket becomes the two halves the
//! protocol code reads and writes.
//!
//! Why a module of its own: the source and the destination only speak
//! frames over an `AsyncRead`/`AsyncWrite` pair; whether that pair is a bare
//! TCP socket or a TLS session is decided here, at the connect and accept
//! points, so the protocol code does not change with the transport.

use std::time::Duration;

use tokio::net::TcpStream;

use super::{ReadHalf, WriteHalf};
use crate::node::NodeInner;

/// An open migration connection.
pub(crate) struct Conn {
    pub rd: ReadHalf,
    pub wr: WriteHalf,
    /// The peer's certificate (DER) when the connection is TLS.
    pub peer_cert: Option<Vec<u8>>,
}

fn plain(sock: TcpStream) -> Conn {
    sock.set_nodelay(true).ok();
    let (rd, wr) = sock.into_split();
    Conn {
        rd: Box::new(rd),
        wr: Box::new(wr),
        peer_cert: None,
    }
}

/// Open a connection to the migration port `addr` of node `name`.
pub(crate) async fn connect(_n: &NodeInner, addr: &str, name: &str) -> Result<Conn, String> {
    let sock = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("cannot connect to {addr} ({name}): {e}"))?;
    Ok(plain(sock))
}

/// Take an accepted socket.
pub(crate) async fn accept(_n: &NodeInner, sock: TcpStream) -> Result<Conn, String> {
    Ok(plain(sock))
}

/// Check that the node name a peer's `Hello` claims is the one its
/// certificate was issued for. Without TLS there is nothing to check.
pub(crate) fn check_peer(
    _n: &NodeInner,
    _cert: Option<&Vec<u8>>,
    _hello_node: &str,
) -> Result<(), String> {
    Ok(())
}
