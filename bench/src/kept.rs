//! The memory a kept checkpoint costs its owner and its holder.
//!
//! Why: a kept checkpoint is one more copy of a cell's memory, and a node
//! near its memory cap that needs more than that on a checkpoint tick is
//! killed by the OOM killer with every cell on it. This starts an owner
//! and a holder node (`roam node`, plain, on loopback), launches the
//! `dirty` workload on the owner with a given amount of state, keeps a
//! checkpoint of it on the holder again and again, and reads both
//! processes' resident and peak memory (`VmRSS`, `VmHWM`) after each.
//! With `--baseline ROAM` it does the same with another `roam` binary
//! first, in the same run, so two builds compare side by side.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_api::types::{KeepRequest, LaunchRequest};
use roam_api::Client;

use crate::paths::Paths;
use crate::report::{Report, Table};

/// What to run.
pub struct Options {
    /// The `dirty` workload's state, MiB.
    pub mib: u64,
    /// Its dirtying rate, MiB/s.
    pub rate: u64,
    /// Checkpoints kept per binary.
    pub keeps: usize,
    /// Another `roam` to measure first.
    pub baseline: Option<PathBuf>,
}

/// A node process, killed on drop.
pub(crate) struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn memory(pid: u32) -> anyhow::Result<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    let field = |k: &str| -> anyhow::Result<f64> {
        let line = s
            .lines()
            .find(|l| l.starts_with(k))
            .with_context(|| format!("no {k} in /proc/{pid}/status"))?;
        let kib: f64 = line
            .split_whitespace()
            .nth(1)
            .context("an empty field")?
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// A free loopback port (bound and released: another process could take
/// it in between, which the node's start would then report).
pub(crate) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn start_node(
    roam: &Path,
    name: &str,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Proc, String)> {
    start_node_in(None, roam, name, dir, extra)
}

/// A command that runs `roam` in network namespace `ns`, or here.
pub(crate) fn roam_in(ns: Option<&str>, roam: &Path) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(roam);
            c
        }
        None => Command::new(roam),
    }
}

/// [`start_node`] inside network namespace `ns`, listening on its address
/// (`Some((namespace, address))`), or on loopback (`None`).
pub(crate) fn start_node_in(
    ns: Option<(&str, &str)>,
    roam: &Path,
    name: &str,
    dir: &Path,
    extra: &[&str],
) -> anyhow::Result<(Proc, String)> {
    // A namespace of its own has every port free.
    let port = free_port()?;
    let ip = ns.map_or("127.0.0.1", |(_, ip)| ip);
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut cmd = roam_in(ns.map(|(ns, _)| ns), roam);
    let child = cmd
        .args(["node", "--listen", &format!("{ip}:{port}")])
        .args(["--migrate-listen", &format!("{ip}:0"), "--name", name])
        // The namespaces are this machine's own, reachable from no other:
        // the node may serve without authentication there.
        .args(ns.map(|_| "--insecure"))
        .arg("--state-dir")
        .arg(dir.join(name))
        .arg("--cache-dir")
        .arg(dir.join("cache"))
        .args(["--memory-reserve-mib", "0"])
        .args(extra)
        // The nodes are killed at the end: with nice, no CPU group of theirs
        // is left behind (what is measured here is memory). An environment
        // variable, not the flag, so that a baseline older than CPU limits
        // starts too.
        .env("ROAM_CELL_CPU_CONTROL", "nice")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", roam.display()))?;
    Ok((Proc(child), format!("http://{ip}:{port}")))
}

/// One row per checkpoint kept.
struct Row {
    binary: String,
    keep: usize,
    secs: f64,
    bytes: u64,
    sent: u64,
    owner: (f64, f64),
    holder: (f64, f64),
}

async fn wait_up(c: &Client) -> anyhow::Result<()> {
    let start = Instant::now();
    while c.node().await.is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the node did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn one_binary(
    roam: &Path,
    label: &str,
    wasm: &[u8],
    dir: &Path,
    o: &Options,
) -> anyhow::Result<Vec<Row>> {
    let (owner, owner_url) = start_node(roam, "owner", dir, &[])?;
    let (holder, holder_url) = start_node(roam, "holder", dir, &[])?;
    let oc = Client::new(&owner_url);
    wait_up(&oc).await?;
    wait_up(&Client::new(&holder_url)).await?;
    let module = oc.upload_module(wasm.to_vec()).await?.hash;
    let args = ["dirty", &o.mib.to_string(), &o.rate.to_string(), "3600"];
    let cell = oc
        .launch(&LaunchRequest {
            module,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            dirs: Vec::new(),
            max_memory: Some((o.mib + 64) << 20),
            service: None,
            id: None,
            generation: None,
            cpu: Default::default(),
            far: None,
        })
        .await?
        .id;
    // The state is written once at the start (its program's output is
    // buffered, so the log does not say when): give it time, then check
    // that the first checkpoint holds all of it.
    tokio::time::sleep(Duration::from_secs(5 + o.mib / 16)).await;
    let req = KeepRequest {
        holder: holder_url.clone(),
        holder_name: "holder".into(),
    };
    let mut rows = Vec::new();
    for keep in 1..=o.keeps {
        let t = Instant::now();
        let r = oc
            .keep(&cell, &req)
            .await
            .with_context(|| format!("{label}: keep {keep}"))?;
        let secs = t.elapsed().as_secs_f64();
        if keep == 1 && r.bytes < (o.mib << 20) {
            bail!(
                "{label}: the first checkpoint holds {:.0} MiB of the {} MiB of state: \
                 the workload had not written it yet (a busy machine?)",
                mib(r.bytes),
                o.mib
            );
        }
        // Let freed memory go back where the allocator gives it back.
        tokio::time::sleep(Duration::from_secs(1)).await;
        rows.push(Row {
            binary: label.to_string(),
            keep,
            secs,
            bytes: r.bytes,
            sent: r.sent_bytes,
            owner: memory(owner.0.id())?,
            holder: memory(holder.0.id())?,
        });
        eprintln!(
            "kept: {label} #{keep}: {secs:.1} s, holder RSS {:.0} MiB",
            rows[rows.len() - 1].holder.0
        );
    }
    drop((owner, holder));
    Ok(rows)
}

/// Run the benchmark.
pub fn run(paths: &Paths, o: &Options) -> anyhow::Result<Report> {
    let current = paths.tool("roam")?;
    let wasm = std::fs::read(paths.wasm("dirty")?)?;
    let mut binaries = Vec::new();
    if let Some(b) = &o.baseline {
        if !b.exists() {
            bail!("the baseline {} does not exist", b.display());
        }
        binaries.push((b.clone(), "baseline".to_string()));
    }
    binaries.push((current, "current".to_string()));
    let rt = tokio::runtime::Runtime::new()?;
    let mut rows = Vec::new();
    for (bin, label) in &binaries {
        let dir = paths.fresh_dir(&format!("kept-{label}"))?;
        rows.extend(rt.block_on(one_binary(bin, label, &wasm, &dir, o))?);
    }
    Ok(report(&rows, o, &binaries))
}

fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1 << 20)
}

fn report(rows: &[Row], o: &Options, binaries: &[(PathBuf, String)]) -> Report {
    let mut table = Table::new(&[
        "binary",
        "keep",
        "time s",
        "checkpoint MiB",
        "sent MiB",
        "owner RSS MiB",
        "owner peak MiB",
        "holder RSS MiB",
        "holder peak MiB",
    ]);
    for r in rows {
        table.push(vec![
            r.binary.clone(),
            r.keep.to_string(),
            format!("{:.2}", r.secs),
            format!("{:.0}", mib(r.bytes)),
            format!("{:.1}", mib(r.sent)),
            format!("{:.0}", r.owner.0),
            format!("{:.0}", r.owner.1),
            format!("{:.0}", r.holder.0),
            format!("{:.0}", r.holder.1),
        ]);
    }
    let mut notes = Vec::new();
    let last = |label: &str| rows.iter().rev().find(|r| r.binary == label);
    if let (Some(b), Some(c)) = (last("baseline"), last("current")) {
        notes.push(format!(
            "current ÷ baseline, holder resident after the last checkpoint: **{:.2}×** \
             ({:.0} → {:.0} MiB); peak {:.2}×",
            c.holder.0 / b.holder.0.max(1.0),
            b.holder.0,
            c.holder.0,
            c.holder.1 / b.holder.1.max(1.0)
        ));
    }
    // Alone, the current binary's line is the headline.
    let alone = last("baseline").is_none();
    for (_, label) in binaries {
        if let Some(r) = last(label) {
            let held = format!("{:.0} MiB", r.holder.0);
            notes.push(format!(
                "{label}: after {} checkpoints of {:.0} MiB the holder holds {} \
                 resident ({:.2}× the checkpoint; peak {:.0} MiB) and the owner {:.0} MiB \
                 (peak {:.0} MiB)",
                r.keep,
                mib(r.bytes),
                if alone { format!("**{held}**") } else { held },
                r.holder.0 / mib(r.bytes).max(1.0),
                r.holder.1,
                r.owner.0,
                r.owner.1
            ));
        }
    }
    notes.push(
        "resident and peak memory are the node process's `VmRSS` and `VmHWM`, read 1 s after \
         each keep returned; the cell's own memory is on the owner"
            .into(),
    );
    let baseline = binaries
        .iter()
        .find(|(_, l)| l == "baseline")
        .map(|(p, _)| format!(" --baseline {}", p.display()))
        .unwrap_or_default();
    Report {
        figure: None,
        name: "kept".into(),
        label: String::new(),
        title: "Kept checkpoints: the owner's and the holder's memory".into(),
        setup: format!(
            "`roam-bench kept --mib {} --rate {} --keeps {}{baseline}`: owner and holder \
             `roam node` on loopback, plain; the `dirty` workload with {} MiB of state \
             rewritten at {} MiB/s",
            o.mib, o.rate, o.keeps, o.mib, o.rate
        ),
        table,
        notes,
    }
}
