//! Snapshot formats v2 (default) and v1 for roam: encoding, decoding and validation of
//! architecture-independent checkpoints.
//!
//! A roam checkpoint has to survive a trip from one CPU architecture to
//! another, so nothing in it may depend on the host: every integer is
//! little-endian with a fixed width, memory is kept as wasm sees it, and the
//! call stack is the Asyncify unwind buffer rather than native frames. This
//! crate owns that representation and nothing else; it knows nothing of
//! wasmtime, and treats OS-layer state as opaque bytes.
//!
//! Decoding is written for hostile input: every length is checked against a
//! cap before anything is allocated, and the payload is hashed before it is
//! decompressed. See `docs/snapshot-format.md` for the byte-level layout.
//!
//! ```
//! use roam_snapshot::*;
//! let initial = InitialImage::new(65536, vec![(1024, b"hello".to_vec())]);
//! let mut mem = vec![0u8; 2 * 65536];
//! mem[1024..1029].copy_from_slice(b"hello");
//! mem[70000] = 1;
//! let snap = Snapshot {
//!     module: ModuleRef::by_hash(b"prepared module bytes"),
//!     origin: Origin { isa: "x86_64".into(), roam_version: "0.1.0".into(),
//!                      created_unix_ms: 0, reason: "api".into() },
//!     memory: MemoryImage::capture(&mem, &initial),
//!     globals: vec![GlobalValue { name: "sp".into(), value: GlobalVal::I32(4096) }],
//!     stack: UnwoundStack::default(),
//!     os_state: Vec::new(),
//!     files: None,
//!     threads: Vec::new(),
//! };
//! let bytes = snap.encode(&EncodeOptions::default()).unwrap();
//! let back = Snapshot::decode(&bytes).unwrap();
//! let mut restored = vec![0u8; 2 * 65536];
//! back.memory.restore_into(&mut restored, &initial, false).unwrap();
//! assert_eq!(restored, mem);
//! ```

#![deny(missing_docs)]

mod bytes_serde;
mod decode;
mod encode;
mod file;
mod header;
mod initial;
mod memory;
mod model;
mod pages;
mod payload;
mod stack;
mod summary;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;
mod v2;
mod validate;

pub use decode::DecodeError;
pub use encode::{EncodeError, EncodeOptions, Format};
pub use file::{Opened, ReadFileError, WriteFileError};
pub use header::{peek_header, Header, Version, FLAG_FILES, FLAG_MODULE_EMBEDDED, HEADER_LEN};
pub use initial::InitialImage;
pub use memory::{MemoryImage, PageBuilder, PageKind, RestoreError};
pub use model::{
    FileEntry, FileKind, FileTree, GlobalVal, GlobalValue, ModuleRef, Origin, Snapshot,
    ThreadImage, UnwoundStack, ASYNCIFY_HEADER_LEN, MAX_THREADS,
};
pub use stack::StackError;
pub use summary::{EncodedSizes, Summary};
pub use v2::PageFile;

/// The first 8 bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"ROAMSNAP";
/// Format major version written by default; readers accept it and 1.0
/// (accept N and N-1), and refuse any other.
pub const FORMAT_MAJOR: u16 = 2;
/// Format minor version; readers refuse newer minor versions. 1: the
/// metadata section may end with the program's other threads.
pub const FORMAT_MINOR: u16 = 1;
/// Snapshot page granularity in bytes.
pub const PAGE_SIZE: usize = 4096;
/// The wasm page size; memory sizes are multiples of it.
pub const WASM_PAGE_SIZE: u64 = 65536;

/// Largest linear memory a snapshot may hold: 4 GiB, the wasm32 maximum.
pub const MAX_MEMORY_BYTES: u64 = 1 << 32;
/// Largest combined size of all non-memory sections (metadata, embedded
/// module, OS state, file tree).
pub const MAX_METADATA_BYTES: u64 = 1 << 30;
/// Largest uncompressed payload: both caps plus the section length prefixes.
pub const MAX_PAYLOAD_BYTES: u64 =
    MAX_MEMORY_BYTES + MAX_METADATA_BYTES + payload::SECTION_COUNT as u64 * 8;
/// Largest compressed payload accepted: zstd's worst-case expansion of
/// [`MAX_PAYLOAD_BYTES`] with generous slack.
pub const MAX_COMPRESSED_BYTES: u64 = MAX_PAYLOAD_BYTES + MAX_PAYLOAD_BYTES / 128 + (1 << 20);
