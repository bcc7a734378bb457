//! Pipelining, backpressure and shutdown behaviour of the encoder.

mod common;
use common::*;
use roam_transfer::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

#[test]
fn first_batch_comes_out_before_input_ends() {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = static_cfg(Mode::new(false, Codec::Lz4));
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    let (first_tx, first_rx) = mpsc::channel();
    let consumer = std::thread::spawn(move || {
        let mut n = 0;
        while let Some(b) = rx.recv() {
            if n == 0 {
                let _ = first_tx.send(b.len());
            }
            n += 1;
        }
        n
    });
    let mut rng = SplitMix64::new(1);
    for i in 0..100 {
        enc.submit(i, &text_page(&mut rng)).unwrap();
    }
    // No flush, no finish: the batch must come out on its own.
    let got = first_rx.recv_timeout(Duration::from_secs(5));
    assert!(got.is_ok(), "no batch before the input ended");
    for i in 100..200 {
        enc.submit(i, &text_page(&mut rng)).unwrap();
    }
    let stats = enc.finish().unwrap();
    assert_eq!(stats.pages_in, 200);
    assert!(consumer.join().unwrap() >= 2);
}

#[test]
fn flush_with_nothing_pending_does_not_split_later_batches() {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = EncoderConfig {
        batch_bytes: 1 << 20,
        flush_after: Duration::from_secs(10),
        ..static_cfg(Mode::new(false, Codec::Lz4))
    };
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    let consumer = std::thread::spawn(move || rx.count());
    let mut rng = SplitMix64::new(4);
    enc.submit(0, &text_page(&mut rng)).unwrap();
    enc.flush();
    std::thread::sleep(Duration::from_millis(100));
    enc.flush(); // nothing pending any more
    std::thread::sleep(Duration::from_millis(50));
    for i in 1..200 {
        enc.submit(i, &text_page(&mut rng)).unwrap();
    }
    enc.finish().unwrap();
    assert_eq!(consumer.join().unwrap(), 2, "one batch per flush/finish");
}

#[test]
fn slow_consumer_stalls_the_submitter() {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = EncoderConfig {
        max_in_flight: 32,
        output_batches: 1,
        batch_bytes: 8 * 1024,
        ..static_cfg(Mode::new(false, Codec::None))
    };
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    let submitted = Arc::new(AtomicUsize::new(0));
    let sub = submitted.clone();
    let producer = std::thread::spawn(move || {
        let mut rng = SplitMix64::new(2);
        for i in 0..2000u32 {
            enc.submit(i, &rng_page(&mut rng)).unwrap();
            sub.fetch_add(1, Ordering::SeqCst);
        }
        enc.finish().unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    let stalled_at = submitted.load(Ordering::SeqCst);
    assert!(
        stalled_at < 200,
        "submitter ran ahead of a stopped consumer: {stalled_at}"
    );
    let n: usize = rx.map(|b| decode_batch(&b).unwrap().len()).sum();
    let stats = producer.join().unwrap();
    assert_eq!(n, 2000);
    assert!(
        stats.output_wait_nanos > 100_000_000,
        "{}",
        stats.output_wait_nanos
    );
}

#[test]
fn dropped_consumer_is_reported() {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = EncoderConfig {
        max_in_flight: 16,
        output_batches: 1,
        batch_bytes: 8 * 1024,
        ..static_cfg(Mode::new(false, Codec::None))
    };
    let (mut enc, rx) = Encoder::new(cfg, &initial, None);
    drop(rx);
    let mut rng = SplitMix64::new(3);
    let mut err = None;
    for i in 0..10_000u32 {
        if let Err(e) = enc.submit(i, &rng_page(&mut rng)) {
            err = Some(e);
            break;
        }
    }
    assert_eq!(err, Some(EncodeError::ConsumerGone));
    assert_eq!(enc.finish(), Err(EncodeError::ConsumerGone));
}

#[test]
fn wrong_input_is_rejected() {
    let initial = roam_snapshot::InitialImage::empty();
    let cfg = EncoderConfig {
        shuffle_seed: Some(1),
        ..static_cfg(Mode::new(false, Codec::Lz4))
    };
    let (mut enc, _rx) = Encoder::new(cfg, &initial, None);
    assert_eq!(
        enc.submit(3, &[0; 10]),
        Err(EncodeError::PageSize { index: 3, len: 10 })
    );
    let mem = vec![0u8; 2 * PS];
    assert_eq!(
        enc.submit_memory(&mem, &[0, 1, 0]),
        Err(EncodeError::DuplicateInSet(0))
    );
    assert_eq!(
        enc.submit_memory(&mem, &[5]),
        Err(EncodeError::OutOfRange { index: 5, pages: 2 })
    );
}

#[test]
fn push_image_reports_totals() {
    let (initial, mem) = mixed_memory(256, 8);
    let cfg = static_cfg(Mode::new(true, Codec::Zstd(3)));
    let mut got = 0u64;
    let r = push_image(&mem, None, &initial, None, cfg, |b, meter| {
        got += b.len() as u64;
        meter.record(b.len() as u64);
    })
    .unwrap();
    assert_eq!(r.bytes_in, mem.len() as u64);
    assert!(r.bytes_out > 0 && r.bytes_out < r.bytes_in / 4);
    assert!(r.first_batch_after.unwrap() <= r.elapsed);
    assert_eq!(r.stats.pages_in, 256);
}

/// End-to-end encoder throughput per static mode with an unthrottled consumer.
#[test]
#[ignore]
fn print_pipeline_throughput() {
    let (initial, mem) = mixed_memory(8192, 12);
    for codec in [
        Codec::None,
        Codec::Lz4,
        Codec::Zstd(1),
        Codec::Zstd(3),
        Codec::Zstd(9),
        Codec::Zstd(19),
    ] {
        for workers in [1, 2] {
            let cfg = EncoderConfig {
                workers,
                ..static_cfg(Mode::new(false, codec))
            };
            let r = push_image(&mem, None, &initial, None, cfg, |b, m| {
                m.record(b.len() as u64)
            })
            .unwrap();
            println!(
                "{codec:8} workers {workers}: {:7.1} MB/s in, ratio {:.3}, first batch after {:?}",
                r.bytes_in as f64 / r.elapsed.as_secs_f64() / 1e6,
                r.bytes_out as f64 / r.bytes_in as f64,
                r.first_batch_after.unwrap()
            );
        }
    }
}
