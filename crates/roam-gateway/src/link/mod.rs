//! The node side of the gateway protocol: one [`GatewayLink`] per node,
//! bridging the gateway's frames to the [`NetHub`]s of the cells it serves.
//!
//! Why a library and not node code: the rules that keep a client's bytes
//! intact across a move (which offsets to report in `Serve`, what to resend
//! after a reconnect, which frames go to which cell) belong with the
//! protocol, and the gateway's tests drive this same code.
//!
//! The link keeps its connection: it reconnects with backoff (100 ms
//! doubling to 5 s) and, after every (re)connect, sends `Serve` again for
//! every service it serves, with the resume points of the cell's hub, and
//! `Hold` again for a service that is held. A cell's connections live in
//! its hub, not in the link, so a lost link loses nothing: the gateway
//! holds the clients (for its wait timeout), the cell keeps their state.
//!
//! ```text
//!   cell (guest thread)        GatewayLink task               gateway
//!   NetHub ── notify ─────────► take_outgoing ── Data ──────────► client
//!   NetHub ◄─ deliver/open ──── frame router ◄── Open/Data/Eof ── client
//! ```

mod rtt;
mod session;

pub use rtt::{Rtt, PING_EVERY};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use roam_auth::ClientTls;
use roam_wasi::net::NetHub;
use roam_wire::ident::{self, InvalidIdent};
use tokio::sync::{watch, Notify};

use crate::proto::{ConnId, ToGateway};

/// Why a link call was refused.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// A name fails its check.
    #[error("invalid name for the gateway link")]
    Ident(#[from] InvalidIdent),
    /// The gateway address has no `host:port` form.
    #[error("gateway address {0:?} is not host:port (e.g. 127.0.0.1:7800 or gw.lan:7800)")]
    Address(String),
    /// The TLS configuration could not be built.
    #[error("cannot build the TLS configuration for the gateway link")]
    Tls(#[from] roam_auth::rustls::Error),
    /// `hold` or `unserve` for a service this link does not serve with
    /// that cell.
    #[error("service {service} is not served by cell {cell} on this node; call serve first")]
    NotServed {
        /// The service.
        service: String,
        /// The cell.
        cell: String,
    },
    /// Called outside a tokio runtime.
    #[error("GatewayLink::connect must be called inside a tokio runtime")]
    NoRuntime,
}

/// A service this node serves.
struct Served {
    cell: String,
    generation: u64,
    hub: Arc<NetHub>,
    held: bool,
}

/// What the session task and the API share.
#[derive(Default)]
pub(crate) struct Shared {
    services: HashMap<String, Served>,
    /// Connection -> the service it belongs to.
    conns: HashMap<ConnId, String>,
    /// Control messages not yet written, in order.
    control: Vec<ToGateway>,
    /// Pings in flight and the round trips measured.
    pings: rtt::Pings,
    /// The id the gateway gave in its last `Pong`.
    gateway_id: Option<String>,
    /// Client->cell traffic per service, since the link started.
    traffic: HashMap<String, Traffic>,
}

impl Shared {
    /// The service `conn` belongs to, and how it is served here.
    fn route(&self, conn: ConnId) -> Option<(&String, &Served)> {
        let svc = self.conns.get(&conn)?;
        Some((svc, self.services.get(svc)?))
    }

    /// `service` is no longer served here: its hub stops waking the link,
    /// and its connections and traffic are forgotten.
    fn forget(&mut self, service: &str) {
        if let Some(gone) = self.services.remove(service) {
            gone.hub.set_notify(Arc::new(|| {}));
        }
        self.conns.retain(|_, svc| svc != service);
        self.traffic.remove(service);
    }
}

/// Client->cell traffic of one service through this link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// `Data` frames the gateway forwarded.
    pub frames: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One service this node serves, as the link sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedService {
    /// The service.
    pub service: String,
    /// The cell serving it here.
    pub cell: String,
    /// Client connections the link knows for it.
    pub conns: usize,
    /// Its traffic so far.
    pub traffic: Traffic,
}

pub(crate) struct Inner {
    pub(crate) addr: String,
    pub(crate) host: String,
    pub(crate) node: String,
    pub(crate) tls: Option<Arc<roam_auth::rustls::ClientConfig>>,
    pub(crate) shared: Mutex<Shared>,
    /// Something to write: a hub has output, or a control message waits.
    pub(crate) wake: Notify,
    pub(crate) connected: watch::Sender<bool>,
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A node's connection to the gateway. Cheap to clone; the background task
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct GatewayLink {
    inner: Arc<Inner>,
    _guard: Arc<StopGuard>,
}

struct StopGuard(watch::Sender<bool>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

impl std::fmt::Debug for GatewayLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayLink")
            .field("addr", &self.inner.addr)
            .field("node", &self.inner.node)
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl GatewayLink {
    /// Start a link from node `node` to the gateway's control address
    /// `addr` (`host:port`), with mutual TLS when `tls` is given (the
    /// node's certificate; the gateway's is checked against the CA for
    /// `host`, and must carry the `gateway` role). Returns at once; the link connects in the background and
    /// keeps reconnecting. Must be called inside a tokio runtime.
    pub fn connect(
        addr: &str,
        tls: Option<&ClientTls>,
        node: &str,
    ) -> Result<GatewayLink, LinkError> {
        ident::check_node_name(node)?;
        let host = match addr.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                h.trim_start_matches('[').trim_end_matches(']').to_string()
            }
            _ => return Err(LinkError::Address(addr.to_string())),
        };
        let tls = tls
            .map(|t| t.config_for(crate::ALPN_GATEWAY, roam_auth::Role::Gateway))
            .transpose()?;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| LinkError::NoRuntime)?;
        let (stop, stop_rx) = watch::channel(false);
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            host,
            node: node.to_string(),
            tls,
            shared: Mutex::new(Shared::default()),
            wake: Notify::new(),
            connected: watch::channel(false).0,
        });
        rt.spawn(session::run(inner.clone(), stop_rx));
        Ok(GatewayLink {
            inner,
            _guard: Arc::new(StopGuard(stop)),
        })
    }

    /// Whether a session with the gateway is open now.
    pub fn is_connected(&self) -> bool {
        *self.inner.connected.borrow()
    }

    /// The gateway's control address, as given to [`connect`](Self::connect).
    pub fn address(&self) -> &str {
        &self.inner.addr
    }

    /// The round-trip time of the path to the gateway, once measured (a
    /// gateway of protocol 3 or later; see [`Rtt`]).
    pub fn rtt(&self) -> Option<Rtt> {
        self.inner.lock().pings.rtt(std::time::Instant::now())
    }

    /// The id the gateway answers pings with (see `ToNode::Pong`), once it
    /// has answered one.
    pub fn gateway_id(&self) -> Option<String> {
        self.inner.lock().gateway_id.clone()
    }

    /// Every service served here, with its connections and traffic.
    pub fn served(&self) -> Vec<ServedService> {
        let s = self.inner.lock();
        let mut v: Vec<ServedService> = s
            .services
            .iter()
            .map(|(service, x)| ServedService {
                service: service.clone(),
                cell: x.cell.clone(),
                conns: s.conns.values().filter(|c| *c == service).count(),
                traffic: s.traffic.get(service).copied().unwrap_or_default(),
            })
            .collect();
        v.sort_by(|a, b| a.service.cmp(&b.service));
        v
    }

    /// Wait until a session is open, at most `timeout`; whether it is.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.inner.connected.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// This node now runs `service`'s cell `cell` at `generation` (its
    /// `CellSpec.hops`), with `hub`: after a launch, when a migrated-in
    /// cell starts running (the restored hub), or again with the same
    /// generation when a migration failed and the source resumes. Sends
    /// `Serve` with the hub's resume points for this service, and
    /// re-sends the hub's undelivered output.
    pub fn serve(
        &self,
        service: &str,
        cell: &str,
        generation: u64,
        hub: Arc<NetHub>,
    ) -> Result<(), LinkError> {
        ident::check_service_name(service)?;
        ident::check_cell_id(cell)?;
        if hub.window() > roam_wasi::net::DEFAULT_WINDOW {
            tracing::warn!(
                service,
                cell,
                window = hub.window(),
                "the cell's window is larger than the link announces; the gateway refuses output beyond its window"
            );
        }
        // Weak: the hub must not keep the link alive (the link holds the hub).
        let wake = Arc::downgrade(&self.inner);
        hub.set_notify(Arc::new(move || {
            if let Some(i) = wake.upgrade() {
                i.wake.notify_one();
            }
        }));
        {
            let mut s = self.inner.lock();
            let serve = serve_msg(service, cell, generation, &hub);
            s.conns.retain(|_, svc| svc != service);
            if let ToGateway::Serve { conns, .. } = &serve {
                for c in conns {
                    s.conns.insert(c.conn, service.to_string());
                }
            }
            if s.services.get(service).is_none_or(|v| v.cell != cell) {
                // Another cell: its traffic counts from now.
                s.traffic.remove(service);
            }
            s.services.insert(
                service.to_string(),
                Served {
                    cell: cell.to_string(),
                    generation,
                    hub,
                    held: false,
                },
            );
            s.control.push(serve);
        }
        tracing::info!(service, cell, generation, "gateway link: serving");
        self.inner.wake.notify_one();
        Ok(())
    }

    /// The cell is pausing to move: the gateway stops forwarding to this
    /// node, buffers both ways and queues new clients until a `Serve`.
    pub fn hold(&self, service: &str, cell: &str, generation: u64) -> Result<(), LinkError> {
        self.control(service, cell, |s| {
            s.held = true;
            ToGateway::Hold {
                service: service.to_string(),
                cell: cell.to_string(),
                generation,
            }
        })
    }

    /// The cell exited (or left this node for good): the gateway routes no
    /// more clients here. A gateway ignores it when the service has
    /// meanwhile been served at a higher generation elsewhere.
    pub fn unserve(&self, service: &str, cell: &str, generation: u64) -> Result<(), LinkError> {
        self.control(service, cell, |_| ToGateway::Unserve {
            service: service.to_string(),
            cell: cell.to_string(),
            generation,
        })?;
        self.inner.lock().forget(service);
        Ok(())
    }

    /// The cell left this node for good by moving: forget `service`'s hub
    /// here without a message. The destination's `Serve` of a higher
    /// generation moves the clients; an `Unserve` from here, on another
    /// connection, could reach the gateway first and end them. Nothing
    /// happens unless `cell` serves `service` here.
    pub fn release(&self, service: &str, cell: &str) {
        let mut s = self.inner.lock();
        if s.services.get(service).is_some_and(|v| v.cell == cell) {
            s.forget(service);
            tracing::info!(
                service,
                cell,
                "gateway link: released (the cell moved away)"
            );
        }
    }

    fn control(
        &self,
        service: &str,
        cell: &str,
        f: impl FnOnce(&mut Served) -> ToGateway,
    ) -> Result<(), LinkError> {
        ident::check_service_name(service)?;
        ident::check_cell_id(cell)?;
        {
            let mut s = self.inner.lock();
            let served = s
                .services
                .get_mut(service)
                .filter(|v| v.cell == cell)
                .ok_or_else(|| LinkError::NotServed {
                    service: service.to_string(),
                    cell: cell.to_string(),
                })?;
            let m = f(served);
            tracing::info!(service, cell, msg = m.name(), "gateway link");
            s.control.push(m);
        }
        self.inner.wake.notify_one();
        Ok(())
    }
}

/// `Serve` for `service` with the hub's resume points for its listener.
/// `resume_points` also marks undelivered output as unsent, so it goes out
/// again (the gateway drops what it already has).
fn serve_msg(service: &str, cell: &str, generation: u64, hub: &NetHub) -> ToGateway {
    let mut conns: Vec<_> = hub
        .resume_points()
        .into_iter()
        .filter(|r| r.listener == service)
        .map(|r| crate::proto::ConnResume {
            conn: r.conn,
            rx_next: r.rx_next,
            tx_from: r.tx_from,
        })
        .collect();
    if conns.len() > crate::proto::MAX_RESUME {
        tracing::warn!(
            service,
            conns = conns.len(),
            "more connections than one Serve may list; the rest are reported gone by the gateway"
        );
        conns.truncate(crate::proto::MAX_RESUME);
    }
    ToGateway::Serve {
        service: service.to_string(),
        cell: cell.to_string(),
        generation,
        conns,
    }
}
