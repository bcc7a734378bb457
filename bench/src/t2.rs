//! T2: checkpoint capture and restore time against live memory size.
//!
//! Why it exists: a migration's pause is dominated by copying linear memory
//! out (capture) and back in (restore). Targets: 256 MiB in ≤ 50 ms each.
//! The baseline, measured in the same run, is the cheapest possible copy of
//! the same bytes: a memcpy of N MiB into a freshly allocated `Vec`.
//!
//! Restore is "to first instruction": from a snapshot to a cell whose next
//! `run` executes the guest. It is timed four ways, each against format v1
//! and v2 in the same run: from the snapshot object just captured (pages on
//! the heap, always copied), from encoded bytes in memory (decode + restore:
//! what a migration receiver pays), and from a file (read + decode +
//! restore: what `roam restore --eager` pays), and lazily from a v2 file
//! (`Snapshot::open_file` + `Cell::restore_file`: what `roam restore`
//! pays; the pages are then read in the background, and the time until the
//! last one is in is reported too). Capture is the pause the program
//! sees in a checkpoint-and-continue: from the migration point until the
//! program may go on.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_runtime::{
    Cell, CellOptions, CheckpointKind, CheckpointTiming, Outcome, Runtime, Trigger,
};
use roam_snapshot::{EncodeOptions, Format, Snapshot, PAGE_SIZE};
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
    /// `Cell::restore` times from the captured snapshot (heap pages).
    pub restores: Vec<Duration>,
    /// Baseline: memcpy of `mib` MiB into a fresh `Vec`.
    pub memcpy: Vec<Duration>,
    /// Per format (v1, v2): encode time at level 3 and bytes.
    pub encode: [(Duration, usize); 2],
    /// Per format (v1, v2): `Snapshot::decode` + `Cell::restore` times.
    pub from_bytes: [Vec<Duration>; 2],
    /// Per format (v1, v2): `Snapshot::read_file` + `Cell::restore` times.
    pub from_file: [Vec<Duration>; 2],
    /// v2 file, lazily: `Snapshot::open_file` + `Cell::restore_file` times,
    /// and from the same start until every page was in. Empty without
    /// userfaultfd.
    pub lazy: Vec<(Duration, Duration)>,
}

const FORMATS: [Format; 2] = [Format::V1, Format::V2];

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

/// Time `reps` restores of `get()`'s snapshot; the cell is dropped
/// untimed, and its snapshot checked against `want` stored pages.
fn time_restores(
    rt: &Runtime,
    module: &std::sync::Arc<roam_runtime::LoadedModule>,
    reps: usize,
    want: usize,
    mut get: impl FnMut() -> anyhow::Result<Snapshot>,
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let snap = get()?;
        let cell = Cell::restore(rt, module.clone(), &snap, vec![], CellOptions::default())
            .context("restore failed")?;
        out.push(t.elapsed());
        if snap.memory.stored_pages() != want {
            bail!("decoded snapshot differs from the captured one");
        }
        drop(cell);
    }
    Ok(out)
}

/// Time `reps` lazy restores from the v2 file at `path`, each to first
/// instruction and to the last page read; empty when the restore is not
/// lazy here (no userfaultfd).
fn time_lazy_restores(
    rt: &Runtime,
    module: &std::sync::Arc<roam_runtime::LoadedModule>,
    reps: usize,
    want: usize,
    path: &std::path::Path,
) -> anyhow::Result<Vec<(Duration, Duration)>> {
    let mut out = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let (opened, _) = Snapshot::open_file(path)?;
        let (cell, lazy) =
            Cell::restore_file(rt, module.clone(), &opened, vec![], CellOptions::default())
                .context("lazy restore failed")?;
        let first = t.elapsed();
        let Some(lazy) = lazy else {
            return Ok(Vec::new());
        };
        while !lazy.is_complete() {
            if t.elapsed() > Duration::from_secs(60) {
                bail!(
                    "the pages of {} were not all read within 60 s",
                    path.display()
                );
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        out.push((first, t.elapsed()));
        let st = lazy.stats();
        if (st.pages_fetched + st.pages_prefetched) as usize != want {
            bail!("the lazy restore read {st:?}, not the {want} stored pages");
        }
        drop(cell);
    }
    Ok(out)
}

/// Measure one size.
pub fn measure(rt: &Runtime, mib: u32, samples: usize) -> anyhow::Result<Row> {
    let (captures, snap, stop_capture) = checkpoints(rt, mib, samples)?;
    let module = rt.load_bytes(&fill_module(mib)?)?;
    let want = snap.memory.stored_pages();
    let restores = time_restores(rt, &module, 3, want, || Ok(snap.clone()))?;
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let mut encode = [(Duration::ZERO, 0); 2];
    let mut from_bytes: [Vec<Duration>; 2] = Default::default();
    let mut from_file: [Vec<Duration>; 2] = Default::default();
    let mut lazy = Vec::new();
    for (i, format) in FORMATS.into_iter().enumerate() {
        let t = Instant::now();
        let bytes = snap.encode(&EncodeOptions { level: 3, format })?;
        encode[i] = (t.elapsed(), bytes.len());
        from_bytes[i] = time_restores(rt, &module, 3, want, || Ok(Snapshot::decode(&bytes)?))?;
        let path = dir.path().join(format!("t2-{i}.roam"));
        std::fs::write(&path, &bytes)?;
        drop(bytes);
        from_file[i] = time_restores(rt, &module, 3, want, || Ok(Snapshot::read_file(&path)?))?;
        if format == Format::V2 {
            lazy = time_lazy_restores(rt, &module, 3, want, &path)?;
        }
        std::fs::remove_file(&path)?;
    }
    Ok(Row {
        mib,
        stored: want as u64 * PAGE_SIZE as u64,
        captures,
        stop_capture,
        restores,
        memcpy: memcpy_baseline(mib, 3),
        encode,
        from_bytes,
        from_file,
        lazy,
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
        "pause p50 ms",
        "pause max ms",
        "memcpy p50 ms",
        "restore captured ms",
        "restore v1 bytes ms",
        "restore v2 bytes ms",
        "restore v1 file ms",
        "restore v2 file ms",
        "lazy v2 file ms",
        "lazy all pages in ms",
        "v2 file ÷ memcpy",
        "v1 file ÷ v2 file",
        "encode v1 ms",
        "encode v2 ms",
        "v1 MiB",
        "v2 MiB",
    ]);
    let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
    let size = |b: usize| format!("{:.1}", b as f64 / (1 << 20) as f64);
    let mut notes = Vec::new();
    for r in rows {
        let mut caps = r.captures.clone();
        caps.push(r.stop_capture);
        let (c, m) = (med(&caps), med(&r.memcpy));
        let (f1, f2) = (med(&r.from_file[0]), med(&r.from_file[1]));
        let max = caps.iter().max().map(|d| ms(*d));
        let lazy_first = med(&r.lazy.iter().map(|l| l.0).collect::<Vec<_>>());
        let lazy_all = med(&r.lazy.iter().map(|l| l.1).collect::<Vec<_>>());
        t.push(vec![
            r.mib.to_string(),
            format!("{:.1}", r.stored as f64 / (1 << 20) as f64),
            f(c),
            f(max),
            f(m),
            f(med(&r.restores)),
            f(med(&r.from_bytes[0])),
            f(med(&r.from_bytes[1])),
            f(f1),
            f(f2),
            f(lazy_first),
            f(lazy_all),
            f(f2.zip(m).map(|(a, b)| a / b)),
            f(f1.zip(f2).map(|(a, b)| a / b)),
            f(Some(ms(r.encode[0].0))),
            f(Some(ms(r.encode[1].0))),
            size(r.encode[0].1),
            size(r.encode[1].1),
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
                "target capture (program-visible pause) of 256 MiB ≤ 50 ms: {} ({} ms)",
                ok(c),
                f(c)
            ));
            let b2 = med(&r.from_bytes[1]);
            notes.push(format!(
                "target restore of 256 MiB ≤ 50 ms: lazily from a v2 file (the default of `roam restore`) {} ({} ms, every page in after {} ms); reading the whole v2 file first {} ({} ms), from v2 bytes in memory {} ({} ms)",
                ok(lazy_first),
                f(lazy_first),
                f(lazy_all),
                ok(f2),
                f(f2),
                ok(b2),
                f(b2)
            ));
        }
    }
    notes.push(format!(
        "pause: CheckpointTiming.capture (migration point reached → snapshot complete, the program then resumes) of {samples} checkpoint-and-continue after the fill plus the final stop; \
         restore captured: Cell::restore of the in-memory snapshot just captured (heap pages, copied); \
         restore vN bytes: Snapshot::decode of the level-3 encoding + Cell::restore; \
         restore vN file: Snapshot::read_file (file just written, in the page cache) + Cell::restore; \
         lazy v2 file: Snapshot::open_file + Cell::restore_file (pages read on first touch and by a background reader; `-` without userfaultfd), and the time until the reader had every page in (the restored program idle); \
         restores to first instruction (instantiate, memory, globals, OS state, start of the rewind), 3 times each; \
         memcpy: clone of an N MiB Vec (allocation + page faults + copy), 3 times"
    ));
    Report {
        figure: None,
        name: "t2".into(),
        label: String::new(),
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
        assert!(row.encode[0].1 >= 1 << 20 && row.encode[1].1 >= 1 << 20);
        assert!(row.from_file.iter().all(|d| d.len() == 3));
        if roam_runtime::userfaultfd_available() {
            assert_eq!(row.lazy.len(), 3);
            assert!(row.lazy.iter().all(|(first, all)| first <= all));
        }
        let r = report(&[row], 2);
        assert_eq!(r.table.rows.len(), 1);
        assert_eq!(r.table.rows[0][0], "1");
    }

    #[test]
    fn baseline_copies_the_requested_size() {
        assert_eq!(memcpy_baseline(1, 2).len(), 2);
    }
}
