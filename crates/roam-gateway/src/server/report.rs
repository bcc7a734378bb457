//! What the gateway sees of its clients and nodes, for `GET /metrics`
//! (`roam gateway --metrics`) and for tests: per service, its route, its
//! clients (where they connect from and the round trip to each) and the
//! bytes both ways; per node link, the round trip to the node.
//!
//! Why the kernel's round trip: the gateway relays bytes and never sees a
//! request, so it cannot time one. Every TCP socket already carries the
//! kernel's smoothed estimate (`TCP_INFO`'s `tcpi_rtt`), for free; the
//! gateway reads it for each client at most once a second while it writes
//! to that client, and for each node link once a second. A client that
//! has been sent nothing yet has no estimate.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::GatewayHandle;

/// How often a round trip is read again.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// A service's clients and bytes since the gateway started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Client connections accepted.
    pub accepted: u64,
    /// Bytes from clients, buffered for the cell.
    pub to_cell: u64,
    /// Bytes written to clients.
    pub to_client: u64,
}

/// One connected client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientReport {
    /// Its address, as accepted.
    pub peer: String,
    /// The kernel's smoothed round trip, once the gateway has written to it.
    pub rtt: Option<Duration>,
}

/// One service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceReport {
    /// Its name.
    pub name: String,
    /// The node serving it, while its link is up.
    pub node: Option<String>,
    /// Its clients and bytes.
    pub traffic: Traffic,
    /// The clients connected now.
    pub clients: Vec<ClientReport>,
}

/// One node link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkReport {
    /// The node's name.
    pub node: String,
    /// The kernel's smoothed round trip to it.
    pub rtt: Option<Duration>,
}

/// What the gateway sees now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Services by name.
    pub services: Vec<ServiceReport>,
    /// Node links.
    pub links: Vec<LinkReport>,
}

impl GatewayHandle {
    /// What the gateway sees now.
    pub fn report(&self) -> Report {
        let s = self.0.lock();
        let mut services: BTreeMap<&str, ServiceReport> = s
            .services
            .iter()
            .map(|(name, svc)| {
                let node = svc
                    .route
                    .as_ref()
                    .filter(|r| r.link.is_some())
                    .map(|r| r.node.clone());
                let r = ServiceReport {
                    name: name.clone(),
                    node,
                    traffic: svc.traffic,
                    clients: Vec::new(),
                };
                (name.as_str(), r)
            })
            .collect();
        for c in s.conns.values() {
            if let Some(r) = services.get_mut(c.service.as_str()) {
                r.clients.push(ClientReport {
                    peer: c.peer.clone(),
                    rtt: c.rtt,
                });
            }
        }
        let mut links: Vec<LinkReport> = s
            .links
            .values()
            .map(|l| LinkReport {
                node: l.node.clone(),
                rtt: l.rtt,
            })
            .collect();
        links.sort_by(|a, b| a.node.cmp(&b.node));
        let mut services: Vec<ServiceReport> = services.into_values().collect();
        for r in &mut services {
            r.clients.sort_by(|a, b| a.peer.cmp(&b.peer));
        }
        Report { services, links }
    }

    /// [`GatewayHandle::report`] in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        encode_report(&self.report())
    }
}

type Labels = Vec<(String, String)>;
type Seconds = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The host part of `peer` (`10.0.0.7:51234` → `10.0.0.7`): one series
/// per client machine, not per connection.
fn host(peer: &str) -> &str {
    match peer.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            h.trim_start_matches('[').trim_end_matches(']')
        }
        _ => peer,
    }
}

/// `report` as Prometheus text (built afresh: every value is read from the
/// gateway's state at the scrape).
pub fn encode_report(report: &Report) -> String {
    let mut registry = Registry::with_prefix("roam_gateway");
    let clients = Family::<Labels, Gauge>::default();
    registry.register(
        "clients",
        "Clients connected now, by service",
        clients.clone(),
    );
    let accepted = Family::<Labels, Counter>::default();
    registry.register(
        "clients_accepted",
        "Client connections accepted, by service",
        accepted.clone(),
    );
    let bytes = Family::<Labels, Counter>::default();
    registry.register_with_unit(
        "client",
        "Bytes relayed, by service and direction (to_cell, to_client)",
        Unit::Bytes,
        bytes.clone(),
    );
    let client_rtt = Family::<Labels, Seconds>::default();
    registry.register_with_unit(
        "client_rtt",
        "The kernel's smoothed round trip to each client machine (the shortest over its connections), by service",
        Unit::Seconds,
        client_rtt.clone(),
    );
    let routed = Family::<Labels, Gauge>::default();
    registry.register(
        "service_node",
        "1 for the node serving each service while its link is up",
        routed.clone(),
    );
    let node_rtt = Family::<Labels, Seconds>::default();
    registry.register_with_unit(
        "node_rtt",
        "The kernel's smoothed round trip to each linked node",
        Unit::Seconds,
        node_rtt.clone(),
    );
    for s in &report.services {
        let svc = vec![("service".to_string(), s.name.clone())];
        clients.get_or_create(&svc).set(s.clients.len() as i64);
        accepted.get_or_create(&svc).inc_by(s.traffic.accepted);
        for (dir, n) in [
            ("to_cell", s.traffic.to_cell),
            ("to_client", s.traffic.to_client),
        ] {
            let mut l = svc.clone();
            l.push(("direction".into(), dir.into()));
            bytes.get_or_create(&l).inc_by(n);
        }
        let mut by_host: BTreeMap<&str, Duration> = BTreeMap::new();
        for c in &s.clients {
            if let Some(rtt) = c.rtt {
                let e = by_host.entry(host(&c.peer)).or_insert(rtt);
                *e = (*e).min(rtt);
            }
        }
        for (h, rtt) in by_host {
            let mut l = svc.clone();
            l.push(("client".into(), h.to_string()));
            client_rtt.get_or_create(&l).set(rtt.as_secs_f64());
        }
        if let Some(node) = &s.node {
            let mut l = svc.clone();
            l.push(("node".into(), node.clone()));
            routed.get_or_create(&l).set(1);
        }
    }
    for link in &report.links {
        if let Some(rtt) = link.rtt {
            let l = vec![("node".to_string(), link.node.clone())];
            node_rtt.get_or_create(&l).set(rtt.as_secs_f64());
        }
    }
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

/// The kernel's smoothed round trip of TCP socket `sock`, if it has one.
pub(crate) fn tcp_rtt(sock: &impl AsRawFd) -> Option<Duration> {
    // SAFETY: `sock` is an open socket for the duration of the call
    // (borrowed), and the kernel writes at most `len` bytes into `info`,
    // a plain-old-data struct that any bytes make valid.
    let (r, info, len) = unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (r, info, len)
    };
    // `tcpi_rtt` lies well inside the first bytes every kernel fills.
    let filled = len as usize >= std::mem::offset_of!(libc::tcp_info, tcpi_rtt) + 4;
    (r == 0 && filled && info.tcpi_rtt > 0).then(|| Duration::from_micros(info.tcpi_rtt.into()))
}

/// Says a sample is due at most once per [`SAMPLE_EVERY`].
#[derive(Debug, Default)]
pub(crate) struct Every(Option<Instant>);

impl Every {
    /// Whether a sample is due now (and if so, the next one is not before
    /// [`SAMPLE_EVERY`]).
    pub(crate) fn due(&mut self) -> bool {
        let now = Instant::now();
        if self.0.is_some_and(|t| now.duration_since(t) < SAMPLE_EVERY) {
            return false;
        }
        self.0 = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_drop_the_port_only() {
        assert_eq!(host("10.0.0.7:51234"), "10.0.0.7");
        assert_eq!(host("[::1]:80"), "::1");
        assert_eq!(host("unix"), "unix");
    }

    #[test]
    fn the_text_has_every_family_and_the_shortest_round_trip_per_host() {
        let ms = Duration::from_millis;
        let r = Report {
            services: vec![ServiceReport {
                name: "kv".into(),
                node: Some("edge-1".into()),
                traffic: Traffic {
                    accepted: 3,
                    to_cell: 100,
                    to_client: 2048,
                },
                clients: vec![
                    ClientReport {
                        peer: "10.0.0.7:1000".into(),
                        rtt: Some(ms(12)),
                    },
                    ClientReport {
                        peer: "10.0.0.7:1001".into(),
                        rtt: Some(ms(9)),
                    },
                    ClientReport {
                        peer: "10.0.0.8:1000".into(),
                        rtt: None,
                    },
                ],
            }],
            links: vec![LinkReport {
                node: "edge-1".into(),
                rtt: Some(ms(3)),
            }],
        };
        let t = encode_report(&r);
        for line in [
            "roam_gateway_clients{service=\"kv\"} 3",
            "roam_gateway_clients_accepted_total{service=\"kv\"} 3",
            "roam_gateway_client_bytes_total{service=\"kv\",direction=\"to_cell\"} 100",
            "roam_gateway_client_bytes_total{service=\"kv\",direction=\"to_client\"} 2048",
            "roam_gateway_client_rtt_seconds{service=\"kv\",client=\"10.0.0.7\"} 0.009",
            "roam_gateway_service_node{service=\"kv\",node=\"edge-1\"} 1",
            "roam_gateway_node_rtt_seconds{node=\"edge-1\"} 0.003",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} not in\n{t}");
        }
        assert!(!t.contains("10.0.0.8"), "a client without an estimate: {t}");
    }

    #[tokio::test]
    async fn a_connected_socket_has_a_round_trip() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut s, b"x")
            .await
            .unwrap();
        let mut b = [0u8; 1];
        let mut c = c;
        tokio::io::AsyncReadExt::read_exact(&mut c, &mut b)
            .await
            .unwrap();
        let rtt = tcp_rtt(&s).expect("an estimate after a round trip");
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
        let mut every = Every::default();
        assert!(every.due());
        assert!(!every.due());
    }
}
