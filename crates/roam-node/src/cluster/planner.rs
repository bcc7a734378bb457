//! The node's side of the control plane (`roam node --planner URL`):
//! registration, heartbeats, fencing, and the ownership transactions of
//! migrations (`docs/control-plane.md`).
//!
//! Why here and not in the planner: a node must keep working through a
//! planner outage (its cells run on; only ownership changes wait), and it
//! must obey the one rule that keeps a cell from running twice: start or
//! resume a planner's cell only after the planner says it owns it.

use std::sync::Arc;
use std::time::Duration;

use roam_api::planner::{
    CellUsage, GatewayPath, HandoffRequest, HeartbeatRequest, NodeStatus, OwnerRequest,
    RegisterRequest, ServiceTraffic,
};
use roam_api::{PlannerClient, PlannerError};

use crate::cell::Decision;
use crate::state::NodeInner;
use crate::types::CellState;

/// Heartbeat period until the planner gives one.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// Longest wait between two attempts while the planner is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Where the node stands with the planner, for logging state changes once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Unknown,
    Up,
    Down,
}

/// The status the node reports: its machine and the cells running here.
fn status(n: &NodeInner) -> NodeStatus {
    let table = n.cells();
    let mut cells: Vec<String> = table
        .iter()
        .filter(|(_, e)| matches!(e.state, CellState::Running | CellState::Migrating))
        .map(|(id, _)| id.clone())
        .collect();
    cells.sort();
    let mut usage: Vec<CellUsage> = table
        .iter()
        .filter(|(_, e)| e.state == CellState::Running)
        .filter_map(|(id, e)| {
            let h = e.handle.as_ref()?;
            Some(CellUsage {
                cell: id.clone(),
                cpu_ms: u64::try_from(h.cpu_time()?.as_millis()).unwrap_or(u64::MAX),
                memory_bytes: h.memory.len() as u64,
            })
        })
        .collect();
    usage.sort_by(|a, b| a.cell.cmp(&b.cell));
    let mut machine = crate::sysinfo::Machine::read();
    if let Some(cores) = n.cfg.cores {
        machine.cores = cores;
    }
    NodeStatus {
        machine,
        cells,
        gateway: n.gateway.as_ref().map(gateway_path),
        usage,
        power: n.power.as_ref().map(|m| m.report()),
        memory_server: n
            .far_server
            .as_ref()
            .map(|f| roam_api::planner::MemoryServer {
                capacity: f.capacity_bytes(),
                free: f.free_pages() * roam_wire::FAR_PAGE as u64,
            }),
    }
}

/// The link's view of the path to the gateway, for the planner's
/// follow-the-client policy.
fn gateway_path(link: &roam_gateway::link::GatewayLink) -> GatewayPath {
    GatewayPath {
        address: link.address().to_string(),
        id: link.gateway_id(),
        connected: link.is_connected(),
        rtt_us: link
            .rtt()
            .map(|r| u64::try_from(r.estimate().as_micros()).unwrap_or(u64::MAX)),
        services: link
            .served()
            .into_iter()
            .map(|s| ServiceTraffic {
                service: s.service,
                cell: s.cell,
                conns: s.conns as u64,
                frames: s.traffic.frames,
                bytes: s.traffic.bytes,
            })
            .collect(),
    }
}

/// What the node tells the planner when it registers.
fn registration(n: &NodeInner) -> RegisterRequest {
    let api = n
        .cfg
        .advertise
        .clone()
        .unwrap_or_else(|| format!("{}://{}", crate::secure::scheme(&n.auth), n.cfg.listen));
    RegisterRequest {
        name: n.cfg.name.clone(),
        isa: roam_runtime::host_isa().to_string(),
        api,
        migrate: n
            .cfg
            .advertise_migrate
            .clone()
            .unwrap_or_else(|| n.migrate_addr.to_string()),
        version: env!("CARGO_PKG_VERSION").to_string(),
        status: status(n),
    }
}

/// Register, then heartbeat every period the planner asks for, until the
/// node stops. Registers again on `410`; keeps trying through outages.
pub(crate) async fn heartbeats(n: Arc<NodeInner>, planner: PlannerClient) {
    let mut link = Link::Unknown;
    let mut registered = false;
    let mut period = DEFAULT_HEARTBEAT;
    let mut backoff = Duration::from_millis(250);
    loop {
        let sent = std::time::Instant::now();
        let answer = if registered {
            let req = HeartbeatRequest { status: status(&n) };
            planner.heartbeat(&n.cfg.name, &req).await
        } else {
            planner.register(&registration(&n)).await
        };
        match answer {
            Ok(a) => {
                if link != Link::Up {
                    tracing::info!(planner = planner.base(), registered, "planner reached");
                    link = Link::Up;
                }
                if !registered {
                    tracing::info!(planner = planner.base(), name = %n.cfg.name, "registered");
                }
                registered = true;
                backoff = Duration::from_millis(250);
                if a.heartbeat_ms > 0 {
                    period = Duration::from_millis(a.heartbeat_ms);
                }
                // Cells given away first, so the fence never resumes them.
                for id in a.stop {
                    let local = n.cells().get(&id).and_then(|e| e.spec.generation);
                    let decided = a.stop_generations.get(&id).copied();
                    if stale_stop(local, decided) {
                        tracing::info!(cell = %id, ?local, ?decided,
                            "a stop decided before this node took the cell back; ignored");
                        continue;
                    }
                    stop_lost(&n, &id).await;
                }
                n.fence.renew(sent, Duration::from_millis(a.lease_ms));
                // One heartbeat per period however long the answers take.
                tokio::time::sleep(period.saturating_sub(sent.elapsed())).await;
            }
            Err(PlannerError::LeaseExpired(why)) => {
                tracing::warn!(planner = planner.base(), %why, "lease expired; registering again");
                registered = false;
                n.fence.expire();
            }
            Err(e) => {
                if link != Link::Down {
                    tracing::warn!(planner = planner.base(), error = %e,
                        "planner unreachable; cells keep running, retrying with backoff");
                    link = Link::Down;
                }
                tokio::time::sleep(backoff.min(period)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Whether a heartbeat's stop is older than this node's ownership: the
/// planner decided it on a record of generation `decided`, and this node
/// owns the cell at `local`, a later one (it took the cell back since,
/// while the answer was on its way). Every ownership change raises the
/// generation, so a later local generation was won after that record.
fn stale_stop(local: Option<u64>, decided: Option<u64>) -> bool {
    matches!((local, decided), (Some(l), Some(d)) if l > d)
}

/// Stop a cell the planner says this node no longer owns: it was restored
/// elsewhere while this node was cut off. No one else is told.
async fn stop_lost(n: &Arc<NodeInner>, id: &str) {
    let why = "stopped: the planner gave this cell to another node while this node was \
               cut off from it (it was restored there from a kept checkpoint)";
    if n.fence.release(id) {
        tracing::warn!(cell = id, "{why}");
        n.set_state(id, CellState::Failed { error: why.into() });
        return;
    }
    let Ok(h) = crate::cells::running_handle(n, id) else {
        return;
    };
    tracing::warn!(cell = id, "{why}");
    n.set_state(id, CellState::Migrating);
    match h.pause_or_kill().await {
        Some(p) => {
            let _ = p.reply.send(Decision::Release);
            n.set_state(id, CellState::Failed { error: why.into() });
        }
        // Reached no migration point in time: killed (or it ended meanwhile).
        None if h.controller.is_killed() => {
            tracing::warn!(
                cell = id,
                "the lost cell reached no migration point within {} ms; killed",
                roam_runtime::STOP_GRACE.as_millis()
            );
            n.set_state(id, CellState::Killed);
        }
        None => n.set_state(id, CellState::Failed { error: why.into() }),
    }
}

/// The destination's ownership transaction at a migration's commit point
/// (called on the receiving thread): `from` is the source's name. The
/// new generation if this node now owns the cell; why not otherwise.
pub(crate) fn take(n: &NodeInner, id: &str, from: &str, generation: u64) -> Result<u64, String> {
    let Some(planner) = &n.planner else {
        return Err("bug: an ownership transaction on a node without a planner".into());
    };
    let req = OwnerRequest {
        from: from.to_string(),
        generation,
        to: n.cfg.name.clone(),
    };
    let r = n.tokio.block_on(async {
        tokio::time::timeout(n.cfg.planner_timeout, planner.owner(id, &req)).await
    });
    match r {
        Ok(Ok(won)) if won.owner == n.cfg.name => Ok(won.generation),
        Ok(Ok(won)) => Err(format!(
            "the planner gave cell {id} to {} instead of this node",
            won.owner
        )),
        Ok(Err(e)) => Err(format!(
            "no ownership of cell {id}, so it does not start here: {e}"
        )),
        Err(_) => Err(format!(
            "the planner did not answer the ownership transaction of cell {id} within {} s, \
             so it does not start here",
            n.cfg.planner_timeout.as_secs_f64()
        )),
    }
}

/// The source's announcement, before a migration moves anything, that
/// `to` may take cell `id` at `generation` (the planner refuses an
/// ownership change that its owner did not announce). Nothing to do on a
/// node without a planner, or for a cell the planner does not manage.
pub(crate) async fn hand_off(
    n: &NodeInner,
    id: &str,
    to: &str,
    generation: Option<u64>,
) -> Result<(), String> {
    let (Some(planner), Some(generation)) = (&n.planner, generation) else {
        return Ok(());
    };
    let req = HandoffRequest {
        from: n.cfg.name.clone(),
        generation,
        to: to.to_string(),
    };
    match tokio::time::timeout(n.cfg.planner_timeout, planner.handoff(id, &req)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!(
            "the planner refused the hand-off of cell {id} to {to}: {e}"
        )),
        Err(_) => Err(format!(
            "the planner did not answer the hand-off of cell {id} to {to} within {} s",
            n.cfg.planner_timeout.as_secs_f64()
        )),
    }
}

/// What a source learns when it asks for a cell back after an ambiguous
/// commit.
pub(crate) enum Back {
    /// It owns the cell again, at this generation: it resumes.
    Won(u64),
    /// Another node (the destination) owns it: it never resumes.
    Lost(String),
    /// The planner does not handle this cell (an error other than a lost
    /// transaction): fall back to asking the destination.
    Unknown(String),
}

/// The source's ownership transaction after the link broke past the final
/// state: give the cell back to this node. Retries for as long as the
/// planner cannot be reached (the cell stays paused meanwhile: resuming
/// without an answer could run it twice).
pub(crate) async fn take_back(n: &NodeInner, id: &str, generation: u64) -> Back {
    take_from(n, id, &n.cfg.name, generation).await
}

/// Move ownership of `id` from `from` (at `generation`) to this node,
/// retrying while the planner cannot be reached.
pub(crate) async fn take_from(n: &NodeInner, id: &str, from: &str, generation: u64) -> Back {
    let Some(planner) = &n.planner else {
        return Back::Unknown("no planner".into());
    };
    let req = OwnerRequest {
        from: from.to_string(),
        generation,
        to: n.cfg.name.clone(),
    };
    let mut backoff = Duration::from_millis(200);
    let mut logged = false;
    loop {
        match tokio::time::timeout(n.cfg.planner_timeout, planner.owner(id, &req)).await {
            Ok(Ok(won)) if won.owner == n.cfg.name => return Back::Won(won.generation),
            Ok(Ok(won)) => return Back::Lost(format!("the planner says {} owns it", won.owner)),
            Ok(Err(PlannerError::Conflict(e))) => return Back::Lost(e),
            Ok(Err(e))
                if !e.is_unreachable()
                    && !matches!(&e, PlannerError::Api { status, .. } if *status >= 500) =>
            {
                return Back::Unknown(e.to_string())
            }
            r => {
                if !logged {
                    let error = match r {
                        Ok(Err(e)) => e.to_string(),
                        _ => "no answer".to_string(),
                    };
                    tracing::warn!(cell = id, %error,
                        "cannot ask the planner for the cell back; it stays paused until the planner answers");
                    logged = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stale_stop;

    #[test]
    fn only_a_stop_decided_before_this_nodes_ownership_is_ignored() {
        // The destination took the cell (3 -> 4), the heartbeat answer was
        // decided then; the source took it back (4 -> 5) and resumed.
        assert!(stale_stop(Some(5), Some(4)));
        // The cell really went elsewhere, or ended, at or after what this
        // node holds.
        assert!(!stale_stop(Some(4), Some(4)));
        assert!(!stale_stop(Some(3), Some(4)));
        // A planner that sends no generation, or a cell without one: stop.
        assert!(!stale_stop(Some(5), None));
        assert!(!stale_stop(None, Some(4)));
    }
}
