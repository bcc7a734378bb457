//! A human-readable overview of a snapshot, for `roam inspect`.
//!
//! Kept as a plain struct (not just a `Display` impl) so callers can also
//! render it differently, e.g. as JSON, without re-deriving the numbers.

use std::fmt;

use crate::header::{peek_header, Header, Version};
use crate::model::{hex, GlobalVal, GlobalValue, Origin};
use crate::{DecodeError, Snapshot, PAGE_SIZE};

/// On-disk sizes, known only for a snapshot that was encoded or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedSizes {
    /// Bytes after the header (the file is [`crate::HEADER_LEN`] larger).
    pub compressed: u64,
    /// Bytes of the payload after decompression.
    pub uncompressed: u64,
}

/// Everything `roam inspect` shows about a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Format version (of the file, or the current one for an in-memory snapshot).
    pub version: Version,
    /// Module hash, lowercase hex.
    pub module_hash: String,
    /// Size of the embedded module, if embedded.
    pub module_embedded_bytes: Option<u64>,
    /// Where, when and why.
    pub origin: Origin,
    /// Linear memory size in bytes.
    pub memory_bytes: u64,
    /// 4 KiB pages stored verbatim.
    pub stored_pages: usize,
    /// 4 KiB pages elided as zero.
    pub zero_pages: usize,
    /// 4 KiB pages elided as equal to the initial image.
    pub initial_pages: usize,
    /// Globals with their values.
    pub globals: Vec<GlobalValue>,
    /// Bytes of unwound Asyncify stack.
    pub stack_bytes: usize,
    /// Bytes of OS-layer state.
    pub os_state_bytes: usize,
    /// Number of file-tree entries and total file bytes, if files are included.
    pub files: Option<(usize, u64)>,
    /// Compressed and uncompressed payload sizes, when known.
    pub sizes: Option<EncodedSizes>,
}

impl Snapshot {
    /// Summarise this in-memory snapshot (on-disk sizes unknown).
    pub fn summary(&self) -> Summary {
        Summary {
            version: Version::CURRENT,
            module_hash: hex(&self.module.hash),
            module_embedded_bytes: self.module.embedded.as_ref().map(|m| m.len() as u64),
            origin: self.origin.clone(),
            memory_bytes: self.memory.byte_len(),
            stored_pages: self.memory.stored_pages(),
            zero_pages: self.memory.zero_pages(),
            initial_pages: self.memory.initial_pages(),
            globals: self.globals.clone(),
            stack_bytes: self.stack.data.len(),
            os_state_bytes: self.os_state.len(),
            files: self
                .files
                .as_ref()
                .map(|f| (f.entries.len(), f.total_file_bytes())),
            sizes: None,
        }
    }
}

impl Summary {
    /// Add the version and sizes from a file header.
    pub fn with_header(mut self, h: &Header) -> Summary {
        self.version = h.version;
        self.sizes = Some(EncodedSizes {
            compressed: h.compressed_len,
            uncompressed: h.uncompressed_len,
        });
        self
    }

    /// Decode `bytes` and summarise them, including on-disk sizes.
    pub fn of_bytes(bytes: &[u8]) -> Result<Summary, DecodeError> {
        let (snap, header) = Snapshot::decode_with_header(bytes)?;
        debug_assert_eq!(peek_header(bytes).ok(), Some(header));
        Ok(snap.summary().with_header(&header))
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl fmt::Display for GlobalVal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GlobalVal::I32(v) => write!(f, "i32 {v}"),
            GlobalVal::I64(v) => write!(f, "i64 {v}"),
            GlobalVal::F32(b) => write!(f, "f32 {} ({b:#010x})", f32::from_bits(b)),
            GlobalVal::F64(b) => write!(f, "f64 {} ({b:#018x})", f64::from_bits(b)),
            GlobalVal::V128(v) => write!(f, "v128 {v:#034x}"),
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.origin;
        writeln!(f, "format:       roam snapshot v{}", self.version)?;
        let embedded = match self.module_embedded_bytes {
            Some(n) => format!("embedded, {n} bytes"),
            None => "not embedded".to_string(),
        };
        writeln!(f, "module:       blake3 {} ({embedded})", self.module_hash)?;
        writeln!(
            f,
            "origin:       {} (roam {}), reason {:?}",
            o.isa, o.roam_version, o.reason
        )?;
        writeln!(
            f,
            "created:      {} ms since the Unix epoch",
            o.created_unix_ms
        )?;
        writeln!(
            f,
            "memory:       {} bytes ({:.1} MiB)",
            self.memory_bytes,
            mib(self.memory_bytes)
        )?;
        writeln!(
            f,
            "pages (4KiB): {} stored ({:.1} MiB), {} zero, {} initial",
            self.stored_pages,
            mib((self.stored_pages * PAGE_SIZE) as u64),
            self.zero_pages,
            self.initial_pages
        )?;
        writeln!(f, "globals:      {}", self.globals.len())?;
        for g in &self.globals {
            writeln!(f, "  {:<20} {}", g.name, g.value)?;
        }
        writeln!(f, "stack:        {} bytes unwound", self.stack_bytes)?;
        writeln!(f, "os state:     {} bytes", self.os_state_bytes)?;
        match self.files {
            Some((n, bytes)) => {
                writeln!(f, "files:        {n} entries, {bytes} bytes of file data")?
            }
            None => writeln!(f, "files:        not included")?,
        }
        match self.sizes {
            Some(s) => write!(
                f,
                "size:         {} bytes compressed, {} uncompressed ({:.1}%)",
                s.compressed,
                s.uncompressed,
                100.0 * s.compressed as f64 / (s.uncompressed.max(1) as f64)
            ),
            None => write!(f, "size:         not encoded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::sample_snapshot;
    use crate::EncodeOptions;

    #[test]
    fn summary_reports_every_part() {
        let (_, _, snap) = sample_snapshot(4, 30);
        let bytes = snap.encode(&EncodeOptions::default()).unwrap();
        let s = Summary::of_bytes(&bytes).unwrap();
        assert_eq!(s.memory_bytes, 4 * 65536);
        assert_eq!(s.stored_pages + s.zero_pages + s.initial_pages, 64);
        assert_eq!(s.stored_pages, snap.memory.stored_pages());
        assert_eq!(s.files, Some((3, 5)));
        assert_eq!(
            s.sizes.unwrap().compressed as usize,
            bytes.len() - crate::HEADER_LEN
        );
        let text = s.to_string();
        for needle in [
            "v2.0",
            &snap.module.hash_hex(),
            "embedded, ",
            "x86_64",
            "__stack_pointer",
            "i32 65000",
            "i64 -5",
            "f64 1.5",
            "200 bytes unwound",
            "15 bytes",
            "3 entries, 5 bytes",
            "compressed",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert!(snap.summary().to_string().contains("not encoded"));
    }

    #[test]
    fn float_globals_show_bits() {
        assert_eq!(
            GlobalVal::F32(0x7fc0_0001).to_string(),
            "f32 NaN (0x7fc00001)"
        );
        assert_eq!(GlobalVal::V128(1).to_string(), format!("v128 0x{:032x}", 1));
    }
}
