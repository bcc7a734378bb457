//! Cells through the planner: launch (placed by policy), list, status,
//! logs and kill. The ownership transaction nodes ask for at a
//! migration's commit point is in `ownership.rs`, migrations and drains
//! in `moves.rs`, kept checkpoints in `kept.rs`.
//!
//! The planner drives nodes only through their public API; the cluster
//! store is the truth about who owns a cell, and every change to a cell's
//! record is a compare-and-swap ([`update`]), so two planners, or a
//! planner and a node's ownership transaction, never overwrite each other.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use roam_api::planner::PlaceRequest;
use roam_api::types::LaunchRequest;
use roam_cluster::{CellRecord, CellState, NodeRecord, StoreError, Versioned};

use crate::far;

use crate::api::{bad, AppError, P};
use crate::events::Event;
use crate::policy::{self, Ctx, Load, Want};
use crate::{lock, random_hex, unix_ms, Inner};

pub(crate) use crate::kept::{checkpoint, claim, keep_now};
pub(crate) use crate::moves::{drain, migrate, undrain};
pub(crate) use crate::ownership::{handoff, owner};

/// Most arguments, environment entries or directories of a cell.
const MAX_LIST: usize = 4096;
/// Most bytes of arguments and environment together.
const MAX_ARGS_BYTES: usize = 1 << 20;
/// Compare-and-swap attempts before giving up on a busy record.
const CAS_TRIES: usize = 16;

fn check_place(r: &PlaceRequest) -> Result<(), AppError> {
    roam_wire::ident::parse_module_hash(&r.module).map_err(|e| bad(e.to_string()))?;
    if r.args.is_empty() {
        return Err(bad("args must hold at least the program name"));
    }
    if r.args.len() > MAX_LIST || r.env.len() > MAX_LIST || r.dirs.len() > MAX_LIST {
        return Err(bad(format!(
            "at most {MAX_LIST} arguments, environment entries and directories"
        )));
    }
    let bytes: usize = r.args.iter().map(String::len).sum::<usize>()
        + r.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if bytes > MAX_ARGS_BYTES {
        return Err(bad(format!(
            "arguments and environment hold {}, more than {}",
            policy::human(bytes as u64),
            policy::human(MAX_ARGS_BYTES as u64)
        )));
    }
    if r.env.iter().any(|(k, _)| k.is_empty() || k.contains('=')) {
        return Err(bad("an environment name is empty or holds '='"));
    }
    roam_wire::ident::check_guest_dirs(&r.dirs).map_err(|e| bad(e.to_string()))?;
    if let Some(s) = &r.service {
        roam_wire::ident::check_service_name(s).map_err(|e| bad(e.to_string()))?;
    }
    if let Some(node) = &r.node {
        roam_wire::ident::check_node_name(node).map_err(|e| bad(e.to_string()))?;
    }
    if let Some(f) = &r.far {
        far::check(f, r.max_memory)?;
    }
    Ok(())
}

/// Every node and every cell.
pub(crate) async fn snapshot(n: &Inner) -> Result<(Vec<NodeRecord>, Vec<CellRecord>), AppError> {
    let nodes = n.timed("nodes", n.store.nodes()).await?;
    let read = Instant::now();
    let cells: Vec<CellRecord> = n
        .timed("cells", n.store.cells())
        .await?
        .into_iter()
        .map(|c| c.value)
        .collect();
    lock(&n.owners).reset(&cells, read);
    Ok((nodes, cells))
}

/// How old the planner's copy of the cells' owners may be for a placement
/// to count from it instead of reading every cell. The leader reads every
/// cell each tick, so on the leader it is never older than a tick.
const OWNERS_FRESH: Duration = Duration::from_secs(2);

/// The owners of the cells that have not ended, as this planner last read
/// them (every full read) or wrote them (its own changes since). Placements
/// count load from it; with several planners, another's placements since
/// the last read are missing until the next one, at most
/// [`OWNERS_FRESH`] later.
#[derive(Debug, Default)]
pub(crate) struct Owners {
    owner: HashMap<String, String>,
    read: Option<Instant>,
}

impl Owners {
    fn reset(&mut self, cells: &[CellRecord], read: Instant) {
        self.owner = cells
            .iter()
            .filter(|c| !c.state.ended())
            .map(|c| (c.id.clone(), c.owner.clone()))
            .collect();
        self.read = Some(read);
    }

    /// This planner wrote `c`.
    pub(crate) fn note(&mut self, c: &CellRecord) {
        if c.state.ended() {
            self.owner.remove(&c.id);
        } else {
            self.owner.insert(c.id.clone(), c.owner.clone());
        }
    }

    fn load(&self) -> Option<Load> {
        let fresh = self.read.is_some_and(|t| t.elapsed() <= OWNERS_FRESH);
        fresh.then(|| Load::of(self.owner.values().map(|o| (o.as_str(), false))))
    }
}

/// Every node, and every node's load: from the planner's copy of the
/// owners when it is fresh, from every cell otherwise.
pub(crate) async fn load_view(n: &Inner) -> Result<(Vec<NodeRecord>, Load), AppError> {
    let cached = lock(&n.owners).load();
    if let Some(load) = cached {
        let nodes = n.timed("nodes", n.store.nodes()).await?;
        return Ok((nodes, load));
    }
    let (nodes, cells) = snapshot(n).await?;
    Ok((nodes, Load::of_cells(&cells)))
}

/// Run the policy called `name` (`manual` when `want` names a node) with
/// `cells` (at least the one being placed, if it exists) and `load`, and
/// remember the decision as `what` (`launch`, `migrate`, ...) for the
/// dashboard.
pub(crate) fn choose(
    n: &Inner,
    what: &str,
    name: &str,
    want: &Want,
    nodes: &[NodeRecord],
    cells: &[CellRecord],
    load: Load,
) -> Result<(NodeRecord, &'static str), AppError> {
    let p = if want.node.is_some() {
        Box::new(policy::Manual)
    } else {
        policy::by_name(name).unwrap_or_else(|| Box::new(policy::LeastLoaded))
    };
    let ctx = Ctx {
        nodes,
        cells,
        load,
        want,
    };
    n.history.decided(crate::history::Decision::new(
        what,
        want.cell.clone(),
        p.name(),
        &policy::explain(p.as_ref(), &ctx),
    ));
    policy::place(p.as_ref(), &ctx)
        .map(|node| (node.clone(), p.name()))
        .map_err(|e| AppError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}

/// A cell's record, or 404.
pub(crate) async fn get_cell(n: &Inner, id: &str) -> Result<Versioned<CellRecord>, AppError> {
    n.timed("cell", n.store.cell(id)).await?.ok_or_else(|| {
        AppError(
            StatusCode::NOT_FOUND,
            format!("no cell {id} in the cluster: list them with GET /v1/cells"),
        )
    })
}

/// A node's record, or 404.
pub(crate) async fn get_node(n: &Inner, name: &str) -> Result<NodeRecord, AppError> {
    n.timed("nodes", n.store.nodes())
        .await?
        .into_iter()
        .find(|x| x.name == name)
        .ok_or_else(|| {
            AppError(
                StatusCode::NOT_FOUND,
                format!("no node {name} in the cluster: list them with GET /v1/nodes"),
            )
        })
}

/// Change cell `id` with `f` by compare-and-swap, reading it again after a
/// lost race. `f` returns false to leave the record as it is (it no longer
/// holds what the change assumed): `Ok(None)` then.
pub(crate) async fn update(
    n: &Inner,
    id: &str,
    mut f: impl FnMut(&mut CellRecord) -> bool,
) -> Result<Option<CellRecord>, AppError> {
    for _ in 0..CAS_TRIES {
        let cur = get_cell(n, id).await?;
        let mut c = cur.value;
        if !f(&mut c) {
            return Ok(None);
        }
        match n
            .timed("update_cell", n.store.update_cell(cur.revision, c.clone()))
            .await
        {
            Ok(_) => {
                lock(&n.owners).note(&c);
                return Ok(Some(c));
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AppError(
        StatusCode::CONFLICT,
        format!("cell {id} changed {CAS_TRIES} times while it was being updated; try again"),
    ))
}

/// Make sure `node` has the module `hash` of the repository: the hash the
/// node knows it by (it prepares an unprepared module, which changes it).
pub(crate) async fn ensure_module(
    n: &Inner,
    node: &NodeRecord,
    hash: &str,
) -> Result<String, String> {
    let key = (node.name.clone(), hash.to_string());
    if let Some(h) = lock(&n.uploaded).get(&key) {
        return Ok(h.clone());
    }
    let bytes = n
        .timed("module", n.store.module(hash))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("module {hash} is not in the repository: upload it again"))?;
    let c = n.node_client(node).map_err(|e| e.to_string())?;
    let info = c
        .upload_module(bytes)
        .await
        .map_err(|e| format!("uploading module {hash} to node {}: {e}", node.name))?;
    lock(&n.uploaded).insert(key, info.hash.clone());
    Ok(info.hash)
}

/// Start cell `c` on `node`, which owns it.
async fn start_on(
    n: &Inner,
    node: &NodeRecord,
    c: &CellRecord,
    far: Option<roam_api::types::FarRequest>,
) -> Result<(), String> {
    let module = ensure_module(n, node, &c.module).await?;
    let client = n.node_client(node).map_err(|e| e.to_string())?;
    let req = LaunchRequest {
        module,
        args: c.args.clone(),
        env: c.env.clone(),
        dirs: c.dirs.clone(),
        max_memory: c.max_memory,
        service: c.service.clone(),
        id: Some(c.id.clone()),
        generation: Some(c.generation),
        cpu: Default::default(),
        far,
    };
    match client.launch(&req).await {
        Ok(_) => Ok(()),
        // The node lost the module (it restarted with another cache): once more.
        Err(e) if e.to_string().contains("(404") => {
            lock(&n.uploaded).remove(&(node.name.clone(), c.module.clone()));
            let module = ensure_module(n, node, &c.module).await?;
            client
                .launch(&LaunchRequest {
                    module,
                    ..req.clone()
                })
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) async fn launch(
    State(n): P,
    Json(r): Json<PlaceRequest>,
) -> Result<Json<CellRecord>, AppError> {
    check_place(&r)?;
    if n.timed("module", n.store.module(&r.module))
        .await?
        .is_none()
    {
        return Err(AppError(
            StatusCode::NOT_FOUND,
            format!(
                "no module {} in the repository: upload it first with POST /v1/modules",
                r.module
            ),
        ));
    }
    let (nodes, load) = load_view(&n).await?;
    // A far-memory cell's server first: the host needs room for the local
    // budget only, and is never the server.
    let server = match &r.far {
        Some(f) => {
            let room = far::room(f, r.max_memory);
            let host: Vec<(&str, &str)> = r
                .node
                .iter()
                .map(|h| (h.as_str(), "it runs the cell"))
                .collect();
            Some(far::pick_server(&nodes, f, room, &host)?.clone())
        }
        None => None,
    };
    let want = Want {
        max_memory: far::host_memory(r.far.as_ref(), r.max_memory),
        node: r.node.clone(),
        exclude: server
            .iter()
            .map(|s| (s.name.clone(), far::HOLDS_PAGES))
            .collect(),
        ..Want::default()
    };
    let (node, policy) = match choose(&n, "launch", n.placement(), &want, &nodes, &[], load) {
        Ok(x) => x,
        Err(e) => {
            n.metrics.placement(n.placement(), "no-node");
            return Err(e);
        }
    };
    let far_place = r.far.clone().zip(server.as_ref()).map(|(f, s)| {
        (
            roam_api::planner::FarPlace {
                server: Some(s.name.clone()),
                ..f
            },
            s,
        )
    });
    let rec = CellRecord {
        id: format!("c-{}", random_hex(6)),
        module: r.module,
        args: r.args,
        env: r.env,
        dirs: r.dirs,
        max_memory: r.max_memory,
        service: r.service,
        owner: node.name.clone(),
        generation: 1,
        state: CellState::Placing,
        checkpoint_interval_s: r
            .checkpoint_interval_s
            .unwrap_or(n.cfg.checkpoint_interval_s),
        kept: None,
        created_ms: unix_ms(),
        handoff: None,
        far: far_place.as_ref().map(|(f, _)| f.clone()),
    };
    n.timed("create_cell", n.store.create_cell(rec.clone()))
        .await?;
    lock(&n.owners).note(&rec);
    let far_req = far_place.as_ref().map(|(f, s)| far::request(f, s));
    let started = start_on(&n, &node, &rec, far_req).await;
    let id = rec.id.clone();
    let new_state = match &started {
        Ok(()) => CellState::Running,
        Err(e) => CellState::Failed {
            error: format!("node {} could not start it: {e}", node.name),
        },
    };
    let rec = update(&n, &id, |c| {
        let placing = c.state == CellState::Placing;
        if placing {
            c.state = new_state.clone();
        }
        placing
    })
    .await?;
    match started {
        Ok(()) => {
            n.metrics.placement(policy, "placed");
            n.events.send(Event::Placement {
                cell: id.clone(),
                node: node.name.clone(),
                policy: policy.to_string(),
            });
            let rec = match rec {
                Some(r) => r,
                None => get_cell(&n, &id).await?.value,
            };
            Ok(Json(rec))
        }
        Err(e) => {
            n.metrics.placement(policy, "failed");
            Err(AppError(
                StatusCode::BAD_GATEWAY,
                format!(
                    "node {} could not start cell {id}: {e} (the cell is recorded as failed)",
                    node.name
                ),
            ))
        }
    }
}

pub(crate) async fn list(State(n): P) -> Result<Json<Vec<CellRecord>>, AppError> {
    let mut cells: Vec<CellRecord> = n
        .timed("cells", n.store.cells())
        .await?
        .into_iter()
        .map(|c| c.value)
        .collect();
    cells.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
    Ok(Json(cells))
}

pub(crate) async fn status(
    State(n): P,
    Path(id): Path<String>,
) -> Result<Json<CellRecord>, AppError> {
    let c = get_cell(&n, &id).await?.value;
    if let Settled::Ended(rec) = settle(&n, &c).await? {
        return Ok(Json(*rec));
    }
    Ok(Json(get_cell(&n, &id).await?.value))
}

/// What settling a running cell's record found on its owner.
pub(crate) enum Settled {
    /// It ended there: the new record.
    Ended(Box<CellRecord>),
    /// The live owner answered that it does not know the cell at all (not
    /// running, not ended, not arriving).
    Unknown,
    /// It failed on its owner because pages of its memory were lost (its
    /// memory server died), and a kept checkpoint can bring it back: the
    /// record stays as it is for the restore.
    MemoryLost,
    /// Neither: it runs, the record changed, or the owner did not answer.
    Unchanged,
}

/// If `c` (a record that says running) ended on its owner, record how.
/// Nodes do not report exits; the planner asks when someone reads the
/// cell, and when the owner's heartbeat no longer lists it.
pub(crate) async fn settle(n: &Inner, c: &CellRecord) -> Result<Settled, AppError> {
    use roam_api::types::CellState as OnNode;
    if c.state != CellState::Running {
        return Ok(Settled::Unchanged);
    }
    let Some((isa, answer)) = ask_owner(n, c).await else {
        return Ok(Settled::Unchanged);
    };
    let mut cpu_ms = None;
    let ended = match answer {
        Ok(info) if info.memory_lost && c.kept.is_some() => return Ok(Settled::MemoryLost),
        Ok(info) => match info.state {
            OnNode::Exited { code } => {
                cpu_ms = info.cpu_ms;
                CellState::Exited { code }
            }
            OnNode::Failed { error } => CellState::Failed { error },
            OnNode::Killed => CellState::Killed,
            OnNode::Running | OnNode::Migrating | OnNode::Moved { .. } => {
                return Ok(Settled::Unchanged)
            }
        },
        Err(roam_api::ClientError::NotFound(_)) => return Ok(Settled::Unknown),
        Err(_) => return Ok(Settled::Unchanged),
    };
    let rec = update(n, &c.id, |x| {
        let same = x.owner == c.owner && x.generation == c.generation;
        if same && x.state == CellState::Running {
            x.state = ended.clone();
            return true;
        }
        false
    })
    .await?;
    let Some(rec) = rec else {
        return Ok(Settled::Unchanged);
    };
    // A whole run: what the planner learns each program's time from.
    let name = c.args.first().map_or("", String::as_str);
    lock(&n.learner).ended(
        &c.id,
        &c.module,
        name,
        &isa,
        c.generation,
        cpu_ms.unwrap_or(0),
        cpu_ms.is_some(),
    );
    n.events.send(crate::events::Event::Ended {
        cell: c.id.clone(),
        node: c.owner.clone(),
        state: ended,
    });
    Ok(Settled::Ended(Box::new(rec)))
}

/// How long a status read waits for the owner's word.
const OWNER_ASK: std::time::Duration = std::time::Duration::from_secs(2);

/// Cell `c`'s live owner's answer about it; `None` when the owner is not
/// alive, cannot be called, or does not answer within [`OWNER_ASK`] (a
/// node alive by its lease but frozen or cut off must not hold up a status
/// read: the record's word stands).
/// The owner's ISA and its word on the cell; `None` when it is dead or
/// did not answer in time.
async fn ask_owner(
    n: &Inner,
    c: &CellRecord,
) -> Option<(
    String,
    Result<roam_api::types::CellInfo, roam_api::ClientError>,
)> {
    let node = get_node(n, &c.owner).await.ok().filter(|x| x.alive)?;
    let client = n.node_client(&node).ok()?;
    let answer = tokio::time::timeout(OWNER_ASK, client.cell(&c.id))
        .await
        .ok()?;
    Some((node.isa, answer))
}

pub(crate) async fn logs(State(n): P, Path(id): Path<String>) -> Result<Response, AppError> {
    let c = get_cell(&n, &id).await?.value;
    let node = get_node(&n, &c.owner).await?;
    let client = n
        .node_client(&node)
        .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?;
    let log = client.logs(&id).await.map_err(|e| {
        AppError(
            StatusCode::BAD_GATEWAY,
            format!(
                "cannot get cell {id}'s log from its owner {}: {e}",
                node.name
            ),
        )
    })?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], log).into_response())
}

pub(crate) async fn kill(
    State(n): P,
    Path(id): Path<String>,
) -> Result<Json<CellRecord>, AppError> {
    let c = get_cell(&n, &id).await?.value;
    if c.state.ended() {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id} has already ended ({:?})", c.state),
        ));
    }
    let node = get_node(&n, &c.owner).await?;
    // A dead owner cannot be asked; the record says killed, and the node is
    // told to stop the cell if it comes back.
    if node.alive {
        let client = n
            .node_client(&node)
            .map_err(|e| AppError(StatusCode::BAD_GATEWAY, e.to_string()))?;
        if let Err(e) = client.kill(&id).await {
            // A cell that already ended there is as good as killed.
            let ended = client
                .cell(&id)
                .await
                .is_ok_and(|i| !matches!(i.state, roam_api::types::CellState::Running));
            if !ended {
                return Err(AppError(
                    StatusCode::BAD_GATEWAY,
                    format!("node {} could not kill cell {id}: {e}", node.name),
                ));
            }
        }
    }
    let rec = update(&n, &id, |c| {
        c.state = CellState::Killed;
        true
    })
    .await?;
    n.events.send(Event::Killed { cell: id.clone() });
    match rec {
        Some(r) => Ok(Json(r)),
        None => Ok(Json(get_cell(&n, &id).await?.value)),
    }
}
