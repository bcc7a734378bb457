//! threads-rayon - parallel map/reduce and parallel sorts with `rayon`.
//!
//! A deterministic pseudo-random array is generated in parallel; then, on a
//! `ThreadPoolBuilder::new().num_threads(n)` pool: a map/reduce (an integer
//! kernel per element, wrapping sum and maximum), an unstable parallel sort
//! of the values, and a stable parallel sort of (key, index) pairs by key.
//! The sorted arrays are hashed in order. Every reduction is associative and
//! commutative and every sort has one answer, so the output does not depend
//! on the thread count. The same is then computed sequentially and compared.

use common::{mix, Hash};
use rayon::prelude::*;
use std::process::ExitCode;

const SEED: u64 = 0x7261_796f_6e5f_7773;
/// Number of distinct keys for the stable sort (many ties).
const KEYS: u64 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Totals {
    sum: u64,
    max: u64,
    median: u64,
    sorted_hash: u64,
    pairs_hash: u64,
}

fn value(i: usize) -> u64 {
    mix(i as u64 ^ SEED)
}

/// Map kernel: `rounds` steps of multiply-xorshift.
fn kernel(mut x: u64, rounds: u32) -> u64 {
    for _ in 0..rounds {
        x = (x ^ (x >> 31)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        x = x.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    }
    x
}

fn key(x: u64) -> u32 {
    (x % KEYS) as u32
}

fn hash_all(xs: impl Iterator<Item = u64>) -> u64 {
    let mut h = Hash::default();
    xs.for_each(|x| h.add(x));
    h.value()
}

fn parallel(threads: usize, n: usize, rounds: u32) -> Totals {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("cannot build the rayon thread pool");
    pool.install(|| {
        let data: Vec<u64> = (0..n).into_par_iter().map(value).collect();
        let (sum, max) = data
            .par_iter()
            .map(|&x| {
                let y = kernel(x, rounds);
                (y, y)
            })
            .reduce(|| (0, 0), |a, b| (a.0.wrapping_add(b.0), a.1.max(b.1)));
        let mut sorted = data.clone();
        sorted.par_sort_unstable();
        let mut pairs: Vec<(u32, u32)> = data
            .par_iter()
            .enumerate()
            .map(|(i, &x)| (key(x), i as u32))
            .collect();
        pairs.par_sort_by_key(|p| p.0);
        // Hash fixed-size chunks in parallel, then combine them in order.
        let chunk_hashes: Vec<u64> = sorted
            .par_chunks(4096)
            .map(|c| hash_all(c.iter().copied()))
            .collect();
        let pair_hashes: Vec<u64> = pairs
            .par_chunks(4096)
            .map(|c| hash_all(c.iter().map(|&(k, i)| (u64::from(k) << 32) | u64::from(i))))
            .collect();
        Totals {
            sum,
            max,
            median: sorted[n / 2],
            sorted_hash: hash_all(chunk_hashes.into_iter()),
            pairs_hash: hash_all(pair_hashes.into_iter()),
        }
    })
}

fn sequential(n: usize, rounds: u32) -> Totals {
    let data: Vec<u64> = (0..n).map(value).collect();
    let mut sum = 0u64;
    let mut max = 0u64;
    for &x in &data {
        let y = kernel(x, rounds);
        sum = sum.wrapping_add(y);
        max = max.max(y);
    }
    let mut sorted = data.clone();
    sorted.sort();
    // A counting sort by key: stable by construction, independent of std's sort.
    let mut buckets = vec![Vec::new(); KEYS as usize];
    for (i, &x) in data.iter().enumerate() {
        buckets[key(x) as usize].push(i as u32);
    }
    let pairs: Vec<(u32, u32)> = buckets
        .iter()
        .enumerate()
        .flat_map(|(k, is)| is.iter().map(move |&i| (k as u32, i)))
        .collect();
    let chunk_hashes = sorted.chunks(4096).map(|c| hash_all(c.iter().copied()));
    let pair_hashes = pairs
        .chunks(4096)
        .map(|c| hash_all(c.iter().map(|&(k, i)| (u64::from(k) << 32) | u64::from(i))));
    Totals {
        sum,
        max,
        median: sorted[n / 2],
        sorted_hash: hash_all(chunk_hashes),
        pairs_hash: hash_all(pair_hashes),
    }
}

fn main() -> ExitCode {
    let args = common::args("threads-rayon");
    let (n, rounds) = args.size.pick((1 << 17, 192), (1 << 20, 192));
    println!("threads-rayon: n={n} rounds={rounds} keys={KEYS}");
    let p = parallel(args.threads, n, rounds);
    println!("map-reduce sum: {:016x}", p.sum);
    println!("map-reduce max: {:016x}", p.max);
    println!("median: {:016x}", p.median);
    println!("sorted hash: {:016x}", p.sorted_hash);
    println!("stable sort hash: {:016x}", p.pairs_hash);
    let s = sequential(n, rounds);
    if s != p {
        eprintln!("threads-rayon: sequential result differs: {s:?}");
    }
    common::finish(s == p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_matches_sequential_for_any_thread_count() {
        let s = sequential(10_000, 3);
        for t in [1, 2, 3, 8] {
            assert_eq!(parallel(t, 10_000, 3), s);
        }
    }
}
