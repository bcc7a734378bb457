//! `roam prepare` checked against the unprepared module on programs that
//! `wasm-smith` generates from the input (`roam-diff`): the same exit
//! status, or a trap of any kind, and the same memory, uninterrupted, with checkpoints and
//! after a stop and restore, and points never far apart. Under the default
//! capture (exceptions) and under Asyncify.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use roam_prepare::{Capture, PrepareOptions};

fn harness() -> &'static roam_diff::Harness {
    static H: OnceLock<roam_diff::Harness> = OnceLock::new();
    H.get_or_init(|| {
        roam_diff::Harness::new(vec![
            PrepareOptions::default(),
            PrepareOptions {
                capture: Capture::Asyncify,
                ..PrepareOptions::default()
            },
        ])
        .expect("harness")
    })
}

fuzz_target!(|data: &[u8]| {
    if let Err(m) = harness().check(data) {
        panic!("{m}");
    }
});
