//! A snapshot file opened for a lazy restore (`Snapshot::open_file`, then
//! every chunk read on demand) must agree with a full decode of the same
//! bytes: refused exactly when the decode is refused, and otherwise the
//! same snapshot and the same pages, chunk by chunk. Never a panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use roam_snapshot::{Opened, PageKind, Snapshot};

/// One file per fuzzing process, rewritten for every input.
fn path() -> &'static std::path::Path {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("roam-fuzz-open-{}.roam", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    std::fs::write(path(), data).expect("temporary file");
    let decoded = Snapshot::decode(data);
    let opened = Snapshot::open_file(path());
    let (opened, decoded) = match (opened, decoded) {
        (Ok((o, _)), Ok(d)) => (o, d),
        (Err(_), Err(_)) => return,
        // Chunks are checked when read, so opening lazily may accept what
        // the decode refuses, but then some chunk must fail to read.
        (Ok((Opened::Lazy { pages, .. }, _)), Err(e)) => {
            let mut buf = Vec::new();
            let failed = (0..pages.chunk_count()).any(|i| pages.read_chunk(i, &mut buf).is_err());
            assert!(failed, "opens and reads every chunk, but the decode refuses: {e}");
            return;
        }
        (Ok((Opened::Whole(_), _)), Err(e)) => panic!("opens whole, but the decode refuses: {e}"),
        (Err(e), Ok(_)) => panic!("decodes, but opening refuses: {e}"),
    };
    let (snapshot, pages) = match opened {
        Opened::Whole(s) => {
            assert_eq!(s, decoded);
            return;
        }
        Opened::Lazy { snapshot, pages } => (snapshot, pages),
    };
    assert_eq!(snapshot.globals, decoded.globals);
    assert_eq!(snapshot.stack, decoded.stack);
    assert_eq!(snapshot.os_state, decoded.os_state);
    assert_eq!(pages.kinds(), decoded.memory.page_kinds());
    let mut all = Vec::new();
    let mut buf = Vec::new();
    for i in 0..pages.chunk_count() {
        pages.read_chunk(i, &mut buf).expect("a chunk the decode accepted");
        all.extend_from_slice(&buf);
        for &p in pages.chunk_pages(i) {
            assert_eq!(pages.chunk_of(p), Some(i));
            assert_eq!(pages.kinds()[p as usize], PageKind::Data);
        }
    }
    assert_eq!(all, decoded.memory.stored_data());
});
