//! Runs CoreMark 1.0 (crates.io `coremark`, a Rust port of EEMBC CoreMark
//! whose CRCs match the C reference) for a fixed number of iterations with
//! the standard performance-run seeds, and prints its report.
//!
//! Usage: `coremark ITERATIONS`. CoreMark itself only reports "Correct
//! operation validated" for runs of at least 10 s (a shorter run counts as an
//! error and ends in "Errors detected"), so this driver checks the CRCs on
//! its own: the seeds must be the known 2K performance run and none of the
//! list, matrix and state CRCs may differ from the known values. It then
//! prints `CRC validation: ok` (exit 0) or `CRC validation: FAILED` (exit 1).
//! The timing lines of the report (ticks, seconds, iterations/sec, the
//! 10-second notice) vary between runs; the CRC lines do not.

fn main() {
    let iterations: u32 = match std::env::args().nth(1).map(|a| a.parse()) {
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!("usage: coremark ITERATIONS   (ITERATIONS >= 1)");
            std::process::exit(2);
        }
    };
    let config = coremark::Config {
        // All-zero seeds select the 2K performance run (seeds 0, 0, 0x66).
        seed1: 0,
        seed2: 0,
        seed3: 0,
        iterations,
        execs: 0,
        size: 0,
    };
    let results = coremark::run(&config);
    let report = results.to_string();
    print!("{report}");
    // known_id 3 is the 2K performance run (seedcrc 0xe9f5); the report has
    // an "[0]ERROR! <name> crc" line for each CRC that differs.
    let crc_ok = results.known_id == 3 && !report.lines().any(|l| l.starts_with("[0]ERROR!"));
    if crc_ok {
        println!("CRC validation: ok");
    } else {
        println!("CRC validation: FAILED");
        eprintln!("VERIFICATION FAILED: CoreMark's CRCs differ from the known values");
        std::process::exit(1);
    }
}
