//! Migration protocol messages come from another node: arbitrary bytes must
//! decode to an error or to a message that re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_wire::Msg;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = Msg::decode(data) {
        let again = Msg::decode(&msg.encode().expect("a decoded message encodes"))
            .expect("a re-encoded message decodes");
        assert_eq!(again, msg);
    }
});
