//! Shared contract of the multi-threaded workloads.
//!
//! Every program takes `[threads] [size]`: `threads` is 1..=8 (default 4),
//! `size` is `S` (small, tests) or `M` (medium, the default). Its stdout is
//! identical for every thread count and every run; the thread count goes to
//! stderr only. The last line is `check: ok` (or `check: FAILED`, exit 1),
//! from recomputing the result sequentially.

#![deny(missing_docs)]

use std::process::ExitCode;

/// Problem size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Small: about 0.1-0.3 s.
    S,
    /// Medium (default): about 1-3 s of CPU.
    M,
}

impl Size {
    /// Picks the parameter for this size.
    pub fn pick<T>(self, s: T, m: T) -> T {
        match self {
            Size::S => s,
            Size::M => m,
        }
    }
}

/// The parsed command line.
#[derive(Clone, Copy, Debug)]
pub struct Args {
    /// Number of worker threads, 1..=8.
    pub threads: usize,
    /// Problem size class.
    pub size: Size,
}

/// Parses `[threads] [S|M]` from `args` (without the program name).
pub fn parse(args: &[String]) -> Option<Args> {
    let threads = match args.first() {
        None => 4,
        Some(a) => a.parse().ok().filter(|t| (1..=8).contains(t))?,
    };
    let size = match args.get(1).map(String::as_str) {
        None | Some("M") => Size::M,
        Some("S") => Size::S,
        Some(_) => return None,
    };
    (args.len() <= 2).then_some(Args { threads, size })
}

/// Reads the process arguments; on anything else prints usage and exits 2.
/// Reports the thread count on stderr (`threads: N`).
pub fn args(name: &str) -> Args {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = parse(&argv).unwrap_or_else(|| {
        eprintln!("usage: {name} [THREADS 1..=8, default 4] [S|M, default M]");
        std::process::exit(2)
    });
    eprintln!("threads: {}", a.threads);
    a
}

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform double in `[0, 1)` from the top 53 bits of `mix(seed)`.
pub fn unit(seed: u64) -> f64 {
    (mix(seed) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

/// An order-sensitive hash of a sequence of 64-bit words (FNV-1a style,
/// one word at a time).
#[derive(Clone, Copy, Debug)]
pub struct Hash(u64);

impl Default for Hash {
    fn default() -> Self {
        Hash(0xcbf2_9ce4_8422_2325)
    }
}

impl Hash {
    /// Feeds one word.
    pub fn add(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x0000_0100_0000_01b3);
        self.0 ^= self.0 >> 32;
    }

    /// The hash so far.
    pub fn value(self) -> u64 {
        self.0
    }
}

/// Prints `check: ok` or `check: FAILED` and returns the exit status.
pub fn finish(ok: bool) -> ExitCode {
    if ok {
        println!("check: ok");
        ExitCode::SUCCESS
    } else {
        println!("check: FAILED");
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_threads_and_size() {
        let a = parse(&v(&[])).unwrap();
        assert_eq!((a.threads, a.size), (4, Size::M));
        let a = parse(&v(&["8", "S"])).unwrap();
        assert_eq!((a.threads, a.size), (8, Size::S));
        assert!(parse(&v(&["0"])).is_none());
        assert!(parse(&v(&["9"])).is_none());
        assert!(parse(&v(&["2", "L"])).is_none());
        assert!(parse(&v(&["2", "S", "x"])).is_none());
    }

    #[test]
    fn mix_matches_splitmix_reference() {
        // SplitMix64 with seed 0: first output is mix(0).
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert!((0.0..1.0).contains(&unit(42)));
    }
}
