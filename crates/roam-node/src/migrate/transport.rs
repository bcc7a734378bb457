//! Migration connections: where a socket becomes the two halves the
//! protocol code reads and writes.
//!
//! Why a module of its own: the source and the destination only speak
//! frames over an `AsyncRead`/`AsyncWrite` pair; whether that pair is a bare
//! TCP socket or a mutual-TLS session is decided here, at the connect and
//! accept points, so the protocol code does not change with the transport.
//!
//! With TLS, both sides present node certificates of the cluster CA. A peer
//! without one, with one of another CA, or speaking plain TCP fails the
//! handshake, before any protocol message is read or sent; so does a
//! destination whose certificate is not a node's (the connector checks its
//! role). An accepted peer whose certificate is not a node's (an
//! operator's, the planner's) is dropped before any message too. After the
//! `Hello` exchange, [`check_peer`] checks that the peer's certificate was
//! issued for the node name its `Hello` claims.

use roam_wire::Hello;
use tokio::net::TcpStream;

use super::{ReadHalf, WriteHalf};
use crate::client::Client;
use crate::secure::HANDSHAKE_TIMEOUT;
use crate::state::NodeInner;
use crate::types::NodeInfo;

/// An open migration connection.
pub(crate) struct Conn {
    pub rd: ReadHalf,
    pub wr: WriteHalf,
    /// The peer's certificate (DER) when the connection is TLS.
    pub peer_cert: Option<Vec<u8>>,
}

fn split<S>(s: S, peer_cert: Option<Vec<u8>>) -> Conn
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(s);
    Conn {
        rd: Box::new(rd),
        wr: Box::new(wr),
        peer_cert,
    }
}

fn plain(sock: TcpStream) -> Conn {
    let (rd, wr) = sock.into_split();
    Conn {
        rd: Box::new(rd),
        wr: Box::new(wr),
        peer_cert: None,
    }
}

/// Open a connection to the migration port `addr` of node `name`. With
/// TLS, the server's certificate must be a node certificate for `name`.
pub(crate) async fn connect(n: &NodeInner, addr: &str, name: &str) -> Result<Conn, String> {
    let sock = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connecting to {addr} timed out"))?
        .map_err(|e| format!("cannot connect to {addr} ({name}): {e}"))?;
    sock.set_nodelay(true).ok();
    let Some(connector) = &n.auth.connector else {
        return Ok(plain(sock));
    };
    let server_name = roam_auth::rustls::pki_types::ServerName::try_from(name.to_string())
        .map_err(|_| {
            format!("the destination's name `{name}` is not a DNS name, so its certificate cannot name it")
        })?;
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(server_name, sock))
        .await
        .map_err(|_| format!("TLS handshake with {addr} ({name}) timed out"))?
        .map_err(|e| {
            format!(
                "TLS handshake with {addr} ({name}) failed: {e}; both nodes need node \
                 certificates from the same cluster CA (`roam cert node`)"
            )
        })?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    Ok(split(tls, cert))
}

/// Take an accepted socket: with TLS, finish the handshake (the peer must
/// present a node certificate of the cluster CA) before anything else.
pub(crate) async fn accept(n: &NodeInner, sock: TcpStream) -> Result<Conn, String> {
    sock.set_nodelay(true).ok();
    let Some(acceptor) = &n.auth.migrate else {
        return Ok(plain(sock));
    };
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock))
        .await
        .map_err(|_| "TLS handshake timed out; refused before any message".to_string())?
        .map_err(|e| {
            format!(
                "TLS handshake refused before any message: {e}; a source needs a node \
                 certificate from this cluster's CA"
            )
        })?;
    let cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    let Some(der) = &cert else {
        return Err("the peer presented no certificate".into());
    };
    // Only nodes push cells: refuse any other role before reading a byte.
    roam_auth::role::admit(der, &[roam_auth::Role::Node])
        .map_err(|e| format!("refused before any message: {e}"))?;
    Ok(split(tls, cert))
}

/// Check that the node name a peer's `Hello` claims is the one its
/// certificate was issued for (a node certificate of the cluster: an
/// operator's client certificate is refused here). Without TLS there is
/// nothing to check.
pub(crate) fn check_peer(
    n: &NodeInner,
    cert: Option<&Vec<u8>>,
    hello_node: &str,
) -> Result<(), String> {
    match (cert, &n.auth.identity) {
        (Some(cert), Some(id)) => id.check_node(cert, hello_node).map_err(|e| {
            format!(
                "the peer says it is node `{hello_node}`, but its certificate does not: {e} ({})",
                std::error::Error::source(&e).map_or_else(String::new, |s| s.to_string())
            )
        }),
        (None, Some(_)) => Err("the peer presented no certificate".into()),
        _ => Ok(()),
    }
}

/// A node reached by [`reach`].
pub(crate) struct Reached {
    pub rd: ReadHalf,
    pub wr: WriteHalf,
    /// Its control API.
    pub api: Client,
    /// What its API says of it (name, migration address).
    pub info: NodeInfo,
    /// Its hello.
    pub peer: Hello,
}

/// Reach the node whose control API is at `api` the way a migration
/// source does: ask it for its migration address, connect, exchange
/// hellos and check that the certificate names the node that said hello.
/// `what` names the peer in errors ("destination", "memory server").
pub(crate) async fn reach(n: &NodeInner, api: &str, what: &str) -> Result<Reached, String> {
    let unreachable = |e: String| format!("cannot reach {what} {api}: {e}");
    let client = n.client(api).map_err(|e| unreachable(e.to_string()))?;
    let info = client
        .node()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let Conn {
        mut rd,
        mut wr,
        peer_cert,
    } = connect(n, &info.migrate_addr, &info.name).await?;
    let peer = super::dest::handshake(n, &mut rd, &mut wr).await?;
    check_peer(n, peer_cert.as_ref(), &peer.node)?;
    Ok(Reached {
        rd,
        wr,
        api: client,
        info,
        peer,
    })
}
