//! Runs on a plain wasmtime engine that counts fuel: the reference run of
//! the unprepared module, and a run of the prepared module with the
//! migration flag up that measures how far apart its points are.
//!
//! Why fuel: a generated program may loop for ever. Fuel bounds the
//! reference run, and it is also the unit in which "a point is reached
//! within a bounded number of instructions" is checked: wasmtime spends one
//! unit per operator, whatever the machine.

use std::sync::{Arc, Mutex};

use wasmtime::{Config, Engine, Linker, Module, Store, Trap, Val};

use crate::gen::MEMORY_EXPORT;

/// How a run ended, and the memory it left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// Exit status, or the trap that ended it.
    pub end: End,
    /// blake3 of linear memory, and its length in bytes.
    pub memory: ([u8; 32], usize),
}

/// Exit status or trap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `proc_exit` with this status.
    Exit(i32),
    /// A trap, by its code.
    Trap(Trap),
}

/// What the reference run gave.
#[derive(Debug)]
pub enum Reference {
    /// It ended within the fuel.
    Ended(Ending),
    /// It ran out of fuel, or of stack: no reference to compare with.
    Unbounded(Trap),
    /// It traps while it is instantiated: not a program.
    NoInstance,
}

/// The module traps while it is instantiated.
#[derive(Debug, thiserror::Error)]
#[error("the module traps when instantiated")]
pub struct NoInstance;

/// `proc_exit`'s payload.
#[derive(Debug, thiserror::Error)]
#[error("exit {0}")]
struct Exit(i32);

/// A fuel-counting engine with exceptions on (for prepared modules).
pub fn engine() -> wasmtime::Result<Engine> {
    let mut c = Config::new();
    c.consume_fuel(true);
    c.wasm_exceptions(true);
    c.max_wasm_stack(1 << 20);
    Engine::new(&c)
}

/// What the state of the point recorder is.
#[derive(Default)]
struct Points {
    /// Fuel left at the last point (or at the start).
    last: u64,
    /// Most fuel spent between two points (or from the start to the first).
    widest: u64,
    count: u64,
}

/// One run on the fuel engine.
#[derive(Debug)]
pub struct Run {
    /// How it ended, or the trap that leaves nothing to compare (out of
    /// fuel or of stack).
    pub ending: Result<Ending, Trap>,
    /// Points reached (with the flag up).
    pub points: u64,
    /// Most fuel spent between two points, or before the first, or after
    /// the last.
    pub widest: u64,
}

/// Run `bytes` with `fuel`. With `flag` (a prepared module), the migration
/// flag is raised so that every point calls the host, which records how
/// much fuel was spent since the previous one.
pub fn run(engine: &Engine, bytes: &[u8], fuel: u64, flag: bool) -> anyhow::Result<Run> {
    run_inner(engine, bytes, fuel, flag).map_err(|e| anyhow::anyhow!("{e:?}"))?
}

fn run_inner(
    engine: &Engine,
    bytes: &[u8],
    fuel: u64,
    flag: bool,
) -> wasmtime::Result<anyhow::Result<Run>> {
    let module = Module::new(engine, bytes)?;
    let points = Arc::new(Mutex::new(Points {
        last: fuel,
        ..Points::default()
    }));
    let mut linker: Linker<()> = Linker::new(engine);
    linker.func_wrap(
        "wasi_snapshot_preview1",
        "proc_exit",
        |code: i32| -> wasmtime::Result<()> { Err(wasmtime::Error::new(Exit(code))) },
    )?;
    let p = points.clone();
    linker.func_wrap(
        roam_prepare::POINT_MODULE,
        roam_prepare::POINT_FUNC,
        move |caller: wasmtime::Caller<'_, ()>| -> wasmtime::Result<()> {
            let left = caller.get_fuel()?;
            let mut p = p.lock().unwrap();
            p.widest = p.widest.max(p.last - left);
            p.last = left;
            p.count += 1;
            Ok(())
        },
    )?;
    let mut store = Store::new(engine, ());
    store.set_fuel(fuel)?;
    let instance = match linker.instantiate(&mut store, &module) {
        Ok(i) => i,
        // An active segment out of bounds: no program to run.
        Err(e) if e.downcast_ref::<Trap>().is_some() => {
            return Ok(Err(anyhow::Error::new(NoInstance)))
        }
        Err(e) => return Err(e),
    };
    if flag {
        let g = instance
            .get_global(&mut store, roam_prepare::FLAG_GLOBAL_EXPORT)
            .ok_or_else(|| wasmtime::format_err!("no {}", roam_prepare::FLAG_GLOBAL_EXPORT))?;
        g.set(&mut store, Val::I32(1))?;
    }
    let start = instance.get_typed_func::<(), ()>(&mut store, "_start")?;
    let result = start.call(&mut store, ());
    let end = match result {
        Ok(()) => {
            return Ok(Err(anyhow::anyhow!(
                "`_start` returned without calling proc_exit"
            )))
        }
        Err(e) => {
            if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
                End::Exit(*code)
            } else if let Some(t) = e.downcast_ref::<Trap>() {
                End::Trap(*t)
            } else {
                return Ok(Err(anyhow::anyhow!(
                    "the run failed other than by a trap: {e:?}"
                )));
            }
        }
    };
    let left = store.get_fuel()?;
    let p = points.lock().unwrap();
    let widest = p.widest.max(p.last - left);
    let count = p.count;
    drop(p);
    let ending = match end {
        End::Trap(t @ (Trap::OutOfFuel | Trap::StackOverflow)) => Err(t),
        end => {
            let mem = instance
                .get_memory(&mut store, MEMORY_EXPORT)
                .ok_or_else(|| wasmtime::format_err!("no memory export"))?;
            let data = mem.data(&store);
            Ok(Ending {
                end,
                memory: (*blake3::hash(data).as_bytes(), data.len()),
            })
        }
    };
    Ok(Ok(Run {
        ending,
        points: count,
        widest,
    }))
}

/// The reference run of an unprepared module.
pub fn reference(engine: &Engine, bytes: &[u8], fuel: u64) -> anyhow::Result<Reference> {
    match run(engine, bytes, fuel, false).map(|r| r.ending) {
        Ok(Ok(e)) => Ok(Reference::Ended(e)),
        Ok(Err(t)) => Ok(Reference::Unbounded(t)),
        Err(e) if e.downcast_ref::<NoInstance>().is_some() => Ok(Reference::NoInstance),
        Err(e) => Err(e),
    }
}
