//! What the leading planner does on its own, every [`TICK`]: notice dead
//! nodes, restore their cells elsewhere from their newest kept checkpoints,
//! and take the kept checkpoints that are due.
//!
//! Why only the leader: two planners restoring the same cell would race;
//! the store's election ([`roam_cluster::ClusterStore::lead`]) makes one
//! of them act, and every change is still a compare-and-swap on the cell's
//! record, so even a planner that lost the lead without knowing it yet
//! cannot make a cell run twice: its change loses.
//!
//! The rule is a state, not an event: every tick, each cell that has not
//! ended and whose owner is dead is restored. A planner that takes the
//! lead after another died therefore finishes what the other left.
//!
//! So is a cell whose owner is alive but does not have it: its heartbeats
//! leave the cell out, and asked, it answers that it does not know it (not
//! even as arriving). That happens when a destination took a cell's
//! ownership and then gave up on it; its source normally takes the cell
//! back, and the leader waits a lease for that before it restores.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use roam_api::types::{KeptAccess, KeptGrant, RestoreRequest};
use roam_cluster::{CellRecord, CellState, NodeRecord};

use crate::cells::{claim, ensure_module, keep_now, snapshot, update};
use crate::events::Event;
use crate::kept::grant_on;
use crate::policy::{self, Ctx, Want};
use crate::{lock, unix_ms, Inner};

/// How often the leader looks at the cluster.
pub const TICK: Duration = Duration::from_millis(500);
/// How long to wait before asking for the lead again after the store
/// failed.
const RETRY: Duration = Duration::from_secs(1);

/// Lead whenever elected, until the task is aborted.
pub(crate) async fn run(n: Arc<Inner>) {
    loop {
        let mut lead = match n.store.lead(&n.cfg.id).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("cannot take part in the leader election: {e}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        tracing::info!(id = %n.cfg.id, "this planner leads the cluster");
        n.metrics.set_leader(true);
        let mut seen = Seen::default();
        loop {
            tokio::select! {
                _ = lead.lost() => break,
                _ = tokio::time::sleep(TICK) => {}
            }
            if let Err(e) = tick(&n, &mut seen).await {
                tracing::warn!("leader: {}", e.1);
            }
        }
        n.metrics.set_leader(false);
        tracing::warn!(id = %n.cfg.id, "this planner lost the lead");
    }
}

/// What the leader remembers from one tick to the next.
#[derive(Default)]
struct Seen {
    /// Cells whose live owner said it does not know them: since when (Unix
    /// ms), for the owner and generation of the record then. Filled by the
    /// tasks that ask owners (see [`absent_on_owner`]).
    absent: Arc<std::sync::Mutex<HashMap<String, Absent>>>,
    /// Node → whether it was alive, to report each death once.
    alive: HashMap<String, bool>,
    /// Cell → the owner's heartbeat (Unix ms) after which the leader asked
    /// the owner whether the cell ended: asked once per heartbeat.
    asked: HashMap<String, u64>,
    /// What the policies that move cells by themselves remember.
    auto: crate::auto::Trackers,
    /// What the maintenance windows' evacuation remembers.
    maintenance: crate::maintenance::Seen,
}

/// A live owner's word that it does not have a cell its record gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Absent {
    owner: String,
    generation: u64,
    since_ms: u64,
}

async fn tick(n: &Arc<Inner>, seen: &mut Seen) -> Result<(), crate::api::AppError> {
    let (nodes, cells) = snapshot(n).await?;
    for node in &nodes {
        let before = seen.alive.insert(node.name.clone(), node.alive);
        if before == Some(true) && !node.alive {
            let owned = cells
                .iter()
                .filter(|c| c.owner == node.name && !c.state.ended())
                .map(|c| c.id.clone())
                .collect();
            n.events.send(Event::NodeDeath {
                node: node.name.clone(),
                cells: owned,
            });
        }
    }
    let by_name: HashMap<&str, &NodeRecord> = nodes.iter().map(|x| (x.name.as_str(), x)).collect();
    let alive = |name: &str| by_name.get(name).is_some_and(|x| x.alive);
    let now = unix_ms();
    let live: HashSet<&str> = cells
        .iter()
        .filter(|c| !c.state.ended())
        .map(|c| c.id.as_str())
        .collect();
    seen.asked.retain(|id, _| live.contains(id.as_str()));
    // An owner's "absent" holds only for the record it was said about.
    lock(&seen.absent).retain(|id, a| {
        cells
            .iter()
            .any(|c| &c.id == id && c.owner == a.owner && c.generation == a.generation)
    });
    for c in &cells {
        if c.state.ended() || lock(&n.busy).contains(&c.id) {
            continue;
        }
        match unlisted(&by_name, c) {
            Some(beat) => {
                if seen.asked.insert(c.id.clone(), beat) != Some(beat) {
                    let (n, c, absent) = (n.clone(), c.clone(), seen.absent.clone());
                    tokio::spawn(async move {
                        match crate::cells::settle(&n, &c).await {
                            Ok(crate::cells::Settled::Unknown) => absent_on_owner(&c, &absent),
                            Ok(crate::cells::Settled::MemoryLost) => {
                                lock(&absent).remove(&c.id);
                                tracing::warn!(cell = %c.id, owner = %c.owner,
                                    "the cell lost its far memory: restoring it from its kept checkpoint");
                                evacuate(&n, c, Why::MemoryLost).await;
                            }
                            Ok(_) => {
                                lock(&absent).remove(&c.id);
                            }
                            Err(e) => {
                                tracing::debug!(cell = %c.id, "cannot settle the cell's end: {}", e.1)
                            }
                        }
                    });
                }
            }
            None => {
                lock(&seen.absent).remove(&c.id);
            }
        }
        let gone = lock(&seen.absent)
            .get(&c.id)
            .is_some_and(|a| now >= a.since_ms.saturating_add(grace(n)));
        if !alive(&c.owner) {
            let (n, c) = (n.clone(), c.clone());
            tokio::spawn(async move { evacuate(&n, c, Why::Dead).await });
        } else if gone {
            lock(&seen.absent).remove(&c.id);
            tracing::warn!(cell = %c.id, owner = %c.owner,
                "the cell's owner is alive but does not run it: restoring it from its kept checkpoint");
            let (n, c) = (n.clone(), c.clone());
            tokio::spawn(async move { evacuate(&n, c, Why::Absent).await });
        } else if c.state == CellState::Running && due(n, c, now) {
            // At most `kept_parallel` at once; the others are still due on
            // the next tick.
            let Ok(permit) = n.keeping.clone().try_acquire_owned() else {
                tracing::debug!(cell = %c.id, "kept checkpoint due; waiting for one under way");
                continue;
            };
            let (n, id) = (n.clone(), c.id.clone());
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(e) = keep_now(&n, &id).await {
                    lock(&n.keep_failed).insert(id.clone(), unix_ms());
                    tracing::warn!(cell = %id, "kept checkpoint failed: {}", e.1);
                }
            });
        }
    }
    crate::auto::tick(n, &nodes, &cells, &live, &mut seen.auto, now);
    crate::maintenance::tick(n, &nodes, &cells, &mut seen.maintenance, now).await;
    Ok(())
}

/// If running cell `c`'s live owner sent a heartbeat after the cell was
/// created that does not list it, that heartbeat's time: the cell may have
/// ended there. (A cell placed after the heartbeat is not in it yet.)
fn unlisted(nodes: &HashMap<&str, &NodeRecord>, c: &CellRecord) -> Option<u64> {
    if c.state != CellState::Running {
        return None;
    }
    let owner = nodes.get(c.owner.as_str()).filter(|x| x.alive)?;
    let listed = owner.status.cells.contains(&c.id);
    (!listed && owner.heartbeat_ms > c.created_ms).then_some(owner.heartbeat_ms)
}

/// How long a live owner must keep saying it does not know a cell before
/// the leader restores the cell elsewhere: a lease. A migration that
/// failed at its commit settles within that time (its source takes the
/// cell back), and a restore takes the cell only if its record did not
/// change meanwhile.
fn grace(n: &Inner) -> u64 {
    n.cfg.lease.as_millis() as u64
}

/// Cell `c`'s live owner said it does not know the cell: remember since
/// when, unless it said so already about the same record.
fn absent_on_owner(c: &CellRecord, absent: &std::sync::Mutex<HashMap<String, Absent>>) {
    let mut a = lock(absent);
    let same = a
        .get(&c.id)
        .is_some_and(|x| x.owner == c.owner && x.generation == c.generation);
    if !same {
        tracing::info!(cell = %c.id, owner = %c.owner,
            "the cell's owner does not know the cell; it is restored if that lasts a lease");
        a.insert(
            c.id.clone(),
            Absent {
                owner: c.owner.clone(),
                generation: c.generation,
                since_ms: unix_ms(),
            },
        );
    }
}

/// For a cell without periodic checkpoints whose only copy is on its
/// owner: seconds between attempts to keep one elsewhere after a failure.
const ALONE_RETRY_S: u64 = 10;

/// Whether cell `c`'s next kept checkpoint is due at `now`.
fn due(n: &Inner, c: &CellRecord, now: u64) -> bool {
    // The only copy is on the owner itself (the cell was restored onto its
    // checkpoint's holder, or moved there): the owner's death would take
    // both, so a copy elsewhere is due at once, also for a cell without
    // periodic checkpoints whose checkpoint was kept by hand.
    let alone = c.kept.as_ref().is_some_and(|k| k.holder == c.owner);
    if c.checkpoint_interval_s == 0 && !alone {
        return false;
    }
    let interval = match c.checkpoint_interval_s {
        0 => ALONE_RETRY_S,
        s => s,
    }
    .saturating_mul(1000);
    let last = match &c.kept {
        Some(_) if alone => 0,
        Some(k) => k.taken_ms,
        None => c.created_ms,
    };
    let failed = lock(&n.keep_failed).get(&c.id).copied().unwrap_or(0);
    now >= last.max(failed).saturating_add(interval)
}

/// Why a cell is restored away from its owner.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// The owner is dead.
    Dead,
    /// The owner is alive but does not have the cell.
    Absent,
    /// The cell failed on its owner because its memory server died.
    MemoryLost,
}

impl Why {
    /// Why placement must not choose the owner.
    fn exclusion(self) -> &'static str {
        match self {
            Why::Dead => "the cell's dead owner",
            Why::Absent => "the cell's owner, which lost it",
            Why::MemoryLost => "the node where the cell lost its far memory",
        }
    }

    /// What happened to the owner, for messages.
    fn owner(self, owner: &str) -> String {
        match self {
            Why::Dead => format!("its owner {owner} died"),
            Why::Absent => format!("its owner {owner} no longer had it"),
            Why::MemoryLost => format!("it lost its far memory on {owner}"),
        }
    }
}

/// Restore cell `c` on another node from its newest kept checkpoint;
/// without one, it is lost.
async fn evacuate(n: &Arc<Inner>, c: CellRecord, why: Why) {
    let Ok(_busy) = claim(n, &c.id) else {
        return;
    };
    match restore(n, &c, why).await {
        Ok(()) => n.metrics.evacuation("restored"),
        Err(Gone::Lost(e)) => {
            n.metrics.evacuation("lost");
            tracing::warn!(cell = %c.id, "lost: {e}");
        }
        // Tried again every tick: logged only when asked for.
        Err(Gone::Retry(e)) => tracing::debug!(cell = %c.id, "evacuation waits: {e}"),
    }
}

/// Why a restoration did not happen.
enum Gone {
    /// The cell cannot come back (its record now says `lost`).
    Lost(String),
    /// Not now (the store, no live node); the next tick tries again.
    Retry(String),
}

async fn lose(n: &Inner, c: &CellRecord, error: String) -> Gone {
    let r = update(n, &c.id, |x| {
        let same = x.owner == c.owner && x.generation == c.generation && !x.state.ended();
        if same {
            x.state = CellState::Lost {
                error: error.clone(),
            };
        }
        same
    })
    .await;
    if let Ok(Some(_)) = r {
        n.events.send(Event::Lost {
            cell: c.id.clone(),
            error: error.clone(),
        });
    }
    Gone::Lost(error)
}

/// How many nodes one restoration tries before the cell counts as lost.
const RESTORE_TRIES: usize = 3;

async fn restore(n: &Arc<Inner>, c: &CellRecord, why: Why) -> Result<(), Gone> {
    let Some(kept) = c.kept.clone() else {
        return Err(lose(
            n,
            c,
            format!(
                "{} and it had no kept checkpoint (its checkpoint interval is {} s)",
                why.owner(&c.owner),
                c.checkpoint_interval_s
            ),
        )
        .await);
    };
    // The record as this restoration last left it.
    let mut now = c.clone();
    let mut exclude = vec![(c.owner.clone(), why.exclusion())];
    let mut failed: Vec<String> = Vec::new();
    for _ in 0..RESTORE_TRIES {
        let (nodes, cells) = snapshot(n).await.map_err(|e| Gone::Retry(e.1))?;
        let Some(holder) = nodes.iter().find(|x| x.name == kept.holder && x.alive) else {
            let error = format!(
                "{} and {}, the holder of its kept checkpoint, is dead",
                why.owner(&c.owner),
                kept.holder
            );
            return Err(lose(n, &now, error).await);
        };
        // A far-memory cell pages to a live server again (its old one may
        // be the node that died), which is then no host for it.
        let server = match &c.far {
            Some(f) => {
                let room = crate::far::room(f, c.max_memory);
                let any = roam_api::planner::FarPlace {
                    server: None,
                    ..f.clone()
                };
                // The server that failed the cell may not look dead yet.
                let failed: Vec<(&str, &str)> = match why {
                    Why::MemoryLost => f
                        .server
                        .iter()
                        .map(|s| (s.as_str(), "it failed the cell"))
                        .collect(),
                    Why::Dead | Why::Absent => Vec::new(),
                };
                match crate::far::pick_server(&nodes, &any, room, &failed) {
                    Ok(s) => Some(s.clone()),
                    Err(e) => {
                        let error = format!("{}, and {}", why.owner(&c.owner), e.1);
                        return Err(lose(n, &now, error).await);
                    }
                }
            }
            None => None,
        };
        let mut exclude_here = exclude.clone();
        if let Some(s) = &server {
            exclude_here.push((s.name.clone(), crate::far::HOLDS_PAGES));
        }
        let want = Want {
            cell: Some(c.id.clone()),
            max_memory: crate::far::host_memory(c.far.as_ref(), c.max_memory),
            exclude: exclude_here,
            ..Want::default()
        };
        let ctx = Ctx::new(&nodes, &cells, &want);
        n.history.decided(crate::history::Decision::new(
            format!("restore ({})", why.owner(&c.owner)),
            Some(c.id.clone()),
            "evacuate",
            &policy::explain(&policy::Evacuate, &ctx),
        ));
        let target: NodeRecord = match policy::place(&policy::Evacuate, &ctx) {
            Ok(t) => t.clone(),
            // No node at all yet: wait for one. After failures: lost.
            Err(e) if failed.is_empty() => return Err(Gone::Retry(e.to_string())),
            Err(_) => break,
        };
        let far = c.far.as_ref().zip(server.as_ref());
        let far = far.map(|(f, s)| (crate::far::request(f, s), s.name.clone()));
        match restore_on(n, &now, &c.owner, &kept, holder, &target, far).await? {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(cell = %c.id, node = %target.name, "restore failed: {e}");
                failed.push(format!("on {}: {e}", target.name));
                exclude.push((target.name.clone(), "a restore of the cell failed there"));
                now.owner = target.name.clone();
                now.generation += 1;
                now.state = CellState::Restoring;
            }
        }
    }
    let error = format!(
        "{} and restoring it from the checkpoint kept on {} failed {}: {}",
        why.owner(&c.owner),
        kept.holder,
        if failed.len() == 1 {
            "once"
        } else {
            "on every node tried"
        },
        failed.join("; ")
    );
    Err(lose(n, &now, error).await)
}

/// Give cell `c` (its record as last seen), whose owner `dead` died, to
/// `target` and restore it there from `kept`, held by `holder`. The outer error: the record changed
/// meanwhile or the store failed (try again next tick); the inner one: the
/// target refused or failed the restore (ownership stays with it, so its
/// copy, should it have started after all, is fenced like any other).
async fn restore_on(
    n: &Arc<Inner>,
    c: &CellRecord,
    dead: &str,
    kept: &roam_cluster::Kept,
    holder: &NodeRecord,
    target: &NodeRecord,
    far: Option<(roam_api::types::FarRequest, String)>,
) -> Result<Result<(), String>, Gone> {
    // Take ownership for the target first: from here on the dead owner,
    // should it come back, is told to stop the cell.
    let generation = c.generation + 1;
    let (far, server) = far.unzip();
    let moved = update(n, &c.id, |x| {
        let same = x.owner == c.owner && x.generation == c.generation && !x.state.ended();
        if same {
            x.owner = target.name.clone();
            x.generation = generation;
            x.state = CellState::Restoring;
            if let (Some(f), Some(s)) = (x.far.as_mut(), &server) {
                f.server = Some(s.clone());
            }
        }
        same
    })
    .await
    .map_err(|e| Gone::Retry(e.1))?;
    if moved.is_none() {
        return Err(Gone::Retry("the cell changed meanwhile".into()));
    }
    let started = async {
        let module = ensure_module(n, target, &c.module).await?;
        if holder.name != target.name {
            // The holder hands this version to the target only.
            let grant = KeptGrant {
                node: target.name.clone(),
                access: KeptAccess::Read,
                snapshot: Some(kept.snapshot.clone()),
            };
            grant_on(n, holder, &c.id, &grant).await.map_err(|e| e.1)?;
        }
        let client = n.node_client(target).map_err(|e| e.to_string())?;
        client
            .restore(&RestoreRequest {
                id: c.id.clone(),
                module,
                args: c.args.clone(),
                env: c.env.clone(),
                dirs: c.dirs.clone(),
                max_memory: c.max_memory,
                service: c.service.clone(),
                generation,
                holder: holder.api.clone(),
                snapshot: kept.snapshot.clone(),
                cpu: Default::default(),
                far,
            })
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    if let Err(e) = started {
        return Ok(Err(e));
    }
    let _ = update(n, &c.id, |x| {
        let ok =
            x.owner == target.name && x.generation == generation && x.state == CellState::Restoring;
        if ok {
            x.state = CellState::Running;
        }
        ok
    })
    .await;
    n.events.send(Event::Restore {
        cell: c.id.clone(),
        from: dead.to_string(),
        to: target.name.clone(),
        generation,
        snapshot: kept.snapshot.clone(),
    });
    Ok(Ok(()))
}
