//! The OS-layer state inside a snapshot is untrusted: arbitrary bytes must
//! decode to an error or to a state that re-encodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_wasi::OsState;

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = OsState::decode(data) {
        let again = OsState::decode(&state.encode()).expect("re-encoded state decodes");
        assert_eq!(again, state);
    }
});
