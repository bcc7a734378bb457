//! `roam run` and `roam restore` of a threaded program (wasi-threads).
//!
//! Such a program runs as a [`ThreadedCell`], with the same triggers as any
//! other: SIGTERM and `--checkpoint-after` stop it into the snapshot file
//! (a second SIGTERM, or the grace period, kills it), SIGUSR1 and
//! `--checkpoint-every` write a checkpoint and let it go on. `--listen`
//! serves its listeners, as for any program; a checkpoint keeps its
//! connections, and a restore serves them on the sockets given again. What
//! it cannot do yet is refused up front instead of being ignored.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use roam_runtime::{
    CellOptions, CheckpointTiming, LoadedModule, Outcome, RunError, Runtime, ThreadedCell,
    STOP_GRACE,
};
use roam_snapshot::Snapshot;
use roam_wasi::{Preopen, WasiConfig};
use signal_hook::iterator::Signals;

use crate::args::CellArgs;
use crate::human::duration;
use crate::listen::{self, Serving};

/// What a threaded run cannot do yet; refused before the program starts.
fn refuse_unsupported(c: &CellArgs) -> anyhow::Result<()> {
    let unsupported = [
        (c.checkpoint_at_point.is_some(), "--checkpoint-at-point"),
        (
            c.checkpoint_every_points.is_some(),
            "--checkpoint-every-points",
        ),
        (c.checkpoint_on_block, "--checkpoint-on-block"),
        (c.with_files, "--with-files"),
    ];
    for (given, flag) in unsupported {
        if given {
            bail!(
                "{flag} is not supported for threaded programs yet: they take checkpoints \
                 on SIGTERM and SIGUSR1, --checkpoint-after and --checkpoint-every"
            );
        }
    }
    Ok(())
}

/// The listeners of a fresh run: (label, socket) in the program's order,
/// and the fd the first one gets.
pub(crate) struct Net {
    pub listeners: Vec<(String, TcpListener)>,
    pub first_fd: usize,
}

fn drive(
    cell: ThreadedCell,
    c: &CellArgs,
    path: &Path,
    signals: Signals,
    serving: Option<Serving>,
) -> anyhow::Result<i32> {
    let written = super::run::spawn_triggers(&cell.controller(), c, signals)?;
    let level = c.level;
    let mut sink = |s: &mut Snapshot, t: CheckpointTiming| {
        let r = super::run::write_snapshot(s, path, level, "continue", None);
        report(s, t);
        if let Some(w) = &written {
            let _ = w.send(());
        }
        r.map_err(|e| e.into())
    };
    match cell.run(&mut sink) {
        Ok(Outcome::Exited(code)) => {
            if let Some(s) = &serving {
                s.flush(super::run::FLUSH_LIMIT);
            }
            Ok(code)
        }
        Ok(Outcome::Stopped(s, t)) => {
            super::run::write_snapshot(&s, path, c.level, "stop", None)?;
            report(&s, t);
            Ok(0)
        }
        Ok(Outcome::Paused(..)) => bail!("the program paused, which the CLI never requests"),
        Err(RunError::Killed) => {
            eprintln!(
                "roam: killed: the program's threads did not all reach a migration point \
                 within {} ms of SIGTERM (no snapshot was written to {})",
                STOP_GRACE.as_millis(),
                path.display()
            );
            Ok(super::run::EXIT_KILLED)
        }
        Err(e) => Err(e.into()),
    }
}

/// The cell options a threaded program runs with: what `roam run` offers
/// it (the per-point triggers and the files are refused up front).
fn options(c: &CellArgs) -> CellOptions {
    CellOptions {
        embed_module: c.embed_module,
        ..CellOptions::default()
    }
}

fn report(s: &Snapshot, t: CheckpointTiming) {
    eprintln!(
        "roam: the checkpoint held {} threads: all parked {} after the request, captured in {}",
        1 + s.threads.len(),
        duration(t.response),
        duration(t.capture)
    );
}

/// `roam run` of a threaded module.
pub(crate) fn run(
    rt: &Runtime,
    module: Arc<LoadedModule>,
    cfg: WasiConfig,
    c: &CellArgs,
    path: &Path,
    signals: Signals,
    net: Net,
) -> anyhow::Result<i32> {
    refuse_unsupported(c)?;
    let cell = ThreadedCell::start(rt, module, cfg, options(c))?;
    let serving = cell.net().map(|hub| {
        for (i, (l, _)) in net.listeners.iter().enumerate() {
            eprintln!("roam: listening on {l} (fd {})", net.first_fd + i);
        }
        listen::serve(hub, net.listeners)
    });
    drive(cell, c, path, signals, serving)
}

/// `roam restore` of a snapshot of a threaded program.
pub(crate) fn restore(
    rt: &Runtime,
    module: Arc<LoadedModule>,
    snap: &Snapshot,
    preopens: Vec<Preopen>,
    c: &CellArgs,
    path: &Path,
    signals: Signals,
) -> anyhow::Result<i32> {
    refuse_unsupported(c)?;
    let cell = ThreadedCell::restore(rt, module, snap, preopens, options(c))?;
    let serving = super::run::serve_restored(cell.net(), &c.listen)?;
    tracing::info!(
        threads = 1 + snap.threads.len(),
        from = %snap.origin.isa,
        to = roam_runtime::host_isa(),
        "restored; resuming"
    );
    drive(cell, c, path, signals, serving)
}
