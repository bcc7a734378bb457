//! Semantic checks shared by encode and decode.
//!
//! A snapshot that decodes structurally can still be nonsense: a stack buffer
//! outside memory, a file path escaping its preopen, an embedded module that
//! is not the one named by the hash. Encode refuses to write such snapshots
//! and decode refuses to return them, so the runtime can trust what it gets.

use std::collections::HashSet;

use crate::model::{FileTree, ModuleRef, Snapshot, UnwoundStack, ASYNCIFY_HEADER_LEN, MAX_THREADS};

/// A failed check: which part of the snapshot, and what is wrong with it.
pub(crate) type Invalid = (&'static str, String);

/// Run every semantic check on `snap`.
pub(crate) fn snapshot(snap: &Snapshot) -> Result<(), Invalid> {
    module(&snap.module)?;
    stack(&snap.stack, snap.memory.byte_len())?;
    let mut names = HashSet::new();
    for g in &snap.globals {
        if !names.insert(g.name.as_str()) {
            return Err(("globals", format!("global {:?} appears twice", g.name)));
        }
    }
    if let Some(files) = &snap.files {
        file_tree(files)?;
    }
    threads(snap)
}

/// The largest thread id wasi-threads gives.
const MAX_TID: u32 = 0x1FFF_FFFF;

/// At most [`MAX_THREADS`] other threads, each with a distinct id from 1
/// to [`MAX_TID`] (as wasi-threads gives them), and a stack inside memory.
fn threads(snap: &Snapshot) -> Result<(), Invalid> {
    if snap.threads.len() > MAX_THREADS {
        return Err((
            "threads",
            format!("{} threads; at most {MAX_THREADS}", snap.threads.len()),
        ));
    }
    let mut ids = HashSet::new();
    for t in &snap.threads {
        if t.tid == 0 || t.tid > MAX_TID || !ids.insert(t.tid) {
            return Err((
                "threads",
                format!("thread id {} is 0, above {MAX_TID:#x} or repeated", t.tid),
            ));
        }
        stack(&t.stack, snap.memory.byte_len())?;
        let mut names = HashSet::new();
        for g in &t.globals {
            if !names.insert(g.name.as_str()) {
                return Err((
                    "threads",
                    format!("global {:?} appears twice in thread {}", g.name, t.tid),
                ));
            }
        }
    }
    Ok(())
}

/// The embedded module, if any, must hash to the recorded hash.
pub(crate) fn module(m: &ModuleRef) -> Result<(), Invalid> {
    if let Some(bytes) = &m.embedded {
        if blake3::hash(bytes).as_bytes() != &m.hash {
            return Err((
                "embedded module",
                "its blake3 hash differs from the module hash".into(),
            ));
        }
    }
    Ok(())
}

/// A non-empty unwind buffer must lie inside memory and hold its data.
/// `capacity == 0` with no data means "no unwound stack".
pub(crate) fn stack(s: &UnwoundStack, memory_len: u64) -> Result<(), Invalid> {
    if s.capacity == 0 && s.data.is_empty() {
        return Ok(());
    }
    let need = s.data.len() as u64 + u64::from(ASYNCIFY_HEADER_LEN);
    if need > u64::from(s.capacity) {
        return Err((
            "unwound stack",
            format!(
                "{} data bytes do not fit a {}-byte buffer with its 8-byte header",
                s.data.len(),
                s.capacity
            ),
        ));
    }
    let end = u64::from(s.buffer_offset) + u64::from(s.capacity);
    if end > memory_len {
        return Err((
            "unwound stack",
            format!(
                "buffer [{}, {end}) lies outside the {memory_len}-byte memory",
                s.buffer_offset
            ),
        ));
    }
    Ok(())
}

/// Paths must be relative, `'/'`-separated, without empty, `.` or `..`
/// components, and unique per preopen.
pub(crate) fn file_tree(t: &FileTree) -> Result<(), Invalid> {
    let mut seen = HashSet::new();
    for e in &t.entries {
        if e.preopen.is_empty() || e.preopen.contains('\0') {
            return Err(("file tree", format!("invalid preopen name {:?}", e.preopen)));
        }
        path(&e.path).map_err(|why| ("file tree", format!("path {:?} {why}", e.path)))?;
        if !seen.insert((e.preopen.as_str(), e.path.as_str())) {
            return Err((
                "file tree",
                format!("{}/{} appears twice", e.preopen, e.path),
            ));
        }
    }
    Ok(())
}

fn path(p: &str) -> Result<(), &'static str> {
    if p.is_empty() {
        return Err("is empty");
    }
    if p.starts_with('/') {
        return Err("is absolute");
    }
    if p.contains('\0') {
        return Err("contains a NUL byte");
    }
    for c in p.split('/') {
        match c {
            "" => return Err("has an empty component"),
            "." | ".." => return Err("has a '.' or '..' component"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FileEntry, FileKind};

    #[test]
    fn paths() {
        for good in ["a", "a/b", "a b/.hidden", "x..y"] {
            assert!(path(good).is_ok(), "{good}");
        }
        for bad in ["", "/a", "a//b", "a/", "../a", "a/../b", "./a", "a\0b"] {
            assert!(path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn duplicate_entries_are_refused() {
        let e = FileEntry {
            preopen: "/d".into(),
            path: "a".into(),
            kind: FileKind::Dir,
            mode: 0,
            mtime_ns: 0,
        };
        let mut other = e.clone();
        other.preopen = "/e".into();
        assert!(file_tree(&FileTree {
            entries: vec![e.clone(), other]
        })
        .is_ok());
        assert!(file_tree(&FileTree {
            entries: vec![e.clone(), e]
        })
        .is_err());
    }

    #[test]
    fn stack_bounds() {
        let s = |buffer_offset, capacity, n| UnwoundStack {
            buffer_offset,
            capacity,
            data: vec![0; n],
        };
        assert!(stack(&UnwoundStack::default(), 0).is_ok());
        assert!(stack(&s(0, 0, 1), 65536).is_err());
        assert!(stack(&s(100, 108, 100), 65536).is_ok());
        assert!(stack(&s(100, 107, 100), 65536).is_err());
        assert!(stack(&s(65536 - 108, 108, 0), 65536).is_ok());
        assert!(stack(&s(65536 - 107, 108, 0), 65536).is_err());
        assert!(stack(&s(u32::MAX, u32::MAX, 0), 1 << 32).is_err());
    }

    #[test]
    fn embedded_module_must_match_hash() {
        let mut m = ModuleRef::embedded(b"abc".to_vec());
        assert!(module(&m).is_ok());
        m.embedded = Some(b"abd".to_vec());
        assert!(module(&m).is_err());
    }
}
