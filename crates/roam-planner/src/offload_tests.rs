//! `offload-by-slowdown` on hand-made cluster views: where it places, which
//! cell the leader offloads and brings back, and the damping.

use super::*;
use crate::policy::{place, Want};
use roam_api::power::PowerReport;

/// A node of `cores` cores and ISA `isa` with declared speed `speed`.
fn node(name: &str, isa: &str, cores: usize, speed: f64) -> NodeRecord {
    let mut n = crate::policy::tests::node(name, true, cores, 8);
    n.isa = isa.into();
    n.status.power = Some(PowerReport {
        model: format!("idle=10,busy=5,speed={speed}").parse().unwrap(),
        watts: 0.0,
        joules: 0.0,
    });
    n
}

fn server() -> NodeRecord {
    node("server", "x86_64", 1, 1.0)
}

fn board() -> NodeRecord {
    node("board", "aarch64", 1, 0.1)
}

/// A running cell of program `module` on `owner`.
fn cell(id: &str, owner: &str, module: &str) -> CellRecord {
    let mut c = crate::policy::tests::cell(id, owner, CellState::Running);
    c.module = module.into();
    c.args = vec![module.into()];
    c
}

/// A table where `ep` is 3× slower on the board and `cg` 30×.
fn table() -> Table {
    let mut t = Table::default();
    for (m, board_ms) in [("ep", 3000), ("cg", 30000)] {
        t.learn(m, m, &[("x86_64".into(), 1000)]);
        t.learn(m, m, &[("aarch64".into(), board_ms)]);
    }
    t
}

fn no_busy(_: &str) -> bool {
    false
}

fn never_moved(_: &str) -> Option<(u64, Option<Cost>)> {
    None
}

/// The tracker's moves at `now`, after it saw the same view `HOLD_MS`
/// before.
fn judge_held(t: &mut Tracker, ctx: &Ctx, table: &Table, now: u64) -> Vec<Move> {
    assert!(t
        .judge(now - HOLD_MS, ctx, table, &no_busy, &never_moved)
        .is_empty());
    t.judge(now, ctx, table, &no_busy, &never_moved)
}

#[test]
fn jobs_start_on_the_fastest_node_even_one_over_when_a_board_is_free() {
    let nodes = [server(), board()];
    let w = Want::default();
    let ctx = Ctx::new(&nodes, &[], &w);
    assert_eq!(place(&OffloadBySlowdown, &ctx).unwrap().name, "server");
    // The server's core is taken, the board's free: still the server (the
    // leader then chooses which of the two leaves).
    let cells = [cell("a", "server", "ep")];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&OffloadBySlowdown, &ctx).unwrap().name, "server");
    // Two over: the board's free core goes to the new cell.
    let cells = [cell("a", "server", "ep"), cell("b", "server", "cg")];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&OffloadBySlowdown, &ctx).unwrap().name, "board");
    // Everything full: fewest cells per unit of speed, the server.
    let cells = [
        cell("a", "server", "ep"),
        cell("b", "server", "cg"),
        cell("c", "board", "ep"),
    ];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&OffloadBySlowdown, &ctx).unwrap().name, "server");
}

#[test]
fn the_cell_that_loses_least_is_offloaded_once_the_overload_held() {
    let nodes = [server(), board()];
    let cells = [cell("a", "server", "cg"), cell("b", "server", "ep")];
    let w = Want::default();
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    // Not before the overload has held for HOLD_MS.
    assert!(t
        .judge(10_000, &ctx, &table(), &no_busy, &never_moved)
        .is_empty());
    assert!(t
        .judge(10_000 + HOLD_MS - 1, &ctx, &table(), &no_busy, &never_moved)
        .is_empty());
    let moves = t.judge(10_000 + HOLD_MS, &ctx, &table(), &no_busy, &never_moved);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].cell.as_str(), moves[0].to.as_str()),
        ("b", "board")
    );
    assert!(moves[0].what.contains("3.0× slower"), "{}", moves[0].what);
    assert!(moves[0].what.contains("learned"), "{}", moves[0].what);
}

#[test]
fn no_offload_without_a_free_slower_core_nor_of_a_busy_or_cooling_cell() {
    let w = Want::default();
    let mut t = Tracker::default();
    // The board is full.
    let nodes = [server(), board()];
    let cells = [
        cell("a", "server", "cg"),
        cell("b", "server", "ep"),
        cell("c", "board", "ep"),
    ];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert!(judge_held(&mut t, &ctx, &table(), 100_000).is_empty());
    // Only a faster node is free: never offload upwards.
    let nodes = [server(), node("big", "x86_64", 1, 2.0)];
    let cells = [cell("a", "server", "cg"), cell("b", "server", "ep")];
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    // "big" takes one back instead: on the same ISA, its declared speed
    // (2× the server's) is what a cell gains there.
    let moves = judge_held(&mut t, &ctx, &table(), 100_000);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].to, "big");
    assert!(moves[0].what.starts_with("bring back"), "{}", moves[0].what);
    assert!(
        moves[0].what.contains("2.0× faster (declared speeds)"),
        "{}",
        moves[0].what
    );
    // The better victim is busy (a kept checkpoint): the other one goes.
    let nodes = [server(), board()];
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    t.judge(0, &ctx, &table(), &|c| c == "b", &never_moved);
    let moves = t.judge(HOLD_MS, &ctx, &table(), &|c| c == "b", &never_moved);
    assert_eq!(moves[0].cell, "a");
    // It moved a moment ago: it cools down.
    let mut t = Tracker::default();
    let recent = |c: &str| (c == "b").then_some((HOLD_MS - 10, None));
    t.judge(0, &ctx, &table(), &no_busy, &recent);
    let moves = t.judge(HOLD_MS, &ctx, &table(), &no_busy, &recent);
    assert_eq!(moves[0].cell, "a");
}

#[test]
fn the_cell_that_gains_most_comes_back_to_a_free_fast_core() {
    let nodes = [server(), node("board", "aarch64", 2, 0.1)];
    let cells = [cell("a", "board", "ep"), cell("b", "board", "cg")];
    let w = Want::default();
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    let moves = judge_held(&mut t, &ctx, &table(), 100_000);
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].cell.as_str(), moves[0].to.as_str()),
        ("b", "server")
    );
    assert!(moves[0].what.contains("30.0× faster"), "{}", moves[0].what);
    // Not when it would gain too little.
    let mut flat = Table::default();
    for isa in ["x86_64", "aarch64"] {
        flat.learn("ep", "ep", &[(isa.into(), 1000)]);
        flat.learn("cg", "cg", &[(isa.into(), 1000)]);
    }
    let mut t = Tracker::default();
    assert!(judge_held(&mut t, &ctx, &flat, 100_000).is_empty());
}

#[test]
fn unknown_programs_are_judged_by_the_median_then_the_declared_speeds() {
    let nodes = [server(), board()];
    let cells = [cell("a", "server", "new1"), cell("b", "server", "new2")];
    let w = Want::default();
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    let moves = judge_held(&mut t, &ctx, &Table::default(), 100_000);
    // Both at the declared 10×: the first found goes.
    assert_eq!(moves.len(), 1);
    assert!(moves[0].what.contains("10.0× slower"), "{}", moves[0].what);
    assert!(
        moves[0].what.contains("declared speeds"),
        "{}",
        moves[0].what
    );
    // A known 3× program beats an unknown one at the median (the upper
    // one of 3× and 30×).
    let cells = [cell("a", "server", "new1"), cell("b", "server", "ep")];
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    let moves = judge_held(&mut t, &ctx, &table(), 100_000);
    assert_eq!(moves[0].cell, "b");
}

#[test]
fn a_state_that_breaks_starts_its_hold_again() {
    let nodes = [server(), board()];
    let w = Want::default();
    let over = [cell("a", "server", "cg"), cell("b", "server", "ep")];
    let calm = [cell("a", "server", "cg"), cell("b", "board", "ep")];
    let mut t = Tracker::default();
    t.judge(
        0,
        &Ctx::new(&nodes, &over, &w),
        &table(),
        &no_busy,
        &never_moved,
    );
    t.judge(
        HOLD_MS / 2,
        &Ctx::new(&nodes, &calm, &w),
        &table(),
        &no_busy,
        &never_moved,
    );
    // Over again: the hold counts from here.
    let ctx = Ctx::new(&nodes, &over, &w);
    assert!(t
        .judge(HOLD_MS, &ctx, &table(), &no_busy, &never_moved)
        .is_empty());
    assert_eq!(
        t.judge(2 * HOLD_MS, &ctx, &table(), &no_busy, &never_moved)
            .len(),
        1
    );
}

#[test]
fn a_cell_migrating_away_is_not_a_reason_to_send_another() {
    let nodes = [server(), node("board", "aarch64", 2, 0.1)];
    let w = Want::default();
    // Two cells on the server's one core, one of them already on its way
    // to the board: the server is not over any more.
    let mut leaving = cell("b", "server", "ep");
    leaving.state = CellState::Migrating { to: "board".into() };
    let cells = [cell("a", "server", "cg"), leaving];
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    assert!(judge_held(&mut t, &ctx, &table(), 100_000).is_empty());
}

#[test]
fn a_board_without_the_memory_for_a_cell_does_not_take_it() {
    let mut small = board();
    small.status.machine.memory_available = 256 << 20;
    let nodes = [server(), small];
    let mut big = cell("b", "server", "ep");
    big.max_memory = Some(512 << 20);
    let mut fits = cell("a", "server", "cg");
    fits.max_memory = Some(128 << 20);
    let cells = [fits, big];
    let w = Want::default();
    let ctx = Ctx::new(&nodes, &cells, &w);
    let mut t = Tracker::default();
    // ep loses less, but only cg fits: cg goes.
    let moves = judge_held(&mut t, &ctx, &table(), 100_000);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(moves[0].cell, "a");
}
