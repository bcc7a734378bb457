//! The energy policies on hand-made cluster views: the placements of
//! `energy-balanced` and `energy-unbalanced`, and each rule of the
//! leader's decision to move a busy cell to a cheaper node.

use super::*;
use crate::policy::{place, Want};
use roam_api::planner::CellUsage;
use roam_api::power::PowerReport;

/// A node of `cores` cores with the power model `model` (`None`: none).
fn node(name: &str, cores: usize, model: Option<&str>) -> NodeRecord {
    let mut n = crate::policy::tests::node(name, true, cores, 8);
    n.status.power = model.map(|m| PowerReport {
        model: m.parse().unwrap(),
        watts: 0.0,
        joules: 0.0,
    });
    n
}

/// A server: work costs 12 J per unit.
fn server() -> NodeRecord {
    node("server", 4, Some("idle=50,busy=12"))
}

/// A board: a core does a quarter of the server's work per second on
/// 1 W, so work costs 1 / 0.25 = 4 J per unit.
fn board(cores: usize) -> NodeRecord {
    node("board", cores, Some("idle=2,busy=1,speed=0.25"))
}

fn cell(id: &str, owner: &str) -> CellRecord {
    crate::policy::tests::cell(id, owner, CellState::Running)
}

fn want(cell: Option<&str>) -> Want {
    Want {
        cell: cell.map(str::to_string),
        ..Want::default()
    }
}

/// `n` with cell `id`'s CPU counter at `cpu_ms` in a heartbeat at `at`.
fn beat(mut n: NodeRecord, id: &str, at: u64, cpu_ms: u64) -> NodeRecord {
    n.heartbeat_ms = at;
    n.status.usage = vec![CellUsage {
        cell: id.into(),
        cpu_ms,
        memory_bytes: 1 << 20,
    }];
    n
}

#[test]
fn balanced_spreads_first_and_breaks_ties_on_energy() {
    let nodes = [server(), board(4), node("plain", 4, None)];
    let w = want(None);
    // All empty: equally loaded, the board's work is cheapest.
    let ctx = Ctx::new(&nodes, &[], &w);
    assert_eq!(place(&EnergyBalanced, &ctx).unwrap().name, "board");
    // One cell on the board: the server is now less loaded, and it beats
    // the node that declares no model.
    let cells = [cell("a", "board")];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&EnergyBalanced, &ctx).unwrap().name, "server");
}

#[test]
fn unbalanced_packs_the_cheapest_cores_first_then_spreads() {
    let nodes = [server(), board(2)];
    let w = want(None);
    let mut cells = vec![];
    let mut placed = vec![];
    for i in 0..8 {
        let ctx = Ctx::new(&nodes, &cells, &w);
        let to = place(&EnergyUnbalanced, &ctx).unwrap().name.clone();
        cells.push(cell(&format!("c{i}"), &to));
        placed.push(to);
    }
    // Two on the board's two cores, four on the server's, then the least
    // loaded per core, the cheaper on a tie.
    assert_eq!(
        placed,
        ["board", "board", "server", "server", "server", "server", "board", "server"]
    );
}

#[test]
fn unbalanced_skips_dead_and_draining_nodes() {
    let mut b = board(2);
    b.state = roam_cluster::NodeState::Draining;
    let nodes = [server(), b];
    let w = want(None);
    let ctx = Ctx::new(&nodes, &[], &w);
    assert_eq!(place(&EnergyUnbalanced, &ctx).unwrap().name, "server");
}

/// Judge cell `c1`, owned by the server, over `nodes` at `t`.
fn judge(tr: &mut Tracker, t: u64, nodes: &[NodeRecord], cells: &[CellRecord]) -> Verdict {
    let w = want(Some("c1"));
    let ctx = Ctx::new(nodes, cells, &w);
    let c = cells.iter().find(|c| c.id == "c1").unwrap();
    tr.judge(t, c, &ctx, || None)
}

#[test]
fn a_busy_cell_moves_to_a_cheaper_free_core_after_the_hold() {
    let mut tr = Tracker::default();
    let cells = [cell("c1", "server")];
    // A full core busy: 1,000 ms of CPU per second.
    let at = |t: u64| [beat(server(), "c1", t, t), board(2)];
    assert_eq!(
        judge(&mut tr, 0, &at(0), &cells),
        Verdict::Stay("not CPU-busy".into()),
        "one sample gives no rate"
    );
    let v = judge(&mut tr, 2_000, &at(2_000), &cells);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("free for 0 ms")),
        "{v:?}"
    );
    // Held 2 s, and 4 s of run so far saves (12 − 4) · 4 = 32 J against a
    // move of 2 s · 13 W = 26 J.
    let v = judge(&mut tr, 4_000, &at(4_000), &cells);
    let Verdict::Move {
        to,
        from_j,
        to_j,
        saves_j,
    } = v
    else {
        panic!("{v:?}")
    };
    assert_eq!((to.as_str(), from_j, to_j), ("board", 12.0, 4.0));
    assert!((saves_j - 6.0).abs() < 1e-9, "{saves_j}");
}

#[test]
fn a_young_cell_stays_until_the_saving_beats_the_move() {
    let mut tr = Tracker::default();
    let cells = [cell("c1", "server")];
    // A quarter of a core: saves a quarter as fast.
    let at = |t: u64| [beat(server(), "c1", t, t / 4), board(2)];
    judge(&mut tr, 0, &at(0), &cells);
    judge(&mut tr, 1_000, &at(1_000), &cells);
    let v = judge(&mut tr, 4_000, &at(4_000), &cells);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("does not pay yet")),
        "{v:?}"
    );
    // 8 s of run: 0.25 · 8 · 8 = 16 J < 26 J; 14 s: 28 J > 26 J.
    let v = judge(&mut tr, 8_000, &at(8_000), &cells);
    assert!(matches!(&v, Verdict::Stay(_)), "{v:?}");
    let v = judge(&mut tr, 14_000, &at(14_000), &cells);
    assert!(matches!(&v, Verdict::Move { .. }), "{v:?}");
}

#[test]
fn idle_cells_full_boards_and_small_gains_stay() {
    let cells = [
        cell("c1", "server"),
        cell("b1", "board"),
        cell("b2", "board"),
    ];
    // Idle: 10 ms of CPU in 2 s.
    let mut tr = Tracker::default();
    let idle = |t: u64| [beat(server(), "c1", t, t / 200), board(2)];
    judge(&mut tr, 0, &idle(0), &cells[..1]);
    let v = judge(&mut tr, 2_000, &idle(2_000), &cells[..1]);
    assert_eq!(v, Verdict::Stay("not CPU-busy".into()));
    // Busy, but both board cores are taken.
    let mut tr = Tracker::default();
    let busy = |t: u64| [beat(server(), "c1", t, t), board(2)];
    judge(&mut tr, 0, &busy(0), &cells);
    let v = judge(&mut tr, 2_000, &busy(2_000), &cells);
    assert_eq!(v, Verdict::Stay("no cheaper node has a free core".into()));
    // Busy, a free core, but only 10 % cheaper.
    let mut tr = Tracker::default();
    let near = node("board", 2, Some("idle=2,busy=10.8"));
    let close = |t: u64| [beat(server(), "c1", t, t), near.clone()];
    judge(&mut tr, 0, &close(0), &cells[..1]);
    let v = judge(&mut tr, 2_000, &close(2_000), &cells[..1]);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("cheaper by 10 % only")),
        "{v:?}"
    );
    // The owner declares no model: nothing to compare.
    let mut tr = Tracker::default();
    let bare = |t: u64| [beat(node("server", 4, None), "c1", t, t), board(2)];
    judge(&mut tr, 0, &bare(0), &cells[..1]);
    let v = judge(&mut tr, 2_000, &bare(2_000), &cells[..1]);
    assert_eq!(v, Verdict::Stay("its owner declares no power model".into()));
}

#[test]
fn a_moved_cell_cools_down_and_its_counter_starts_again() {
    let mut tr = Tracker::default();
    let cells = [cell("c1", "server")];
    let at = |t: u64| [beat(server(), "c1", t, t), board(2)];
    for t in (0..=20_000).step_by(2_000) {
        judge(&mut tr, t, &at(t), &cells);
    }
    tr.moving("c1", 20_000);
    // The move failed (the cell is still on the server): the hold starts
    // again, and no new move within the cool-down of max(5 s, 5 × 2 s).
    let v = judge(&mut tr, 24_000, &at(24_000), &cells);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("free for 0 ms")),
        "{v:?}"
    );
    let v = judge(&mut tr, 26_000, &at(26_000), &cells);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("moved 6000 ms ago")),
        "{v:?}"
    );
    let v = judge(&mut tr, 30_000, &at(30_000), &cells);
    assert!(matches!(&v, Verdict::Move { .. }), "{v:?}");
    // On a new owner (a new generation) the leader starts watching afresh:
    // the CPU counter, which restarts from 0 there, is a baseline.
    let mut moved = cell("c1", "board");
    moved.generation = 2;
    let nodes = [server(), beat(board(2), "c1", 32_000, 5)];
    let v = judge(&mut tr, 32_000, &nodes, std::slice::from_ref(&moved));
    assert_eq!(v, Verdict::Stay("not CPU-busy".into()));
}

#[test]
fn a_cell_on_its_way_takes_the_free_core_it_goes_to() {
    // b1 is moving to the board's only core: a second busy cell must not
    // be sent there too.
    let mut b1 = cell("b1", "server");
    b1.state = CellState::Migrating { to: "board".into() };
    let cells = [cell("c1", "server"), b1];
    let mut tr = Tracker::default();
    let at = |t: u64| [beat(server(), "c1", t, t), board(1)];
    judge(&mut tr, 0, &at(0), &cells);
    let v = judge(&mut tr, 2_000, &at(2_000), &cells);
    assert_eq!(v, Verdict::Stay("no cheaper node has a free core".into()));
}

#[test]
fn balanced_moves_a_busy_cell_only_when_it_evens_the_load_out() {
    let a = |t: u64| beat(node("a", 2, Some("idle=50,busy=12")), "c1", t, t);
    let b = node("b", 2, Some("idle=50,busy=12"));
    let judge_b = |tr: &mut Tracker, t: u64, nodes: &[NodeRecord], cells: &[CellRecord]| {
        let w = want(Some("c1"));
        let ctx = Ctx::new(nodes, cells, &w);
        tr.judge_balanced(t, &cells[0], &ctx, || None)
    };
    // Three cells on a's two cores, none on b: 1.5 per core against 0.5.
    let three = [cell("c1", "a"), cell("c2", "a"), cell("c3", "a")];
    let mut tr = Tracker::default();
    judge_b(&mut tr, 0, &[a(0), b.clone()], &three);
    let v = judge_b(&mut tr, 2_000, &[a(2_000), b.clone()], &three);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("for 0 ms")),
        "{v:?}"
    );
    // Held, but it has run 4 s here, less than five 2-second moves.
    let v = judge_b(&mut tr, 4_000, &[a(4_000), b.clone()], &three);
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("ran 4000 ms")),
        "{v:?}"
    );
    let v = judge_b(&mut tr, 10_000, &[a(10_000), b.clone()], &three);
    assert_eq!(
        v,
        Verdict::Balance {
            to: "b".into(),
            from_per_core: 1.5,
            to_per_core: 0.5
        }
    );
    // Two on a, one on b: moving one would only swap the imbalance.
    let two = [cell("c1", "a"), cell("c2", "a"), cell("c3", "b")];
    let mut tr = Tracker::default();
    judge_b(&mut tr, 0, &[a(0), b.clone()], &two);
    let v = judge_b(&mut tr, 2_000, &[a(2_000), b.clone()], &two);
    assert_eq!(
        v,
        Verdict::Stay("the load is as even as a move can make it".into())
    );
}

#[test]
fn both_policies_are_registered() {
    for name in ["energy-balanced", "energy-unbalanced"] {
        assert_eq!(crate::policy::by_name(name).unwrap().name(), name);
    }
}
