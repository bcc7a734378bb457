//! The control API's request bodies come from any client that can reach it:
//! arbitrary bytes must be refused or parsed into the request types, and
//! the strings the node then interprets (mode, bandwidth) must parse to an
//! error or a value, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_node::types::{LaunchRequest, MigrateRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<MigrateRequest>(data) {
        let _ = roam_wire::Mode::parse(&req.mode);
        if let Some(b) = &req.transfer.bandwidth {
            let _ = roam_link::parse_rate(b);
        }
        let again = serde_json::to_vec(&req).expect("a parsed request serialises");
        serde_json::from_slice::<MigrateRequest>(&again).expect("and parses again");
    }
    if let Ok(req) = serde_json::from_slice::<LaunchRequest>(data) {
        let again = serde_json::to_vec(&req).expect("a parsed request serialises");
        serde_json::from_slice::<LaunchRequest>(&again).expect("and parses again");
    }
    // Rates also come from the command line and link configurations.
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = roam_link::parse_rate(text);
    }
});
