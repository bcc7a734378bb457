//! `roam prepare` reads untrusted modules: validation and the `roam`
//! section reader must return errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = roam_prepare::validate(data);
    let _ = roam_prepare::read_section(data);
    let _ = roam_prepare::initial_memory(data);
});
