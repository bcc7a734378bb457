//! Arbitrary bytes must decode to an error or a valid snapshot, never panic
//! or allocate beyond the format's caps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_snapshot::{peek_header, Snapshot};

fuzz_target!(|data: &[u8]| {
    let _ = peek_header(data);
    if let Ok(snap) = Snapshot::decode(data) {
        // Anything that decodes must re-encode and decode to the same value.
        let bytes = snap
            .encode(&Default::default())
            .expect("decoded snapshot re-encodes");
        assert_eq!(
            Snapshot::decode(&bytes).expect("re-encoded snapshot decodes"),
            snap
        );
        let _ = snap.summary().to_string();
    }
});
