//! Migration protocol messages come from another node: arbitrary bytes must
//! decode to an error or to a message that re-encodes to the same value.
//! The memory server's checks of what a decoded far-memory message asks
//! for must answer, never panic, whatever the sizes and indices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_wire::{check_far_request, Msg};

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = Msg::decode(data) {
        let again = Msg::decode(&msg.encode().expect("a decoded message encodes"))
            .expect("a re-encoded message decodes");
        assert_eq!(again, msg);
        let max = data.first().map_or(0, |&b| u32::from(b) << 8);
        match &msg {
            Msg::FarPut(p) | Msg::FarData(p) => {
                if p.check(max).is_ok() {
                    for i in 0..p.pages.len() {
                        assert_eq!(p.page(i).len(), roam_wire::FAR_PAGE);
                    }
                }
            }
            Msg::FarGet { pages } => {
                let _ = check_far_request(pages, max);
            }
            _ => {}
        }
    }
});
