//! The data a snapshot carries, as plain Rust values.
//!
//! These types are the contract between the runtime (which fills them in at a
//! checkpoint and consumes them at a restore) and the on-disk format (which
//! only encodes them). They hold no pointers, host sizes or ISA details, which
//! is what lets a snapshot taken on one architecture restore on another.

use serde::{Deserialize, Serialize};

use crate::memory::MemoryImage;

/// A complete checkpoint of one running prepared module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Which prepared module this snapshot belongs to.
    pub module: ModuleRef,
    /// Where, when and why the snapshot was taken.
    pub origin: Origin,
    /// The linear memory, page-classified.
    pub memory: MemoryImage,
    /// Values of the module's exported mutable globals.
    pub globals: Vec<GlobalValue>,
    /// The Asyncify unwind buffer holding the call stack.
    pub stack: UnwoundStack,
    /// OS-layer state, encoded by the OS-layer crate (opaque here).
    pub os_state: Vec<u8>,
    /// Contents of the preopened directories, present with `--with-files`.
    pub files: Option<FileTree>,
    /// The program's other threads (wasi-threads), each with its own
    /// globals and stack over the one memory above; empty for a program
    /// of one thread. `globals` and `stack` above are the first thread's.
    /// Written as format 2.1; a snapshot without threads stays 2.0.
    pub threads: Vec<ThreadImage>,
}

/// One thread of a threaded program, besides the first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadImage {
    /// The id `thread-spawn` gave it, which the program may have stored.
    pub tid: u32,
    /// The argument its `wasi_thread_start` was called with.
    pub start_arg: u32,
    /// Its instance's exported mutable globals (its stack pointer and
    /// TLS base among them).
    pub globals: Vec<GlobalValue>,
    /// Its unwound stack: records, as for the first thread.
    pub stack: UnwoundStack,
}

/// Most threads a snapshot may hold besides the first.
pub const MAX_THREADS: usize = 1024;

/// Identifies the prepared module a snapshot was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleRef {
    /// blake3 of the prepared module bytes.
    pub hash: [u8; 32],
    /// The prepared module bytes themselves, when embedding was requested.
    /// When present, `blake3(embedded) == hash` is checked on encode and decode.
    pub embedded: Option<Vec<u8>>,
}

impl ModuleRef {
    /// A reference to `module_bytes` by hash only.
    pub fn by_hash(module_bytes: &[u8]) -> Self {
        ModuleRef {
            hash: *blake3::hash(module_bytes).as_bytes(),
            embedded: None,
        }
    }

    /// A reference to `module_bytes` that also embeds them.
    pub fn embedded(module_bytes: Vec<u8>) -> Self {
        ModuleRef {
            hash: *blake3::hash(&module_bytes).as_bytes(),
            embedded: Some(module_bytes),
        }
    }

    /// The hash as lowercase hex (64 characters).
    pub fn hash_hex(&self) -> String {
        hex(&self.hash)
    }
}

/// Where, when and why a snapshot was taken (informational only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The host ISA, e.g. `"x86_64"`, `"aarch64"`, `"riscv64"`.
    pub isa: String,
    /// Version of roam that took the snapshot.
    pub roam_version: String,
    /// Wall-clock time of the checkpoint, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Why the checkpoint was taken: `"signal"`, `"timer"`, `"api"`, ...
    pub reason: String,
}

/// The value of one wasm global. Floats are stored as raw bits so NaN payloads
/// survive the trip bit-exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GlobalVal {
    /// An `i32` global.
    I32(i32),
    /// An `i64` global.
    I64(i64),
    /// An `f32` global, as its IEEE-754 bits.
    F32(u32),
    /// An `f64` global, as its IEEE-754 bits.
    F64(u64),
    /// A `v128` global.
    V128(u128),
}

/// One mutable global, identified by its export name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalValue {
    /// The global's export name in the prepared module.
    pub name: String,
    /// Its value at the checkpoint.
    pub value: GlobalVal,
}

/// The Asyncify unwind buffer: `data` are the bytes the unwind wrote after the
/// 8-byte header at `buffer_offset` (i.e. `[buffer_offset+8, current)`).
/// `capacity` is the buffer size in bytes including the header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwoundStack {
    /// Offset of the Asyncify data header in linear memory.
    pub buffer_offset: u32,
    /// Size of the buffer in bytes, including the 8-byte header.
    pub capacity: u32,
    /// The unwound stack bytes.
    #[serde(with = "crate::bytes_serde")]
    pub data: Vec<u8>,
}

/// Size of the Asyncify data header (`current` and `end` pointers, 2 x u32).
pub const ASYNCIFY_HEADER_LEN: u32 = 8;

/// Contents of the guest-visible preopened directories.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileTree {
    /// All entries; directories are listed before their contents.
    pub entries: Vec<FileEntry>,
}

impl FileTree {
    /// Total bytes of regular-file contents.
    pub fn total_file_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match &e.kind {
                FileKind::File { data } => data.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

/// One file, directory or symlink under a preopen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Guest path of the preopen, e.g. `"/data"`.
    pub preopen: String,
    /// Path relative to the preopen: `'/'`-separated, no `".."`, no leading `'/'`.
    pub path: String,
    /// What the entry is, with its contents.
    pub kind: FileKind,
    /// Unix permission bits.
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
}

/// The kind and content of a [`FileEntry`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    /// A regular file and its bytes.
    File {
        /// The file's contents.
        #[serde(with = "crate::bytes_serde")]
        data: Vec<u8>,
    },
    /// A directory.
    Dir,
    /// A symbolic link and its target, verbatim.
    Symlink {
        /// The link target as stored in the link.
        target: String,
    },
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_ref_hashes_with_blake3() {
        let m = ModuleRef::embedded(b"\0asm\x01\0\0\0".to_vec());
        assert_eq!(m.hash, *blake3::hash(b"\0asm\x01\0\0\0").as_bytes());
        assert_eq!(m.hash_hex().len(), 64);
        assert_eq!(ModuleRef::by_hash(b"\0asm\x01\0\0\0").hash, m.hash);
        assert_eq!(hex(&[0x00, 0xab, 0x10]), "00ab10");
    }

    #[test]
    fn total_file_bytes_counts_only_files() {
        let e = |kind| FileEntry {
            preopen: "/d".into(),
            path: "x".into(),
            kind,
            mode: 0o644,
            mtime_ns: 0,
        };
        let t = FileTree {
            entries: vec![
                e(FileKind::Dir),
                e(FileKind::File { data: vec![1; 10] }),
                e(FileKind::Symlink {
                    target: "abcdef".into(),
                }),
                e(FileKind::File { data: vec![2; 5] }),
            ],
        };
        assert_eq!(t.total_file_bytes(), 15);
    }
}
