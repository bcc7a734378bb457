//! threads-sum - an integer kernel over a shared vector, with `std::thread`.
//!
//! Phase 1: the threads fill a shared `Vec<u64>`, block by block (blocks are
//! dealt round-robin), each element the result of `rounds` LCG steps with
//! xorshift mixing. Phase 2: the threads scan the filled vector read-only;
//! each element is mixed with a far-away one. Results meet three ways: the
//! wrapping sum through an `AtomicU64`, the maximum and a count through a
//! `Mutex`, and one order-sensitive hash per block through an `mpsc`
//! channel, combined in block order. The block count is fixed, so the output
//! does not depend on the thread count. At the end everything is recomputed
//! on one thread and compared (`check: ok`).

use common::{mix, Hash};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;

/// Blocks of the vector; fixed, independent of the thread count.
const BLOCKS: usize = 64;
const SEED: u64 = 0x7468_7265_6164_7321;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Totals {
    sum: u64,
    max: u64,
    high: u64,
    hash: u64,
}

/// Phase 1 kernel: `rounds` steps of an LCG with xorshift mixing.
fn kernel(i: u64, rounds: u32) -> u64 {
    let mut x = mix(i ^ SEED);
    for _ in 0..rounds {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x ^= x >> 29;
    }
    x
}

/// Fills `chunk`, which starts at element `first`.
fn fill(first: usize, chunk: &mut [u64], rounds: u32) {
    for (k, x) in chunk.iter_mut().enumerate() {
        *x = kernel((first + k) as u64, rounds);
    }
}

/// Phase 2 result of one block.
struct Scan {
    sum: u64,
    max: u64,
    high: u64,
    hash: u64,
}

/// Scans block `b` of the filled vector `v`, reading anywhere in it.
fn scan(v: &[u64], b: usize) -> Scan {
    let n = v.len();
    let len = n / BLOCKS;
    let mut r = Scan {
        sum: 0,
        max: 0,
        high: 0,
        hash: 0,
    };
    let mut h = Hash::default();
    for i in b * len..(b + 1) * len {
        let far = v[(i.wrapping_mul(7919) + 1) % n];
        let y = mix(v[i] ^ far.rotate_left((i % 64) as u32));
        r.sum = r.sum.wrapping_add(y);
        r.max = r.max.max(y);
        r.high += y >> 63;
        h.add(y);
    }
    r.hash = h.value();
    r
}

fn parallel(threads: usize, n: usize, rounds: u32) -> Totals {
    let mut v = vec![0u64; n];
    let len = n / BLOCKS;
    // Phase 1: deal the blocks round-robin, each thread fills its own.
    let mut work: Vec<Vec<(usize, &mut [u64])>> = (0..threads).map(|_| Vec::new()).collect();
    for (b, chunk) in v.chunks_mut(len).enumerate() {
        work[b % threads].push((b, chunk));
    }
    thread::scope(|s| {
        for mine in work {
            s.spawn(move || {
                for (b, chunk) in mine {
                    fill(b * len, chunk, rounds);
                }
            });
        }
    });
    // Phase 2: scan the shared vector; results by atomic, mutex and channel.
    let v = &v;
    let sum = AtomicU64::new(0);
    let stats = Mutex::new((0u64, 0u64));
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        for t in 0..threads {
            let (tx, sum, stats) = (tx.clone(), &sum, &stats);
            s.spawn(move || {
                for b in (t..BLOCKS).step_by(threads) {
                    let r = scan(v, b);
                    sum.fetch_add(r.sum, Ordering::Relaxed);
                    {
                        let mut g = stats.lock().unwrap();
                        g.0 = g.0.max(r.max);
                        g.1 += r.high;
                    }
                    tx.send((b, r.hash)).unwrap();
                }
            });
        }
    });
    drop(tx);
    let mut hashes = [None; BLOCKS];
    for (b, h) in rx {
        assert!(hashes[b].replace(h).is_none(), "block {b} reported twice");
    }
    let mut hash = Hash::default();
    for h in hashes {
        hash.add(h.expect("a block was never reported"));
    }
    let (max, high) = *stats.lock().unwrap();
    Totals {
        sum: sum.load(Ordering::Relaxed),
        max,
        high,
        hash: hash.value(),
    }
}

fn sequential(n: usize, rounds: u32) -> Totals {
    let mut v = vec![0u64; n];
    fill(0, &mut v, rounds);
    let mut t = Totals {
        sum: 0,
        max: 0,
        high: 0,
        hash: 0,
    };
    let mut hash = Hash::default();
    for b in 0..BLOCKS {
        let r = scan(&v, b);
        t.sum = t.sum.wrapping_add(r.sum);
        t.max = t.max.max(r.max);
        t.high += r.high;
        hash.add(r.hash);
    }
    t.hash = hash.value();
    t
}

/// `THREADS_SUM_END=exit` or `trap`: a second thread ends the whole
/// program (`exit(3)`, or an abort, which traps) while the first waits on
/// a channel that never delivers. Tests use it to see that one thread's end
/// is the program's.
fn end_from_a_thread(how: &str) -> ! {
    let (_keep, never) = mpsc::channel::<()>();
    let how = how.to_string();
    thread::spawn(move || {
        println!("leaving from a second thread: {how}");
        match how.as_str() {
            "exit" => std::process::exit(3),
            _ => std::process::abort(),
        }
    });
    let _ = never.recv();
    unreachable!("the channel never delivers");
}

fn main() -> ExitCode {
    if let Ok(how) = std::env::var("THREADS_SUM_END") {
        end_from_a_thread(&how);
    }
    let args = common::args("threads-sum");
    let (n, rounds) = args.size.pick((1 << 16, 512), (1 << 19, 512));
    println!("threads-sum: n={n} rounds={rounds} blocks={BLOCKS}");
    let p = parallel(args.threads, n, rounds);
    println!("sum: {:016x}", p.sum);
    println!("max: {:016x}", p.max);
    println!("high: {}", p.high);
    println!("hash: {:016x}", p.hash);
    let s = sequential(n, rounds);
    if s != p {
        eprintln!("threads-sum: sequential result differs: {s:?}");
    }
    common::finish(s == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_matches_sequential_for_any_thread_count() {
        let s = sequential(BLOCKS * 16, 3);
        for t in 1..=8 {
            assert_eq!(parallel(t, BLOCKS * 16, 3), s);
        }
    }
}
