//! The memory-server rows of `roam-bench far --server`: the same workload
//! launched on a node whose far pages go to a memory server on another
//! node (two `roam node` processes on this machine's loopback), against the
//! same launch with all of its memory on the node.
//!
//! Both sides go through the node (upload, compile cache, launch, the end
//! seen by polling the node's API every 20 ms), so their ratio is the
//! paging's cost alone; the loopback link is much faster than a board's
//! network, which these rows do not emulate.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::kept::{start_node, Proc};
use crate::proc::checksum;

/// A memory server and a node paging to it.
pub(crate) struct Pair {
    _procs: [Proc; 2],
    server: String,
    board: String,
    roam: PathBuf,
}

impl Pair {
    /// Start both nodes in `dir` and wait until they answer.
    pub(crate) fn start(roam: &Path, dir: &Path) -> anyhow::Result<Pair> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {dir:?}"))?;
        let (s, server) = start_node(roam, "server", dir, &["--memory-server", "4GiB"])?;
        let (b, board) = start_node(roam, "board", dir, &[])?;
        let pair = Pair {
            _procs: [s, b],
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

    fn roam(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.roam)
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
