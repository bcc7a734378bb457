//! Migrations between two nodes in this process: every mode moves a cell
//! with its output intact, and a refusal leaves the cell running where it
//! was. The same failure matrix as the process tests, without spawning.

mod common;

use std::time::Duration;

use common::*;
use roam_node::types::CellState;
use roam_node::NodeLimits;

/// `dirty`: 8 MiB of state rewritten at 4 MiB/s for 4 s.
const ARGS: [&str; 3] = ["8", "4", "4"];
const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_mode_moves_a_cell_and_keeps_its_output() {
    let a = TestNode::start("a", Setup::default()).await;
    let b = TestNode::start("b", Setup::default()).await;
    let module = a.upload("dirty").await;
    a.launch(&module, "reference", &ARGS).await;
    let (state, reference) = a.output("reference", LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
    assert!(
        String::from_utf8_lossy(&reference).contains("checksum: "),
        "{}",
        String::from_utf8_lossy(&reference)
    );
    for mode in ["stop-and-copy", "pre-copy", "post-copy"] {
        let id = format!("c-{mode}");
        a.launch(&module, &id, &ARGS).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let st = a.migrate(&id, &b, mode).await;
        assert!(st.error.is_none(), "{mode}: {:?}", st.error);
        let (state, out) = b.output(&id, LIMIT).await;
        assert_eq!(state, CellState::Exited { code: 0 }, "{mode}");
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&reference),
            "{mode}: the moved cell's output differs from an uninterrupted run"
        );
        let here = a.cell(&id).await.expect("the source remembers the cell");
        assert!(
            matches!(here.state, CellState::Moved { .. }),
            "{mode}: {:?}",
            here.state
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_offer_leaves_the_cell_running_on_the_source() {
    let a = TestNode::start("a", Setup::default()).await;
    // Too small for the cell's 8 MiB: the destination refuses the offer.
    let small = NodeLimits {
        cell_memory: 4 << 20,
        max_cell_memory: 4 << 20,
        ..NodeLimits::default()
    };
    let b = TestNode::start(
        "b",
        Setup {
            limits: Some(small),
            ..Setup::default()
        },
    )
    .await;
    let module = a.upload("dirty").await;
    a.launch(&module, "reference", &ARGS).await;
    a.launch(&module, "moving", &ARGS).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = a.migrate("moving", &b, "pre-copy").await;
    let error = st.error.expect("the migration fails");
    assert!(error.contains("refused"), "{error}");
    assert!(error.contains("keeps running on this node"), "{error}");
    assert!(
        b.cell("moving").await.is_none(),
        "the destination knows the cell"
    );
    let (_, reference) = a.output("reference", LIMIT).await;
    let (state, out) = a.output("moving", LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
    assert_eq!(out, reference);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_deleted_while_the_cell_was_away_stays_deleted_when_it_returns() {
    let a = TestNode::start("a", Setup::default()).await;
    let b = TestNode::start("b", Setup::default()).await;
    let module = a.upload("dirty").await;
    // Long enough for two moves.
    a.launch_with(&module, "roundtrip", &["8", "4", "8"], &["/data"])
        .await;
    // A file in the cell's sandbox, as the program would write it.
    std::fs::write(a.sandbox("roundtrip").join("note.txt"), b"written on a").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = a.migrate("roundtrip", &b, "stop-and-copy").await;
    assert!(st.error.is_none(), "{:?}", st.error);
    let on_b = b.sandbox("roundtrip").join("note.txt");
    assert_eq!(std::fs::read(&on_b).unwrap(), b"written on a");
    wait_for("the source to drop its sandbox", LIMIT, || async {
        (!a.sandbox("roundtrip").exists()).then_some(())
    })
    .await;
    // The program deletes the file on b; then the cell comes back.
    std::fs::remove_file(&on_b).unwrap();
    let st = b.migrate("roundtrip", &a, "stop-and-copy").await;
    assert!(st.error.is_none(), "{:?}", st.error);
    assert!(
        !a.sandbox("roundtrip").join("note.txt").exists(),
        "a file deleted while the cell was away came back"
    );
    let (state, _) = a.output("roundtrip", LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_offer_that_reuses_a_migration_id_is_refused() {
    use roam_wire::{recv, send, Features, Hello, Mode, Msg, Offer};
    let a = TestNode::start("a", Setup::default()).await;
    let b = TestNode::start("b", Setup::default()).await;
    let module = a.upload("dirty").await;
    a.launch(&module, "first", &ARGS).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = a.migrate("first", &b, "stop-and-copy").await;
    assert!(st.error.is_none(), "{:?}", st.error);
    // A peer offers another cell under the id of that migration: were it
    // taken, b's resolve endpoint would answer for the wrong migration.
    let info = b.client.node().await.unwrap();
    let sock = tokio::net::TcpStream::connect(&info.migrate_addr)
        .await
        .unwrap();
    let (mut rd, mut wr) = sock.into_split();
    let hello = Hello::new("peer", "x86_64", Features::default());
    send(&mut wr, &Msg::Hello(hello)).await.unwrap();
    assert!(matches!(recv(&mut rd).await.unwrap(), Msg::Hello(_)));
    let offer = Offer {
        migration_id: st.id.clone(),
        cell: roam_wire::CellSpec {
            id: "second".into(),
            module_hash: [0; 32],
            args: vec!["prog".into()],
            env: Vec::new(),
            dirs: Vec::new(),
            launched_unix_ms: 0,
            hops: 0,
            max_memory: 64 << 20,
            service: None,
            generation: None,
            cpu: Default::default(),
            far: None,
        },
        mode: Mode::StopAndCopy,
        module_len: 1,
        memory_bytes: 65536,
    };
    send(&mut wr, &Msg::Offer(offer)).await.unwrap();
    match recv(&mut rd).await.unwrap() {
        Msg::Abort { reason } => assert!(reason.contains("already known"), "{reason}"),
        m => panic!("`{}` instead of Abort", m.name()),
    }
    let (state, _) = b.output("first", LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
}
