//! Identifiers and clocks every layer of the node uses.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh random id: `prefix` and 12 hex digits.
pub(crate) fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("the OS random source works");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}{hex}")
}
