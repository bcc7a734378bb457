//! A kept checkpoint's body comes from any node that can reach a holder's
//! API: arbitrary bytes must be refused with an error, never panic, never
//! allocate past what the file holds, and leave no file behind but a
//! version that verifies.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temp dir");
    let mut upload = tempfile::tempfile().expect("a temp file");
    upload.write_all(data).expect("the upload is written");
    let stored = roam_node::fuzz_upload(dir.path(), &upload, 1 << 30).is_ok();
    let kept = dir.path().join("kept");
    let names: Vec<String> = match std::fs::read_dir(&kept) {
        Ok(d) => d
            .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".kept")).count(),
        usize::from(stored)
    );
});
