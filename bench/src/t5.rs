//! T5: the page transfer pipeline against bandwidth, VM handoff style.
//!
//! Why it exists: the pipeline claims that its adaptive mode choice is about
//! as fast as the best fixed mode at every bandwidth, and that it sends far
//! fewer bytes than the memory that changed. T5 pushes real memory images
//! (workloads stopped mid-run, plus a synthetic page mix) through
//! `roam_transfer::push_image` with a consumer paced by a token bucket at
//! several bandwidths, for every static mode of a reduced set and for the
//! adaptive mode. The baseline, measured in the same run, is the best static
//! mode at the same bandwidth (and the raw pipeline: no compression).
//!
//! One round only: nothing was sent before, so no page has a delta base and
//! "delta" would make no difference; the static modes run without it.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_link::TokenBucket;
use roam_runtime::{
    Cell, CellOptions, CheckpointKind, CheckpointTiming, Outcome, Runtime, Trigger,
};
use roam_snapshot::{InitialImage, Snapshot};
use roam_transfer::{
    push_image, reference_workload, AdaptConfig, Codec, EncoderConfig, Mode, ModeSelect,
    PushReport, PAGE_SIZE,
};
use roam_wasi::WasiConfig;

use crate::paths::Paths;
use crate::quiet::Quiet;
use crate::report::{Report, Table};

/// Static codecs compared (without delta: a single round has no base).
pub const CODECS: [Codec; 6] = [
    Codec::None,
    Codec::Lz4,
    Codec::Zstd(1),
    Codec::Zstd(3),
    Codec::Zstd(9),
    Codec::Zstd(19),
];

/// A memory image to push.
pub struct Image {
    /// Workload name (or `synthetic`).
    pub name: String,
    /// The memory bytes.
    pub memory: Vec<u8>,
    /// Pages pushed (all zero/initial pages, and modified pages up to the cap).
    pub pages: Vec<u32>,
    /// The module's initial image.
    pub initial: InitialImage,
    /// Bytes of pushed pages that are neither zero nor equal to the initial image.
    pub modified: u64,
    /// Modified bytes of the whole memory, before the cap.
    pub modified_uncapped: u64,
}

fn is_modified(memory: &[u8], initial: &InitialImage, i: u32) -> bool {
    let o = i as usize * PAGE_SIZE;
    let p = &memory[o..o + PAGE_SIZE];
    if p.iter().all(|&b| b == 0) {
        return false;
    }
    initial.page(u64::from(i)) != Some(p)
}

/// Select the pages to push: every unmodified page, and modified pages in
/// address order until `cap` bytes of them.
fn select(name: &str, memory: Vec<u8>, initial: InitialImage, cap: u64) -> Image {
    let n = (memory.len() / PAGE_SIZE) as u32;
    let mut pages = Vec::new();
    let mut modified = 0u64;
    let mut uncapped = 0u64;
    for i in 0..n {
        if is_modified(&memory, &initial, i) {
            uncapped += PAGE_SIZE as u64;
            if modified + PAGE_SIZE as u64 <= cap {
                modified += PAGE_SIZE as u64;
                pages.push(i);
            }
        } else {
            pages.push(i);
        }
    }
    Image {
        name: name.to_string(),
        memory,
        pages,
        initial,
        modified,
        modified_uncapped: uncapped,
    }
}

/// Run workload `name` at `size`, stop it after `after`, and rebuild its
/// linear memory from the snapshot.
pub fn workload_image(
    rt: &Runtime,
    paths: &Paths,
    name: &str,
    size: &str,
    after: Duration,
    cap: u64,
) -> anyhow::Result<Image> {
    let wasm = paths.wasm(name)?;
    let module = rt.load_file(&wasm)?;
    let initial = module.initial_image().clone();
    let mut cell = Cell::start(
        rt,
        module,
        WasiConfig {
            args: vec![format!("{name}.wasm"), size.into()],
            ..Default::default()
        },
        CellOptions::default(),
    )?;
    let ctl = cell.controller();
    let (tx, rx) = mpsc::channel::<()>();
    let driver = std::thread::spawn(move || {
        if rx.recv_timeout(after).is_err() {
            ctl.request(CheckpointKind::Stop, Trigger::Api);
        }
    });
    let outcome = {
        let _q = Quiet::new()?;
        cell.run(&mut |_s: &Snapshot, _t: CheckpointTiming| Ok(()))
    };
    let _ = tx.send(());
    driver
        .join()
        .map_err(|_| anyhow::anyhow!("driver thread panicked"))?;
    let snap = match outcome.context("workload failed")? {
        Outcome::Stopped(s, _) => *s,
        Outcome::Exited(c) => bail!("{name} exited ({c}) before {after:?}: use a larger size"),
        Outcome::Paused(..) => bail!("{name} paused unexpectedly"),
    };
    let mut memory = vec![0u8; snap.memory.byte_len() as usize];
    snap.memory
        .restore_into(&mut memory, &initial, false)
        .context("rebuilding memory from the snapshot")?;
    Ok(select(name, memory, initial, cap))
}

/// `reference_workload` pages (text, small integers, pointers, sparse,
/// random) with one zero page after every three data pages, `cap` bytes of
/// data pages in all.
pub fn synthetic_image(cap: u64) -> Image {
    let data = (cap / PAGE_SIZE as u64) as usize;
    let mut memory = Vec::with_capacity((data + data / 3 + 1) * PAGE_SIZE);
    for (k, (_, cur)) in reference_workload(data).into_iter().enumerate() {
        memory.extend_from_slice(&cur);
        if k % 3 == 2 {
            memory.extend_from_slice(&[0u8; PAGE_SIZE]);
        }
    }
    select("synthetic", memory, InitialImage::empty(), cap)
}

/// What one push measured.
#[derive(Debug, Clone)]
pub struct Run {
    /// Mode label (`none`, `lz4`, …, `adaptive`).
    pub label: String,
    /// Until the last byte passed the bucket.
    pub elapsed: Duration,
    /// Bytes of batches.
    pub bytes_out: u64,
    /// Final mode and number of switches (adaptive only).
    pub end_mode: String,
    /// Mode switches.
    pub switches: usize,
}

/// Push `img` with `mode` through a consumer paced at `mbit` Mbit/s.
pub fn push(img: &Image, mode: ModeSelect, mbit: u64) -> anyhow::Result<PushReport> {
    let cfg = EncoderConfig {
        mode,
        ..Default::default()
    };
    let rate = mbit * 1_000_000;
    // 64 KiB chunks, or 10 ms of link time if that is less.
    let chunk = (rate / 8 / 100).clamp(1500, 64 * 1024);
    let start = Instant::now();
    let mut bucket = TokenBucket::new(rate, chunk, Duration::ZERO);
    let sink = move |batch: &[u8], meter: &roam_transfer::WireMeter| {
        for part in batch.chunks(chunk as usize) {
            let wait = bucket.spend(start.elapsed(), part.len() as u64);
            meter.record(part.len() as u64);
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
    };
    Ok(push_image(
        &img.memory,
        Some(&img.pages),
        &img.initial,
        None,
        cfg,
        sink,
    )?)
}

/// All runs of one image at one bandwidth.
#[derive(Debug, Clone)]
pub struct Cellrow {
    /// Image name.
    pub image: String,
    /// Modified bytes pushed.
    pub modified: u64,
    /// Bandwidth.
    pub mbit: u64,
    /// Static runs in [`CODECS`] order, then adaptive.
    pub runs: Vec<Run>,
}

/// Measure every mode on `img` at `mbit`.
pub fn measure(img: &Image, mbit: u64) -> anyhow::Result<Cellrow> {
    let mut runs = Vec::new();
    let mut modes: Vec<(String, ModeSelect)> = CODECS
        .iter()
        .map(|&c| (c.to_string(), ModeSelect::Static(Mode::new(false, c))))
        .collect();
    modes.push((
        "adaptive".into(),
        ModeSelect::Adaptive(AdaptConfig::default()),
    ));
    for (label, mode) in modes {
        let r = push(img, mode, mbit)?;
        let end_mode = r.stats.mode.map(|m| m.to_string()).unwrap_or_default();
        eprintln!(
            "t5: {} {mbit} Mbit/s {label}: {:.2} s, {} B out (end mode {end_mode}, {} switches)",
            img.name,
            r.elapsed.as_secs_f64(),
            r.bytes_out,
            r.stats.mode_switches.len()
        );
        runs.push(Run {
            label,
            elapsed: r.elapsed,
            bytes_out: r.bytes_out,
            end_mode,
            switches: r.stats.mode_switches.len(),
        });
    }
    Ok(Cellrow {
        image: img.name.clone(),
        modified: img.modified,
        mbit,
        runs,
    })
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// Build the report.
pub fn report(rows: &[Cellrow], setup: String, mut notes: Vec<String>) -> Report {
    let mut headers = vec!["image", "modified MiB", "Mbit/s", "raw s"];
    let labels: Vec<String> = CODECS.iter().skip(1).map(|c| format!("{c} s")).collect();
    headers.extend(labels.iter().map(String::as_str));
    headers.extend([
        "adaptive s",
        "best static",
        "adaptive ÷ best static",
        "adaptive end mode (switches)",
        "adaptive bytes ÷ modified",
        "best static bytes ÷ modified",
        "zstd-3 bytes ÷ modified",
    ]);
    let mut t = Table::new(&headers);
    let mut time_ok = 0;
    let mut bytes_ok = 0;
    let mut n = 0;
    for r in rows {
        let statics = &r.runs[..CODECS.len()];
        let adaptive = &r.runs[CODECS.len()];
        let Some(best) = statics.iter().min_by_key(|x| x.elapsed) else {
            continue;
        };
        let m = r.modified.max(1) as f64;
        let ratio = adaptive.elapsed.as_secs_f64() / best.elapsed.as_secs_f64();
        let bytes = adaptive.bytes_out as f64 / m;
        n += 1;
        time_ok += usize::from(ratio <= 1.1);
        bytes_ok += usize::from(bytes <= 0.2);
        let mut row = vec![
            r.image.clone(),
            format!("{:.2}", r.modified as f64 / (1 << 20) as f64),
            r.mbit.to_string(),
        ];
        row.extend(statics.iter().map(|x| secs(x.elapsed)));
        row.extend([
            secs(adaptive.elapsed),
            best.label.clone(),
            format!("{ratio:.2}"),
            format!("{} ({})", adaptive.end_mode, adaptive.switches),
            format!("{bytes:.3}"),
            format!("{:.3}", best.bytes_out as f64 / m),
            format!("{:.3}", statics[3].bytes_out as f64 / m),
        ]);
        t.push(row);
    }
    notes.insert(
        0,
        format!(
            "adaptive ÷ best static ≤ 1.1 in {time_ok} of {n} cases; \
             adaptive bytes ÷ modified ≤ 0.2 in {bytes_ok} of {n} cases"
        ),
    );
    Report {
        figure: None,
        name: "t5".into(),
        label: String::new(),
        title: "T5 — transfer pipeline vs bandwidth (single round)".into(),
        setup,
        table: t,
        notes,
    }
}
