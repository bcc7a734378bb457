//! A `roam planner` process as the cluster tests drive it (on the embedded
//! store or on etcd, restarted on the same store and port, spoken to by the
//! `roam` commands or its raw HTTP API), the nodes that register with it,
//! and the waits on what the planner records: nodes alive, checkpoints
//! kept, cells restored. Shared by the cluster, node and stop tests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;

use serde_json::Value;

use super::*;

/// A `roam planner` process, killed on drop.
pub struct Planner {
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
            .args(&self.extra);
        self.child = spawn_logged(&mut cmd, &log);
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
        http_get(addr, "/metrics")
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

    /// Its control API, `127.0.0.1:port`.
    pub fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// `GET path`: the status and the body as JSON (`null` if it is not).
    pub fn api_get(&self, path: &str) -> (u16, Value) {
        let (st, body) = http_get(self.addr(), path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.log()));
        (st, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// `POST path` with a JSON body: the status and the body as JSON (a
    /// JSON string if it is not JSON).
    pub fn api_post(&self, path: &str, body: Value) -> (u16, Value) {
        let (st, body) = http_post(self.addr(), path, &body)
            .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", self.log()));
        let v = serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(text(&body)));
        (st, v)
    }

    /// `POST /v1/modules` with the module's bytes: its hash.
    pub fn upload(&self, bytes: &[u8]) -> String {
        let mut s = TcpStream::connect(self.addr()).unwrap();
        write!(
            s,
            "POST /v1/modules HTTP/1.0\r\nHost: {}\r\nContent-Type: application/wasm\r\n\
             Content-Length: {}\r\n\r\n",
            self.addr(),
            bytes.len()
        )
        .unwrap();
        s.write_all(bytes).unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).unwrap();
        let reply = text(&buf);
        assert!(reply.starts_with("HTTP/1.0 200"), "{reply}\n{}", self.log());
        let body = &reply[reply.find("\r\n\r\n").unwrap() + 4..];
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["bytes"].as_u64(), Some(bytes.len() as u64));
        v["hash"].as_str().unwrap().to_string()
    }

    /// The cell's record, once `ok` holds for it.
    pub fn wait_cell(&self, id: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, SLOW, || {
            let (st, c) = self.api_get(&format!("/v1/cells/{id}"));
            assert_eq!(st, 200, "{c}\n{}", self.log());
            ok(&c).then_some(c)
        })
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A node registered with `p`, named `name`.
pub fn node(isa: Isa, p: &Planner, name: &str) -> Node {
    node_of(isa, &p.url, name)
}

/// A node registered with the planners at `urls` (comma-separated).
pub fn node_of(isa: Isa, urls: &str, name: &str) -> Node {
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

/// A host node named `name` that registers with `p` itself; returns once
/// the planner lists it alive under that name.
pub fn registered_node(p: &Planner, name: &str) -> Node {
    let node = node(Isa::X86_64, p, name);
    wait_for(&format!("{name} to register"), SLOW, || {
        let (_, nodes) = p.api_get("/v1/nodes");
        nodes
            .as_array()?
            .iter()
            .any(|n| n["name"] == name && n["alive"] == true)
            .then_some(())
    });
    node
}

/// Wait until `n` nodes are alive in the planner's eyes.
pub fn wait_alive(p: &Planner, n: usize) {
    wait_for("the nodes to register", SLOW, || {
        let nodes = p.get("/v1/nodes");
        let alive = |n: &&Value| n["alive"] == true;
        (nodes.as_array().unwrap().iter().filter(alive).count() >= n).then_some(())
    });
}

/// The nodes among `nodes` that have the cell running or ended (not moved
/// away, not stopped as a stale copy): must be exactly one.
pub fn holders(id: &str, nodes: &[&Node]) -> Vec<String> {
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
pub fn wait_restored(p: &Planner, id: &str, gen: u64, dead: &str) -> Value {
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
pub fn wait_kept(p: &Planner, id: &str) -> Value {
    wait_for("a kept checkpoint", SLOW, || {
        let c = p.cell(id);
        (!c["kept"].is_null()).then_some(c)
    })
}

pub fn owner_node<'a>(c: &Value, nodes: &'a mut [(String, Node)]) -> &'a mut Node {
    let owner = c["owner"].as_str().unwrap().to_string();
    &mut nodes.iter_mut().find(|(n, _)| *n == owner).unwrap().1
}

/// The planner's log and every node's.
pub fn all_logs(p: &Planner, nodes: &[(String, Node)]) -> String {
    let mut all = p.log();
    for (name, n) in nodes {
        all.push_str(&format!("--- node {name} ---\n{}\n", n.log()));
    }
    all
}

/// Wait until one of `ids` runs on node `to`, having moved there once
/// (generation 2): its record.
pub fn wait_one_moved(p: &Planner, nodes: &[(String, Node)], ids: &[String], to: &str) -> Value {
    let moved = wait_for(&format!("one cell to move to {to}"), SLOW, || {
        ids.iter()
            .map(|id| p.cell(id))
            .find(|c| c["owner"] == to && c["state"]["state"] == "running")
    });
    assert_eq!(moved["generation"], 2, "{moved}\n{}", all_logs(p, nodes));
    moved
}

/// Wait for each of `ids` to exit on its owner, moved at most once, and
/// check its output against `expected`.
pub fn expect_exits(p: &Planner, nodes: &[(String, Node)], ids: &[String], expected: &str) {
    expect_exits_moved(p, nodes, ids, expected, 1);
}

/// [`expect_exits`], for cells that may move up to `moves` times: a cell
/// that moves on while it is waited for is followed to its new owner.
pub fn expect_exits_moved(
    p: &Planner,
    nodes: &[(String, Node)],
    ids: &[String],
    expected: &str,
    moves: u64,
) {
    for id in ids {
        let mut end = Value::Null;
        for _ in 0..=moves {
            let owner = p.cell(id)["owner"].as_str().unwrap().to_string();
            let node = &nodes.iter().find(|(n, _)| *n == owner).unwrap().1;
            end = node.wait_end(id, SLOW);
            if end["state"] != "moved" {
                break;
            }
            // It moved on meanwhile: the planner names its next owner once
            // the move is done.
            wait_for(&format!("cell {id} to leave {owner}"), SLOW, || {
                (p.cell(id)["owner"] != owner.as_str()).then_some(())
            });
        }
        assert_eq!(end["state"], "exited", "{end}\n{}", all_logs(p, nodes));
        assert!(
            p.cell(id)["generation"].as_u64().unwrap() <= 1 + moves,
            "cell {id} moved more than {moves} times\n{}",
            all_logs(p, nodes)
        );
        let (_, log) = http_get(p.addr(), &format!("/v1/cells/{id}/logs")).unwrap();
        assert_eq!(text(&log), expected, "cell {id}'s output differs");
    }
}

/// An x86-64 node of planner `p`'s cluster called `name`, with `extra`
/// flags.
pub fn planner_node(p: &Planner, name: &str, extra: &[&str]) -> Node {
    let mut args = vec![
        "--migrate-listen",
        "127.0.0.1:0",
        "--planner",
        &p.url,
        "--name",
        name,
    ];
    args.extend(extra);
    Node::start_with(Isa::X86_64, &args)
}

/// A node of planner `p` called `name` that declares the power model
/// `model` (`--power`), with `extra` flags.
pub fn powered_with(p: &Planner, name: &str, model: &str, extra: &[&str]) -> Node {
    let mut args = vec!["--power", model];
    args.extend(extra);
    planner_node(p, name, &args)
}
