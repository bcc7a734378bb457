//! The cluster commands: the same `roam launch/cells/migrate/logs/kill` as
//! against one node, but through the planner (no `--node`; `main` chooses),
//! plus `roam nodes`, `roam drain` and `roam undrain`. Nodes are named, not
//! addressed.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use roam_api::planner::{
    CellRecord, CellState, DrainResponse, FarPlace, MoveRequest, MoveResponse, NodeRecord,
    NodeState, PlaceRequest, PoliciesResponse,
};
use roam_api::PlannerClient;
use roam_node::Client;

use crate::auth_args::ClientAuthArgs;
use crate::follow::{follow, print_summary};
use crate::human::{ago, bytes};
use crate::node_args::{
    CellsArgs, DrainArgs, KillArgs, LaunchArgs, LogsArgs, MigrateArgs, NodesArgs, PlannerArg,
    PolicyArgs, SlowdownsArgs, UndrainArgs,
};
use crate::runtime;

pub(crate) fn planner(p: &PlannerArg, a: &ClientAuthArgs, what: &str) -> Result<PlannerClient> {
    Ok(PlannerClient::with_auth(p.get(what)?, &a.load()?)?)
}

/// A node's state, as the tables write it.
pub(crate) fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Ready => "ready",
        NodeState::Draining => "draining",
    }
}

fn state_word(s: &CellState) -> String {
    match s {
        CellState::Placing => "placing".into(),
        CellState::Running => "running".into(),
        CellState::Migrating { to } => format!("→ {to}"),
        CellState::Restoring => "restoring".into(),
        CellState::Exited { code } => format!("exited({code})"),
        CellState::Failed { .. } => "failed".into(),
        CellState::Killed => "killed".into(),
        CellState::Lost { .. } => "lost".into(),
    }
}

/// `roam launch` without `--node`.
pub fn launch(a: LaunchArgs) -> Result<i32> {
    if a.cpu_weight.is_some() || a.cpu_max.is_some() {
        anyhow::bail!(
            "--cpu-weight and --cpu-max need --node: the planner does not carry CPU settings \
             (its cells get their node's defaults, roam node --cell-cpu-weight and --cell-cpu-max)"
        );
    }
    let (module, args, env) = a.parts()?;
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam launch")?;
        let m = p.upload_module(module).await?;
        let cell = p
            .place(&PlaceRequest {
                module: m.hash,
                args,
                env,
                dirs: a.dirs.clone(),
                max_memory: a.max_memory,
                service: a.service.clone(),
                node: a.on.clone(),
                checkpoint_interval_s: a.checkpoint_interval,
                far: a.local_memory.map(|local_memory| FarPlace {
                    local_memory,
                    eviction: a.eviction.clone(),
                    server: a.memory_server.clone(),
                }),
            })
            .await?;
        match &cell.far {
            Some(FarPlace {
                server: Some(server),
                local_memory,
                ..
            }) => eprintln!(
                "placed on {}, {} of its memory there and the rest on memory server {server}",
                cell.owner,
                bytes(*local_memory)
            ),
            _ => eprintln!("placed on {}", cell.owner),
        }
        println!("{}", cell.id);
        Ok(0)
    })
}

/// `roam cells` without `--node`: every cell of the cluster.
pub fn cells(a: CellsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let cells = planner(&a.planner, &a.auth, "roam cells")?.cells().await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
            return Ok(0);
        }
        println!(
            "{:<16} {:<14} {:<14} {:<20} {:>4}  {:<22} SERVICE",
            "CELL", "NODE", "STATE", "PROGRAM", "GEN", "KEPT CHECKPOINT"
        );
        for c in &cells {
            let kept = c.kept.as_ref().map_or_else(
                || "-".to_string(),
                |k| format!("{} on {}", ago(k.taken_ms), k.holder),
            );
            println!(
                "{:<16} {:<14} {:<14} {:<20} {:>4}  {:<22} {}",
                c.id,
                c.owner,
                state_word(&c.state),
                c.args.first().map_or("-", String::as_str),
                c.generation,
                kept,
                c.service.as_deref().unwrap_or("-")
            );
        }
        Ok(0)
    })
}

/// `roam migrate` without `--from`: the planner finds the cell, and the
/// node by name (or chooses one).
pub fn migrate(a: MigrateArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam migrate")?;
        let cell = p.cell(&a.cell).await?;
        let nodes = p.nodes().await?;
        let source = node_named(&nodes, &cell.owner)?;
        let r = p
            .migrate(
                &a.cell,
                &MoveRequest {
                    to: a.to.clone(),
                    mode: Some(a.mode.clone()),
                },
            )
            .await?;
        let r: MoveResponse =
            serde_json::from_value(r).context("unexpected answer from the planner to a move")?;
        let (mid, to) = (r.migration, r.to);
        let src = Client::with_auth(&source.api, &a.auth.load()?)?;
        let status = follow(&src, &mid, a.json).await?;
        if let Some(e) = status.error {
            bail!("migration of {} failed: {e}", a.cell);
        }
        if let (false, Some(s)) = (a.json, &status.summary) {
            print_summary(&a.cell, &source.name, &to, s);
        }
        Ok(0)
    })
}

fn node_named<'a>(nodes: &'a [NodeRecord], name: &str) -> Result<&'a NodeRecord> {
    nodes
        .iter()
        .find(|n| n.name == name)
        .with_context(|| format!("the planner knows no node {name:?}"))
}

/// `roam logs` without `--node`.
pub fn logs(a: LogsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let out = planner(&a.planner, &a.auth, "roam logs")?
            .logs(&a.cell)
            .await?;
        use std::io::Write;
        std::io::stdout().write_all(&out)?;
        Ok(0)
    })
}

/// `roam kill` without `--node`.
pub fn kill(a: KillArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let c = planner(&a.planner, &a.auth, "roam kill")?
            .kill(&a.cell)
            .await?;
        println!("{} killed (was on {})", c.id, c.owner);
        Ok(0)
    })
}

/// `roam nodes`.
pub fn nodes(a: NodesArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let nodes = planner(&a.planner, &a.auth, "roam nodes")?.nodes().await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&nodes)?);
            return Ok(0);
        }
        println!(
            "{:<14} {:<8} {:<9} {:<8} {:>5} {:>19} {:>5} {:>5} {:>10} {:>9}  HEARTBEAT",
            "NODE",
            "ISA",
            "STATE",
            "LIVE",
            "CORES",
            "MEMORY FREE/TOTAL",
            "LOAD",
            "CELLS",
            "GATEWAY RTT",
            "POWER"
        );
        for n in &nodes {
            let m = &n.status.machine;
            println!(
                "{:<14} {:<8} {:<9} {:<8} {:>5} {:>19} {:>5.2} {:>5} {:>11} {:>9}  {}",
                n.name,
                n.isa,
                state_name(n.state),
                if n.alive { "alive" } else { "dead" },
                m.cores,
                format!("{} / {}", bytes(m.memory_available), bytes(m.memory_total)),
                m.load1,
                n.status.cells.len(),
                gateway_rtt(n),
                n.status
                    .power
                    .map_or("-".into(), |p| roam_api::power::watts(p.watts)),
                ago(n.heartbeat_ms)
            );
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for n in &nodes {
            if let Some(m) = &n.maintenance {
                println!("{}: {}", n.name, crate::maintenance_cmd::describe(m, now));
            }
        }
        let reported: Vec<_> = nodes
            .iter()
            .filter(|n| n.alive)
            .filter_map(|n| n.status.power)
            .collect();
        if !reported.is_empty() {
            println!(
                "{} of {} live nodes report power: {} now, {} since each started",
                reported.len(),
                nodes.iter().filter(|n| n.alive).count(),
                roam_api::power::watts(reported.iter().map(|p| p.watts).sum()),
                roam_api::power::joules(reported.iter().map(|p| p.joules).sum())
            );
        }
        Ok(0)
    })
}

/// `roam policy [NAME]`: set the placement policy, then list them all with
/// the one in force marked.
pub fn policy(a: PolicyArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam policy")?;
        let v = match &a.name {
            Some(name) => {
                p.set_policies(&serde_json::json!({ "placement": name }))
                    .await?
            }
            None => p.policies().await?,
        };
        let r: PoliciesResponse =
            serde_json::from_value(v).context("unexpected answer from the planner")?;
        for x in &r.available {
            let mark = if x.name == r.placement { "*" } else { " " };
            println!("{mark} {:<20} {}", x.name, x.description);
        }
        if let Some(name) = &a.name {
            println!("placement policy is now {name}");
        }
        Ok(0)
    })
}

/// `roam slowdowns`: each program's CPU time per ISA and the slowdowns
/// between ISAs, as the planner learned them.
pub fn slowdowns(a: SlowdownsArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam slowdowns")?;
        let t = p.slowdowns().await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&t)?);
            return Ok(0);
        }
        if t.programs.is_empty() {
            println!("nothing learned yet: the planner learns from the runs it sees end");
            return Ok(0);
        }
        println!(
            "{:<20} {:<14} {:<40} SLOWDOWN",
            "PROGRAM", "MODULE", "CPU PER RUN"
        );
        for (module, prog) in &t.programs {
            let times: Vec<String> = prog
                .isas
                .iter()
                .map(|(isa, e)| {
                    format!(
                        "{isa} {} ({:.1} runs)",
                        crate::human::duration(Duration::from_secs_f64(e.cpu_ms / 1000.0)),
                        e.runs
                    )
                })
                .collect();
            let ratios: Vec<String> = prog
                .slowdowns()
                .into_iter()
                .map(|(slow, fast, x)| format!("{slow} ÷ {fast} {x:.2}×"))
                .collect();
            println!(
                "{:<20} {:<14} {:<40} {}",
                prog.name,
                &module[..module.len().min(12)],
                times.join(", "),
                if ratios.is_empty() {
                    "-".into()
                } else {
                    ratios.join(", ")
                }
            );
        }
        Ok(0)
    })
}

/// A node's round trip to its gateway for people: `4.1 ms`, `down`, `-`.
fn gateway_rtt(n: &NodeRecord) -> String {
    match &n.status.gateway {
        None => "-".into(),
        Some(g) if !g.connected => "down".into(),
        Some(g) => g.rtt_us.map_or("?".into(), |us| {
            crate::human::duration(Duration::from_micros(us))
        }),
    }
}

/// `roam undrain NODE`: the node takes new cells again.
pub fn undrain(a: UndrainArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam undrain")?;
        let node = p.undrain(&a.node).await?;
        println!(
            "{} takes cells again ({})",
            node.name,
            if node.alive { "alive" } else { "dead" }
        );
        Ok(0)
    })
}

/// `roam drain NODE`: no new cells there, and every cell moved away; waits
/// until the node is empty, reporting each move.
pub fn drain(a: DrainArgs) -> Result<i32> {
    runtime()?.block_on(async move {
        let p = planner(&a.planner, &a.auth, "roam drain")?;
        let started: DrainResponse = serde_json::from_value(p.drain(&a.node).await?)
            .context("unexpected answer from the planner to a drain")?;
        println!(
            "draining {}: no new cells there; moving its {} cells",
            a.node,
            started.moves.len()
        );
        for m in &started.moves {
            match (&m.to, &m.error) {
                (_, Some(e)) => println!("  {}: cannot move: {e}", m.cell),
                (Some(to), None) => println!("  {} → {to}", m.cell),
                (None, None) => println!("  {}: waiting", m.cell),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(a.timeout);
        let mut reported = std::collections::BTreeSet::new();
        // The drained node runs each move: its migrations say how they end.
        let source = node_named(&p.nodes().await?, &a.node)?.api.clone();
        let src = Client::with_auth(&source, &a.auth.load()?)?;
        let mut failed = 0;
        loop {
            for m in &started.moves {
                let Some(mid) = &m.migration else { continue };
                if reported.contains(&m.cell) {
                    continue;
                }
                if let Ok(st) = src.migration(mid).await {
                    if let (true, Some(e)) = (st.done, &st.error) {
                        println!("cannot move {}: {e}", m.cell);
                        reported.insert(m.cell.clone());
                        failed += 1;
                    }
                }
            }
            let cells: Vec<CellRecord> = p.cells().await?;
            let mut left = 0;
            for c in cells.iter().filter(|c| !c.state.ended()) {
                if c.owner == a.node {
                    left += 1;
                } else if started.moves.iter().any(|m| m.cell == c.id)
                    && reported.insert(c.id.clone())
                {
                    println!("moved {} → {}", c.id, c.owner);
                }
            }
            if left == 0 {
                println!("{} is drained", a.node);
                return Ok(0);
            }
            if left <= failed {
                bail!(
                    "{left} cells could not leave {} (above); it takes no new cells, and `roam migrate` can move them",
                    a.node
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{left} cells are still on {} after {} s; the moves go on (see `roam cells`)",
                    a.node,
                    a.timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}
