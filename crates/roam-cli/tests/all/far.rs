//! Far memory (`docs/far-memory.md`): every workload runs right with most
//! of its memory paged out, to a swap file (`roam run --local-memory`) and
//! to another node's memory server (`roam launch --local-memory`); a cell
//! whose memory server dies stops with the reason and prints nothing wrong.
//! The real programs run under far memory in `real.rs` (`mod far`).

use std::time::Duration;

use super::common::*;

/// Every workload of the suite.
const SUITE: [&str; 12] = roam_testkit::WORKLOADS;

/// `roam run` of `name` at size `S`, with `extra` flags; stdout.
fn run_workload(name: &str, extra: &[&str]) -> Vec<u8> {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = roam(Isa::X86_64);
    cmd.arg("run").args(extra);
    if name == "filework" {
        cmd.arg("--dir")
            .arg(format!("{}::/data", data.path().display()));
    }
    cmd.arg(workload(name)).arg("--").arg("S");
    let out = run_bounded(cmd, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "roam run {extra:?} {name}: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("checksum: "), "{name}");
    out.stdout
}

#[test]
fn every_workload_runs_right_paging_to_a_swap_file() {
    let swap = tempfile::tempdir().unwrap();
    let dir = swap.path().display().to_string();
    for name in SUITE {
        let want = run_workload(name, &[]);
        for (local, eviction) in [("256KiB", "clock"), ("1MiB", "random")] {
            let flags = [
                "--local-memory",
                local,
                "--eviction",
                eviction,
                "--swap-dir",
                &dir,
            ];
            assert_eq!(
                text(&run_workload(name, &flags)),
                text(&want),
                "{name} with {local} local ({eviction})"
            );
        }
    }
    // The swap files were unlinked as soon as they were made.
    assert_eq!(std::fs::read_dir(swap.path()).unwrap().count(), 0);
}

/// A memory server and a node of little memory beside it.
fn pair(server_bytes: &str) -> (Node, Node) {
    let server = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--name",
            "memory-server",
            "--memory-server",
            server_bytes,
        ],
    );
    let board = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--name",
            "board",
            "--max-total-memory",
            "48MiB",
        ],
    );
    (server, board)
}

/// `roam launch` of the `dirty` workload on `board` with `local` of its
/// memory there and the rest on `server`.
fn launch_far(board: &Node, server: &Node, local: &str, max: &str, args: &[&str]) -> String {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &board.addr])
        .args(["--local-memory", local, "--memory-server", &server.addr])
        .args(["--max-memory", max])
        .arg(workload(WORKLOAD))
        .arg("--")
        .args(args);
    let out = run_bounded(cmd, SLOW);
    launched(&out, || both_logs(server, board))
}

/// The memory server's `roam_node_memory_server_bytes{kind}`.
fn held(server: &Node) -> u64 {
    let (_, body) = http_get(&server.addr, "/metrics").unwrap();
    let text = String::from_utf8(body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("roam_node_memory_server_bytes{kind=\"held\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no held bytes in\n{text}"))
}

#[test]
fn a_cell_bigger_than_its_node_runs_right_with_its_pages_on_a_memory_server() {
    // 64 MiB of state, rewritten for 4 s, on a node that admits 48 MiB in
    // all: refused without far memory, right with 8 MiB of it local.
    let (server, board) = pair("256MiB");
    let args = ["64", "16", "4"];
    let want = reference(&args);
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["launch", "--node", &board.addr, "--max-memory", "128MiB"])
        .arg(workload(WORKLOAD))
        .arg("--")
        .args(args);
    let refused = run_bounded(cmd, SLOW);
    assert!(
        !refused.status.success(),
        "a 128 MiB cell was admitted by a 48 MiB node"
    );

    let id = launch_far(&board, &server, "8MiB", "128MiB", &args);
    let far = wait_for("pages on the memory server", SLOW, || {
        let c = board.cell(&id)?;
        assert_eq!(c["state"], "running", "{c}\n{}", both_logs(&server, &board));
        let far = c["far"]["far_bytes"].as_u64()?;
        (far >= 32 << 20).then_some(c)
    });
    // The board keeps at most its budget (and one fetch batch).
    let resident = far["far"]["resident_bytes"].as_u64().unwrap();
    assert!(resident <= (8 << 20) + (64 << 12), "{far}");
    assert!(held(&server) >= 32 << 20);
    let cells = run_bounded(
        {
            let mut c = roam(Isa::X86_64);
            c.args(["cells", "--node", &board.addr]);
            c
        },
        SLOW,
    );
    assert!(
        text(&cells.stdout).contains("% here"),
        "{}",
        text(&cells.stdout)
    );

    let end = board.wait_end(&id, SLOW);
    assert_eq!(
        end["state"],
        "exited",
        "{end}\n{}",
        both_logs(&server, &board)
    );
    assert_eq!(text(&logs(&id, &board)), text(&want));
    // The cell ended: its connection closed, and its pages went.
    wait_for("the memory server to free the pages", SLOW, || {
        (held(&server) == 0).then_some(())
    });
}

/// A node that admits `total` of cells in all.
fn board(name: &str, total: &str) -> Node {
    Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--name",
            name,
            "--max-total-memory",
            total,
        ],
    )
}

/// `roam migrate` of `id` from `a` to `b` by stop-and-copy; the JSON report.
fn migrate(id: &str, a: &Node, b: &Node, nodes: &[&Node]) -> serde_json::Value {
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["migrate", id, "--from", &a.addr, "--to", &b.addr])
        .args(["--mode", "stop-and-copy", "--json"]);
    let out = run_bounded(cmd, SLOW);
    let logs: String = nodes.iter().map(|n| n.log()).collect();
    assert!(
        out.status.success(),
        "roam migrate: {}\n{logs}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The cell's far-memory row on `node` once it runs there with at least
/// `far` bytes on the memory server.
fn far_row(node: &Node, id: &str, far: u64) -> serde_json::Value {
    wait_for("the cell's pages on the memory server", SLOW, || {
        let c = node.cell(id)?;
        assert_eq!(c["state"], "running", "{c}\n{}", node.log());
        (c["far"]["far_bytes"].as_u64()? >= far).then_some(c)
    })
}

#[test]
fn a_256_mib_cell_runs_on_64_mib_nodes_and_migrates_keeping_its_pages_far() {
    // 256 MiB of state, on nodes that admit 64 MiB of cells in all, with
    // 32 MiB of it local. It moves there and back by stop-and-copy, each
    // time checkpointed on one node and restored on the other, and must
    // print what an uninterrupted run prints.
    let server = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--name",
            "memory-server",
            "--memory-server",
            "768MiB",
        ],
    );
    let (a, b) = (board("board-a", "64MiB"), board("board-b", "64MiB"));
    let args = ["256", "8", "6"];
    let want = reference(&args);
    let local = 32u64 << 20;
    let id = launch_far(&a, &server, "32MiB", "320MiB", &args);
    far_row(&a, &id, 128 << 20);
    let nodes = [&server, &a, &b];
    for (from, to) in [(&a, &b), (&b, &a)] {
        let report = migrate(&id, from, to, &nodes);
        assert_eq!(report["summary"]["mode"], "stop-and-copy", "{report}");
        // On arrival it pages as it did before: the destination holds its
        // budget, and the memory server the rest.
        let row = far_row(to, &id, 128 << 20);
        let resident = row["far"]["resident_bytes"].as_u64().unwrap();
        assert!(resident <= local + (64 << 12), "{row}");
        assert_eq!(row["far"]["local_memory"].as_u64(), Some(local), "{row}");
        // The source's page space is freed once the cell left it: one
        // cell's worth stays held (its memory is at most 257 MiB).
        wait_for("the source's pages to be freed", SLOW, || {
            (held(&server) <= 260 << 20).then_some(())
        });
    }
    let end = a.wait_end(&id, SLOW);
    let logs_all = || nodes.iter().map(|n| n.log()).collect::<String>();
    assert_eq!(end["state"], "exited", "{end}\n{}", logs_all());
    assert_eq!(text(&logs(&id, &a)), text(&want));
    wait_for("the memory server to free the pages", SLOW, || {
        (held(&server) == 0).then_some(())
    });
}

#[test]
fn a_cell_whose_memory_server_dies_stops_with_the_reason() {
    let (mut server, board) = pair("256MiB");
    let args = ["64", "16", "30"];
    let id = launch_far(&board, &server, "4MiB", "128MiB", &args);
    wait_for("pages on the memory server", SLOW, || {
        let far = board.cell(&id)?["far"]["far_bytes"].as_u64()?;
        (far >= 16 << 20).then_some(())
    });
    server.kill9();
    let end = board.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", board.log());
    let error = end["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("memory pages could not be fetched") && error.contains("memory-server"),
        "{end}"
    );
    // It never went on with wrong memory: no checksum was printed.
    let out = logs(&id, &board);
    assert!(!text(&out).contains("checksum: "), "{}", text(&out));
}

#[test]
fn far_memory_is_refused_with_the_reason() {
    let (server, board) = pair("1MiB");
    // `roam launch` on the board with `flags` fails, saying `why`.
    let refused = |flags: &[&str], why: &str| {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["launch", "--node", &board.addr])
            .args(flags)
            .arg(workload(WORKLOAD))
            .args(["--", "8", "4", "1"]);
        let out = run_bounded(cmd, SLOW);
        assert!(!out.status.success(), "{flags:?} was not refused");
        assert!(
            text(&out.stderr).contains(why),
            "{flags:?}: {}",
            text(&out.stderr)
        );
    };
    // Below the minimum budget.
    refused(
        &["--local-memory", "64KiB", "--memory-server", &server.addr],
        "below the minimum",
    );
    // On a node, the memory server must be named (only a planner picks).
    refused(&["--local-memory", "1MiB"], "needs --memory-server");
    // A node that is not a memory server.
    refused(
        &["--local-memory", "1MiB", "--memory-server", &board.addr],
        "is not a memory server",
    );
    // A memory server too small for the pages: the cell stops, and says so.
    let id = launch_far(&board, &server, "1MiB", "64MiB", &["16", "4", "10"]);
    let end = board.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}");
    assert!(
        end["error"]
            .as_str()
            .unwrap_or_default()
            .contains("the memory server is full"),
        "{end}"
    );
}

/// Two boards of the planner `p`'s cluster that admit 64 MiB of cells
/// each, by name.
fn boards(p: &Planner) -> Vec<(String, Node)> {
    ["board-a", "board-b"]
        .into_iter()
        .map(|b| {
            let node = planner_node(p, b, &["--max-total-memory", "64MiB"]);
            (b.to_string(), node)
        })
        .collect()
}

/// Wait until at least 64 MiB of cell `id` on `node` is on its memory
/// server, with at most its 16 MiB budget (and one fetch batch) resident:
/// its row then.
fn wait_far(node: &Node, id: &str, what: &str) -> serde_json::Value {
    let row = wait_for(what, SLOW, || {
        let row = node.cell(id)?;
        (row["far"]["far_bytes"].as_u64()? >= 64 << 20).then_some(row)
    });
    assert!(
        row["far"]["resident_bytes"].as_u64().unwrap() <= (16 << 20) + (64 << 12),
        "{row}"
    );
    row
}

#[test]
fn the_planner_places_a_far_cell_and_restores_it_far_when_its_node_dies() {
    // Two boards that admit 64 MiB of cells each, and a memory server. The
    // planner must put a 128 MiB cell's pages on the server and the cell
    // on a board, and, when that board dies, bring the cell back from its
    // kept checkpoint on the other board, paging to a server again.
    let p = Planner::start(None, &["--lease", "5"]);
    let server = planner_node(&p, "server", &["--memory-server", "512MiB"]);
    let mut boards = boards(&p);
    wait_alive(&p, 3);
    let args = ["128", "4", "30"];
    let expected = std::thread::spawn(move || reference(&args));
    let flags = [
        "--local-memory",
        "16MiB",
        "--max-memory",
        "192MiB",
        "--checkpoint-interval",
        "5",
    ];
    let id = p.launch(&args, &flags);
    let c = p.cell(&id);
    assert_eq!(c["far"]["server"], "server", "{c}");
    assert_eq!(c["far"]["local_memory"], 16 << 20, "{c}");
    let first = c["owner"].as_str().unwrap().to_string();
    assert!(first.starts_with("board-"), "placed on {first}: {c}");
    let owner = owner_node(&c, &mut boards);
    wait_far(owner, &id, "the cell's pages on the memory server");

    // Its node dies after a kept checkpoint: restored on the other board,
    // never on the server, with its pages far again.
    let kept = wait_kept(&p, &id);
    let generation = kept["generation"].as_u64().unwrap();
    owner_node(&kept, &mut boards).kill9();
    let back = wait_restored(&p, &id, generation, &first);
    let second = back["owner"].as_str().unwrap().to_string();
    assert!(second.starts_with("board-") && second != first, "{back}");
    let node = owner_node(&back, &mut boards);
    wait_far(node, &id, "the restored cell's pages on the memory server");
    let end = node.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", all_logs(&p, &boards));
    assert_eq!(
        text(&logs(&id, node)),
        text(&expected.join().unwrap()),
        "{}",
        server.log()
    );
}

#[test]
fn a_cell_whose_memory_server_dies_comes_back_from_its_kept_checkpoint() {
    // Its pages on the roomier of two memory servers, which dies after a
    // kept checkpoint: the cell fails on its board without printing
    // anything wrong, and the planner restores it from the checkpoint
    // (never kept on the server that held its pages), paging to the other
    // server, to finish with the uninterrupted run's output.
    let p = Planner::start(None, &["--lease", "5"]);
    let mut servers = [
        planner_node(&p, "server-1", &["--memory-server", "1GiB"]),
        planner_node(&p, "server-2", &["--memory-server", "512MiB"]),
    ];
    let mut boards = boards(&p);
    wait_alive(&p, 4);
    let args = ["128", "4", "30"];
    let expected = std::thread::spawn(move || reference(&args));
    let flags = [
        "--local-memory",
        "16MiB",
        "--max-memory",
        "192MiB",
        "--checkpoint-interval",
        "5",
        "--on",
        "board-a",
    ];
    let id = p.launch(&args, &flags);
    let c = p.cell(&id);
    assert_eq!(c["far"]["server"], "server-1", "{c}");
    let first = c["owner"].as_str().unwrap().to_string();
    let kept = wait_kept(&p, &id);
    assert_ne!(kept["kept"]["holder"], "server-1", "{kept}");
    let generation = kept["generation"].as_u64().unwrap();
    servers[0].kill9();
    let back = wait_for("the cell to be restored", SLOW, || {
        let c = p.cell(&id);
        assert_ne!(c["state"]["state"], "lost", "{c}\n{}", p.log());
        assert_ne!(c["state"]["state"], "failed", "{c}\n{}", p.log());
        (c["generation"].as_u64().unwrap() > generation && c["state"]["state"] == "running")
            .then_some(c)
    });
    assert_eq!(back["far"]["server"], "server-2", "{back}");
    let second = back["owner"].as_str().unwrap().to_string();
    assert!(second.starts_with("board-") && second != first, "{back}");
    // On the board it failed on: failed for its lost memory, and without
    // printing a wrong checksum.
    let failed_on = &boards.iter().find(|(n, _)| *n == first).unwrap().1;
    let row = failed_on.cell(&id).unwrap();
    assert_eq!(row["state"], "failed", "{row}");
    assert_eq!(row["memory_lost"], true, "{row}");
    assert!(!text(&logs(&id, failed_on)).contains("checksum"));
    let node = owner_node(&back, &mut boards);
    let row = wait_far(node, &id, "the restored cell's pages on the other server");
    assert!(
        row["far"]["server"].as_str().unwrap().contains("server-2"),
        "{row}"
    );
    let end = node.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", all_logs(&p, &boards));
    assert_eq!(
        text(&logs(&id, node)),
        text(&expected.join().unwrap()),
        "{}",
        servers[1].log()
    );
}
