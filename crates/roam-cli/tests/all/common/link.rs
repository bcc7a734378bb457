//! A `roam-link` proxy between two nodes: the tests that cut, slow down or
//! corrupt a migration stream put it in front of the destination's
//! migration port and make the destination advertise it.

use std::net::SocketAddr;
use std::time::Duration;

use roam_link::{LinkConfig, LinkProxy};

use super::*;

/// A proxy on its own tokio runtime, between a source and a destination's
/// migration port; the destination advertises the proxy.
pub struct Link {
    rt: tokio::runtime::Runtime,
    proxy: Option<LinkProxy>,
}

impl Link {
    /// Start a proxy to `127.0.0.1:target`.
    pub fn start(target: u16, cfg: LinkConfig) -> Link {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let target: SocketAddr = format!("127.0.0.1:{target}").parse().unwrap();
        let proxy = rt
            .block_on(LinkProxy::start(
                "127.0.0.1:0".parse().unwrap(),
                target,
                cfg,
            ))
            .unwrap();
        Link {
            rt,
            proxy: Some(proxy),
        }
    }

    pub fn proxy(&self) -> &LinkProxy {
        self.proxy.as_ref().unwrap()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(p) = self.proxy.take() {
            self.rt.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(5), p.shutdown()).await;
            });
        }
    }
}

/// A source node on `from`, and a destination on `to` whose migration
/// port is reached through a [`Link`] configured by `cfg` (the destination
/// advertises the proxy).
pub fn linked_pair(from: Isa, to: Isa, cfg: LinkConfig) -> (Node, Node, Link) {
    let port = free_port();
    let link = Link::start(port, cfg);
    let a = Node::start(from);
    let b = Node::start_with(
        to,
        &[
            "--migrate-listen",
            &format!("127.0.0.1:{port}"),
            "--advertise-migrate",
            &link.proxy().local_addr().to_string(),
        ],
    );
    (a, b, link)
}
