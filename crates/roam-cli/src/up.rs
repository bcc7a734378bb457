//! `roam up`: a whole cluster on one machine, for trying roam and for
//! development. A planner with the embedded store and N local nodes, one of
//! them an aarch64 node under qemu-user when that is installed, so that
//! moves across ISAs work out of the box.
//!
//! Why a command and not a script: it has to find the right binaries, wait
//! for every node to register, say what to type next, and stop everything
//! cleanly on Ctrl-C, including when a node was killed on purpose in
//! between (a dead node is a demo, not an error).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

/// `roam up`.
#[derive(Args, Debug)]
pub struct UpArgs {
    /// Local nodes to start.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Where the planner's database, the nodes' state and the logs go.
    #[arg(long, default_value = "roam-up")]
    pub dir: PathBuf,
    /// First port: the planner listens on it, node i's control API on
    /// PORT+100+i and its migration listener on PORT+200+i.
    #[arg(long, default_value_t = 7600)]
    pub port: u16,
    /// Seconds between kept checkpoints of each cell.
    #[arg(long, default_value_t = 30)]
    pub checkpoint_interval: u64,
    /// The aarch64 `roam` executable for the node under qemu-user
    /// (default: the one built next to this one by
    /// `cargo build --release --target aarch64-unknown-linux-gnu`).
    #[arg(long, env = "ROAM_AARCH64_BIN")]
    pub aarch64_roam: Option<PathBuf>,
    /// Run every node on this machine's own ISA.
    #[arg(long)]
    pub no_aarch64: bool,
}

/// A child process, stopped on drop.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    reported: bool,
}

impl Proc {
    fn start(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let f = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()
            .with_context(|| format!("cannot start the {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
            reported: false,
        })
    }

    /// The last lines of its log, for an error.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Ask it to stop (SIGTERM), as Ctrl-C would.
    fn terminate(&self) {
        // SAFETY: kill(2) on the pid of a child this process has not reaped
        // yet, so the pid still names that child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
}

/// The aarch64 executable and the qemu-user command to run it, if this
/// machine can.
fn aarch64(a: &UpArgs) -> std::result::Result<(PathBuf, PathBuf), String> {
    if a.no_aarch64 {
        return Err("--no-aarch64".into());
    }
    if std::env::consts::ARCH == "aarch64" {
        return Err("this machine is aarch64 already".into());
    }
    let bin = match &a.aarch64_roam {
        Some(p) => p.clone(),
        None => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            // <target>/release/roam -> <target>/aarch64-unknown-linux-gnu/release/roam
            let target = exe.parent().and_then(Path::parent).ok_or("no target dir")?;
            target.join("aarch64-unknown-linux-gnu/release/roam")
        }
    };
    if !bin.is_file() {
        return Err(format!(
            "no aarch64 roam at {} (build it with `cargo build --release -p roam-cli --target aarch64-unknown-linux-gnu`, or give --aarch64-roam)",
            bin.display()
        ));
    }
    let qemu = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("qemu-aarch64"))
        .find(|p| p.is_file())
        .ok_or("qemu-aarch64 is not installed (Debian: apt-get install qemu-user)")?;
    if !Path::new("/usr/aarch64-linux-gnu").is_dir() {
        return Err("no aarch64 libraries in /usr/aarch64-linux-gnu (Debian: apt-get install gcc-aarch64-linux-gnu)".into());
    }
    Ok((bin, qemu))
}

pub fn up(a: UpArgs) -> Result<i32> {
    if a.nodes == 0 || a.nodes > 50 {
        bail!("--nodes must be between 1 and 50");
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create {}", a.dir.display()))?;
    let dir = a.dir.canonicalize()?;
    let exe = std::env::current_exe().context("cannot find the roam executable")?;
    let planner_addr = format!("127.0.0.1:{}", a.port);
    let planner_url = format!("http://{planner_addr}");
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }

    let mut procs = Vec::new();
    let mut cmd = Command::new(&exe);
    cmd.args(["planner", "--listen", &planner_addr])
        .arg("--store")
        .arg(format!("redb:{}", dir.join("cluster.redb").display()))
        .args(["--checkpoint-interval", &a.checkpoint_interval.to_string()]);
    procs.push(Proc::start("planner", cmd, dir.join("planner.log"))?);

    let arm = aarch64(&a);
    let mut isas = Vec::new();
    for i in 0..a.nodes {
        let name = format!("node-{}", i + 1);
        // The last node is the aarch64 one, when there are two or more.
        let on_arm = a.nodes > 1 && i == a.nodes - 1 && arm.is_ok();
        let mut cmd = match (&arm, on_arm) {
            (Ok((bin, qemu)), true) => {
                let mut c = Command::new(qemu);
                c.args(["-L", "/usr/aarch64-linux-gnu"]).arg(bin);
                c
            }
            _ => Command::new(&exe),
        };
        let control = a.port + 100 + i as u16;
        let migrate = a.port + 200 + i as u16;
        cmd.args(["node", "--name", &name])
            .args(["--listen", &format!("127.0.0.1:{control}")])
            .args(["--migrate-listen", &format!("127.0.0.1:{migrate}")])
            .args(["--planner", &planner_url])
            .arg("--state-dir")
            .arg(dir.join(&name));
        isas.push(if on_arm {
            "aarch64"
        } else {
            std::env::consts::ARCH
        });
        procs.push(Proc::start(&name, cmd, dir.join(format!("{name}.log")))?);
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client =
        roam_api::PlannerClient::with_auth(&planner_url, &roam_api::ClientAuth::default())?;
    // Wait for every node to register (qemu's node takes a few seconds).
    let start = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            return shutdown(procs);
        }
        for p in &mut procs {
            if let Some(st) = p.child.try_wait()? {
                let tail = p.tail();
                let name = p.name.clone();
                shutdown(procs)?;
                bail!("the {name} exited ({st}) while starting:\n{tail}");
            }
        }
        if let Ok(nodes) = rt.block_on(client.nodes()) {
            if nodes.iter().filter(|n| n.alive).count() >= a.nodes {
                break;
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            shutdown(procs)?;
            bail!(
                "the nodes did not all register within 2 minutes; see the logs in {}",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    println!(
        "roam is up: a planner and {} nodes, state and logs in {}\n",
        a.nodes,
        dir.display()
    );
    println!(
        "  planner   {planner_url}   (embedded store {})",
        dir.join("cluster.redb").display()
    );
    for (i, isa) in isas.iter().enumerate() {
        println!(
            "  node-{:<3}  http://127.0.0.1:{}   {isa}",
            i + 1,
            a.port + 100 + i as u16
        );
    }
    if let Err(why) = &arm {
        println!("\n  (no aarch64 node: {why})");
    }
    println!(
        "\nIn another shell:\n  export ROAM_PLANNER={planner_url}\n  roam nodes\n  roam launch app.wasm -- args\n  roam cells\n  roam migrate CELL --to node-2\n  roam drain node-1\n\nCtrl-C stops everything."
    );

    while !stop.load(Ordering::Relaxed) {
        for p in &mut procs {
            if p.reported {
                continue;
            }
            if let Some(st) = p.child.try_wait()? {
                p.reported = true;
                eprintln!(
                    "roam up: the {} exited ({st}); the others keep running{}",
                    p.name,
                    if p.name == "planner" {
                        ""
                    } else {
                        " and the planner restores its cells from their kept checkpoints"
                    }
                );
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    shutdown(procs)
}

/// Stop the nodes, then the planner (so that the nodes do not see their
/// planner vanish): SIGTERM, then SIGKILL after 10 s.
fn shutdown(mut procs: Vec<Proc>) -> Result<i32> {
    eprintln!("roam up: stopping");
    let planner = procs.remove(0);
    stop_all(&mut procs)?;
    stop_all(&mut [planner])?;
    Ok(0)
}

fn stop_all(procs: &mut [Proc]) -> Result<()> {
    for p in procs.iter() {
        p.terminate();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for p in procs.iter_mut() {
        while p.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                eprintln!("roam up: the {} did not stop in 10 s; killing it", p.name);
                let _ = p.child.kill();
                let _ = p.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}
