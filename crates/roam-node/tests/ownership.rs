//! Ownership through a planner when its answer comes late: the
//! destination gives up waiting after the planner has already given it the
//! cell. The cell must run on, exactly once, and finish with the output of
//! an uninterrupted run; the planner must end up naming the node that runs
//! it. Over the embedded store and over a real etcd.

mod common;

use std::time::Duration;

use common::*;
use roam_node::types::CellState;

const ARGS: [&str; 3] = ["8", "4", "5"];
const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_ownership_answer_loses_no_cell_embedded() {
    late_ownership_answer(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_ownership_answer_loses_no_cell_etcd() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    late_ownership_answer(Some(format!("etcd://{}/roam-test", etcd.endpoint()))).await;
}

async fn late_ownership_answer(store: Option<String>) {
    let p = Planner::start(store).await;
    // The destination reaches the planner through a proxy that can hold
    // the planner's answers back.
    let slow = Delay::start(p.addr).await;
    let a = TestNode::start(
        "a",
        Setup {
            planner: Some(p.url.clone()),
            ..Setup::default()
        },
    )
    .await;
    let b = TestNode::start(
        "b",
        Setup {
            planner: Some(format!("http://{}", slow.addr)),
            planner_timeout: Some(Duration::from_secs(1)),
            ..Setup::default()
        },
    )
    .await;
    p.wait_alive(2).await;
    let module = a.upload("dirty").await;
    a.launch(&module, "reference", &ARGS).await;
    let placed = p.place("dirty", &ARGS, "a", None, 0).await;
    let id = placed.id.clone();
    wait_for("the cell to run on a", LIMIT, || async {
        a.cell(&id).await.filter(|c| c.state == CellState::Running)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // From now on the planner's answers reach b 3 s late, past its 1 s
    // timeout: b's ownership transaction is applied, and b gives up.
    slow.set(Duration::from_secs(3));
    let st = a.migrate(&id, &b, "stop-and-copy").await;
    slow.set(Duration::ZERO);
    let error = st.error.expect("the migration fails");
    assert!(error.contains("keeps running on this node"), "{error}");

    let (state, out) = a.output(&id, LIMIT).await;
    assert_eq!(
        state,
        CellState::Exited { code: 0 },
        "the cell did not finish on its source"
    );
    let (_, reference) = a.output("reference", LIMIT).await;
    assert_eq!(
        out, reference,
        "the cell's output differs from an uninterrupted run"
    );
    assert!(b.cell(&id).await.is_none(), "the cell ran on b");
    let rec = wait_for("the planner to record the end", LIMIT, || async {
        let c = p.client.cell(&id).await.ok()?;
        c.state.ended().then_some(c)
    })
    .await;
    assert_eq!(rec.owner, "a", "{rec:?}");
}

/// An owner that is alive but does not have its cell: here node a restarts
/// with an empty state directory within its lease, so it never looks dead,
/// and its heartbeats stop listing the cell. The leader asks it, hears
/// that it does not know the cell, and after a lease restores the cell
/// from its kept checkpoint, which then finishes with the output of an
/// uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_owner_that_lost_its_cell_has_it_restored() {
    let p = Planner::start(None).await;
    let setup = Setup {
        planner: Some(p.url.clone()),
        ..Setup::default()
    };
    let a = TestNode::start("a", setup.clone()).await;
    let b = TestNode::start("b", setup.clone()).await;
    p.wait_alive(2).await;
    let module = b.upload("dirty").await;
    b.launch(&module, "reference", &ARGS).await;
    let placed = p.place("dirty", &ARGS, "a", None, 1).await;
    let id = placed.id.clone();
    wait_for("a kept checkpoint on b", LIMIT, || async {
        let c = p.client.cell(&id).await.ok()?;
        c.kept.filter(|k| k.holder == "b")
    })
    .await;
    // a restarts: the same name, a new address, none of its cells.
    drop(a);
    let a = TestNode::start("a", setup).await;
    let rec = wait_for("the cell to be restored on b", LIMIT, || async {
        let c = p.client.cell(&id).await.ok()?;
        (c.owner == "b" && c.generation > placed.generation).then_some(c)
    })
    .await;
    assert!(!rec.state.ended(), "{rec:?}");
    assert!(a.cell(&id).await.is_none(), "the cell came back on a");
    let (state, out) = b.output(&id, LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
    let (_, reference) = b.output("reference", LIMIT).await;
    assert_eq!(
        out, reference,
        "the restored cell's output differs from an uninterrupted run"
    );
}
