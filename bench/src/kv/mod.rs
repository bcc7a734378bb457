//! The pieces the Redis-protocol benchmarks (gateway overhead, T4 with the
//! KV cell, T7 follow-the-user) share: starting the `kvserver` natively, as
//! a cell under `roam run --listen`, or behind `roam gateway` on nodes;
//! launching and migrating it with the `roam` CLI; and the client load.
//!
//! Why it exists: those benchmarks measure what a client of a migrating
//! server sees, so they drive the real executables exactly as a user would
//! (see the walk-through in docs/benchmarks.md), and every process
//! they start is killed when its handle is dropped, whatever fails.

pub mod delay;
pub mod load;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A child process, killed on drop; its stderr goes to a log file.
pub struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// Start `cmd`, logging stderr (and stdout) to `log`.
    pub fn spawn(mut cmd: Command, log: &Path, what: &str) -> anyhow::Result<Proc> {
        let f = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("cannot start the {what}"))?;
        Ok(Proc {
            child,
            what: what.into(),
        })
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(s) = self.child.try_wait()? {
            bail!("the {} exited: {s}", self.what);
        }
        Ok(())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback address nothing listens on (at the moment of the call).
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Wait until something accepts connections on `addr`, while `proc` lives.
pub fn wait_listening(addr: SocketAddr, proc: &mut Proc, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        proc.check_alive()?;
        if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!("nothing accepted connections on {addr} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The native kvserver on `addr`.
pub fn native_server(bin: &Path, addr: SocketAddr, dir: &Path) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(bin);
    cmd.arg("--listen").arg(addr.to_string());
    let mut p = Proc::spawn(cmd, &dir.join("native.log"), "native kvserver")?;
    wait_listening(addr, &mut p, Duration::from_secs(10))?;
    Ok(p)
}

/// The kvserver cell under `roam run --listen addr`.
pub fn run_listen(
    roam: &Path,
    wasm: &Path,
    addr: SocketAddr,
    dir: &Path,
    cache: &Path,
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(roam);
    cmd.env("ROAM_CACHE_DIR", cache)
        .arg("run")
        .arg("--listen")
        .arg(addr.to_string())
        .arg(wasm);
    let mut p = Proc::spawn(cmd, &dir.join("run-listen.log"), "roam run --listen")?;
    wait_listening(addr, &mut p, Duration::from_secs(300))?;
    Ok(p)
}

/// `roam gateway` serving the RESP `service` to clients on `listen`, nodes on `control`.
pub fn gateway(
    roam: &Path,
    listen: SocketAddr,
    service: &str,
    control: SocketAddr,
    dir: &Path,
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(roam);
    cmd.arg("gateway")
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--service")
        .arg(service)
        .arg("--resp")
        .arg("--control")
        .arg(control.to_string());
    let mut p = Proc::spawn(cmd, &dir.join("gateway.log"), "roam gateway")?;
    wait_listening(control, &mut p, Duration::from_secs(30))?;
    Ok(p)
}

/// A `roam node` named `name` on `listen`, linked to the gateway at `gateway`.
pub fn node(
    roam: &Path,
    listen: SocketAddr,
    name: &str,
    gateway: SocketAddr,
    dir: &Path,
    cache: &Path,
) -> anyhow::Result<Proc> {
    node_with(roam, listen, name, gateway, dir, cache, &[])
}

/// [`node`] with more `roam node` arguments (`--planner URL`).
pub fn node_with(
    roam: &Path,
    listen: SocketAddr,
    name: &str,
    gateway: SocketAddr,
    dir: &Path,
    cache: &Path,
    extra: &[String],
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(roam);
    cmd.arg("node")
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--name")
        .arg(name)
        .arg("--gateway")
        .arg(gateway.to_string())
        .arg("--state-dir")
        .arg(dir.join(name))
        .arg("--cache-dir")
        .arg(cache)
        .arg("--memory-reserve-mib")
        .arg("0")
        .args(extra);
    let mut p = Proc::spawn(cmd, &dir.join(format!("node-{name}.log")), "roam node")?;
    wait_listening(listen, &mut p, Duration::from_secs(30))?;
    Ok(p)
}

/// A `roam planner` on a fresh redb store in `dir`, lease 3 s (heartbeats
/// every second), no kept checkpoints, with placement `policy` in force:
/// the process and its URL.
pub fn planner(roam: &Path, dir: &Path, policy: &str) -> anyhow::Result<(Proc, String)> {
    let addr = free_addr()?;
    let store = format!("redb:{}", dir.join("cluster.redb").display());
    let mut cmd = Command::new(roam);
    cmd.args(["planner", "--listen", &addr.to_string(), "--store", &store])
        .args(["--lease", "3", "--checkpoint-interval", "0"]);
    let mut p = Proc::spawn(cmd, &dir.join("planner.log"), "roam planner")?;
    wait_listening(addr, &mut p, Duration::from_secs(30))?;
    let url = format!("http://{addr}");
    run_bounded(
        Command::new(roam).args(["policy", policy, "--planner", &url]),
        Duration::from_secs(30),
    )?;
    Ok((p, url))
}

/// One `roam node` of a benchmark cluster.
pub struct ClusterNode<'a> {
    /// Its name.
    pub name: &'a str,
    /// roam's aarch64 build under qemu-user (`arm`), else `roam`.
    pub aarch64: bool,
    /// Its `--power` model.
    pub power: &'a str,
    /// The CPU it is pinned to (`taskset -c`), if any.
    pub pin: Option<&'a str>,
}

/// Start node `n` of the planner at `url`, offering one core, its state in
/// `dir/NAME`, its log in `dir/node-NAME.log`, its compile cache in
/// `cache`; wait until it listens. The process and its API address.
pub fn cluster_node(
    roam: &Path,
    arm: &Path,
    url: &str,
    dir: &Path,
    cache: &Path,
    n: &ClusterNode,
) -> anyhow::Result<(Proc, SocketAddr)> {
    let listen = free_addr()?;
    let mut cmd = match n.pin {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpu]);
            c
        }
        None if n.aarch64 => Command::new("qemu-aarch64"),
        None => Command::new(roam),
    };
    if n.pin.is_some() {
        cmd.arg(if n.aarch64 {
            Path::new("qemu-aarch64")
        } else {
            roam
        });
    }
    if n.aarch64 {
        cmd.args(["-L", "/usr/aarch64-linux-gnu"]).arg(arm);
    }
    cmd.args(["node", "--listen", &listen.to_string(), "--name", n.name])
        .args(["--migrate-listen", "127.0.0.1:0", "--planner", url])
        .args(["--power", n.power, "--cores", "1"])
        .args(["--memory-reserve-mib", "0"])
        .arg("--state-dir")
        .arg(dir.join(n.name))
        .arg("--cache-dir")
        .arg(cache);
    let mut p = Proc::spawn(cmd, &dir.join(format!("node-{}.log", n.name)), "roam node")?;
    wait_listening(listen, &mut p, Duration::from_secs(120))?;
    Ok((p, listen))
}

/// Wait, up to `limit`, until `n` nodes of the planner at `url` are alive
/// and `ready` (what else the caller needs of each record); else an error
/// naming `what` with the planner's last answer.
pub fn wait_nodes(
    roam: &Path,
    url: &str,
    n: usize,
    limit: Duration,
    what: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let out = run_bounded(
            Command::new(roam).args(["nodes", "--planner", url, "--json"]),
            Duration::from_secs(30),
        )?;
        let nodes: serde_json::Value = serde_json::from_str(&out)?;
        let count = nodes.as_array().map_or(0, |v| {
            v.iter().filter(|x| x["alive"] == true && ready(x)).count()
        });
        if count == n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{what}: {out}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Run `cmd` with a deadline; its stdout on success, else an error with its output.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> anyhow::Result<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            let out = child.wait_with_output()?;
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if !out.status.success() {
                bail!(
                    "{:?} failed ({}): {} {}",
                    cmd.get_args().next().unwrap_or_default(),
                    out.status,
                    stdout.trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            return Ok(stdout);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("timed out after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `roam launch --node NODE --service SERVICE WASM`: the cell id.
pub fn launch_service(
    roam: &Path,
    node: SocketAddr,
    service: &str,
    wasm: &Path,
) -> anyhow::Result<String> {
    let out = run_bounded(
        Command::new(roam)
            .arg("launch")
            .arg("--node")
            .arg(node.to_string())
            .arg("--service")
            .arg(service)
            .arg(wasm),
        Duration::from_secs(300),
    )
    .context("roam launch --service failed")?;
    Ok(out.trim().to_string())
}

/// `roam migrate CELL --from A --to B --mode MODE [--bandwidth BW] --json`:
/// the `summary` object.
pub fn migrate(
    roam: &Path,
    cell: &str,
    from: SocketAddr,
    to: SocketAddr,
    mode: &str,
    bandwidth: Option<&str>,
) -> anyhow::Result<serde_json::Value> {
    migrate_with(roam, cell, from, to, mode, bandwidth, &[])
}

/// [`migrate`] with more `roam migrate` arguments.
pub fn migrate_with(
    roam: &Path,
    cell: &str,
    from: SocketAddr,
    to: SocketAddr,
    mode: &str,
    bandwidth: Option<&str>,
    extra: &[String],
) -> anyhow::Result<serde_json::Value> {
    let mut cmd = Command::new(roam);
    cmd.args([
        "migrate",
        cell,
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ])
    .args(["--mode", mode, "--json"]);
    if let Some(bw) = bandwidth {
        cmd.args(["--bandwidth", bw]);
    }
    cmd.args(extra);
    let out = run_bounded(&mut cmd, Duration::from_secs(600)).context("roam migrate failed")?;
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).with_context(|| format!("not JSON: {out}"))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("migration failed: {e}");
    }
    v.get("summary")
        .filter(|s| !s.is_null())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no summary in {out}"))
}

/// A number from a JSON object, NaN when absent.
pub fn num(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(f64::NAN)
}
