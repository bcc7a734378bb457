//! Kept checkpoints between nodes in this process: a holder keeps the
//! checkpoint the planner's record names even after a newer one arrived,
//! so a restore from it works, and the restored cell finishes with the
//! output of an uninterrupted run.

mod common;

use std::time::Duration;

use common::*;
use roam_node::types::{CellState, KeepRequest};

const ARGS: [&str; 3] = ["8", "4", "4"];
const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_from_the_older_of_two_kept_checkpoints_works() {
    let owner = TestNode::start("owner", Setup::default()).await;
    let holder = TestNode::start("holder", Setup::default()).await;
    let spare = TestNode::start("spare", Setup::default()).await;
    let module = owner.upload("dirty").await;
    spare.upload("dirty").await;
    owner.launch(&module, "reference", &ARGS).await;
    owner.launch(&module, "kept", &ARGS).await;
    let keep = || async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let req = KeepRequest {
            holder: holder.url.clone(),
            holder_name: holder.name.clone(),
        };
        owner
            .client
            .keep("kept", &req)
            .await
            .expect("the checkpoint is kept")
            .snapshot
    };
    // The first is what the planner's record would name; the second
    // arrives, but its record fails (no planner here commits it).
    let first = keep().await;
    let second = keep().await;
    assert_ne!(first, second);
    owner
        .client
        .kill("kept")
        .await
        .expect("the owner's copy stops");
    let restored = spare
        .client
        .restore(&restore_request("kept", &module, &ARGS, &holder, &first))
        .await;
    assert!(restored.is_ok(), "{restored:?}");
    assert_same_output(&spare, "kept", &owner, "reference", LIMIT).await;
}

/// In a cluster, a node keeps room for one kept checkpoint of its largest
/// cell: a checkpoint is one more copy of a cell's memory, and a node whose
/// cells' limits fill its memory would run out on a checkpoint tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clustered_node_keeps_room_for_a_kept_checkpoint() {
    let limits = roam_node::NodeLimits {
        max_total_memory: Some(200 << 20),
        cell_memory: 128 << 20,
        ..Default::default()
    };
    // Alone, 128 MiB of 200 fits.
    let alone = TestNode::start(
        "alone",
        Setup {
            limits: Some(limits.clone()),
            ..Default::default()
        },
    )
    .await;
    let module = alone.upload("dirty").await;
    alone.launch(&module, "fits", &ARGS).await;
    // With a planner, it needs 128 MiB more free for the checkpoint.
    let planner = Planner::start(None).await;
    let clustered = TestNode::start(
        "clustered",
        Setup {
            planner: Some(planner.url.clone()),
            limits: Some(limits),
            ..Default::default()
        },
    )
    .await;
    let module = clustered.upload("dirty").await;
    let e = clustered
        .client
        .launch(&launch(&module, None))
        .await
        .expect_err("no room is left for a checkpoint");
    assert!(
        e.to_string().contains("stays free for a kept checkpoint"),
        "{e}"
    );
    let small = clustered
        .client
        .launch(&launch(&module, Some(64 << 20)))
        .await;
    assert!(small.is_ok(), "64 MiB and 64 MiB of room fit: {small:?}");
}

fn launch(module: &str, max_memory: Option<u64>) -> roam_node::types::LaunchRequest {
    roam_node::types::LaunchRequest {
        module: module.to_string(),
        args: argv(&ARGS),
        env: Vec::new(),
        dirs: Vec::new(),
        max_memory,
        service: None,
        id: None,
        generation: None,
        cpu: Default::default(),
        far: None,
    }
}

/// A cell's files travel in its kept checkpoints. A guest can make a 1 TiB
/// sparse file in an instant; read whole, it would take the node down with
/// every cell on it. The checkpoint is refused, naming the file, and the
/// cell runs on to the output of an uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_huge_sparse_file_fails_the_checkpoint_not_the_node() {
    let owner = TestNode::start("owner", Setup::default()).await;
    let holder = TestNode::start("holder", Setup::default()).await;
    let module = owner.upload("dirty").await;
    owner.launch(&module, "reference", &ARGS).await;
    owner
        .launch_with(&module, "sparse", &ARGS, &["/data"])
        .await;
    // What the guest could do with `ftruncate`, done from outside.
    let f = std::fs::File::create(owner.sandbox("sparse").join("huge")).unwrap();
    f.set_len(1 << 40).unwrap();
    let req = KeepRequest {
        holder: holder.url.clone(),
        holder_name: holder.name.clone(),
    };
    let e = owner
        .client
        .keep("sparse", &req)
        .await
        .expect_err("the checkpoint is refused");
    assert!(
        e.to_string()
            .contains("more bytes of files than a checkpoint may carry"),
        "{e}"
    );
    assert!(e.to_string().contains("huge"), "{e}");
    let (state, out) = owner.output("sparse", LIMIT).await;
    assert_eq!(state, CellState::Exited { code: 0 });
    let (_, reference) = owner.output("reference", LIMIT).await;
    assert_eq!(
        String::from_utf8_lossy(&out),
        String::from_utf8_lossy(&reference),
    );
}

/// A cell's sandbox files may add up to the node's `--max-files-size`:
/// past it the guest's write fails (`EDQUOT`), the program sees the error
/// and ends, and the node and its other cells go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guest_that_writes_past_its_disk_quota_gets_an_error() {
    let limits = roam_node::NodeLimits {
        max_files_bytes: 2 << 20,
        ..Default::default()
    };
    let node = TestNode::start(
        "node",
        Setup {
            limits: Some(limits),
            ..Default::default()
        },
    )
    .await;
    let module = node.upload("bigfiles").await;
    // 8 MiB of files in 4 MiB pieces, against a quota of 2 MiB.
    node.launch_with(&module, "writer", &["8", "1"], &["/data"])
        .await;
    let (state, out) = node.output("writer", LIMIT).await;
    assert!(
        matches!(state, CellState::Exited { code } if code != 0),
        "{state:?}: {}",
        String::from_utf8_lossy(&out)
    );
    let bytes: u64 = walk(&node.sandbox("writer"));
    assert!(bytes <= 2 << 20, "the sandbox holds {bytes} bytes");
    let log = String::from_utf8_lossy(&out);
    assert!(log.contains("Quota exceeded"), "{log}");
}

/// Bytes of the files under `dir`.
fn walk(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}
