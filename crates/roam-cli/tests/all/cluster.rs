//! The control plane end to end: `roam planner` over the embedded store
//! and over a real etcd, real `roam node` processes registered with it
//! (one aarch64 under qemu-user), and the cluster commands.
//!
//! What must hold: a cell launched through the planner runs once, moves by
//! node name, leaves a drained node, and comes back from its kept
//! checkpoint when its node is killed, on another ISA if need be, finishing
//! with the output of an uninterrupted run; a planner leader killed is
//! replaced while the cells keep running; the embedded store survives a
//! planner restart. "Runs once" is checked on every live node: exactly one
//! of them reports the cell running or ended there.

use std::process::{Child, Stdio};

use serde_json::Value;

use super::common::*;
use crate::nodes::{free_port, reference, run_bounded, wait_for, Node, SLOW, SMALL_LONG, WORKLOAD};

/// A `roam planner` process, killed on drop.
pub(crate) struct Planner {
    child: Child,
    /// `http://127.0.0.1:port`.
    pub url: String,
    store: String,
    port: u16,
    extra: Vec<String>,
    dir: tempfile::TempDir,
    starts: u32,
}

impl Planner {
    /// A planner on the embedded store in a temp dir, or on `store`.
    pub fn start(store: Option<&str>, extra: &[&str]) -> Planner {
        let dir = tempfile::tempdir().unwrap();
        let store = store.map_or_else(
            || format!("redb:{}", dir.path().join("cluster.redb").display()),
            str::to_string,
        );
        let port = free_port();
        let mut p = Planner {
            child: std::process::Command::new("true").spawn().unwrap(),
            url: format!("http://127.0.0.1:{port}"),
            store,
            port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir,
            starts: 0,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        let log = self.dir.path().join(format!("planner-{}.log", self.starts));
        self.starts += 1;
        let mut cmd = roam(Isa::X86_64);
        cmd.args(["planner", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--store", &self.store])
            .args(&self.extra)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        self.child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let child = &mut self.child;
        wait_for("the planner to answer", SLOW, || {
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "the planner exited ({st}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            http_json(&self.url, "/v1/nodes")
        });
    }

    /// Kill it (SIGKILL) and start it again on the same store and port.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        (0..self.starts)
            .map(|n| {
                let p = self.dir.path().join(format!("planner-{n}.log"));
                format!(
                    "--- planner log {n} ---\n{}",
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    /// `GET path` as JSON.
    pub fn get(&self, path: &str) -> Value {
        http_json(&self.url, path)
            .unwrap_or_else(|| panic!("GET {path} on the planner failed\n{}", self.log()))
    }

    /// Whether it leads the cluster now (its `/metrics` say so).
    pub fn leads(&self) -> bool {
        let addr = self.url.trim_start_matches("http://");
        crate::nodes::http_get(addr, "/metrics")
            .is_ok_and(|(st, body)| st == 200 && text(&body).contains("roam_planner_leader 1"))
    }

    pub fn cell(&self, id: &str) -> Value {
        self.get(&format!("/v1/cells/{id}"))
    }

    /// `roam ARGS --planner URL`; its output.
    pub fn roam(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = roam(Isa::X86_64);
        cmd.args(args).env("ROAM_PLANNER", &self.url);
        run_bounded(cmd, SLOW)
    }

    /// `roam launch` of the workload through the planner: the cell id.
    pub fn launch(&self, args: &[&str], extra: &[&str]) -> String {
        let w = workload(WORKLOAD);
        let mut all = vec!["launch"];
        all.extend(extra);
        all.push(w.to_str().unwrap());
        all.push("--");
        all.extend(args);
        let out = self.roam(&all);
        assert!(
            out.status.success(),
            "roam launch: {}\n{}",
            text(&out.stderr),
            self.log()
        );
        text(&out.stdout).trim().to_string()
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `GET base/path` as JSON, `None` on any failure.
fn http_json(base: &str, path: &str) -> Option<Value> {
    let addr = base.trim_start_matches("http://");
    let (st, body) = crate::nodes::http_get(addr, path).ok()?;
    (st == 200)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
}

/// A node registered with `p`, named `name`.
pub(crate) fn node(isa: Isa, p: &Planner, name: &str) -> Node {
    node_of(isa, &p.url, name)
}

/// A node registered with the planners at `urls` (comma-separated).
fn node_of(isa: Isa, urls: &str, name: &str) -> Node {
    Node::start_with(
        isa,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            urls,
            "--name",
            name,
        ],
    )
}

/// Wait until `n` nodes are alive in the planner's eyes.
pub(crate) fn wait_alive(p: &Planner, n: usize) {
    wait_for("the nodes to register", SLOW, || {
        let nodes = p.get("/v1/nodes");
        let alive = nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["alive"] == true)
            .count();
        (alive >= n).then_some(())
    });
}

/// The nodes among `nodes` that have the cell running or ended (not moved
/// away, not stopped as a stale copy): must be exactly one.
fn holders(id: &str, nodes: &[&Node]) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            n.cell(id).is_some_and(|c| {
                matches!(
                    c["state"].as_str(),
                    Some("running" | "migrating" | "exited")
                )
            })
        })
        .map(|n| n.addr.clone())
        .collect()
}

/// Wait until the planner says the cell's generation passed `gen` and it
/// runs on a node other than `dead`; its record.
fn wait_restored(p: &Planner, id: &str, gen: u64, dead: &str) -> Value {
    wait_for("the cell to be restored elsewhere", SLOW, || {
        let c = p.cell(id);
        assert_ne!(c["state"]["state"], "lost", "{c}\n{}", p.log());
        (c["generation"].as_u64().unwrap() > gen
            && c["owner"] != dead
            && c["state"]["state"] == "running")
            .then_some(c)
    })
}

/// Wait until the cell has a kept checkpoint; its record.
fn wait_kept(p: &Planner, id: &str) -> Value {
    wait_for("a kept checkpoint", SLOW, || {
        let c = p.cell(id);
        (!c["kept"].is_null()).then_some(c)
    })
}

fn owner_node<'a>(c: &Value, nodes: &'a mut [(String, Node)]) -> &'a mut Node {
    let owner = c["owner"].as_str().unwrap().to_string();
    &mut nodes.iter_mut().find(|(n, _)| *n == owner).unwrap().1
}

/// The story's workload: 8 MiB of state rewritten at 1 MiB/s for 60 s,
/// long enough for two moves, two drains and a kept checkpoint before the
/// kill, with the aarch64 node under qemu and other tests on the same cores.
const STORY: [&str; 3] = ["8", "1", "60"];

/// The whole story on the embedded store. See [`story`].
#[test]
fn embedded_cluster_launches_moves_drains_and_survives_a_killed_node() {
    story(None);
}

/// The whole story on a real etcd. See [`story`].
#[test]
fn etcd_cluster_launches_moves_drains_and_survives_a_killed_node() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    story(Some(&format!("etcd://{}", etcd.endpoint())));
}

/// Three nodes, one of them aarch64 under qemu: launch, move by name to
/// the aarch64 node, drain it, put it back in service, drain the idle
/// x86-64 node so that the cell's checkpoints are kept on the aarch64 node,
/// kill the node the cell runs on: the cell is restored on the aarch64
/// node from the checkpoint kept there and finishes with the uninterrupted
/// output, run exactly once.
fn story(store: Option<&str>) {
    let p = Planner::start(store, &["--checkpoint-interval", "1", "--lease", "5"]);
    let mut nodes = vec![
        ("a".to_string(), node(Isa::X86_64, &p, "a")),
        ("b".to_string(), node(Isa::X86_64, &p, "b")),
        ("arm".to_string(), node(Isa::Aarch64, &p, "arm")),
    ];
    wait_alive(&p, 3);
    // The uninterrupted run, meanwhile.
    let expected = std::thread::spawn(|| reference(&STORY));
    // Placed on a, so that the move below goes somewhere else. (The policy
    // alone may well pick the aarch64 node.)
    let id = p.launch(&STORY, &["--on", "a"]);

    // Moved by name.
    let ok = |out: std::process::Output, what: &str, nodes: &[(String, Node)]| {
        assert!(
            out.status.success(),
            "roam {what}: {}\n{}",
            text(&out.stderr),
            all_logs(&p, nodes)
        );
        text(&out.stdout)
    };
    ok(
        p.roam(&["migrate", &id, "--to", "arm", "--mode", "pre-copy"]),
        "migrate",
        &nodes,
    );
    assert_eq!(p.cell(&id)["owner"], "arm");

    // Drained, and back in service.
    ok(p.roam(&["drain", "arm"]), "drain", &nodes);
    let c = p.cell(&id);
    assert_ne!(c["owner"], "arm", "{c}");
    let on = c["owner"].as_str().unwrap().to_string();
    ok(p.roam(&["undrain", "arm"]), "undrain", &nodes);
    // The idle x86-64 node is drained: checkpoints can only go to arm.
    let idle = if on == "a" { "b" } else { "a" };
    let out = ok(p.roam(&["drain", idle]), "drain", &nodes);
    assert!(out.contains("is drained"), "{out}");

    // Killed.
    let c = wait_for_or(
        "a checkpoint kept on arm",
        SLOW,
        || all_logs(&p, &nodes),
        || {
            let c = p.cell(&id);
            (c["kept"]["holder"] == "arm").then_some(c)
        },
    );
    let gen = c["generation"].as_u64().unwrap();
    assert_eq!(c["owner"], on.as_str(), "{c}");
    owner_node(&c, &mut nodes).kill9();
    let c = wait_restored(&p, &id, gen, &on);
    assert_eq!(c["owner"], "arm", "restored on the holder: {c}");

    let live: Vec<&Node> = nodes
        .iter()
        .filter(|(n, _)| *n != on)
        .map(|(_, n)| n)
        .collect();
    let arm = &nodes.iter().find(|(n, _)| n == "arm").unwrap().1;
    let end = arm.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", p.log());
    assert_eq!(
        holders(&id, &live),
        vec![arm.addr.clone()],
        "the cell runs on more than one node"
    );
    let out = p.roam(&["logs", &id]);
    let expected = expected.join().unwrap();
    assert_eq!(text(&out.stdout), text(&expected), "{}", p.log());
    // The planner learned the exit from the heartbeats.
    wait_for("the planner to record the exit", SLOW, || {
        let list = p.get("/v1/cells");
        let c = list
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id.as_str())?;
        (c["state"]["state"] == "exited").then_some(())
    });
}

/// The planner's log and every node's.
fn all_logs(p: &Planner, nodes: &[(String, Node)]) -> String {
    let mut all = p.log();
    for (name, n) in nodes {
        all.push_str(&format!("--- node {name} ---\n{}\n", n.log()));
    }
    all
}

/// [`wait_for`], printing `logs()` if it times out.
fn wait_for_or<T>(
    what: &str,
    limit: std::time::Duration,
    logs: impl FnOnce() -> String,
    f: impl FnMut() -> Option<T>,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_for(what, limit, f))) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{}", logs());
            std::panic::resume_unwind(e)
        }
    }
}

/// Send `sig` to process `pid`.
fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child of this test that has not been reaped.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// A node cut off from the planner past its lease (frozen with SIGSTOP)
/// is declared dead and its cell restored on another node from its kept
/// checkpoint. When it comes back, the planner's answer to its heartbeat
/// makes it stop its own copy: the cell runs to the end exactly once.
#[test]
fn a_node_cut_off_past_its_lease_stops_its_copy_when_it_returns() {
    let p = Planner::start(None, &["--checkpoint-interval", "1", "--lease", "5"]);
    let a = node(Isa::X86_64, &p, "a");
    let b = node(Isa::X86_64, &p, "b");
    wait_alive(&p, 2);
    let id = p.launch(&SMALL_LONG, &["--on", "a"]);
    let c = wait_kept(&p, &id);
    let gen = c["generation"].as_u64().unwrap();
    signal(a.pid(), libc::SIGSTOP);
    let restored = std::panic::catch_unwind(|| wait_restored(&p, &id, gen, "a"));
    signal(a.pid(), libc::SIGCONT);
    let c = restored.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert_eq!(c["owner"], "b", "{c}");
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", a.log());
    assert!(
        end["error"].as_str().unwrap_or("").contains("another node"),
        "{end}"
    );
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    assert_eq!(holders(&id, &[&a, &b]), vec![b.addr.clone()]);
    let out = p.roam(&["logs", &id]);
    assert_eq!(
        text(&out.stdout),
        text(&reference(&SMALL_LONG)),
        "{}",
        p.log()
    );
}

/// A node whose link to the planner is cut (the node itself keeps
/// running) pauses its cells before the planner can declare it dead, so its
/// copy does not run next to the one restored elsewhere: the link stays cut
/// until the restored copy has finished, long enough for an unfenced copy
/// to finish too. When the link comes back, the node stops its held copy.
#[test]
fn a_node_cut_off_from_the_planner_holds_its_cells_until_it_hears_back() {
    let p = Planner::start(None, &["--checkpoint-interval", "1", "--lease", "5"]);
    let port: u16 = p.url.rsplit(':').next().unwrap().parse().unwrap();
    let link = crate::nodes::Link::start(port, roam_link::LinkConfig::transparent());
    let via = format!("http://{}", link.proxy().local_addr());
    let a = Node::start_with(
        Isa::X86_64,
        &[
            "--migrate-listen",
            "127.0.0.1:0",
            "--planner",
            &via,
            "--name",
            "a",
        ],
    );
    let b = node(Isa::X86_64, &p, "b");
    wait_alive(&p, 2);
    let id = p.launch(&SMALL_LONG, &["--on", "a"]);
    let c = wait_kept(&p, &id);
    let gen = c["generation"].as_u64().unwrap();
    link.proxy().handle().cut(roam_link::AfterCut::Refuse);
    wait_for("node a to hold its cells", SLOW, || {
        a.log()
            .contains("pausing this node's planner cells")
            .then_some(())
    });
    let c = wait_restored(&p, &id, gen, "a");
    assert_eq!(c["owner"], "b", "{c}");
    let end = b.wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", b.log());
    // Without the fence, a's copy, started earlier, would have ended by now.
    assert_eq!(a.cell(&id).unwrap()["state"], "running", "{}", a.log());
    link.proxy().handle().restore();
    let end = a.wait_end(&id, SLOW);
    assert_eq!(end["state"], "failed", "{end}\n{}", a.log());
    assert!(
        end["error"].as_str().unwrap_or("").contains("another node"),
        "{end}"
    );
    let out = p.roam(&["logs", &id]);
    assert_eq!(
        text(&out.stdout),
        text(&reference(&SMALL_LONG)),
        "{}",
        p.log()
    );
}

/// The embedded store survives a planner restart: nodes and cells are
/// still known, and the nodes keep heartbeating to the new process.
#[test]
fn embedded_store_survives_a_planner_restart() {
    let mut p = Planner::start(None, &["--checkpoint-interval", "0"]);
    let _a = node(Isa::X86_64, &p, "a");
    wait_alive(&p, 1);
    let id = p.launch(&SMALL_LONG, &[]);
    let before = p.cell(&id);
    p.restart();
    assert_eq!(p.cell(&id)["owner"], before["owner"]);
    assert_eq!(p.cell(&id)["module"], before["module"]);
    wait_alive(&p, 1);
}

/// Several planners on one etcd: the leader is killed while cells run; the
/// other takes over and, when a node is then killed, restores its cell.
#[test]
fn etcd_leader_killed_then_a_node_killed() {
    let Some(etcd) = roam_testkit::etcd::Etcd::start_or_skip() else {
        return;
    };
    let store = format!("etcd://{}", etcd.endpoint());
    let opts = ["--checkpoint-interval", "1", "--lease", "5"];
    let mut leader = Planner::start(Some(&store), &opts);
    wait_for("the first planner to lead", SLOW, || {
        leader.leads().then_some(())
    });
    let other = Planner::start(Some(&store), &opts);
    let both = format!("{},{}", leader.url, other.url);
    let mut nodes = vec![
        // The leader first: the nodes fail over when it dies.
        ("a".to_string(), node_of(Isa::X86_64, &both, "a")),
        ("b".to_string(), node_of(Isa::X86_64, &both, "b")),
    ];
    wait_alive(&other, 2);
    let id = other.launch(&SMALL_LONG, &[]);
    leader.kill9();
    wait_for("the other planner to lead", SLOW, || {
        other.leads().then_some(())
    });
    // The cell kept running through the change of leader, and checkpoints
    // are kept again by the new one.
    let c = wait_kept(&other, &id);
    assert_eq!(c["state"]["state"], "running", "{c}");
    let gen = c["generation"].as_u64().unwrap();
    let dead = c["owner"].as_str().unwrap().to_string();
    owner_node(&c, &mut nodes).kill9();
    let c = wait_restored(&other, &id, gen, &dead);
    let live: Vec<&Node> = nodes
        .iter()
        .filter(|(n, _)| *n != dead)
        .map(|(_, n)| n)
        .collect();
    let end = live[0].wait_end(&id, SLOW);
    assert_eq!(end["state"], "exited", "{end}\n{}", other.log());
    assert!(
        live[0].log().contains("now talking to this planner"),
        "the node did not fail over to the other planner\n{}",
        live[0].log()
    );
    let out = other.roam(&["logs", &id]);
    assert_eq!(text(&out.stdout), text(&reference(&SMALL_LONG)), "{c}");
}
