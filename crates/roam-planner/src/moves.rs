//! Live migrations the planner asks for: one cell to a node by name or by
//! policy (`POST /v1/cells/{id}/migrate`), and every cell of a node being
//! drained (`POST /v1/nodes/{name}/drain`).
//!
//! The planner only starts a migration (the source node runs it) and then
//! follows it. Ownership moves at the commit point by the destination's
//! transaction (`POST /v1/cells/{id}/owner`); a node that does not ask for
//! it (one started without `--planner`) gets its ownership recorded here
//! once the source reports the migration done.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use roam_api::planner::{DrainMove, DrainResponse, MoveRequest, MoveResponse};
use roam_api::types::{MigrateRequest, TransferOptions};
use roam_cluster::{CellRecord, CellState, NodeRecord, NodeState};

use crate::api::{bad, AppError, P};
use crate::cells::{choose, get_cell, get_node, snapshot, update};
use crate::events::Event;
use crate::history::{MigrationTrace, Outcome};
use crate::policy::{Load, Want};
use crate::{lock, Inner};

/// The migration modes a node knows.
const MODES: [&str; 3] = ["stop-and-copy", "pre-copy", "post-copy"];
/// How often a migration's progress is read from its source.
const POLL: Duration = Duration::from_millis(200);
/// Failed reads of a migration's progress before the planner stops
/// following it (the source is gone; the liveness loop takes over).
const POLL_FAILURES: u32 = 50;

pub(crate) async fn migrate(
    State(n): P,
    Path(id): Path<String>,
    Json(r): Json<MoveRequest>,
) -> Result<Json<MoveResponse>, AppError> {
    let mode = r.mode.as_deref().unwrap_or("pre-copy");
    if !MODES.contains(&mode) {
        return Err(bad(format!(
            "unknown mode {mode:?}: choose one of {}",
            MODES.join(", ")
        )));
    }
    if let Some(to) = &r.to {
        roam_wire::ident::check_node_name(to).map_err(|e| bad(e.to_string()))?;
    }
    let c = get_cell(&n, &id).await?.value;
    let (nodes, cells) = snapshot(&n).await?;
    let want = Want {
        cell: Some(id.clone()),
        max_memory: c.max_memory,
        node: r.to.clone(),
        exclude: vec![(c.owner.clone(), "the cell's owner (it runs there)")],
    };
    let (dest, _) = choose(
        &n,
        "migrate",
        n.placement(),
        &want,
        &nodes,
        &cells,
        Load::of_cells(&cells),
    )?;
    let source = nodes
        .iter()
        .find(|x| x.name == c.owner)
        .cloned()
        .ok_or_else(|| {
            AppError(
                StatusCode::CONFLICT,
                format!("cell {id}'s owner {} is not registered", c.owner),
            )
        })?;
    let migration = start(&n, &c, &source, &dest, mode, "user").await?;
    Ok(Json(MoveResponse {
        migration,
        to: dest.name,
    }))
}

/// Start migrating `c` from `source` to `dest`, and follow it in the
/// background: the migration's id on the source.
pub(crate) async fn start(
    n: &Arc<Inner>,
    c: &CellRecord,
    source: &NodeRecord,
    dest: &NodeRecord,
    mode: &str,
    reason: &'static str,
) -> Result<String, AppError> {
    let id = c.id.clone();
    if !source.alive {
        return Err(AppError(
            StatusCode::CONFLICT,
            format!("cell {id}'s owner {} is not alive", source.name),
        ));
    }
    let marked = update(n, &id, |x| {
        let ok = x.state == CellState::Running && x.owner == source.name;
        if ok {
            x.state = CellState::Migrating {
                to: dest.name.clone(),
            };
        }
        ok
    })
    .await?;
    let Some(marked) = marked else {
        let now = get_cell(n, &id).await?.value;
        return Err(AppError(
            StatusCode::CONFLICT,
            format!(
                "cell {id} cannot move now: it is {} on {}",
                crate::metrics::state_name(&now.state),
                now.owner
            ),
        ));
    };
    let req = MigrateRequest {
        to: dest.api.clone(),
        mode: mode.to_string(),
        transfer: TransferOptions::default(),
    };
    let started = match n.node_client(source) {
        Ok(client) => client.migrate(&id, &req).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let migration = match started {
        Ok(r) => r.migration,
        Err(e) => {
            back_to_running(n, &id, &source.name, &dest.name).await;
            n.metrics.migration(reason, "failed");
            return Err(AppError(
                StatusCode::BAD_GATEWAY,
                format!(
                    "node {} could not start migrating cell {id} to {}: {e}",
                    source.name, dest.name
                ),
            ));
        }
    };
    n.events.send(Event::Migration {
        cell: id.clone(),
        from: source.name.clone(),
        to: dest.name.clone(),
        migration: migration.clone(),
        phase: "started".into(),
        error: None,
    });
    n.history.migration_started(MigrationTrace {
        id: migration.clone(),
        cell: id.clone(),
        from: source.name.clone(),
        to: dest.name.clone(),
        from_isa: source.isa.clone(),
        to_isa: dest.isa.clone(),
        mode: mode.to_string(),
        reason,
        started_ms: crate::unix_ms(),
        ended_ms: None,
        phases: Vec::new(),
        samples: Vec::new(),
        outcome: Outcome::Running,
        summary: None,
    });
    tokio::spawn(follow(
        n.clone(),
        marked,
        source.clone(),
        dest.name.clone(),
        migration.clone(),
        reason,
    ));
    Ok(migration)
}

/// A migration that did not happen: the cell runs on its source still.
async fn back_to_running(n: &Inner, id: &str, source: &str, dest: &str) {
    let r = update(n, id, |x| {
        let ours = x.owner == source && x.state == CellState::Migrating { to: dest.into() };
        if ours {
            x.state = CellState::Running;
        }
        ours
    })
    .await;
    if let Err(e) = r {
        tracing::warn!(cell = %id, "cannot record that the migration did not happen: {}", e.1);
    }
}

/// Follow a migration on its source until it ends, then make the record
/// say where the cell runs.
async fn follow(
    n: Arc<Inner>,
    c: CellRecord,
    source: NodeRecord,
    dest: String,
    migration: String,
    reason: &'static str,
) {
    let Ok(client) = n.node_client(&source) else {
        return;
    };
    let mut failures = 0;
    let status = loop {
        tokio::time::sleep(POLL).await;
        match client.migration(&migration).await {
            Ok(s) if s.done => break s,
            Ok(s) => {
                failures = 0;
                n.history.migration_progress(&migration, &s);
            }
            Err(e) => {
                failures += 1;
                if failures >= POLL_FAILURES {
                    tracing::warn!(cell = %c.id, %migration, "stopped following the migration: {e}");
                    let why = format!("its source stopped answering: {e}");
                    n.history
                        .migration_ended(&migration, Outcome::Unfollowed(why), None);
                    return;
                }
            }
        }
    };
    let event = |phase: &str, error: Option<String>| Event::Migration {
        cell: c.id.clone(),
        from: source.name.clone(),
        to: dest.clone(),
        migration: migration.clone(),
        phase: phase.into(),
        error,
    };
    n.history.migration_progress(&migration, &status);
    if let Some(error) = status.error {
        n.history
            .migration_ended(&migration, Outcome::Failed(error.clone()), None);
        back_to_running(&n, &c.id, &source.name, &dest).await;
        n.metrics.migration(reason, "failed");
        n.events.send(event("failed", Some(error)));
        return;
    }
    // The CPU time the cell used on the source: one stint of its run,
    // recorded before the record says the destination runs it (its end
    // could be settled from then on).
    if let Ok(Ok(info)) = tokio::time::timeout(POLL * 10, client.cell(&c.id)).await {
        if let Some(ms) = info.cpu_ms {
            lock(&n.learner).moved(&c.id, &source.isa, ms);
        }
    }
    // Done: the destination runs the cell. If it took ownership by the
    // transaction, the record already says so; otherwise record it now.
    let r = update(&n, &c.id, |x| {
        let migrating_here = x.state == CellState::Migrating { to: dest.clone() };
        if x.owner == source.name && x.generation == c.generation && migrating_here {
            x.owner = dest.clone();
            x.generation += 1;
            x.state = CellState::Running;
            return true;
        }
        if x.owner == dest && migrating_here {
            x.state = CellState::Running;
            return true;
        }
        false
    })
    .await;
    if let Err(e) = r {
        tracing::warn!(cell = %c.id, "cannot record the migration's end: {}", e.1);
    }
    n.history
        .migration_ended(&migration, Outcome::Done, status.summary.clone());
    n.metrics.migration(reason, "done");
    n.events.send(event("done", None));
}

/// `POST /v1/nodes/{name}/undrain`: a drained node takes new cells and
/// kept checkpoints again (after its maintenance). Its record.
pub(crate) async fn undrain(
    State(n): P,
    Path(name): Path<String>,
) -> Result<Json<NodeRecord>, AppError> {
    get_node(&n, &name).await?;
    n.timed(
        "set_node_state",
        n.store.set_node_state(&name, NodeState::Ready),
    )
    .await?;
    n.events.send(Event::Undrain { node: name.clone() });
    Ok(Json(get_node(&n, &name).await?))
}

/// `POST /v1/nodes/{name}/drain`: no new cells or kept checkpoints on the
/// node, and every cell it owns live-migrates (pre-copy) to the node the
/// `evacuate` policy picks.
pub(crate) async fn drain(
    State(n): P,
    Path(name): Path<String>,
) -> Result<Json<DrainResponse>, AppError> {
    get_node(&n, &name).await?;
    n.timed(
        "set_node_state",
        n.store.set_node_state(&name, NodeState::Draining),
    )
    .await?;
    n.events.send(Event::Drain { node: name.clone() });
    let moves = move_all_off(&n, &name, "drain").await?;
    Ok(Json(DrainResponse { node: name, moves }))
}

/// Live-migrate (pre-copy) every cell `name` owns, that is not being moved
/// already, to the node the `evacuate` policy picks; `reason` is the
/// migrations' reason. One entry per cell.
pub(crate) async fn move_all_off(
    n: &Arc<Inner>,
    name: &str,
    reason: &'static str,
) -> Result<Vec<DrainMove>, AppError> {
    let name = name.to_string();
    let mut moves = Vec::new();
    let (nodes, cells) = snapshot(n).await?;
    let source = nodes
        .iter()
        .find(|x| x.name == name)
        .cloned()
        .ok_or_else(|| AppError(StatusCode::NOT_FOUND, format!("node {name} disappeared")))?;
    let owned: Vec<CellRecord> = cells
        .into_iter()
        .filter(|c| c.owner == name && !c.state.ended())
        // A cell on its way already is its migration's to finish. (A
        // kept checkpoint in progress does not hold a move back: the
        // owner serialises the two.)
        .filter(|c| !matches!(c.state, roam_cluster::CellState::Migrating { .. }))
        .collect();
    for c in owned {
        // Read again for each cell: the earlier moves changed the load.
        let (nodes, cells) = snapshot(n).await?;
        let want = Want {
            cell: Some(c.id.clone()),
            max_memory: c.max_memory,
            exclude: vec![(name.clone(), "the node being drained")],
            ..Want::default()
        };
        let what = format!("{reason} of {name}");
        let load = Load::of_cells(&cells);
        let moved = match choose(n, &what, "evacuate", &want, &nodes, &cells, load) {
            Ok((dest, _)) => start(n, &c, &source, &dest, "pre-copy", reason)
                .await
                .map(|m| (dest.name, m)),
            Err(e) => Err(e),
        };
        moves.push(match moved {
            Ok((to, migration)) => DrainMove {
                cell: c.id,
                to: Some(to),
                migration: Some(migration),
                error: None,
            },
            Err(e) => DrainMove {
                cell: c.id,
                to: None,
                migration: None,
                error: Some(e.1),
            },
        });
    }
    Ok(moves)
}
