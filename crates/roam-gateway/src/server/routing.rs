//! What the nodes say about where a service runs: `Serve` (with the
//! replay from each connection's resume point), `Hold`, `Unserve`, a lost
//! link, and the wait timeout. The per-connection byte rules are in
//! `state.rs`.

use std::collections::HashSet;
use std::time::Instant;

use super::authority::Assignment;
use super::state::{LinkId, Route, State};
use crate::proto::{ConnId, ConnResume, ToNode, STALE_VERSION};

impl State {
    /// Whether a `Serve` from `link` needs the authority's word: only one
    /// that would change the service's route. Not a service of this
    /// gateway, a stale generation (both refused by [`State::serve`]
    /// itself), or the route the service already has (the same node, cell
    /// and generation, checked when it was first accepted: a link that
    /// came back) do not. `Some` holds who is asking.
    pub(crate) fn needs_check(
        &self,
        link: LinkId,
        service: &str,
        cell: &str,
        generation: u64,
    ) -> Option<Assignment> {
        let node = &self.links.get(&link)?.node;
        let s = self.services.get(service)?;
        if let Some(r) = &s.route {
            if generation < r.generation
                || (generation == r.generation && r.cell == cell && &r.node == node)
            {
                return None;
            }
        }
        Some(Assignment {
            cell: cell.to_string(),
            node: node.clone(),
            generation,
        })
    }

    /// A `Serve` the authority refused: nothing changes; the node is
    /// answered as for a stale `Serve`, with the generation the planner
    /// names (or the route's, if later).
    pub(crate) fn refuse_serve(
        &self,
        link: LinkId,
        service: &str,
        cell: &str,
        generation: u64,
        named: u64,
        reason: &str,
    ) {
        let Some(l) = self.links.get(&link) else {
            return;
        };
        let route = self.services.get(service).and_then(|s| s.route.as_ref());
        tracing::warn!(
            service,
            node = %l.node,
            cell,
            generation,
            route = ?route.map(|r| (&r.node, &r.cell, r.generation)),
            "Serve refused, the route does not change: {reason}"
        );
        let current = route.map_or(named, |r| r.generation.max(named));
        self.answer_stale(link, service, cell, generation, current);
    }

    /// Tell `link`'s node that its `Serve` of `cell` at `generation` did
    /// not take: the service is at `current`. Nodes before protocol 2 are
    /// not told.
    fn answer_stale(&self, link: LinkId, service: &str, cell: &str, generation: u64, current: u64) {
        if self
            .links
            .get(&link)
            .is_some_and(|l| l.version >= STALE_VERSION)
        {
            self.send(
                link,
                &ToNode::Stale {
                    service: service.to_string(),
                    cell: cell.to_string(),
                    generation,
                    current,
                },
            );
        }
    }

    /// `Serve` from `link`: the service runs there now, with `conns`.
    pub fn serve(
        &mut self,
        link: LinkId,
        service: &str,
        cell: &str,
        generation: u64,
        conns: &[ConnResume],
    ) {
        let node = self
            .links
            .get(&link)
            .map(|l| l.node.clone())
            .unwrap_or_default();
        let Some(s) = self.services.get_mut(service) else {
            tracing::warn!(service, node, "Serve for a service this gateway does not serve; ignored (add it with --service or --route)");
            return;
        };
        if let Some(r) = &s.route {
            if generation < r.generation {
                tracing::warn!(
                    service,
                    node,
                    cell,
                    generation,
                    current = r.generation,
                    "stale Serve ignored: the service runs at a later generation"
                );
                let current = r.generation;
                self.answer_stale(link, service, cell, generation, current);
                return;
            }
        }
        tracing::info!(
            service,
            node,
            cell,
            generation,
            conns = conns.len(),
            "service served"
        );
        s.route = Some(Route {
            link: Some(link),
            node,
            cell: cell.to_string(),
            generation,
        });
        s.held = false;
        s.detached_since = None;
        let mut listed = HashSet::new();
        for r in conns {
            listed.insert(r.conn);
            self.resume(link, service, r);
        }
        let ids: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(id, c)| c.service == service && !listed.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let c = self.conns.get_mut(&id).expect("listed from the map");
            c.opened = false;
            if c.seen || c.cell_closed {
                // The cell lost a connection it had seen: it cannot be
                // resumed. Close the client after what it still has.
                tracing::warn!(
                    conn = id,
                    service,
                    "the serving cell does not have this connection; closing it"
                );
                c.cell_closed = true;
                c.wake.write.notify_one();
                c.wake.read.notify_one();
            } else {
                self.open_if_attached(id);
            }
        }
    }

    fn resume(&mut self, link: LinkId, service: &str, r: &ConnResume) {
        let ok = match self.conns.get(&r.conn) {
            Some(c) if c.service == service && !c.cell_closed => {
                if r.rx_next < c.up_base || r.rx_next > c.up_end() || r.tx_from > c.down_end() {
                    tracing::warn!(
                        conn = r.conn,
                        rx_next = r.rx_next,
                        tx_from = r.tx_from,
                        up_base = c.up_base,
                        up_end = c.up_end(),
                        down_end = c.down_end(),
                        "resume point outside what the gateway holds; closing the connection"
                    );
                    false
                } else {
                    true
                }
            }
            _ => false,
        };
        if !ok {
            self.send(link, &ToNode::Gone { conn: r.conn });
            if let Some(c) = self.conns.get_mut(&r.conn) {
                c.cell_closed = true;
                c.opened = false;
                c.wake.write.notify_one();
                c.wake.read.notify_one();
            }
            return;
        }
        let c = self.conns.get_mut(&r.conn).expect("checked above");
        c.opened = true;
        c.seen = true;
        c.waiting_since = None;
        c.up_sent = r.rx_next;
        c.eof_sent = false;
        let delivered = c.down_base;
        // The cell keeps its output from `tx_from`: tell it what the client
        // already has, and count lazy `Delivered` from there.
        c.acked = delivered.max(r.tx_from);
        if delivered > r.tx_from {
            self.send(
                link,
                &ToNode::Delivered {
                    conn: r.conn,
                    offset: delivered,
                },
            );
        }
        self.pump(r.conn);
    }

    /// `Hold` from `link`.
    pub fn hold(&mut self, link: LinkId, service: &str, cell: &str) {
        match self.services.get_mut(service) {
            Some(s)
                if s.route
                    .as_ref()
                    .is_some_and(|r| r.link == Some(link) && r.cell == cell) =>
            {
                tracing::info!(service, cell, "service held: buffering, new clients wait");
                s.held = true;
            }
            _ => tracing::warn!(
                service,
                cell,
                "Hold from a node that does not serve the service; ignored"
            ),
        }
    }

    /// `Unserve` from `link`: the cell exited; its connections end.
    pub fn unserve(&mut self, link: LinkId, service: &str, cell: &str, generation: u64) {
        let Some(s) = self.services.get_mut(service) else {
            return;
        };
        let matches = s
            .route
            .as_ref()
            .is_some_and(|r| r.link == Some(link) && r.cell == cell && generation >= r.generation);
        if !matches {
            tracing::info!(
                service,
                cell,
                generation,
                "Unserve for a route that is no longer current; ignored"
            );
            return;
        }
        if s.held {
            // Unserve after Hold: the cell has left this node (it moved, or
            // is moving). Keep holding the clients for the destination's
            // Serve, which may arrive on its own link after this, up to the
            // wait timeout.
            tracing::info!(
                service,
                cell,
                "service left its node during a hold; waiting for the destination"
            );
            if let Some(r) = s.route.as_mut() {
                r.link = None;
            }
            s.detached_since = Some(Instant::now());
            return;
        }
        tracing::info!(
            service,
            cell,
            "service unserved: the cell exited; new clients wait"
        );
        s.route = None;
        s.held = false;
        for c in self.conns.values_mut().filter(|c| c.service == service) {
            c.cell_closed = true;
            c.opened = false;
            c.wake.write.notify_one();
            c.wake.read.notify_one();
        }
    }

    /// A node link is gone: its services are held until a `Serve` from
    /// any node, or the wait timeout.
    pub fn link_lost(&mut self, link: LinkId) {
        self.links.remove(&link);
        let now = Instant::now();
        let mut held = HashSet::new();
        for (name, s) in &mut self.services {
            if let Some(r) = s.route.as_mut().filter(|r| r.link == Some(link)) {
                tracing::warn!(service = %name, node = %r.node, "the serving node's link is down; holding its clients");
                r.link = None;
                s.detached_since = Some(now);
                held.insert(name.clone());
            }
        }
        for c in self.conns.values_mut() {
            if held.contains(&c.service) {
                c.opened = false;
            }
        }
    }

    /// Clients that waited too long for a cell get the wait-timeout error:
    /// new clients of a service without a running cell, and every client
    /// of a service whose node link has been down that long.
    pub fn expire(&mut self, now: Instant, timeout: std::time::Duration) {
        let mut dead_services = HashSet::new();
        for (name, s) in &self.services {
            if s.detached_since
                .is_some_and(|t| now.duration_since(t) >= timeout)
            {
                dead_services.insert(name.clone());
            }
        }
        for (id, c) in &mut self.conns {
            if c.fail.is_some() {
                continue;
            }
            let waited = c
                .waiting_since
                .is_some_and(|t| now.duration_since(t) >= timeout);
            if !waited && !dead_services.contains(&c.service) {
                continue;
            }
            let resp = self.services.get(&c.service).is_some_and(|s| s.resp);
            tracing::warn!(conn = id, service = %c.service, peer = %c.peer, "no running cell after {timeout:?}; closing the client");
            c.fail = Some(if resp {
                format!(
                    "-ERR roam gateway: service {} has no running cell (waited {} s); retry later\r\n",
                    c.service,
                    timeout.as_secs_f64()
                )
                .into_bytes()
            } else {
                Vec::new()
            });
            c.opened = false;
            c.wake.write.notify_one();
            c.wake.read.notify_one();
        }
        for name in dead_services {
            if let Some(s) = self.services.get_mut(&name) {
                s.detached_since = None;
                s.route = None;
                s.held = false;
            }
        }
    }
}
