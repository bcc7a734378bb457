//! Far-memory cells (`docs/far-memory.md`): the planner picks the memory
//! server that holds a cell's far pages, and the node that runs the cell
//! needs room for its local budget only.
//!
//! Why here and not in the placement policies: a far cell needs two nodes,
//! one for its budget and one for the rest of its memory, and every policy
//! ranks hosts the same way whatever the cell's memory is split into. So
//! the server is picked first, from the nodes' own reports of their free
//! memory-server room (`NodeStatus::memory_server`), and then excluded from
//! the hosts: a cell paging to its own node would gain nothing.

use axum::http::StatusCode;
use roam_api::planner::FarPlace;
use roam_api::types::FarRequest;
use roam_cluster::NodeRecord;

use crate::api::{bad, AppError};
use crate::policy::{human, DEFAULT_CELL_MEMORY};

/// Why the server is not a host for the cell.
pub(crate) const HOLDS_PAGES: &str = "it holds the cell's far pages";

/// Check a launch's far-memory request.
pub(crate) fn check(far: &FarPlace, max_memory: Option<u64>) -> Result<(), AppError> {
    let spec = roam_wire::FarSpec {
        local_memory: far.local_memory,
        server: far.server.clone().unwrap_or_else(|| "planner".into()),
        eviction: far.eviction.clone().unwrap_or_else(|| "clock".into()),
    };
    spec.check().map_err(bad)?;
    if let Some(s) = &far.server {
        roam_wire::ident::check_node_name(s).map_err(|e| bad(e.to_string()))?;
    }
    if max_memory.is_some_and(|m| m <= far.local_memory) {
        return Err(bad(
            "--local-memory is not below the cell's memory limit: nothing would be far",
        ));
    }
    Ok(())
}

/// Bytes a memory server must have free for the cell: its memory beyond
/// the local budget, at its limit.
pub(crate) fn room(far: &FarPlace, max_memory: Option<u64>) -> u64 {
    max_memory
        .unwrap_or(DEFAULT_CELL_MEMORY)
        .saturating_sub(far.local_memory)
}

/// The memory server for a cell that needs `room` bytes of it: the node
/// named, or the live node with the most free room. Never one of `avoid`
/// (the cell's host, or a server that just failed it).
pub(crate) fn pick_server<'a>(
    nodes: &'a [NodeRecord],
    far: &FarPlace,
    room: u64,
    avoid: &[(&str, &str)],
) -> Result<&'a NodeRecord, AppError> {
    let mut why = Vec::new();
    let mut best: Option<(&NodeRecord, u64)> = None;
    for node in nodes {
        if far.server.as_ref().is_some_and(|s| *s != node.name) {
            continue;
        }
        let free = match node.status.memory_server {
            None => {
                why.push(format!("{}: not a memory server", node.name));
                continue;
            }
            Some(_) if !node.alive => {
                why.push(format!("{}: dead", node.name));
                continue;
            }
            Some(_) if avoid.iter().any(|(n, _)| *n == node.name) => {
                let (_, reason) = avoid.iter().find(|(n, _)| *n == node.name).unwrap();
                why.push(format!("{}: {reason}", node.name));
                continue;
            }
            Some(m) if m.free < room => {
                why.push(format!("{}: {} free", node.name, human(m.free)));
                continue;
            }
            Some(m) => m.free,
        };
        if best.is_none_or(|(_, f)| free > f) {
            best = Some((node, free));
        }
    }
    best.map(|(node, _)| node).ok_or_else(|| {
        let asked = match &far.server {
            Some(s) => format!("memory server {s}"),
            None => "a memory server".into(),
        };
        let why = if why.is_empty() {
            "no such node".to_string()
        } else {
            why.join("; ")
        };
        AppError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "no node can be {asked} with {} free for the cell's far pages ({why})",
                human(room)
            ),
        )
    })
}

/// What a node is sent to run the cell with `far`, paging to `server`.
pub(crate) fn request(far: &FarPlace, server: &NodeRecord) -> FarRequest {
    FarRequest {
        local_memory: far.local_memory,
        server: server.api.clone(),
        eviction: far.eviction.clone(),
    }
}

/// The host placement's memory need: the local budget, not the limit.
pub(crate) fn host_memory(far: Option<&FarPlace>, max_memory: Option<u64>) -> Option<u64> {
    match far {
        Some(f) => Some(max_memory.map_or(f.local_memory, |m| m.min(f.local_memory))),
        None => max_memory,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_api::planner::MemoryServer;

    fn node(name: &str, free: Option<u64>, alive: bool) -> NodeRecord {
        let mut n = crate::policy::tests::node(name, alive, 2, 8);
        n.status.memory_server = free.map(|free| MemoryServer {
            capacity: 1 << 30,
            free,
        });
        n
    }

    fn far(server: Option<&str>) -> FarPlace {
        FarPlace {
            local_memory: 8 << 20,
            eviction: None,
            server: server.map(str::to_string),
        }
    }

    #[test]
    fn the_live_server_with_the_most_room_is_picked_and_never_the_host() {
        let nodes = [
            node("board", None, true),
            node("small", Some(64 << 20), true),
            node("big", Some(512 << 20), true),
            node("dead", Some(1 << 30), false),
        ];
        let f = far(None);
        assert_eq!(pick_server(&nodes, &f, 32 << 20, &[]).unwrap().name, "big");
        assert_eq!(
            pick_server(&nodes, &f, 32 << 20, &[("big", "it runs the cell")])
                .unwrap()
                .name,
            "small"
        );
        let e = pick_server(&nodes, &f, 256 << 20, &[("big", "it runs the cell")]).unwrap_err();
        assert!(
            e.1.contains("small: 64.0 MiB free") && e.1.contains("dead: dead"),
            "{}",
            e.1
        );
        assert_eq!(
            pick_server(&nodes, &far(Some("small")), 32 << 20, &[])
                .unwrap()
                .name,
            "small"
        );
        let e = pick_server(&nodes, &far(Some("board")), 1, &[]).unwrap_err();
        assert!(e.1.contains("board: not a memory server"), "{}", e.1);
    }

    #[test]
    fn a_request_is_checked_and_sized() {
        let f = far(None);
        assert!(check(&f, Some(64 << 20)).is_ok());
        assert!(check(&f, Some(8 << 20)).is_err());
        assert!(check(
            &FarPlace {
                local_memory: 4096,
                ..f.clone()
            },
            None
        )
        .is_err());
        assert!(check(&far(Some("../x")), None).is_err());
        assert_eq!(room(&f, Some(64 << 20)), 56 << 20);
        assert_eq!(host_memory(Some(&f), Some(64 << 20)), Some(8 << 20));
        assert_eq!(host_memory(None, Some(64 << 20)), Some(64 << 20));
    }
}
