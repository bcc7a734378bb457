//! Shared contract of the Rust workloads (the twin of `workloads/c/common.h`).
//!
//! roam's tests compare a workload's stdout after checkpoint/restore with an
//! uninterrupted run, so every workload must be deterministic, parse the same
//! size class, perform exactly one blocking call half-way through (the
//! checkpoint window) and finish with the same `checksum:` line. The PRNG and
//! the checksum are bit-for-bit the same algorithms as the C header's.

#![deny(missing_docs)]

use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

/// Problem size class selected by `argv[1]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Small: tests (well under a second even under emulation).
    S,
    /// Medium: about 1-3 s natively.
    M,
    /// Large: about 10-15 s natively.
    L,
}

impl Size {
    /// Parses `S`, `M` or `L`.
    pub fn parse(arg: &str) -> Option<Size> {
        match arg {
            "S" => Some(Size::S),
            "M" => Some(Size::M),
            "L" => Some(Size::L),
            _ => None,
        }
    }

    /// Reads the size class from the process arguments; on anything else
    /// prints usage to stderr and exits with status 2.
    pub fn from_args(name: &str) -> Size {
        let arg = std::env::args().nth(1).unwrap_or_default();
        Size::parse(&arg).unwrap_or_else(|| {
            eprintln!(
                "usage: {name} S|M|L\n  S: small (tests), M: medium (~1-3 s), L: large (~10-15 s)"
            );
            std::process::exit(2)
        })
    }

    /// Picks the parameter for this size.
    pub fn pick<T>(self, s: T, m: T, l: T) -> T {
        match self {
            Size::S => s,
            Size::M => m,
            Size::L => l,
        }
    }
}

/// SplitMix64, identical to `wl_rng` in the C header.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * u64::from(n)) >> 32) as u32
    }

    /// Uniform double in `[0, 1)` with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}

/// FNV-1a 64 over little-endian result bytes.
#[derive(Clone, Copy, Debug)]
pub struct Checksum(u64);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }
}

impl Checksum {
    /// Feeds raw bytes.
    pub fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// Feeds a 64-bit value as 8 little-endian bytes.
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    /// Feeds the IEEE bit pattern of a double.
    pub fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }

    /// The hash so far.
    pub fn value(&self) -> u64 {
        self.0
    }
}

/// The blocking-call window: one 1 ms sleep, a single WASI `poll_oneoff`.
pub fn pause() {
    std::thread::sleep(Duration::from_millis(1));
}

/// Collects verification failures and produces the exit status.
#[derive(Debug, Default)]
pub struct Verifier {
    failed: bool,
}

impl Verifier {
    /// Records a failure (`VERIFICATION FAILED: ...` on stderr).
    pub fn fail(&mut self, msg: impl Display) {
        eprintln!("VERIFICATION FAILED: {msg}");
        self.failed = true;
    }

    /// Fails with `msg` unless `ok`.
    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) {
        if !ok {
            self.fail(msg());
        }
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Prints the final `checksum:` line and returns the exit status.
    pub fn finish(self, sum: Checksum) -> ExitCode {
        println!("checksum: {:016x}", sum.value());
        if self.failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_stream() {
        // Published SplitMix64 outputs for seed 0.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn fnv1a_matches_reference_values() {
        let mut c = Checksum::default();
        assert_eq!(c.value(), 0xcbf2_9ce4_8422_2325);
        c.bytes(b"a");
        assert_eq!(c.value(), 0xaf63_dc4c_8601_ec8c);
        let mut d = Checksum::default();
        d.bytes(b"foobar");
        assert_eq!(d.value(), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn below_and_unit_stay_in_range() {
        let mut r = Rng::new(7);
        for _ in 0..10_000 {
            assert!(r.below(13) < 13);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(r.below(1), 0);
    }

    #[test]
    fn size_parsing_accepts_only_s_m_l() {
        assert_eq!(Size::parse("S"), Some(Size::S));
        assert_eq!(Size::parse("L"), Some(Size::L));
        assert_eq!(Size::parse("s"), None);
        assert_eq!(Size::parse("SM"), None);
        assert_eq!(Size::parse(""), None);
        assert_eq!(Size::M.pick(1, 2, 3), 2);
    }

    #[test]
    fn verifier_tracks_failures() {
        let mut v = Verifier::default();
        v.check(true, || "never".into());
        assert!(!v.failed());
        v.check(false, || "expected".into());
        assert!(v.failed());
    }
}
