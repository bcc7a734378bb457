//! The follow-the-client decision on hand-made cluster views: each rule of
//! `follow.rs` (traffic, gain, hold, cool-down, the cost of the move) and
//! the placement policy.

use super::*;
use crate::policy::{place, Want};
use roam_api::planner::{GatewayPath, ServiceTraffic};
use roam_api::sysinfo::Machine;
use roam_cluster::{NodeState, NodeStatus};

const GW: &str = "gw-00000000000000a1";

fn node(name: &str, gw: &str, rtt_us: Option<u64>) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        isa: "x86_64".into(),
        api: format!("{name}:7700"),
        migrate: format!("{name}:8700"),
        version: "0.1.0".into(),
        status: NodeStatus {
            machine: Machine {
                cores: 4,
                memory_total: 8 << 30,
                memory_available: 8 << 30,
                load1: 0.0,
            },
            cells: vec![],
            gateway: Some(GatewayPath {
                // Each node dials the gateway through its own path; the
                // id the gateway answers with says it is the same one.
                address: format!("{name}.path:7800"),
                id: Some(gw.into()),
                connected: true,
                rtt_us,
                services: vec![],
            }),
            usage: vec![],
        },
        state: NodeState::Ready,
        alive: true,
        registered_ms: 0,
        heartbeat_ms: 0,
    }
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
    }
}

fn want() -> Want {
    Want {
        cell: Some("c1".into()),
        ..Want::default()
    }
}

/// Judge `c` over `nodes` at `t`, with no move ended before.
fn judge(tr: &mut Tracker, t: u64, c: &CellRecord, nodes: &[NodeRecord]) -> Verdict {
    let cells = [c.clone()];
    let w = want();
    let ctx = Ctx::new(nodes, &cells, &w);
    tr.judge(t, c, &ctx, || None)
}

fn is_move(v: &Verdict, to: &str) -> bool {
    matches!(v, Verdict::Move { to: t, .. } if t == to)
}

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
    // The first look sees traffic and b nearer: not yet (hold).
    let v = judge(&mut tr, 10_000, &c, &at(100));
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
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    // No traffic growth at all: stays, however long.
    let idle = [
        serving(node("a", GW, Some(50_000)), 0),
        node("b", GW, Some(4_000)),
    ];
    for t in (0..20_000).step_by(500) {
        let v = judge(&mut tr, t, &c, &idle);
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
        let v = judge(&mut tr, t, &c, &close);
        assert!(
            matches!(&v, Verdict::Stay(why) if why.contains("only")),
            "{v:?}"
        );
    }
    // 30 % nearer but by 300 µs: noise, stays.
    let mut tr = Tracker::default();
    for (i, t) in (0..20_000).step_by(500).enumerate() {
        let tiny = [
            serving(node("a", GW, Some(1_000)), i as u64 + 1),
            node("b", GW, Some(700)),
        ];
        assert!(matches!(judge(&mut tr, t, &c, &tiny), Verdict::Stay(_)));
    }
}

#[test]
fn a_path_that_flips_faster_than_the_hold_never_moves_the_cell() {
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    // Every 800 ms another node is the nearest (a, then b, then c...).
    for (i, t) in (0..60_000u64).step_by(400).enumerate() {
        let near = ["b", "x"][(t / 800 % 2) as usize];
        let rtt = |n: &str| Some(if n == near { 2_000 } else { 40_000 });
        let nodes = [
            serving(node("a", GW, Some(40_000)), i as u64 + 1),
            node("b", GW, rtt("b")),
            node("x", GW, rtt("x")),
        ];
        let v = judge(&mut tr, t, &c, &nodes);
        assert!(matches!(v, Verdict::Stay(_)), "moved at {t} ms: {v:?}");
    }
}

#[test]
fn after_a_move_the_cell_cools_down_for_five_times_its_length() {
    let mut tr = Tracker::default();
    let c = cell("a", 1);
    let view = |owner_rtt, other_rtt, frames| {
        [
            serving(node("a", GW, Some(owner_rtt)), frames),
            node("b", GW, Some(other_rtt)),
        ]
    };
    let mut frames = 0;
    let mut step =
        |tr: &mut Tracker, t: u64, c: &CellRecord, a, b, last: Option<(u64, Option<Cost>)>| {
            frames += 10;
            let nodes = view(a, b, frames);
            let cells = [c.clone()];
            let w = want();
            let ctx = Ctx::new(&nodes, &cells, &w);
            tr.judge(t, c, &ctx, || last)
        };
    let mut moved_at = None;
    for t in (0..10_000).step_by(500) {
        if is_move(&step(&mut tr, t, &c, 50_000, 4_000, None), "b") {
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
    let view2 = |frames| {
        [
            node("a", GW, Some(4_000)),
            serving(node("b", GW, Some(50_000)), frames),
        ]
    };
    let ended = t0 + 3_000;
    let cost = Some(Cost {
        took_ms: 3_000.0,
        pause_ms: 100.0,
    });
    let mut back = None;
    for (i, t) in (ended..ended + 30_000).step_by(500).enumerate() {
        let nodes = view2(i as u64 + 1);
        let cells = [c2.clone()];
        let w = want();
        let ctx = Ctx::new(&nodes, &cells, &w);
        if is_move(&tr.judge(t, &c2, &ctx, || Some((ended, cost))), "a") {
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
