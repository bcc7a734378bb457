//! The follow-the-client decision on hand-made cluster views: each rule of
//! `follow.rs` (traffic, gain, hold, cool-down, the cost of the move) and
//! the placement policy.

use super::*;
use crate::policy::{place, Want};
use roam_api::planner::{GatewayPath, ServiceTraffic};

const GW: &str = "gw-00000000000000a1";

fn node(name: &str, gw: &str, rtt_us: Option<u64>) -> NodeRecord {
    let mut n = crate::policy::tests::node(name, true, 4, 8);
    n.status.gateway = Some(GatewayPath {
        // Each node dials the gateway through its own path; the id the
        // gateway answers with says it is the same one.
        address: format!("{name}.path:7800"),
        id: Some(gw.into()),
        connected: true,
        rtt_us,
        services: vec![],
    });
    n
}

fn serving(mut n: NodeRecord, frames: u64) -> NodeRecord {
    n.status.gateway.as_mut().unwrap().services = vec![ServiceTraffic {
        service: "kv".into(),
        cell: "c1".into(),
        conns: 4,
        frames,
        bytes: frames * 40,
    }];
    n
}

fn cell(owner: &str, generation: u64) -> CellRecord {
    CellRecord {
        id: "c1".into(),
        module: "0".repeat(64),
        args: vec!["kv".into()],
        env: vec![],
        dirs: vec![],
        max_memory: None,
        service: Some("kv".into()),
        owner: owner.into(),
        generation,
        state: CellState::Running,
        checkpoint_interval_s: 0,
        kept: None,
        created_ms: 0,
        handoff: None,
        far: None,
    }
}

fn want() -> Want {
    Want {
        cell: Some("c1".into()),
        ..Want::default()
    }
}

/// Judge `c` over `nodes` at `t`; `last` is the cell's newest finished
/// move, as the leader would read it from its history.
fn look(
    tr: &mut Tracker,
    t: u64,
    c: &CellRecord,
    nodes: &[NodeRecord],
    last: Option<(u64, Option<Cost>)>,
) -> Verdict {
    let cells = [c.clone()];
    let w = want();
    let ctx = Ctx::new(nodes, &cells, &w);
    tr.judge(t, c, &ctx, || last)
}

/// Judge `c` over `nodes` at `t`, with no move ended before.
fn judge(tr: &mut Tracker, t: u64, c: &CellRecord, nodes: &[NodeRecord]) -> Verdict {
    look(tr, t, c, nodes, None)
}

fn is_move(v: &Verdict, to: &str) -> bool {
    matches!(v, Verdict::Move { to: t, .. } if t == to)
}

/// A move that was cheap: the cost rule then lets the damping alone
/// decide.
const CHEAP: Option<(u64, Option<Cost>)> = Some((
    0,
    Some(Cost {
        took_ms: 100.0,
        pause_ms: 10.0,
    }),
));

#[test]
fn a_busy_cell_moves_to_the_nearer_node_once_that_has_held() {
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    // a: 50 ms to the gateway, b: 4 ms.
    let at = |frames| {
        [
            serving(node("a", GW, Some(50_000)), frames),
            node("b", GW, Some(4_000)),
        ]
    };
    // The first look only takes the traffic counter as a baseline.
    let v = judge(&mut tr, 9_500, &c, &at(100));
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("no client traffic")),
        "{v:?}"
    );
    // Traffic grew, b is nearer: not yet (hold).
    let v = judge(&mut tr, 10_000, &c, &at(150));
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("nearer for 0 ms")),
        "{v:?}"
    );
    // Half a second on: still holding.
    assert!(matches!(
        judge(&mut tr, 10_500, &c, &at(200)),
        Verdict::Stay(_)
    ));
    // Past the hold, but the move's default length (2 s) is not paid for
    // by 1.1 s of being nearer.
    let v = judge(&mut tr, 11_100, &c, &at(300));
    assert!(
        matches!(&v, Verdict::Stay(why) if why.contains("does not pay")),
        "{v:?}"
    );
    // 2.1 s: (2100 - 2000) ms × (50/4 - 1) = 1150 > 300 ms of pause: move.
    let v = judge(&mut tr, 12_100, &c, &at(400));
    assert_eq!(
        v,
        Verdict::Move {
            to: "b".into(),
            from_us: 50_000,
            to_us: 4_000
        }
    );
}

#[test]
fn an_idle_service_or_a_small_gain_never_moves() {
    let c = cell("a", 1);
    // No traffic growth: stays, however long, and however large the
    // counter it started with (a leader that just took over, say).
    let mut tr = Tracker::default();
    let idle = [
        serving(node("a", GW, Some(50_000)), 1_000_000),
        node("b", GW, Some(4_000)),
    ];
    for t in (0..20_000).step_by(500) {
        let v = look(&mut tr, t, &c, &idle, CHEAP);
        assert!(
            matches!(&v, Verdict::Stay(why) if why.contains("no client traffic")),
            "{v:?}"
        );
    }
    // Traffic, but b is only 10 % nearer: stays.
    let mut tr = Tracker::default();
    for (i, t) in (0..20_000).step_by(500).enumerate() {
        let close = [
            serving(node("a", GW, Some(10_000)), i as u64 + 1),
            node("b", GW, Some(9_000)),
        ];
        let v = look(&mut tr, t, &c, &close, CHEAP);
        assert!(matches!(&v, Verdict::Stay(_)), "{v:?}");
    }
    // 30 % nearer but by 300 µs: noise, stays.
    let mut tr = Tracker::default();
    for (i, t) in (0..20_000).step_by(500).enumerate() {
        let tiny = [
            serving(node("a", GW, Some(1_000)), i as u64 + 1),
            node("b", GW, Some(700)),
        ];
        assert!(matches!(
            look(&mut tr, t, &c, &tiny, CHEAP),
            Verdict::Stay(_)
        ));
    }
}

#[test]
fn a_path_that_flips_faster_than_the_hold_never_moves_the_cell() {
    // The owner's clients come and go: every 800 ms its round trip swaps
    // between 2 ms and 40 ms, b stays at 10 ms. Even with a cheap move,
    // no spell of b being nearer lasts the hold.
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    for (i, t) in (0..60_000u64).step_by(200).enumerate() {
        let a_rtt = if (t / 800).is_multiple_of(2) {
            2_000
        } else {
            40_000
        };
        let nodes = [
            serving(node("a", GW, Some(a_rtt)), i as u64 + 1),
            node("b", GW, Some(10_000)),
        ];
        let v = look(&mut tr, t, &c, &nodes, CHEAP);
        assert!(matches!(v, Verdict::Stay(_)), "moved at {t} ms: {v:?}");
    }
    // Held longer, the same cheap move is taken.
    let mut moved = false;
    for (i, t) in (60_000..70_000u64).step_by(200).enumerate() {
        let nodes = [
            serving(node("a", GW, Some(40_000)), 1_000 + i as u64),
            node("b", GW, Some(10_000)),
        ];
        moved |= is_move(&look(&mut tr, t, &c, &nodes, CHEAP), "b");
    }
    assert!(moved, "never moved once the path held");
}

#[test]
fn two_near_nodes_taking_turns_still_count_as_one_spell() {
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    let mut moved = None;
    for (i, t) in (10_000..20_000u64).step_by(200).enumerate() {
        // b and x swap as the best every 400 ms; both beat a.
        let (b, x) = if (t / 400).is_multiple_of(2) {
            (3_000, 3_100)
        } else {
            (3_100, 3_000)
        };
        let nodes = [
            serving(node("a", GW, Some(40_000)), i as u64 + 1),
            node("b", GW, Some(b)),
            node("x", GW, Some(x)),
        ];
        if let Verdict::Move { .. } = look(&mut tr, t, &c, &nodes, CHEAP) {
            moved = Some(t);
            break;
        }
    }
    let t = moved.expect("moved to one of them");
    assert!(t <= 11_600, "moved only at {t} ms");
}

#[test]
fn after_a_move_the_cell_cools_down_for_five_times_its_length() {
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    let mut moved_at = None;
    for (i, t) in (0..10_000).step_by(500).enumerate() {
        let nodes = [
            serving(node("a", GW, Some(50_000)), i as u64 + 1),
            node("b", GW, Some(4_000)),
        ];
        if is_move(&judge(&mut tr, t, &c, &nodes), "b") {
            moved_at = Some(t);
            break;
        }
    }
    let t0 = moved_at.expect("moved to b");
    tr.moving("c1", t0);
    // The move took 3 s (pause 100 ms). Now owned by b (generation 2),
    // and a is nearer again right away: 5 × 3 s of cool-down from the
    // move's end.
    let c2 = cell("b", 2);
    let ended = t0 + 3_000;
    let last = Some((ended, Some(Cost::reported(3_000.0, 100.0))));
    let mut back = None;
    for (i, t) in (ended..ended + 30_000).step_by(500).enumerate() {
        let nodes = [
            node("a", GW, Some(4_000)),
            serving(node("b", GW, Some(50_000)), i as u64 + 1),
        ];
        if is_move(&look(&mut tr, t, &c2, &nodes, last), "a") {
            back = Some(t);
            break;
        }
    }
    let back = back.expect("moves back once cooled down");
    assert!(
        back >= ended + 15_000,
        "moved back {} ms after the move's end",
        back - ended
    );
}

#[test]
fn a_new_leader_honours_a_move_it_did_not_make() {
    // A move ended at 10 s (a user's, or seen by the previous leader);
    // this tracker has never seen the cell.
    let mut tr = Tracker::default();
    let c = cell("a", 2);
    let last = Some((10_000, Some(Cost::reported(1_000.0, 50.0))));
    let mut first = None;
    for (i, t) in (10_500..30_000u64).step_by(250).enumerate() {
        let nodes = [
            serving(node("a", GW, Some(50_000)), i as u64 + 1),
            node("b", GW, Some(4_000)),
        ];
        if is_move(&look(&mut tr, t, &c, &nodes, last), "b") {
            first = Some(t);
            break;
        }
    }
    let t = first.expect("moves once cooled down");
    assert!(
        t >= 15_000,
        "moved at {t} ms, within 5 s of the last move's end"
    );
}

#[test]
fn a_nodes_absurd_migration_figures_are_bounded() {
    let c = Cost::reported(f64::INFINITY, -5.0);
    assert_eq!(c.took_ms, MAX_COST_MS);
    assert_eq!(c.pause_ms, 0.0);
    assert_eq!(Cost::reported(f64::NAN, 1e300).pause_ms, MAX_COST_MS);
    // And the cool-down they make does not overflow.
    let mut tr = Tracker::default();
    let cell = cell("a", 1);
    let nodes = [
        serving(node("a", GW, Some(50_000)), 1),
        node("b", GW, Some(4_000)),
    ];
    let huge = Some((0, Some(Cost::reported(f64::MAX, f64::MAX))));
    look(&mut tr, 0, &cell, &nodes, huge);
    let nodes = [
        serving(node("a", GW, Some(50_000)), 2),
        node("b", GW, Some(4_000)),
    ];
    for t in [500, 1_000, 2_000] {
        assert!(matches!(
            look(&mut tr, t, &cell, &nodes, huge),
            Verdict::Stay(_)
        ));
    }
}

#[test]
fn the_policy_places_by_round_trip_on_the_clients_gateway_only() {
    // The cell runs on a (gateway GW). b is nearest but on another
    // gateway; c has not measured; d is the nearest on GW.
    let nodes = [
        node("a", GW, Some(30_000)),
        node("b", "gw-00000000000000b2", Some(100)),
        node("c", GW, None),
        node("d", GW, Some(2_000)),
    ];
    let cells = [cell("a", 1)];
    let w = want();
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&FollowTheClient, &ctx).unwrap().name, "d");
    let why = crate::policy::explain(&FollowTheClient, &ctx);
    assert!(matches!(&why[1].score, Err(Reason::Excluded(w)) if w.contains("gateway")));
    // A node that has measured beats one that has not, whatever its load.
    let nodes = [node("a", GW, Some(90_000)), node("c", GW, None)];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&FollowTheClient, &ctx).unwrap().name, "a");
    // Before any answer, nodes are told apart by the address they dialed.
    let mut a = node("a", GW, Some(30_000));
    let mut e = node("e", GW, Some(1_000));
    for n in [&mut a, &mut e] {
        let g = n.status.gateway.as_mut().unwrap();
        g.id = None;
        g.address = "10.0.0.1:7800".into();
    }
    let nodes = [a, e, node("d", GW, Some(500))];
    let ctx = Ctx::new(&nodes, &cells, &w);
    assert_eq!(place(&FollowTheClient, &ctx).unwrap().name, "e");
    // A launch (no cell yet): any gateway, nearest first.
    let fresh = Want::default();
    let nodes = [
        node("x", GW, Some(9_000)),
        node("y", "gw-00000000000000b2", Some(1_000)),
    ];
    let ctx = Ctx::new(&nodes, &[], &fresh);
    assert_eq!(place(&FollowTheClient, &ctx).unwrap().name, "y");
}
