//! Node links on the gateway's control port: TLS, the `Hello` handshake,
//! then every frame applied to the routing state. A node that breaks the
//! protocol gets `Refused` with the precise reason and its link is closed;
//! its services are held as for any lost link (a node that reconnects and
//! serves again resumes every connection).
//!
//! Both directions work in batches: every frame one read brought is
//! applied under one lock of the state, and the frames for the node are
//! written by [`LinkOut`], all that queued up in one write.

use roam_wire::error_chain as chain;
use std::sync::Arc;
use std::time::Duration;

use roam_auth::tokio_rustls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::authority::{Assignment, Verdict};
use super::outq::LinkOut;
use super::state::{LinkHandle, State, Violation};
use super::Shared;
use crate::proto::{
    FrameError, FrameReader, Hello, ToGateway, ToNode, MAX_DATA, MIN_PROTOCOL_VERSION,
    PING_VERSION, PROTOCOL_VERSION,
};

/// The link reader's buffer: many small frames per read, a whole `Data`
/// frame of [`MAX_DATA`] at least.
const READ_BUFFER: usize = 4 * MAX_DATA;

/// How long a node may take for TLS and its `Hello`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Serve one node connection to the end.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    sock: TcpStream,
    addr: String,
    tls: Option<TlsAcceptor>,
) {
    sock.set_nodelay(true).ok();
    // A second descriptor of the socket, for reading its round trip: it
    // lives as long as the sampler, whatever becomes of the stream.
    let rtt_fd = std::os::fd::AsFd::as_fd(&sock).try_clone_to_owned().ok();
    let (stream, cert): (Box<dyn Stream>, Option<Vec<u8>>) = match tls {
        None => (Box::new(sock), None),
        Some(acc) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acc.accept(sock)).await {
            Ok(Ok(t)) => {
                let cert = t
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .map(|c| c.to_vec());
                (Box::new(t), cert)
            }
            Ok(Err(e)) => {
                tracing::warn!(peer = %addr, "node TLS handshake refused: {e}; nodes need a node certificate of the cluster CA");
                return;
            }
            Err(_) => {
                tracing::warn!(peer = %addr, "node TLS handshake timed out");
                return;
            }
        },
    };
    let (rd, mut wr) = tokio::io::split(stream);
    let mut rd = FrameReader::new(rd, READ_BUFFER);
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.read()).await {
        Err(_) => Err(format!("no Hello within {HANDSHAKE_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("cannot read Hello: {}", chain(&e))),
        Ok(Ok((kind, p))) => match ToGateway::decode(kind, &p) {
            Ok(ToGateway::Hello(h)) => check_hello(&shared, &h, cert.as_deref()).map(|()| h),
            Ok(m) => Err(format!("the first message must be Hello, not {}", m.name())),
            Err(e) => Err(chain(&e)),
        },
    };
    let hello = match hello {
        Ok(h) => h,
        Err(reason) => {
            tracing::warn!(peer = %addr, "node refused: {reason}");
            refuse(&mut wr, reason).await;
            return;
        }
    };
    let window = hello.window.min(shared.window);
    let mut buf = Vec::new();
    let version = hello.version.min(PROTOCOL_VERSION);
    let welcome = ToNode::Welcome { version, window };
    if welcome.encode(&mut buf).is_err() || wr.write_all(&buf).await.is_err() {
        return;
    }
    let out = Arc::new(LinkOut::new(shared.lock().limits.link_queue));
    let link = shared.lock().add_link(LinkHandle {
        node: hello.node.clone(),
        version,
        window,
        out: out.clone(),
        rtt: None,
    });
    tracing::info!(node = %hello.node, peer = %addr, link, "node link up");
    let o = out.clone();
    let mut writer = WriterGuard {
        out: out.clone(),
        task: tokio::spawn(async move {
            let _ = o.write_to(&mut wr).await;
        }),
    };
    let end = tokio::select! {
        end = links_frames(&shared, link, &mut rd) => end,
        () = out.stuck.notified() => Err(format!(
            "the node has not read the last {} MiB the gateway sent it",
            shared.lock().limits.link_queue >> 20
        )),
        never = sample_rtt(&shared, link, rtt_fd) => match never {},
    };
    shared.lock().link_lost(link);
    match end {
        Ok(()) => tracing::warn!(node = %hello.node, "node link closed"),
        Err(reason) => {
            tracing::warn!(node = %hello.node, "node link refused: {reason}");
            let refused = ToNode::Refused {
                reason: clip(reason),
            };
            let _ = out.push(|b| refused.encode(b));
        }
    }
    out.close();
    // A node that does not read would keep the writer, and all it holds,
    // blocked for ever.
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, &mut writer.task).await;
}

/// Read the link's round trip into the state every
/// [`super::report::SAMPLE_EVERY`]; never ends. Without a descriptor
/// (none could be duplicated) the link has no estimate.
async fn sample_rtt(
    shared: &Shared,
    link: u64,
    fd: Option<std::os::fd::OwnedFd>,
) -> std::convert::Infallible {
    let Some(fd) = fd else {
        return std::future::pending().await;
    };
    loop {
        if let Some(rtt) = super::report::tcp_rtt(&fd) {
            if let Some(l) = shared.lock().links.get_mut(&link) {
                l.rtt = Some(rtt);
            }
        }
        tokio::time::sleep(super::report::SAMPLE_EVERY).await;
    }
}

/// Ends a link's writer with the link's task, also when the gateway stops
/// and drops that task mid-way: the writer holds the socket's write half,
/// and the node must see its link close.
struct WriterGuard {
    out: Arc<LinkOut>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.out.close();
        self.task.abort();
    }
}

fn check_hello(shared: &Shared, h: &Hello, cert: Option<&[u8]>) -> Result<(), String> {
    if h.version < MIN_PROTOCOL_VERSION {
        return Err(format!(
            "the node speaks gateway protocol version {}, this gateway {MIN_PROTOCOL_VERSION}..={PROTOCOL_VERSION}: upgrade roam on the node",
            h.version
        ));
    }
    match (&shared.identity, cert) {
        (Some(id), Some(cert)) => id.check_node(cert, &h.node).map_err(|e| {
            format!(
                "the node says it is `{}`, but its certificate does not: {}",
                h.node,
                chain(&e)
            )
        }),
        (Some(_), None) => Err("the node presented no certificate".into()),
        (None, _) => Ok(()),
    }
}

fn clip(mut s: String) -> String {
    if s.len() > crate::proto::MAX_REASON_LEN {
        let mut at = crate::proto::MAX_REASON_LEN;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s.retain(|c| !c.is_control());
    s
}

async fn refuse<W: AsyncWrite + Unpin>(wr: &mut W, reason: String) {
    let mut b = Vec::new();
    if (ToNode::Refused {
        reason: clip(reason),
    })
    .encode(&mut b)
    .is_ok()
    {
        let _ = wr.write_all(&b).await;
        let _ = wr.shutdown().await;
    }
}

/// Apply frames until the link ends: `Ok` when the node closed it, the
/// reason to refuse it otherwise. Every frame a read brought is applied
/// under one lock of the state, up to a `Serve` that the planner must
/// check (`authority.rs`): the lock is let go while it is asked, and the
/// frames after it wait, in order.
async fn links_frames<R: AsyncRead + Unpin>(
    shared: &Shared,
    link: u64,
    rd: &mut FrameReader<R>,
) -> Result<(), String> {
    loop {
        match rd.fill().await {
            Ok(()) => {}
            Err(FrameError::Closed) => return Ok(()),
            Err(e @ FrameError::Io(_)) => {
                tracing::debug!(link, "node link: {}", chain(&e));
                return Ok(());
            }
            Err(e) => return Err(chain(&e)),
        }
        while let Some(serve) = apply_buffered(shared, link, rd)? {
            checked_serve(shared, link, serve).await?;
        }
    }
}

/// Apply the buffered frames under one lock until they run out (`None`) or
/// a `Serve` needs the planner's word (returned, not applied).
fn apply_buffered<R: AsyncRead + Unpin>(
    shared: &Shared,
    link: u64,
    rd: &mut FrameReader<R>,
) -> Result<Option<PendingServe>, String> {
    let mut s = None;
    while let Some((kind, payload)) = rd.next_buffered().map_err(|e| chain(&e))? {
        let msg = ToGateway::decode(kind, payload).map_err(|e| chain(&e))?;
        let s = s.get_or_insert_with(|| shared.lock());
        if let (
            Some(_),
            ToGateway::Serve {
                service,
                cell,
                generation,
                ..
            },
        ) = (&shared.checker, &msg)
        {
            if let Some(asking) = s.needs_check(link, service, cell, *generation) {
                return Ok(Some(PendingServe { msg, asking }));
            }
        }
        apply(s, &shared.id, link, msg)?;
    }
    Ok(None)
}

/// A `Serve` waiting for the planner's word, and who sent it.
struct PendingServe {
    msg: ToGateway,
    asking: Assignment,
}

/// Ask the planner about `p`, then apply it or refuse it. `Err` (close the
/// link) when the planner cannot answer: the route stays, and the node
/// serves again when it has reconnected.
async fn checked_serve(shared: &Shared, link: u64, p: PendingServe) -> Result<(), String> {
    let checker = shared.checker.as_ref().expect("only with a checker");
    let ToGateway::Serve {
        service,
        cell,
        generation,
        ..
    } = &p.msg
    else {
        unreachable!("only Serve is checked")
    };
    match checker.check(service, &p.asking).await {
        Verdict::Accept => apply(&mut shared.lock(), &shared.id, link, p.msg),
        Verdict::Mismatch { reason, current } => {
            shared
                .lock()
                .refuse_serve(link, service, cell, *generation, current, &reason);
            Ok(())
        }
        Verdict::Unavailable(why) => {
            let reason = format!(
                "the gateway cannot check this node's Serve of service {service} (cell {cell}, \
                 generation {generation}) with the planner: {why}; the route does not change \
                 (fail closed), serve again once the planner answers"
            );
            tracing::warn!(node = %p.asking.node, "{reason}");
            Err(reason)
        }
    }
}

/// Apply one message from the node.
fn apply(s: &mut State, id: &str, link: u64, msg: ToGateway) -> Result<(), String> {
    let r: Result<(), Violation> = match msg {
        ToGateway::Hello(_) => return Err("a second Hello on an open link".into()),
        ToGateway::Serve {
            service,
            cell,
            generation,
            conns,
        } => {
            s.serve(link, &service, &cell, generation, &conns);
            Ok(())
        }
        ToGateway::Hold { service, cell, .. } => {
            s.hold(link, &service, &cell);
            Ok(())
        }
        ToGateway::Unserve {
            service,
            cell,
            generation,
        } => {
            s.unserve(link, &service, &cell, generation);
            Ok(())
        }
        ToGateway::Data {
            conn,
            offset,
            bytes,
        } => s.cell_data(link, conn, offset, &bytes),
        ToGateway::Consumed { conn, offset } => s.consumed(link, conn, offset),
        ToGateway::Shutdown { conn, offset } => s.cell_shutdown(link, conn, offset),
        ToGateway::Closed { conn } => {
            s.cell_closed(link, conn);
            Ok(())
        }
        ToGateway::Ping { nonce } => {
            if s.links.get(&link).is_some_and(|l| l.version < PING_VERSION) {
                return Err(format!(
                    "Ping on a link of protocol version < {PING_VERSION}"
                ));
            }
            s.send(
                link,
                &ToNode::Pong {
                    nonce,
                    gateway: id.to_string(),
                },
            );
            Ok(())
        }
    };
    r.map_err(|v| v.to_string())
}
