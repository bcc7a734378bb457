//! `roam run` and `roam restore`: both end in the same loop, which takes
//! checkpoints on signals and timers and writes them to the snapshot file.
//!
//! SIGTERM asks for a checkpoint-and-stop and gives the program
//! [`STOP_GRACE`] to reach a migration point; a program that does not (one
//! prepared without points in its loops, say) is then killed, so SIGTERM
//! always ends `roam run` within a second: a supervisor's SIGTERM must not
//! need a SIGKILL after it. A second SIGTERM kills at once.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_runtime::{
    Cell, CellOptions, CheckpointKind, Controller, Outcome, RunError, Runtime, RuntimeConfig,
    Trigger, STOP_GRACE,
};
use roam_snapshot::{Opened, Snapshot};
use roam_wasi::{Preopen, WasiConfig};
use signal_hook::consts::{SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

use crate::args::{CellArgs, Points, RestoreArgs, RunArgs};
use crate::human::{bytes, duration};
use crate::listen;

fn runtime(c: &CellArgs, points: Points) -> anyhow::Result<Runtime> {
    let mut cfg = RuntimeConfig::default();
    if let Some(d) = &c.cache_dir {
        cfg.cache_dir = d.clone();
    }
    cfg.prepare.points = points.into();
    Ok(Runtime::new(cfg)?)
}

fn cell_options(c: &CellArgs) -> anyhow::Result<CellOptions> {
    Ok(CellOptions {
        embed_module: c.embed_module,
        with_files: c.with_files,
        checkpoint_at_point: c.checkpoint_at_point,
        checkpoint_every_points: c.checkpoint_every_points,
        compression_level: c.level,
        max_memory: c.max_memory.unwrap_or(roam_runtime::DEFAULT_MAX_MEMORY),
        ..CellOptions::default()
    })
}

fn parse_dirs(dirs: &[String]) -> anyhow::Result<Vec<Preopen>> {
    dirs.iter()
        .map(|d| {
            let Some((host, guest)) = d.split_once("::") else {
                bail!("--dir {d}: expected HOST::GUEST, e.g. --dir ./data::/data");
            };
            let host = PathBuf::from(host);
            if !host.is_dir() {
                bail!("--dir {d}: {} is not a directory", host.display());
            }
            if !guest.starts_with('/') {
                bail!("--dir {d}: the guest path must be absolute, e.g. /data");
            }
            Ok(Preopen {
                host,
                guest: guest.to_string(),
            })
        })
        .collect()
}

fn parse_env(env: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    env.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => bail!("--env {kv}: expected KEY=VALUE"),
        })
        .collect()
}

/// Page the cell's memory beyond `bytes` to a swap file (`--local-memory`).
fn attach_far(cell: &mut Cell, bytes: u64, a: &RunArgs) -> anyhow::Result<roam_runtime::FarMemory> {
    let dir = a.swap_dir.clone().unwrap_or_else(std::env::temp_dir);
    let pages = cell.live_memory().page_count() as usize;
    let max = a.cell.max_memory.unwrap_or(4 << 30);
    let store = roam_runtime::FileStore::create(&dir, (max / 4096) as usize)
        .with_context(|| format!("cannot make a swap file in {}", dir.display()))?;
    let mut opts = roam_runtime::FarOptions::new(usize::try_from(bytes / 4096)?);
    if let Some(e) = &a.eviction {
        opts.eviction = e.parse().map_err(anyhow::Error::msg)?;
    }
    let far = cell
        .attach_far(opts, Box::new(store))
        .context("--local-memory")?;
    tracing::debug!(pages, "far memory attached");
    Ok(far)
}

/// Where `roam run` writes its checkpoints: `--snapshot`, else the
/// module's name with `.roam`.
fn snapshot_path(a: &RunArgs) -> PathBuf {
    a.cell.snapshot.clone().unwrap_or_else(|| {
        let stem = a.module.file_stem().unwrap_or_default().to_string_lossy();
        PathBuf::from(format!("{}.roam", stem.trim_end_matches(".roam")))
    })
}

/// `roam run`.
pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let signals = install_signals()?;
    let rt = runtime(&a.cell, a.points)?;
    let module = rt
        .load_file(&a.module)
        .with_context(|| format!("cannot load {}", a.module.display()))?;
    let name = a
        .module
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program.wasm".into());
    let mut args = vec![name];
    args.extend(a.args.iter().cloned());
    let sockets = listen::bind(&a.cell.listen)?;
    let labels = listen::labels(&sockets);
    let cfg = WasiConfig {
        args,
        env: parse_env(&a.env)?,
        preopens: parse_dirs(&a.cell.dirs)?,
        listeners: labels.clone(),
    };
    let first_fd = 3 + cfg.preopens.len();
    if roam_runtime::is_threaded(&module) {
        let path = snapshot_path(&a);
        let listeners = labels.into_iter().zip(sockets).collect();
        let net = crate::threads::Net {
            listeners,
            first_fd,
        };
        return crate::threads::run(&rt, module, cfg, &a.cell, &path, signals, net);
    }
    let mut cell = Cell::start(&rt, module, cfg, cell_options(&a.cell)?)?;
    let far = match a.local_memory {
        Some(bytes) => Some(attach_far(&mut cell, bytes, &a)?),
        None => None,
    };
    let serving = cell.net().map(|hub| {
        for (i, l) in labels.iter().enumerate() {
            eprintln!("roam: listening on {l} (fd {})", first_fd + i);
        }
        listen::serve(hub, labels.into_iter().zip(sockets).collect())
    });
    let path = snapshot_path(&a);
    let code = drive(cell, &a.cell, &path, signals, serving);
    if let Some(far) = far {
        let s = far.stats();
        let mib = |pages: u64| pages as f64 * 4096.0 / (1 << 20) as f64;
        eprintln!(
            "roam: local memory {:.1} MiB (peak {:.1} MiB resident); {} faults waited {}; \
             {:.1} MiB read back, {:.1} MiB written out, {:.1} MiB dropped clean",
            mib(far.options().local_pages as u64),
            mib(s.resident_peak),
            s.far_faults,
            crate::human::duration(s.fault_wait),
            mib(s.pages_in),
            mib(s.pages_out),
            mib(s.clean_drops),
        );
    }
    code
}

/// `roam restore`.
pub fn restore(a: RestoreArgs) -> anyhow::Result<i32> {
    let signals = install_signals()?;
    let started = Instant::now();
    let load = || format!("cannot load snapshot {}", a.snapshot_file.display());
    let opened = if a.eager {
        Opened::Whole(Snapshot::read_file(&a.snapshot_file).with_context(load)?)
    } else {
        Snapshot::open_file(&a.snapshot_file).with_context(load)?.0
    };
    let snap = opened.snapshot();
    let rt = runtime(&a.cell, Points::Loops)?;
    let module = match &a.module {
        Some(p) => {
            let m = rt
                .load_file(p)
                .with_context(|| format!("cannot load {}", p.display()))?;
            if *m.hash() != snap.module.hash {
                return Err(roam_runtime::LoadError::WrongModule {
                    expected: roam_runtime::cache::hex(&snap.module.hash),
                    found: roam_runtime::cache::hex(m.hash()),
                    path: p.clone(),
                }
                .into());
            }
            m
        }
        None => rt.load_by_hash(&snap.module.hash, snap.module.embedded.as_deref())?,
    };
    let preopens = parse_dirs(&a.cell.dirs)?;
    if !snap.threads.is_empty() || roam_runtime::is_threaded(&module) {
        let path = a
            .cell
            .snapshot
            .clone()
            .unwrap_or_else(|| a.snapshot_file.clone());
        // Every thread rewinds from the memory as a whole.
        let whole;
        let snap = match &opened {
            Opened::Whole(s) => s,
            _ => {
                whole = Snapshot::read_file(&a.snapshot_file).with_context(load)?;
                &whole
            }
        };
        return crate::threads::restore(&rt, module, snap, preopens, &a.cell, &path, signals)
            .with_context(|| format!("cannot restore {}", a.snapshot_file.display()));
    }
    let (cell, lazy) = Cell::restore_file(&rt, module, &opened, preopens, cell_options(&a.cell)?)
        .with_context(|| format!("cannot restore {}", a.snapshot_file.display()))?;
    let serving = serve_restored(cell.net(), &a.cell.listen)?;
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        from = %snap.origin.isa,
        to = roam_runtime::host_isa(),
        pages = if lazy.is_some() { "read while running" } else { "all read" },
        "restored; resuming"
    );
    let path = a
        .cell
        .snapshot
        .clone()
        .unwrap_or_else(|| a.snapshot_file.clone());
    // A snapshot read whole holds all of its pages: free them before running.
    drop(opened);
    drive(cell, &a.cell, &path, signals, serving)
}

/// Install the handlers first thing, so a signal that arrives while the
/// module compiles is queued rather than killing the process.
fn install_signals() -> anyhow::Result<Signals> {
    Signals::new([SIGUSR1, SIGTERM]).context("cannot install signal handlers")
}

/// Start the threads that ask for checkpoints. Returns, for
/// `--checkpoint-every`, where to report that a checkpoint-and-continue has
/// been written: the next one is due a full interval after that.
pub(crate) fn spawn_triggers(
    ctl: &Controller,
    c: &CellArgs,
    mut signals: Signals,
) -> anyhow::Result<Option<mpsc::Sender<()>>> {
    let s = ctl.clone();
    std::thread::spawn(move || {
        let mut terms = 0u32;
        for sig in signals.forever() {
            if sig != SIGTERM {
                s.request(CheckpointKind::Continue, Trigger::Signal);
                continue;
            }
            terms += 1;
            if terms > 1 {
                s.kill();
                continue;
            }
            s.request(CheckpointKind::Stop, Trigger::Signal);
            // A kill after the checkpoint was taken changes nothing.
            let k = s.clone();
            std::thread::spawn(move || {
                std::thread::sleep(STOP_GRACE);
                k.kill();
            });
        }
    });
    if let Some(secs) = c.checkpoint_after {
        let d =
            Duration::try_from_secs_f64(secs).context("--checkpoint-after: invalid duration")?;
        let s = ctl.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            s.request(CheckpointKind::Stop, Trigger::Timer);
        });
    }
    let mut written = None;
    if let Some(secs) = c.checkpoint_every {
        let d = Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| !d.is_zero())
            .context("--checkpoint-every: needs a positive duration")?;
        let s = ctl.clone();
        let (tx, wait) = mpsc::channel();
        written = Some(tx);
        // The interval runs from the end of the last checkpoint, not its
        // start: a checkpoint that takes longer than the interval would
        // otherwise find the next request already waiting, and the program
        // would get no time to run between them.
        std::thread::spawn(move || loop {
            std::thread::sleep(d);
            // Checkpoints asked for by signals meanwhile.
            while wait.try_recv().is_ok() {}
            s.request(CheckpointKind::Continue, Trigger::Timer);
            if wait.recv().is_err() {
                return;
            }
        });
    }
    if c.checkpoint_on_block {
        ctl.stop_when_blocked(true);
    }
    Ok(written)
}

/// Write a checkpoint to `path`; `ran` is how long the program ran since
/// the last one (for a checkpoint-and-continue).
pub(crate) fn write_snapshot(
    s: &Snapshot,
    path: &Path,
    level: i32,
    kind: &str,
    ran: Option<Duration>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let written = s
        .write_file_with(
            path,
            &roam_snapshot::EncodeOptions {
                level,
                ..Default::default()
            },
        )
        .with_context(|| format!("cannot write snapshot {}", path.display()))?;
    let ran = ran.map_or(String::new(), |r| {
        format!(", after {} of running", duration(r))
    });
    eprintln!(
        "roam: checkpoint ({kind}) written to {}: {} memory, {} stored pages, {} B stack, {} on disk, {} ms{ran}",
        path.display(),
        bytes(s.memory.byte_len()),
        s.memory.stored_pages(),
        s.stack.data.len(),
        bytes(written),
        t.elapsed().as_millis()
    );
    Ok(())
}

/// Serve a restored program's listeners on the sockets of `--listen`,
/// which must be as many as the program had.
pub(crate) fn serve_restored(
    hub: Option<Arc<roam_wasi::net::NetHub>>,
    listen: &[String],
) -> anyhow::Result<Option<listen::Serving>> {
    match hub {
        Some(hub) => {
            let sockets = listen::bind(listen)?;
            let new = listen::labels(&sockets);
            let pairs = listen::reattach(&hub, sockets)?;
            for ((old, _), l) in pairs.iter().zip(&new) {
                eprintln!("roam: listening on {l} for the program's listener {old}");
            }
            Ok(Some(listen::serve(hub, pairs)))
        }
        None if !listen.is_empty() => Err(listen::ListenError::CountMismatch {
            have: 0,
            labels: "none".into(),
            given: listen.len(),
        }
        .into()),
        None => Ok(None),
    }
}

/// How long an exited program's clients get to read its last output.
pub(crate) const FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// `roam run` exits with this when SIGTERM had to kill the program (128 +
/// SIGTERM, what a shell reports for a process SIGTERM ended).
pub(crate) const EXIT_KILLED: i32 = 143;

fn drive(
    mut cell: Cell,
    c: &CellArgs,
    path: &Path,
    signals: Signals,
    serving: Option<listen::Serving>,
) -> anyhow::Result<i32> {
    let written = spawn_triggers(&cell.controller(), c, signals)?;
    let level = c.level;
    let interval = c.checkpoint_every.map(Duration::from_secs_f64);
    let mut ended = Instant::now();
    let mut warned = false;
    let mut sink = |s: &Snapshot, t: roam_runtime::CheckpointTiming| {
        // The program ran from the end of the last checkpoint to the start
        // of this one's unwind.
        let ran = Instant::now()
            .saturating_duration_since(ended)
            .saturating_sub(t.capture);
        let result = write_snapshot(s, path, level, "continue", Some(ran));
        let took = ended.elapsed().saturating_sub(ran);
        ended = Instant::now();
        if let Some(every) = interval.filter(|every| !warned && took > *every) {
            warned = true;
            eprintln!(
                "roam: that checkpoint took {}, longer than --checkpoint-every {}; each next one is due {} after the last one ended",
                duration(took),
                duration(every),
                duration(every)
            );
        }
        if let Some(w) = &written {
            let _ = w.send(());
        }
        result.map_err(|e| e.into())
    };
    let outcome = match cell.run(&mut sink) {
        Err(RunError::Killed) => {
            eprintln!(
                "roam: killed: the program reached no migration point within {} ms of SIGTERM, \
                 so it was killed without a checkpoint (no snapshot was written to {} for this stop)",
                STOP_GRACE.as_millis(),
                path.display()
            );
            return Ok(EXIT_KILLED);
        }
        r => r?,
    };
    match outcome {
        Outcome::Exited(code) => {
            if let Some(s) = &serving {
                s.flush(FLUSH_LIMIT);
            }
            if let Some(n) = c.checkpoint_at_point {
                eprintln!(
                    "roam: the program exited after it reached only {} migration points (asked for a checkpoint at {n}); no checkpoint was taken",
                    cell.points_reached()
                );
            }
            Ok(code)
        }
        Outcome::Stopped(s, _) => {
            write_snapshot(&s, path, level, "stop", None)?;
            Ok(0)
        }
        // The CLI never asks for a pause (it has no live memory to send).
        Outcome::Paused(..) => anyhow::bail!("the program paused, which the CLI never requests"),
    }
}
