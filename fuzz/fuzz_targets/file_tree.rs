//! The file tree inside a snapshot (or a migration's final message) names
//! paths that a restore creates on the host. Arbitrary bytes must decode to
//! an error or to a tree that snapshot validation either refuses or accepts
//! with only relative, `..`-free, unique paths, and that survives an
//! encode/decode round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roam_snapshot::*;

fuzz_target!(|data: &[u8]| {
    let Ok(tree) = postcard::from_bytes::<FileTree>(data) else {
        return;
    };
    let snap = Snapshot {
        module: ModuleRef::embedded(b"\0asm\x01\0\0\0".to_vec()),
        origin: Origin {
            isa: "fuzz".into(),
            roam_version: "0".into(),
            created_unix_ms: 0,
            reason: "fuzz".into(),
        },
        memory: MemoryImage::empty(),
        globals: vec![],
        stack: UnwoundStack {
            buffer_offset: 0,
            capacity: 0,
            data: vec![],
        },
        os_state: vec![],
        files: Some(tree),
        threads: Vec::new(),
    };
    let Ok(bytes) = snap.encode(&EncodeOptions {
            level: 1,
            ..Default::default()
        }) else {
        return;
    };
    let tree = snap.files.as_ref().expect("files");
    let mut seen = std::collections::HashSet::new();
    for e in &tree.entries {
        assert!(!e.path.starts_with('/'), "absolute path accepted: {:?}", e.path);
        assert!(
            e.path.split('/').all(|c| !matches!(c, "" | "." | "..")),
            "path with an empty, . or .. component accepted: {:?}",
            e.path
        );
        assert!(!e.path.contains('\0') && !e.preopen.contains('\0'));
        assert!(seen.insert((&e.preopen, &e.path)), "duplicate accepted");
    }
    let back = Snapshot::decode(&bytes).expect("an encoded snapshot decodes");
    assert_eq!(back, snap);
});
