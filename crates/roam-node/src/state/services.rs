//! Service cells and the gateway: which of this node's cells serves which
//! network service, told to the node's `roam gateway` at each moment of a
//! cell's life.
//!
//! Why one module: what keeps clients connected through a move is the
//! order of these calls, and it is easier to check in one place than spread
//! over launch, the cell table and both ends of a migration. The order
//! (`docs/migration.md`, "Service cells and the gateway"):
//!
//! ```text
//!   launch / a migrated-in cell passes the commit point ─► serve (generation = hops, resume points)
//!   the source pauses the cell for the last time        ─► hold
//!   a failed migration resumes the cell on the source    ─► serve again (same generation)
//!   the cell moved away                                  ─► release (nothing sent: the
//!                                                           destination's serve supersedes)
//!   the cell exits, fails or is killed                   ─► unserve
//! ```
//!
//! The gateway follows a `Serve` only if its generation is at least the
//! current one, so a stale message of a node the cell has left never takes
//! the clients back. The generation is [`route_generation`]: the planner's
//! ownership generation for a cell the planner placed, which grows with
//! every move and every restore from a kept checkpoint, and the cell's
//! `hops` otherwise. (`hops` alone starts again at 0 on a restore, so the
//! gateway ignored a restored cell until its old node's link dropped, and
//! an old node back from a partition could take the route from it.)

use std::sync::Arc;

use roam_gateway::link::GatewayLink;
use roam_wasi::net::NetHub;
use roam_wire::CellSpec;

use super::NodeInner;

/// The generation the gateway orders a service's cells by.
pub(crate) fn route_generation(spec: &CellSpec) -> u64 {
    spec.generation.unwrap_or(u64::from(spec.hops))
}

impl NodeInner {
    /// The link and the service name, for a service cell on a node with a
    /// gateway.
    fn service_link<'a>(&'a self, spec: &'a CellSpec) -> Option<(&'a GatewayLink, &'a str)> {
        Some((self.gateway.as_ref()?, spec.service.as_deref()?))
    }

    /// The cell of `spec` runs here now (launched, started after a
    /// migration, or resumed after a failed one), with `hub`: route the
    /// service's clients to it. The link reports the hub's resume points.
    pub(crate) fn serve(&self, spec: &CellSpec, hub: Option<&Arc<NetHub>>) {
        let Some((link, service)) = self.service_link(spec) else {
            return;
        };
        let Some(hub) = hub else {
            tracing::error!(cell = %spec.id, service, "a service cell without sockets; nothing to route to");
            return;
        };
        if let Err(e) = link.serve(service, &spec.id, route_generation(spec), hub.clone()) {
            tracing::error!(cell = %spec.id, service, error = %e, "cannot serve the service");
        }
    }

    /// The cell is paused for the last time before it moves: the gateway
    /// holds its clients and buffers both ways until a `Serve`.
    pub(crate) fn hold(&self, spec: &CellSpec) -> bool {
        let Some((link, service)) = self.service_link(spec) else {
            return false;
        };
        match link.hold(service, &spec.id, route_generation(spec)) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(cell = %spec.id, service, error = %e, "cannot hold the service");
                false
            }
        }
    }

    /// The cell ended here (exited, failed, killed): no more clients.
    pub(crate) fn unserve(&self, spec: &CellSpec) {
        let Some((link, service)) = self.service_link(spec) else {
            return;
        };
        if let Err(e) = link.unserve(service, &spec.id, route_generation(spec)) {
            tracing::warn!(cell = %spec.id, service, error = %e, "cannot unserve the service");
        }
    }

    /// The cell moved away: forget its hub without telling the gateway,
    /// which follows the destination's `Serve` of a higher generation.
    /// (An `Unserve` here could overtake that `Serve`, which travels on
    /// another connection, and end the clients' connections.)
    pub(crate) fn release_service(&self, spec: &CellSpec) {
        if let Some((link, service)) = self.service_link(spec) {
            link.release(service, &spec.id);
        }
    }
}

/// Connect the node's gateway link (`--gateway`), with the node's TLS
/// identity when it has one. It connects in the background, and keeps
/// reconnecting.
pub(crate) fn connect(cfg: &crate::config::NodeConfig) -> anyhow::Result<Option<GatewayLink>> {
    let Some(addr) = &cfg.gateway else {
        return Ok(None);
    };
    let tls = cfg.tls.as_ref().map(|id| id.client());
    GatewayLink::connect(addr, tls, &cfg.name)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--gateway {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(hops: u32, generation: Option<u64>) -> CellSpec {
        CellSpec {
            id: "c-1".into(),
            module_hash: [0; 32],
            args: vec!["prog".into()],
            env: Vec::new(),
            dirs: Vec::new(),
            launched_unix_ms: 0,
            hops,
            max_memory: 1 << 20,
            service: Some("web".into()),
            generation,
            cpu: Default::default(),
            far: None,
        }
    }

    #[test]
    fn a_restored_cell_outranks_the_copy_it_replaces() {
        // Moved three times (generation 4), then its node died and the
        // planner restored it elsewhere at generation 5, with hops reset.
        let before = spec(3, Some(4));
        let restored = spec(0, Some(5));
        assert!(route_generation(&restored) > route_generation(&before));
        // Without a planner, the migration count orders them.
        assert_eq!(route_generation(&spec(2, None)), 2);
    }
}
