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
fn adapter_has_hysteresis() {
    let start = Mode::new(false, Codec::Lz4);
    let mut a = Adapter::new(AdaptConfig {
        initial: start,
        ..AdaptConfig::default()
    });
    // Alternate: slow network, then too few pages to judge: never 2 in a row.
    for _ in 0..5 {
        assert_eq!(a.on_window(&window_for(start, 100_000, true)), None);
        let mut idle = window_for(start, 100_000, true);
        idle.pages = 0;
        assert_eq!(a.on_window(&idle), None);
    }
    assert_eq!(a.current(), start);
}

/// Drive a real encoder with distinct compressible pages for `secs`, with a
/// consumer that sends at `bandwidth` bytes/s (`None`: as fast as it can).
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
    let pool: Vec<Vec<u8>> = (0..512).map(|_| text_page(&mut rng)).collect();
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let producer = std::thread::spawn(move || {
        let mut i = 0u32;
        while !stop2.load(Ordering::Relaxed) {
            let mut p = pool[i as usize % pool.len()].clone();
            p[..4].copy_from_slice(&i.to_le_bytes());
            enc.submit(i, &p).unwrap();
            i += 1;
        }
        enc.finish().unwrap()
    });
    let meter = rx.wire_meter();
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
        if t0.elapsed().as_secs_f64() > secs {
            stop.store(true, Ordering::Relaxed);
        }
    }
    let stats = producer.join().unwrap();
    for s in &stats.mode_switches {
        eprintln!("{} ms: {} -> {}: {}", s.at_ms, s.from, s.to, s.reason);
    }
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
