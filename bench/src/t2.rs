//! T2: checkpoint capture and restore time against live memory size.
//!
//! Why it exists: a migration's pause is dominated by copying linear memory
//! out (capture) and back in (restore). Targets: 256 MiB in ≤ 50 ms each.
//! The baseline, measured in the same run, is the cheapest possible copy of
//! the same bytes: a memcpy of N MiB into a freshly allocated `Vec`.
//! Encode (zstd level 1 and 3) and decode are timed too: they are what a
//! migration over a network or disk adds on top.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_runtime::{
    Cell, CellOptions, CheckpointKind, CheckpointTiming, Outcome, Runtime, Trigger,
};
use roam_snapshot::{EncodeOptions, Snapshot, PAGE_SIZE};
use roam_wasi::WasiConfig;

use crate::report::{Report, Table};
use crate::stats::{median, ms};

/// A module that grows memory by `mib` MiB, fills the new pages with
/// xorshift64 output (incompressible, never equal to the initial image),
/// then spins forever. The loops carry migration points once prepared.
pub fn fill_module(mib: u32) -> anyhow::Result<Vec<u8>> {
    let pages = mib * 16;
    let wat = format!(
        r#"(module
  (memory (export "memory") 1)
  (func (export "_start")
    (local $p i32) (local $end i32) (local $x i64) (local $old i32)
    (local.set $old (memory.grow (i32.const {pages})))
    (if (i32.lt_s (local.get $old) (i32.const 0)) (then unreachable))
    (local.set $p (i32.mul (local.get $old) (i32.const 65536)))
    (local.set $end (i32.add (local.get $p) (i32.const {bytes})))
    (local.set $x (i64.const 0x9e3779b97f4a7c15))
    (block $done
      (loop $fill
        (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
        (local.set $x (i64.xor (local.get $x) (i64.shl (local.get $x) (i64.const 13))))
        (local.set $x (i64.xor (local.get $x) (i64.shr_u (local.get $x) (i64.const 7))))
        (local.set $x (i64.xor (local.get $x) (i64.shl (local.get $x) (i64.const 17))))
        (i64.store (local.get $p) (local.get $x))
        (local.set $p (i32.add (local.get $p) (i32.const 8)))
        (br $fill)))
    (loop $spin (br $spin))))"#,
        bytes = u64::from(mib) << 20,
    );
    Ok(wat::parse_str(wat)?)
}

/// One size's measurements.
#[derive(Debug, Clone)]
pub struct Row {
    /// MiB the program filled.
    pub mib: u32,
    /// Bytes of memory stored in the snapshot (non-zero, non-initial pages).
    pub stored: u64,
    /// Capture times of the Continue checkpoints after the fill.
    pub captures: Vec<Duration>,
    /// Capture time of the final Stop checkpoint.
    pub stop_capture: Duration,
    /// `Cell::restore` times.
    pub restores: Vec<Duration>,
    /// Baseline: memcpy of `mib` MiB into a fresh `Vec`.
    pub memcpy: Vec<Duration>,
    /// Encode at level 1 and 3: time and bytes.
    pub encode: [(Duration, usize); 2],
    /// `Snapshot::decode` of the level-3 encoding.
    pub decode: Duration,
}

fn filled(s: &Snapshot, mib: u32) -> bool {
    s.memory.stored_pages() as u64 * PAGE_SIZE as u64 >= u64::from(mib) << 20
}

/// Take `samples` Continue checkpoints after the fill, then a Stop.
fn checkpoints(
    rt: &Runtime,
    mib: u32,
    samples: usize,
) -> anyhow::Result<(Vec<Duration>, Snapshot, Duration)> {
    let module = rt.load_bytes(&fill_module(mib)?)?;
    let mut cell = Cell::start(
        rt,
        module,
        WasiConfig {
            args: vec!["fill".into()],
            ..Default::default()
        },
        CellOptions::default(),
    )?;
    let ctl = cell.controller();
    let (tx, rx) = mpsc::channel::<(CheckpointTiming, bool)>();
    let driver = std::thread::spawn(move || {
        // Roughly the fill time, so few checkpoints land mid-fill.
        std::thread::sleep(Duration::from_millis(u64::from(mib) * 2 + 5));
        let mut caps = Vec::new();
        while caps.len() < samples {
            ctl.request(CheckpointKind::Continue, Trigger::Api);
            let Ok((t, done)) = rx.recv() else { break };
            if done {
                caps.push(t.capture);
            } else {
                std::thread::sleep(Duration::from_millis(u64::from(mib) / 2 + 5));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        ctl.request(CheckpointKind::Stop, Trigger::Api);
        caps
    });
    let mut sink = move |s: &Snapshot, t: CheckpointTiming| {
        let _ = tx.send((t, filled(s, mib)));
        Ok(())
    };
    let outcome = cell.run(&mut sink);
    drop(sink);
    let caps = driver
        .join()
        .map_err(|_| anyhow::anyhow!("driver thread panicked"))?;
    match outcome? {
        Outcome::Stopped(s, t) if filled(&s, mib) => Ok((caps, *s, t.capture)),
        Outcome::Stopped(..) | Outcome::Paused(..) => {
            bail!("stopped before the {mib} MiB fill finished")
        }
        Outcome::Exited(c) => bail!("the fill program exited ({c}); it should spin"),
    }
}

fn memcpy_baseline(mib: u32, reps: usize) -> Vec<Duration> {
    let src: Vec<u8> = (0..(mib as usize) << 20)
        .map(|i| (i * 31 + 7) as u8)
        .collect();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            let dst = src.clone();
            let d = t.elapsed();
            std::hint::black_box(&dst);
            d
        })
        .collect()
}

/// Measure one size.
pub fn measure(rt: &Runtime, mib: u32, samples: usize) -> anyhow::Result<Row> {
    let (captures, snap, stop_capture) = checkpoints(rt, mib, samples)?;
    let module = rt.load_bytes(&fill_module(mib)?)?;
    let mut restores = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let cell = Cell::restore(rt, module.clone(), &snap, vec![], CellOptions::default())
            .context("restore failed")?;
        restores.push(t.elapsed());
        drop(cell);
    }
    let mut encode = [(Duration::ZERO, 0); 2];
    let mut l3 = Vec::new();
    for (i, level) in [1, 3].into_iter().enumerate() {
        let t = Instant::now();
        let bytes = snap.encode(&EncodeOptions { level })?;
        encode[i] = (t.elapsed(), bytes.len());
        l3 = bytes;
    }
    let t = Instant::now();
    let back = Snapshot::decode(&l3)?;
    let decode = t.elapsed();
    if back.memory.stored_pages() != snap.memory.stored_pages() {
        bail!("decoded snapshot differs from the captured one");
    }
    Ok(Row {
        mib,
        stored: snap.memory.stored_pages() as u64 * PAGE_SIZE as u64,
        captures,
        stop_capture,
        restores,
        memcpy: memcpy_baseline(mib, 3),
        encode,
        decode,
    })
}

fn med(d: &[Duration]) -> Option<f64> {
    median(&d.iter().map(|d| ms(*d)).collect::<Vec<_>>())
}

/// Build the report from measured rows.
pub fn report(rows: &[Row], samples: usize) -> Report {
    let mut t = Table::new(&[
        "live MiB",
        "stored MiB",
        "capture p50 ms",
        "capture max ms",
        "restore p50 ms",
        "memcpy p50 ms",
        "capture ÷ memcpy",
        "restore ÷ memcpy",
        "encode L1 ms",
        "encode L3 ms",
        "L3 MiB",
        "decode ms",
    ]);
    let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
    let mut notes = Vec::new();
    for r in rows {
        let mut caps = r.captures.clone();
        caps.push(r.stop_capture);
        let (c, rs, m) = (med(&caps), med(&r.restores), med(&r.memcpy));
        let max = caps.iter().max().map(|d| ms(*d));
        t.push(vec![
            r.mib.to_string(),
            format!("{:.1}", r.stored as f64 / (1 << 20) as f64),
            f(c),
            f(max),
            f(rs),
            f(m),
            f(c.zip(m).map(|(a, b)| a / b)),
            f(rs.zip(m).map(|(a, b)| a / b)),
            f(Some(ms(r.encode[0].0))),
            f(Some(ms(r.encode[1].0))),
            format!("{:.1}", r.encode[1].1 as f64 / (1 << 20) as f64),
            f(Some(ms(r.decode))),
        ]);
        if r.mib == 256 {
            let ok = |x: Option<f64>| {
                if x.is_some_and(|x| x <= 50.0) {
                    "met"
                } else {
                    "NOT met"
                }
            };
            notes.push(format!(
                "target capture of 256 MiB ≤ 50 ms: {} ({} ms)",
                ok(c),
                f(c)
            ));
            notes.push(format!(
                "target restore of 256 MiB ≤ 50 ms: {} ({} ms)",
                ok(rs),
                f(rs)
            ));
        }
    }
    notes.push(format!(
        "capture: CheckpointTiming.capture of {samples} continue checkpoints plus the final stop, after the fill; restore: Cell::restore (instantiate, write memory, globals, OS state, start rewind) of the stop snapshot, 3 times; memcpy: clone of an N MiB Vec (allocation + page faults + copy), 3 times"
    ));
    Report {
        name: "t2".into(),
        title: "T2: checkpoint capture and restore vs memory size".into(),
        setup: format!(
            "`roam-bench t2` (sizes {:?} MiB)",
            rows.iter().map(|r| r.mib).collect::<Vec<_>>()
        ),
        table: t,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_module_is_valid_wasm_with_start_and_memory() {
        let m = fill_module(4).unwrap();
        roam_prepare::validate(&m).expect("has _start and memory, no unsupported features");
        assert!(roam_prepare::validate(b"\0asm").is_err());
    }

    #[test]
    fn measures_one_mib_and_the_snapshot_holds_the_fill() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(roam_runtime::RuntimeConfig {
            cache_dir: dir.path().to_path_buf(),
            ..Default::default()
        })
        .unwrap();
        let row = measure(&rt, 1, 2).unwrap();
        assert_eq!(row.captures.len(), 2);
        assert!(
            row.stored >= 1 << 20 && row.stored < 2 << 20,
            "{}",
            row.stored
        );
        // Random data does not compress.
        assert!(row.encode[1].1 >= 1 << 20);
        let r = report(&[row], 2);
        assert_eq!(r.table.rows.len(), 1);
        assert_eq!(r.table.rows[0][0], "1");
    }

    #[test]
    fn baseline_copies_the_requested_size() {
        assert_eq!(memcpy_baseline(1, 2).len(), 2);
    }
}
