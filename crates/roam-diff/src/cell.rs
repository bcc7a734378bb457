//! Runs of a prepared module on roam's runtime: uninterrupted, with a
//! checkpoint-and-continue every few points, and stopped at one point and
//! restored from its encoded snapshot.
//!
//! Each run happens on a thread of its own with the stack roam's runtime
//! asks for, and a watchdog kills a run that outlives its time: a prepared
//! program that no longer ends is a finding, not a hang of the suite.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use roam_runtime::{Cell, CellOptions, LoadedModule, Outcome, RunError, Runtime};
use roam_snapshot::{EncodeOptions, Snapshot};
use roam_wasi::WasiConfig;
use wasmtime::Trap;

use crate::plain::{End, Ending};

/// How a run on the runtime went wrong, other than by ending differently.
pub type Failure = String;

/// Most wall time one run may take.
const RUN_LIMIT: Duration = Duration::from_secs(20);

/// Run `cell` to its end on a thread of its own, with checkpoints-and-
/// continue encoded and decoded as a node would. Returns the ending and
/// how many checkpoints were taken, or the snapshot of a stop.
fn drive(mut cell: Cell) -> Result<(Result<Ending, Box<Snapshot>>, u64), Failure> {
    let ctl = cell.controller();
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::Builder::new()
        .stack_size(roam_runtime::RUN_THREAD_STACK)
        .spawn(move || {
            let mut taken = 0u64;
            let result = cell.run(&mut |snap, _| {
                taken += 1;
                let bytes = snap.encode(&EncodeOptions::default())?;
                Snapshot::decode(&bytes)?;
                Ok(())
            });
            let ended = match result {
                Ok(Outcome::Exited(code)) => Ok(Ok(End::Exit(code))),
                Ok(Outcome::Stopped(snap, _)) => Ok(Err(snap)),
                Ok(Outcome::Paused(..)) => Err("paused without being asked".to_string()),
                Err(RunError::Trap(source)) => match trap_of(source.as_ref()) {
                    Some(t) => Ok(Ok(End::Trap(t))),
                    None => Err(format!("trapped without a trap code: {source:?}")),
                },
                Err(e) => Err(format!("{e}: {:?}", std::error::Error::source(&e))),
            };
            let ended = ended.map(|r| {
                r.map(|end| {
                    let mem = cell.memory();
                    Ending {
                        end,
                        memory: (*blake3::hash(mem).as_bytes(), mem.len()),
                    }
                })
            });
            let _ = tx.send((ended, taken));
        })
        .map_err(|e| format!("cannot start a run thread: {e}"))?;
    let out = match rx.recv_timeout(RUN_LIMIT) {
        Ok((ended, taken)) => ended.map(|e| (e, taken)),
        Err(_) => {
            ctl.kill();
            Err(format!(
                "the prepared program did not end within {RUN_LIMIT:?} (killed)"
            ))
        }
    };
    let _ = worker.join();
    out
}

/// The trap code in an error chain, if any. The runtime hands the error on
/// as a boxed trait object, through which the `Trap` itself cannot always
/// be downcast; its message names it as well.
fn trap_of(e: &(dyn std::error::Error + 'static)) -> Option<Trap> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<Trap>() {
            return Some(*t);
        }
        let text = err.to_string();
        if let Some(t) = (0..=u8::MAX)
            .filter_map(Trap::from_u8)
            .find(|t| text.contains(&t.to_string()))
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// A fresh cell of `m` with `opts`.
fn start(rt: &Runtime, m: &Arc<LoadedModule>, opts: CellOptions) -> Result<Cell, Failure> {
    Cell::start(rt, m.clone(), WasiConfig::default(), opts).map_err(|e| format!("start: {e}"))
}

/// Uninterrupted.
pub fn plain(rt: &Runtime, m: &Arc<LoadedModule>) -> Result<Ending, Failure> {
    match drive(start(rt, m, CellOptions::default())?)? {
        (Ok(e), _) => Ok(e),
        (Err(_), _) => Err("stopped without being asked".into()),
    }
}

/// With a checkpoint-and-continue at every `k`th point. Returns the ending
/// and the number of checkpoints.
pub fn every(rt: &Runtime, m: &Arc<LoadedModule>, k: u64) -> Result<(Ending, u64), Failure> {
    let opts = CellOptions {
        checkpoint_every_points: Some(k),
        ..CellOptions::default()
    };
    match drive(start(rt, m, opts)?)? {
        (Ok(e), taken) => Ok((e, taken)),
        (Err(_), _) => Err("stopped without being asked".into()),
    }
}

/// Stopped at point `n`, the snapshot encoded and decoded, restored in a
/// new cell and run to the end. `None` in the second place when the
/// program ended before point `n`.
pub fn stop_and_restore(
    rt: &Runtime,
    m: &Arc<LoadedModule>,
    n: u64,
) -> Result<(Ending, bool), Failure> {
    let opts = CellOptions {
        checkpoint_at_point: Some(n),
        ..CellOptions::default()
    };
    let snap = match drive(start(rt, m, opts)?)?.0 {
        Ok(e) => return Ok((e, false)),
        Err(snap) => snap,
    };
    let bytes = snap
        .encode(&EncodeOptions::default())
        .map_err(|e| format!("encode: {e}"))?;
    let snap = Snapshot::decode(&bytes).map_err(|e| format!("decode: {e}"))?;
    let cell = Cell::restore(rt, m.clone(), &snap, vec![], CellOptions::default())
        .map_err(|e| format!("restore: {e}"))?;
    match drive(cell)? {
        (Ok(e), _) => Ok((e, true)),
        (Err(_), _) => Err("the restored cell stopped without being asked".into()),
    }
}
