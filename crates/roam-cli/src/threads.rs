//! `roam run` and `roam restore` of a threaded program (wasi-threads).
//!
//! Such a program runs as a [`ThreadedCell`], which takes checkpoint-and-
//! stop only: SIGTERM and `--checkpoint-after` stop it into the snapshot
//! file, a second SIGTERM (or the grace period) kills it, and SIGUSR1 or
//! `--checkpoint-every` are refused up front instead of being ignored.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use roam_runtime::{
    CheckpointKind, Controller, LoadedModule, Outcome, RunError, Runtime, ThreadedCell, Trigger,
    STOP_GRACE,
};
use roam_snapshot::Snapshot;
use roam_wasi::{Preopen, WasiConfig};
use signal_hook::consts::SIGTERM;
use signal_hook::iterator::Signals;

use crate::args::CellArgs;
use crate::human::duration;

/// What a threaded run cannot do yet; refused before the program starts.
fn refuse_unsupported(c: &CellArgs) -> anyhow::Result<()> {
    let unsupported = [
        (c.checkpoint_every.is_some(), "--checkpoint-every"),
        (c.checkpoint_at_point.is_some(), "--checkpoint-at-point"),
        (
            c.checkpoint_every_points.is_some(),
            "--checkpoint-every-points",
        ),
        (c.checkpoint_on_block, "--checkpoint-on-block"),
        (c.with_files, "--with-files"),
        (!c.listen.is_empty(), "--listen"),
    ];
    for (given, flag) in unsupported {
        if given {
            bail!(
                "{flag} is not supported for threaded programs yet: they take \
                 checkpoint-and-stop only (SIGTERM or --checkpoint-after)"
            );
        }
    }
    Ok(())
}

/// Ask for a stop on SIGTERM (kill on the second, or after the grace
/// period) and after `--checkpoint-after`.
fn spawn_triggers(ctl: &Controller, c: &CellArgs, mut signals: Signals) -> anyhow::Result<()> {
    let s = ctl.clone();
    std::thread::spawn(move || {
        let mut terms = 0u32;
        for sig in signals.forever() {
            if sig != SIGTERM {
                eprintln!(
                    "roam: a threaded program takes checkpoint-and-stop only; SIGUSR1 ignored"
                );
                continue;
            }
            terms += 1;
            if terms > 1 {
                s.kill();
                continue;
            }
            s.request(CheckpointKind::Stop, Trigger::Signal);
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
    Ok(())
}

fn drive(cell: ThreadedCell, c: &CellArgs, path: &Path, signals: Signals) -> anyhow::Result<i32> {
    spawn_triggers(&cell.controller(), c, signals)?;
    match cell.run() {
        Ok(Outcome::Exited(code)) => Ok(code),
        Ok(Outcome::Stopped(s, t)) => {
            super::run::write_snapshot(&s, path, c.level, "stop", None)?;
            eprintln!(
                "roam: {} threads stopped: all parked {} after the request, captured in {}",
                1 + s.threads.len(),
                duration(t.response),
                duration(t.capture)
            );
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

/// `roam run` of a threaded module.
pub(crate) fn run(
    rt: &Runtime,
    module: Arc<LoadedModule>,
    cfg: WasiConfig,
    c: &CellArgs,
    path: &Path,
    signals: Signals,
) -> anyhow::Result<i32> {
    refuse_unsupported(c)?;
    let cell = ThreadedCell::start(rt, module, cfg, c.embed_module)?;
    drive(cell, c, path, signals)
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
    let cell = ThreadedCell::restore(rt, module, snap, preopens, c.embed_module)?;
    tracing::info!(
        threads = 1 + snap.threads.len(),
        from = %snap.origin.isa,
        to = roam_runtime::host_isa(),
        "restored; resuming"
    );
    drive(cell, c, path, signals)
}
