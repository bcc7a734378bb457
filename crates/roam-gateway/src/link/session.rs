//! One link session after another: connect, handshake, re-announce every
//! service, then route frames both ways until the connection fails.

use roam_wire::error_chain as chain;
use std::sync::Arc;
use std::time::Duration;

use roam_wasi::net::{NetError, NetHub, NetOut, DEFAULT_WINDOW};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{serve_msg, Inner, PING_EVERY};
use crate::proto::{
    write_frame, FrameReader, Hello, ToGateway, ToNode, MAX_DATA, MIN_PROTOCOL_VERSION,
    PING_VERSION, PROTOCOL_VERSION,
};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long connecting and the handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("cannot connect to the gateway at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with the gateway at {addr} failed: {detail}; the gateway needs a node-style certificate of the cluster CA naming {host} (`roam cert node`)")]
    Tls {
        addr: String,
        host: String,
        detail: String,
    },
    #[error("the gateway did not answer the handshake within {0:?}")]
    Timeout(Duration),
    #[error("the gateway refused this node: {0}")]
    Refused(String),
    #[error("the gateway answered the handshake with {0} instead of Welcome or Refused")]
    Unexpected(&'static str),
    #[error("the gateway chose protocol version {0}, which this node does not speak ({MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION})")]
    Version(u16),
    #[error("gateway link frame error")]
    Frame(#[from] crate::proto::FrameError),
    #[error("the gateway sent a malformed message")]
    Decode(#[from] crate::proto::DecodeError),
    #[error("gateway link write failed")]
    Write(#[source] std::io::Error),
    #[error("cannot encode a message for the gateway")]
    Encode(#[from] crate::proto::EncodeError),
}

/// The link's background task.
pub(crate) async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        if *stop.borrow() {
            return;
        }
        let mut welcomed = false;
        let r = tokio::select! {
            r = session(&inner, &mut welcomed) => r,
            _ = stop.changed() => return,
        };
        inner.connected.send_replace(false);
        if welcomed {
            backoff = MIN_BACKOFF;
        }
        if let Err(e) = r {
            tracing::warn!(gateway = %inner.addr, "gateway link down: {}; retrying in {backoff:?}", chain(&e));
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn open(inner: &Inner) -> Result<Box<dyn Stream>, SessionError> {
    let tcp = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(&inner.addr))
        .await
        .map_err(|_| SessionError::Timeout(HANDSHAKE_TIMEOUT))?
        .map_err(|source| SessionError::Connect {
            addr: inner.addr.clone(),
            source,
        })?;
    tcp.set_nodelay(true).ok();
    let Some(cfg) = &inner.tls else {
        return Ok(Box::new(tcp));
    };
    let tls_err = |detail: String| SessionError::Tls {
        addr: inner.addr.clone(),
        host: inner.host.clone(),
        detail,
    };
    let name =
        roam_auth::rustls::pki_types::ServerName::try_from(inner.host.clone()).map_err(|e| {
            tls_err(format!(
                "{:?} is not a DNS name or IP address: {e}",
                inner.host
            ))
        })?;
    let connector = roam_auth::tokio_rustls::TlsConnector::from(cfg.clone());
    let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
        .await
        .map_err(|_| SessionError::Timeout(HANDSHAKE_TIMEOUT))?
        .map_err(|e| tls_err(e.to_string()))?;
    Ok(Box::new(tls))
}

async fn session(inner: &Arc<Inner>, welcomed: &mut bool) -> Result<(), SessionError> {
    let stream = open(inner).await?;
    let (rd, mut wr) = tokio::io::split(stream);
    // Many frames per read; payloads are decoded in place.
    let mut rd = FrameReader::new(rd, 4 * MAX_DATA);
    let mut buf = Vec::new();
    ToGateway::Hello(Hello {
        version: PROTOCOL_VERSION,
        node: inner.node.clone(),
        window: DEFAULT_WINDOW,
    })
    .encode(&mut buf)?;
    write_frame(&mut wr, &buf)
        .await
        .map_err(SessionError::Write)?;
    let (kind, payload) = tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.read())
        .await
        .map_err(|_| SessionError::Timeout(HANDSHAKE_TIMEOUT))??;
    let version = match ToNode::decode(kind, &payload)? {
        ToNode::Welcome { version, .. }
            if (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) =>
        {
            version
        }
        ToNode::Welcome { version, .. } => return Err(SessionError::Version(version)),
        ToNode::Refused { reason } => return Err(SessionError::Refused(reason)),
        other => return Err(SessionError::Unexpected(other.name())),
    };
    *welcomed = true;
    announce(inner);
    inner.connected.send_replace(true);
    tracing::info!(gateway = %inner.addr, version, "gateway link up");
    tokio::select! {
        r = reader(inner, &mut rd) => r,
        r = writer(inner, &mut wr) => r,
        () = pinger(inner, version) => Ok(()),
    }
}

/// Ping the gateway every [`PING_EVERY`], on a link that speaks
/// [`PING_VERSION`]; never returns (on an older link it just waits).
async fn pinger(inner: &Inner, version: u16) {
    if version < PING_VERSION {
        return std::future::pending().await;
    }
    let mut every = tokio::time::interval(PING_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        let mut s = inner.lock();
        if let Some(nonce) = s.pings.ping(std::time::Instant::now()) {
            s.control.push(ToGateway::Ping { nonce });
            drop(s);
            inner.wake.notify_one();
        }
    }
}

/// After a (re)connect: forget what was queued for the old session and
/// announce every service again, with fresh resume points.
fn announce(inner: &Inner) {
    let mut s = inner.lock();
    s.control.clear();
    s.conns.clear();
    s.pings.reset();
    s.gateway_id = None;
    let mut msgs = Vec::new();
    let mut conns = Vec::new();
    for (service, v) in &s.services {
        let serve = serve_msg(service, &v.cell, v.generation, &v.hub);
        if let ToGateway::Serve { conns: cs, .. } = &serve {
            conns.extend(cs.iter().map(|c| (c.conn, service.clone())));
        }
        msgs.push(serve);
        if v.held {
            msgs.push(ToGateway::Hold {
                service: service.clone(),
                cell: v.cell.clone(),
                generation: v.generation,
            });
        }
    }
    s.control = msgs;
    s.conns.extend(conns);
    drop(s);
    inner.wake.notify_one();
}

/// The hub of `conn`'s service, if the connection is known here.
fn hub_of(inner: &Inner, conn: u64) -> Option<Arc<NetHub>> {
    inner.lock().route(conn).map(|(_, v)| v.hub.clone())
}

/// [`hub_of`], counting `bytes` of client data to the connection's service
/// under the same lock.
fn hub_for_data(inner: &Inner, conn: u64, bytes: usize) -> Option<Arc<NetHub>> {
    let mut s = inner.lock();
    let (svc, hub) = s.route(conn).map(|(svc, v)| (svc.clone(), v.hub.clone()))?;
    let t = s.traffic.entry(svc).or_default();
    t.frames += 1;
    t.bytes += bytes as u64;
    Some(hub)
}

/// Forget `conn` once its hub has (a closed connection whose output the
/// gateway has now confirmed).
fn forget_if_gone(inner: &Inner, hub: &NetHub, conn: u64) {
    if !hub.has_conn(conn) {
        inner.lock().conns.remove(&conn);
    }
}

/// Tell the gateway this node has no such connection (any more).
fn refuse(inner: &Inner, conn: u64, why: &str) {
    tracing::debug!(conn, "gateway link: closing connection: {why}");
    inner.lock().control.push(ToGateway::Closed { conn });
    inner.wake.notify_one();
}

fn hub_result(inner: &Inner, conn: u64, what: &str, r: Result<(), NetError>) {
    match r {
        Ok(()) => {}
        Err(e @ NetError::UnknownConn(_)) => refuse(inner, conn, &e.to_string()),
        Err(e) => tracing::warn!(conn, "gateway link: {what} refused by the cell: {e}"),
    }
}

async fn reader<R: AsyncRead + Unpin>(
    inner: &Inner,
    rd: &mut FrameReader<R>,
) -> Result<(), SessionError> {
    loop {
        let Some((kind, payload)) = rd.next_buffered()? else {
            rd.fill().await?;
            continue;
        };
        match ToNode::decode(kind, payload)? {
            ToNode::Open {
                service,
                conn,
                peer,
            } => {
                let hub = inner.lock().services.get(&service).map(|v| v.hub.clone());
                let Some(hub) = hub else {
                    refuse(inner, conn, "the service is not served here");
                    continue;
                };
                match hub.open(&service, conn, &peer) {
                    Ok(()) | Err(NetError::DuplicateConn(_)) => {
                        inner.lock().conns.insert(conn, service);
                    }
                    Err(e) => {
                        tracing::warn!(
                            conn,
                            service,
                            "gateway link: the cell refused a client: {e}"
                        );
                        refuse(inner, conn, "refused by the cell");
                    }
                }
            }
            ToNode::Data {
                conn,
                offset,
                bytes,
            } => match hub_for_data(inner, conn, bytes.len()) {
                Some(h) => hub_result(inner, conn, "data", h.deliver(conn, offset, &bytes)),
                None => refuse(inner, conn, "unknown connection"),
            },
            ToNode::Eof { conn, offset } => match hub_of(inner, conn) {
                Some(h) => hub_result(inner, conn, "end of stream", h.peer_eof(conn, offset)),
                None => refuse(inner, conn, "unknown connection"),
            },
            ToNode::Gone { conn } => {
                if let Some(h) = hub_of(inner, conn) {
                    h.peer_reset(conn);
                    forget_if_gone(inner, &h, conn);
                }
            }
            ToNode::Delivered { conn, offset } => {
                if let Some(h) = hub_of(inner, conn) {
                    hub_result(inner, conn, "delivery", h.delivered(conn, offset));
                    forget_if_gone(inner, &h, conn);
                }
            }
            ToNode::Stale {
                service,
                cell,
                generation,
                current,
            } => {
                tracing::error!(
                    gateway = %inner.addr, service, cell, generation, current,
                    "the gateway refused this node's Serve: it routes the service to a later \
                     copy of the cell elsewhere, or (a gateway with --planner) the planner does \
                     not name this node as the cell's owner at this generation; this node's copy \
                     gets no clients (see the gateway's log for which)"
                );
            }
            ToNode::Pong { nonce, gateway } => {
                let mut s = inner.lock();
                if let Some(rtt) = s.pings.pong(nonce, std::time::Instant::now()) {
                    tracing::trace!(gateway = %inner.addr, ?rtt, "gateway round trip");
                    if s.gateway_id.as_deref() != Some(gateway.as_str()) {
                        s.gateway_id = Some(gateway);
                    }
                }
            }
            ToNode::Refused { reason } => return Err(SessionError::Refused(reason)),
            m @ ToNode::Welcome { .. } => return Err(SessionError::Unexpected(m.name())),
        }
    }
}

async fn writer<W: AsyncWrite + Unpin>(inner: &Inner, wr: &mut W) -> Result<(), SessionError> {
    let mut buf = Vec::with_capacity(MAX_DATA * 2);
    loop {
        buf.clear();
        // Control messages and the hubs to drain, taken together: a Serve
        // always goes out before the first output of its hub.
        let (control, hubs) = {
            let mut s = inner.lock();
            let control = std::mem::take(&mut s.control);
            let mut hubs: Vec<Arc<NetHub>> = Vec::new();
            for v in s.services.values() {
                if !hubs.iter().any(|h| Arc::ptr_eq(h, &v.hub)) {
                    hubs.push(v.hub.clone());
                }
            }
            (control, hubs)
        };
        for m in &control {
            m.encode(&mut buf)?;
        }
        let mut closed = Vec::new();
        for h in &hubs {
            for out in h.take_outgoing() {
                encode_out(out, &mut buf, &mut closed)?;
            }
        }
        if !closed.is_empty() {
            // A closed connection whose last output is not confirmed yet
            // stays known until it is: the gateway's `Delivered` (or
            // `Gone`) for it lets the hub forget it.
            let mut s = inner.lock();
            for c in closed {
                let known = s
                    .conns
                    .get(&c)
                    .and_then(|svc| s.services.get(svc))
                    .is_some_and(|v| v.hub.has_conn(c));
                if !known {
                    s.conns.remove(&c);
                }
            }
        }
        if buf.is_empty() {
            inner.wake.notified().await;
            continue;
        }
        write_frame(wr, &buf).await.map_err(SessionError::Write)?;
    }
}

fn encode_out(out: NetOut, buf: &mut Vec<u8>, closed: &mut Vec<u64>) -> Result<(), SessionError> {
    match out {
        NetOut::Data {
            conn,
            offset,
            bytes,
        } => {
            let mut at = offset;
            for chunk in bytes.chunks(MAX_DATA) {
                ToGateway::Data {
                    conn,
                    offset: at,
                    bytes: chunk.to_vec(),
                }
                .encode(buf)?;
                at += chunk.len() as u64;
            }
        }
        NetOut::Consumed { conn, offset } => ToGateway::Consumed { conn, offset }.encode(buf)?,
        NetOut::Shutdown { conn, offset } => ToGateway::Shutdown { conn, offset }.encode(buf)?,
        NetOut::Closed { conn } => {
            closed.push(conn);
            ToGateway::Closed { conn }.encode(buf)?
        }
    }
    Ok(())
}
