//! Times capture, encode, decode and restore of a large memory.
//!
//! `cargo run --release -p roam-snapshot --example bench -- [MiB]` (default 256).
//! Prints one line per memory pattern; the capture target is <= 50 ms for 256 MiB.

use std::time::Instant;

use roam_snapshot::*;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(256);
    let len = mib << 20;
    let initial = InitialImage::new(WASM_PAGE_SIZE, vec![(0, vec![7u8; 32 * 1024])]);
    for (name, fill) in [("all data", 1usize), ("half zero", 2), ("mostly zero", 16)] {
        let mut mem = vec![0u8; len];
        let mut x: u64 = 0x1234_5678;
        for (i, page) in mem.chunks_exact_mut(PAGE_SIZE).enumerate() {
            if i % fill == 0 {
                for w in page.chunks_exact_mut(8) {
                    // Semi-compressible content: small numbers, like typical heaps.
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    w.copy_from_slice(&(x % 1000).to_le_bytes());
                }
            }
        }
        // Best of 5: the machine may be shared.
        let mut capture = std::time::Duration::MAX;
        let mut image = MemoryImage::empty();
        for _ in 0..5 {
            drop(image);
            let t = Instant::now();
            image = MemoryImage::capture(&mem, &initial);
            capture = capture.min(t.elapsed());
        }
        // Periodic checkpoints recycle the previous buffer.
        let mut reuse = std::time::Duration::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            image = MemoryImage::capture_reusing(&mem, &initial, image.into_stored_data());
            reuse = reuse.min(t.elapsed());
        }
        let snap = Snapshot {
            module: ModuleRef {
                hash: [0; 32],
                embedded: None,
            },
            origin: Origin {
                isa: "x86_64".into(),
                roam_version: "bench".into(),
                created_unix_ms: 0,
                reason: "bench".into(),
            },
            memory: image,
            globals: vec![],
            stack: UnwoundStack::default(),
            os_state: vec![],
            files: None,
            threads: Vec::new(),
        };
        let t = Instant::now();
        let bytes = snap.encode(&EncodeOptions::default()).unwrap();
        let encode = t.elapsed();
        let t = Instant::now();
        let back = Snapshot::decode(&bytes).unwrap();
        let decode = t.elapsed();
        let mut dst = vec![0u8; len];
        let t = Instant::now();
        back.memory.restore_into(&mut dst, &initial, false).unwrap();
        let restore = t.elapsed();
        assert!(dst == mem);
        println!(
            "{mib} MiB {name:<12} capture {:>6.1} ms (reusing {:>5.1} ms)  encode {:>7.1} ms  decode {:>7.1} ms  \
             restore {:>6.1} ms  stored {} pages  file {:.1} MiB",
            capture.as_secs_f64() * 1e3,
            reuse.as_secs_f64() * 1e3,
            encode.as_secs_f64() * 1e3,
            decode.as_secs_f64() * 1e3,
            restore.as_secs_f64() * 1e3,
            back.memory.stored_pages(),
            bytes.len() as f64 / (1 << 20) as f64
        );
    }
}
