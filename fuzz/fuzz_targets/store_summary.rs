//! The destination's chunk-store summary travels in `Accept` and the source
//! believes it: arbitrary bytes must decode to an error or to a summary that
//! re-encodes to the same bytes, and lookups in it must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_transfer::StoreSummary;

fuzz_target!(|data: &[u8]| {
    if let Ok(summary) = StoreSummary::from_bytes(data) {
        assert_eq!(summary.to_bytes(), data);
        assert_eq!(summary.len(), (data.len() - 4) / 8);
        for chunk in data.chunks(32) {
            let mut hash = [0u8; 32];
            hash[..chunk.len()].copy_from_slice(chunk);
            let _ = summary.contains(&hash);
        }
    }
});
