//! Adaptation moves toward stronger compression when the network is the
//! bottleneck and toward cheaper processing when the CPU is.

mod common;
use common::*;
use roam_transfer::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn reference(mode: Mode) -> ModeProfile {
    *ModeTable::builtin().get(mode).unwrap()
}

fn window_for(mode: Mode, wire_bytes: u64, network_bound: bool) -> Window {
    let r = reference(mode);
    Window {
        seconds: 0.1,
        pages: 200,
        with_base: 0,
        // The machine is 3x slower and the data 20% less compressible than
        // the reference: only the ratios between modes should matter.
        p_nanos: r.p_nanos * 3.0,
        hash_nanos: 1000.0,
        ratio: (r.ratio * 1.2).min(1.0),
        wire_bytes,
        network_bound,
        workers: 2,
    }
}

#[test]
fn adapter_prefers_compression_on_a_slow_network() {
    let start = Mode::new(false, Codec::Lz4);
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        ..AdaptConfig::default()
    });
    // 1 MB/s and the pipeline waits on the consumer.
    assert_eq!(
        a.on_window(&window_for(start, 100_000, true)),
        None,
        "needs 2 windows"
    );
    let (to, why) = a
        .on_window(&window_for(start, 100_000, true))
        .expect("switches");
    assert!(
        reference(to).ratio < reference(start).ratio,
        "{start} -> {to}: {why}"
    );
    assert!(why.contains("network-bound"), "{why}");
}

#[test]
fn adapter_prefers_cheap_modes_on_a_fast_network() {
    let start = Mode::new(false, Codec::Zstd(19));
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        ..AdaptConfig::default()
    });
    let mut mode = start;
    for _ in 0..10 {
        if let Some((to, _)) = a.on_window(&window_for(mode, 50_000_000, false)) {
            mode = to;
        }
    }
    assert!(
        reference(mode).p_nanos < reference(start).p_nanos / 4.0,
        "{start} -> {mode}"
    );
}

#[test]
fn adapter_needs_consecutive_windows_and_ignores_idle_ones() {
    let start = Mode::new(false, Codec::Lz4);
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        ..AdaptConfig::default()
    });
    assert_eq!(a.on_window(&window_for(start, 100_000, true)), None);
    let mut idle = window_for(start, 100_000, true);
    idle.pages = 0;
    assert_eq!(a.on_window(&idle), None, "an idle window decides nothing");
    assert!(a.on_window(&window_for(start, 100_000, true)).is_some());
}

#[test]
fn adapter_respects_the_gain_threshold() {
    let start = Mode::new(false, Codec::Lz4);
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        min_gain: 100.0,
        ..AdaptConfig::default()
    });
    for _ in 0..10 {
        assert_eq!(a.on_window(&window_for(start, 100_000, true)), None);
    }
}

#[test]
fn adapter_streak_is_broken_when_the_current_mode_is_best() {
    let start = Mode::new(false, Codec::Lz4);
    // Find a bandwidth at which the current mode is predicted best.
    let mut good = None;
    let mut bytes = 100_000.0f64;
    while bytes < 1e9 {
        let mut probe = Adapter::new(AdaptConfig {
            initial: start,
            ..AdaptConfig::default()
        });
        let w = window_for(start, bytes as u64, true);
        let _ = probe.on_window(&w);
        let preds = probe.predict(&w);
        let best = preds
            .iter()
            .reduce(|a, b| if b.system() > a.system() { b } else { a })
            .unwrap();
        if best.mode == start {
            good = Some(bytes as u64);
            break;
        }
        bytes *= 1.1;
    }
    let good = good.expect("some bandwidth makes lz4 the best mode");
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        ..AdaptConfig::default()
    });
    for _ in 0..5 {
        assert_eq!(a.on_window(&window_for(start, 100_000, true)), None);
        assert_eq!(a.on_window(&window_for(start, good, true)), None);
    }
    assert_eq!(a.current(), start);
}

/// Pages of the driven memory; indices wrap, so pages are re-sent (deltas).
const DRIVE_PAGES: u32 = 2048;

/// Drive a real encoder with distinct compressible pages for `secs`, with a
/// consumer that sends at `bandwidth` bytes/s (`None`: as fast as it can) and
/// applies every batch; the destination must end equal to the source.
fn drive(start: Mode, bandwidth: Option<f64>, secs: f64) -> Stats {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = EncoderConfig {
        workers: 2,
        mode: ModeSelect::Adaptive(short_adapt(start)),
        batch_bytes: 16 * 1024,
        output_batches: 4,
        ..EncoderConfig::default()
    };
    let mut rng = SplitMix64::new(77);
    let pool: Vec<Vec<u8>> = (0..509).map(|_| text_page(&mut rng)).collect();
    let page_for = move |i: u32| {
        let mut p = pool[i as usize % pool.len()].clone();
        p[..4].copy_from_slice(&i.to_le_bytes());
        p
    };
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let page_for2 = page_for.clone();
    let producer = std::thread::spawn(move || {
        let mut i = 0u32;
        while !stop2.load(Ordering::Relaxed) {
            enc.submit(i % DRIVE_PAGES, &page_for2(i)).unwrap();
            i += 1;
        }
        (enc.finish().unwrap(), i)
    });
    let meter = rx.wire_meter();
    let mut dst = vec![0u8; DRIVE_PAGES as usize * PS];
    let mut dec = Decoder::new();
    let t0 = Instant::now();
    let mut sent = 0u64;
    for b in rx {
        sent += b.len() as u64;
        if let Some(bw) = bandwidth {
            let due = Duration::from_secs_f64(sent as f64 / bw);
            if let Some(d) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(d);
            }
        }
        meter.record(b.len() as u64);
        dec.apply(&b, &mut MemoryTarget::new(&mut dst, &initial))
            .unwrap();
        if t0.elapsed().as_secs_f64() > secs {
            stop.store(true, Ordering::Relaxed);
        }
    }
    let (stats, submitted) = producer.join().unwrap();
    for s in &stats.mode_switches {
        eprintln!("{} ms: {} -> {}: {}", s.at_ms, s.from, s.to, s.reason);
    }
    // Each page holds the last version submitted for it.
    for j in 0..DRIVE_PAGES.min(submitted) {
        let last = j + (submitted - 1 - j) / DRIVE_PAGES * DRIVE_PAGES;
        let o = j as usize * PS;
        assert!(dst[o..o + PS] == page_for(last)[..], "page {j} differs");
    }
    eprintln!("{submitted} pages submitted, {} delta", stats.delta_pages);
    stats
}

#[test]
fn slow_consumer_drives_the_encoder_to_stronger_compression() {
    let start = Mode::new(false, Codec::Lz4);
    let stats = drive(start, Some(400_000.0), 2.0);
    let end = stats.mode.unwrap();
    assert!(!stats.mode_switches.is_empty(), "no switch: {stats:?}");
    assert!(
        reference(end).ratio < reference(start).ratio,
        "{start} -> {end}: {:?}",
        stats.mode_switches
    );
}

#[test]
fn fast_consumer_drives_the_encoder_to_cheaper_processing() {
    let start = Mode::new(false, Codec::Zstd(19));
    let stats = drive(start, None, 2.0);
    let end = stats.mode.unwrap();
    assert!(
        reference(end).p_nanos < reference(start).p_nanos,
        "{start} -> {end}: {:?}",
        stats.mode_switches
    );
}

/// Regenerates `src/builtin_table.rs` contents and prints throughput per codec.
#[test]
#[ignore]
fn print_builtin_table() {
    let work = reference_workload(2000);
    let pairs: Vec<(&[u8], &[u8])> = work.iter().map(|(a, b)| (&a[..], &b[..])).collect();
    let t = ModeTable::measure(&pairs, &default_modes());
    for (name, delta) in [("BUILTIN_PLAIN", false), ("BUILTIN_DELTA", true)] {
        println!("const {name}: [(f64, f64); 9] = [");
        for e in t.entries.iter().filter(|e| e.mode.delta == delta) {
            println!(
                "    ({:.1}, {:.4}), // {} {:.0} MB/s/core",
                e.p_nanos,
                e.ratio,
                e.mode,
                PS as f64 / e.p_nanos * 1e3
            );
        }
        println!("];");
    }
}
