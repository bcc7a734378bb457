//! The memory-server rows of `roam-bench far --server`: the same workload
//! launched on a node whose far pages go to a memory server on another
//! node (two `roam node` processes on this machine's loopback), against the
//! same launch with all of its memory on the node.
//!
//! Both sides go through the node (upload, compile cache, launch, the end
//! seen by polling the node's API every 20 ms), so their ratio is the
//! paging's cost alone.
//!
//! With a link rate (`--links 100mbit`, root only), the two nodes run in
//! the network namespaces of `scripts/netns-link.sh`, the board in `roam-a`
//! and the memory server in `roam-b`, joined by a veth pair that the
//! kernel shapes with `tbf` at that rate each way: real TCP over a real
//! bottleneck, without added delay (this machine has no `netem`). A
//! user-space proxy (`roam-link`) was tried first and rejected for these
//! rows: its pacing sleeps on tokio's millisecond timer, which turned each
//! 4 KiB page into a round trip of about 3.5 ms at 100 Mbit/s.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kept::{roam_in, start_node_in, Proc};
use crate::proc::checksum;

/// A memory server and a node paging to it.
pub(crate) struct Pair {
    // Dropped first: the nodes end before their namespaces go.
    _procs: [Proc; 2],
    link: Option<Link>,
    server: String,
    board: String,
    roam: PathBuf,
}

/// The shaped link of `scripts/netns-link.sh`, taken down when dropped.
struct Link;

/// The board's namespace and address, then the memory server's.
const BOARD_NS: (&str, &str) = ("roam-a", "10.77.0.1");
const SERVER_NS: (&str, &str) = ("roam-b", "10.77.0.2");

fn link_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns-link.sh")
}

/// Create the link at `rate`, or reshape it (the script is idempotent).
fn link_up(rate: &str) -> anyhow::Result<()> {
    let script = link_script();
    let out = Command::new(&script)
        .args(["up", rate])
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "a {rate} link needs root and iproute2: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new(link_script()).arg("down").output();
    }
}

impl Pair {
    /// Start both nodes in `dir` and wait until they answer; with `rate`
    /// (`tc` units), in two namespaces joined by a link of that rate.
    pub(crate) fn start(roam: &Path, dir: &Path, rate: Option<&str>) -> anyhow::Result<Pair> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {dir:?}"))?;
        let link = match rate {
            Some(rate) => {
                link_up(rate)?;
                Some(Link)
            }
            None => None,
        };
        let (board_ns, server_ns) = match link {
            Some(_) => (Some(BOARD_NS), Some(SERVER_NS)),
            None => (None, None),
        };
        let server_flags = ["--memory-server", "4GiB"];
        let (s, server) = start_node_in(server_ns, roam, "server", dir, &server_flags)?;
        let (b, board) = start_node_in(board_ns, roam, "board", dir, &[])?;
        let pair = Pair {
            _procs: [s, b],
            link,
            server,
            board,
            roam: roam.to_path_buf(),
        };
        for node in [&pair.server, &pair.board] {
            let up = Instant::now();
            while pair.roam(&["cells", "--node", node, "--json"]).is_err() {
                if up.elapsed() > Duration::from_secs(30) {
                    bail!("node {node} did not answer in 30 s (see its log in {dir:?})");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(pair)
    }

    /// Reshape the link to `rate`, between two cells (a pair started
    /// with a rate only).
    pub(crate) fn shape(&self, rate: &str) -> anyhow::Result<()> {
        match &self.link {
            // The same namespaces: `up` again changes the qdiscs only.
            Some(_) => link_up(rate),
            None => bail!("a pair on loopback has no link to shape"),
        }
    }

    /// Run the CLI where the board is (its namespace, with a link).
    fn roam(&self, args: &[&str]) -> anyhow::Result<String> {
        let ns = self.link.as_ref().map(|_| BOARD_NS.0);
        let out = roam_in(ns, &self.roam)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run roam")?;
        if !out.status.success() {
            bail!(
                "roam {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Launch `wasm` with `size` on the board, with `far` (local bytes,
    /// eviction) or all of its memory, and wait for its end: its checksum,
    /// the time from the launch to the end, and a summary in `roam run
    /// --local-memory`'s words.
    pub(crate) fn run(
        &self,
        wasm: &Path,
        size: &str,
        far: Option<(u64, &str)>,
    ) -> anyhow::Result<(String, Duration, String)> {
        let wasm = wasm.to_str().context("a workload path that is not UTF-8")?;
        let local = far.map(|(l, _)| format!("{}KiB", l / 1024));
        let mut args = vec!["launch", "--node", &self.board, "--max-memory", "2GiB"];
        if let (Some(local), Some((_, eviction))) = (&local, far) {
            args.extend(["--local-memory", local, "--memory-server", &self.server]);
            args.extend(["--eviction", eviction]);
        }
        args.extend([wasm, "--", size]);
        let began = Instant::now();
        let id = self.roam(&args)?.trim().to_string();
        let mut last_far = serde_json::Value::Null;
        let ended = loop {
            let cell: serde_json::Value =
                serde_json::from_str(&self.roam(&["cells", "--node", &self.board, "--json"])?)?;
            let row = cell
                .as_array()
                .and_then(|a| a.iter().find(|c| c["id"] == id.as_str()))
                .cloned()
                .with_context(|| format!("cell {id} is not on the board"))?;
            match row["state"].as_str() {
                Some("running") => {
                    if !row["far"].is_null() {
                        last_far = row["far"].clone();
                    }
                }
                Some("exited") => break began.elapsed(),
                other => bail!("cell {id} ended {other:?}: {row}"),
            }
            if began.elapsed() > Duration::from_secs(1800) {
                bail!("cell {id} still runs after 30 min");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = self.roam(&["logs", "--node", &self.board, &id])?;
        let sum = checksum(&log).with_context(|| format!("cell {id} printed no checksum"))?;
        let mib = |k: &str| last_far[k].as_u64().unwrap_or(0) as f64 / 1048576.0;
        let summary = format!(
            "{} faults, {:.1} MiB read back, {:.1} MiB written out",
            last_far["far_faults"].as_u64().unwrap_or(0),
            mib("bytes_in"),
            mib("bytes_out")
        );
        Ok((sum, ended, summary))
    }
}
