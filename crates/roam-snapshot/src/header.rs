//! The fixed 80-byte file header.
//!
//! The header is what lets a reader decide, before decompressing or allocating
//! anything, whether it understands a file (magic, version), how much it will
//! have to allocate (declared lengths, checked against caps) and whether the
//! bytes are intact (header checksum, payload hash).

use crate::decode::DecodeError;
use crate::{FORMAT_MAJOR, FORMAT_MINOR, MAGIC, MAX_COMPRESSED_BYTES, MAX_PAYLOAD_BYTES};

/// Total header length in bytes.
pub const HEADER_LEN: usize = 80;

/// Flag bit: the prepared module is embedded in the payload.
pub const FLAG_MODULE_EMBEDDED: u32 = 1 << 0;
/// Flag bit: the payload contains a file tree.
pub const FLAG_FILES: u32 = 1 << 1;
/// All flag bits this version defines; any other bit is refused.
pub const KNOWN_FLAGS: u32 = FLAG_MODULE_EMBEDDED | FLAG_FILES;

/// A format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Incompatible changes bump this.
    pub major: u16,
    /// Backward-compatible additions bump this.
    pub minor: u16,
}

impl Version {
    /// The version this build writes by default, and the newest it reads.
    pub const CURRENT: Version = Version {
        major: FORMAT_MAJOR,
        minor: FORMAT_MINOR,
    };
    /// Format 2.0: chunked memory, restorable by mapping. Written for a
    /// program of one thread.
    pub const V2: Version = Version {
        major: FORMAT_MAJOR,
        minor: 0,
    };
    /// Format 2.1: 2.0, and the metadata section may end with the
    /// program's other threads. Written only for a threaded program.
    pub const V2_1: Version = Version::CURRENT;
    /// Format 1.0: one zstd stream. Still read (accept N and N-1), and
    /// written on request.
    pub const V1: Version = Version { major: 1, minor: 0 };

    /// Whether this build reads files of version `self`: the current major
    /// up to its minor, and the previous major's 1.0.
    pub fn is_readable(self) -> bool {
        (self.major == FORMAT_MAJOR && self.minor.cmp(&FORMAT_MINOR).is_le()) || self == Version::V1
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The decoded fixed header of a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Format version of the file.
    pub version: Version,
    /// Flag bits (`FLAG_*`).
    pub flags: u32,
    /// Length of the zstd-compressed payload following the header.
    pub compressed_len: u64,
    /// Length of the payload after decompression.
    pub uncompressed_len: u64,
    /// blake3 of the compressed payload.
    pub payload_hash: [u8; 32],
}

impl Header {
    /// Serialize to the 80-byte on-disk form, including the header checksum.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version.major.to_le_bytes());
        b[10..12].copy_from_slice(&self.version.minor.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.compressed_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.uncompressed_len.to_le_bytes());
        b[32..64].copy_from_slice(&self.payload_hash);
        let check = header_check(&b[..64]);
        b[64..80].copy_from_slice(&check);
        b
    }
}

/// First 16 bytes of blake3 over the first 64 header bytes.
fn header_check(bytes: &[u8]) -> [u8; 16] {
    let h = blake3::hash(bytes);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.as_bytes()[..16]);
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Parse and validate the fixed header at the start of `bytes`, without
/// touching the payload. Checks, in order: magic, version, header length,
/// header checksum, flags, and the declared lengths against the caps.
pub fn peek_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let magic_len = bytes.len().min(8);
    if bytes[..magic_len] != MAGIC[..magic_len] {
        let mut found = [0u8; 8];
        found[..magic_len].copy_from_slice(&bytes[..magic_len]);
        return Err(DecodeError::BadMagic { found });
    }
    if bytes.len() < 12 {
        return Err(DecodeError::truncated("header", HEADER_LEN, bytes.len()));
    }
    // The version comes before the checksum: a future major version may lay
    // out the rest of the header differently.
    let found = Version {
        major: u16_at(bytes, 8),
        minor: u16_at(bytes, 10),
    };
    if !found.is_readable() {
        return Err(DecodeError::UnsupportedVersion {
            found,
            supported: Version::CURRENT,
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::truncated("header", HEADER_LEN, bytes.len()));
    }
    // Under cargo-fuzz checksums are not enforced, so mutations reach the
    // decoder proper instead of all stopping here.
    if !cfg!(fuzzing) && header_check(&bytes[..64])[..] != bytes[64..80] {
        return Err(DecodeError::ChecksumMismatch { what: "header" });
    }
    let header = Header {
        version: found,
        flags: u32_at(bytes, 12),
        compressed_len: u64_at(bytes, 16),
        uncompressed_len: u64_at(bytes, 24),
        payload_hash: bytes[32..64].try_into().expect("32 bytes"),
    };
    if header.flags & !KNOWN_FLAGS != 0 {
        return Err(DecodeError::Malformed {
            what: "header flags",
            detail: format!("unknown flag bits {:#x}", header.flags & !KNOWN_FLAGS),
        });
    }
    if header.uncompressed_len > MAX_PAYLOAD_BYTES {
        return Err(DecodeError::TooLarge {
            what: "uncompressed payload",
            len: header.uncompressed_len,
            max: MAX_PAYLOAD_BYTES,
        });
    }
    if header.compressed_len > MAX_COMPRESSED_BYTES {
        return Err(DecodeError::TooLarge {
            what: "compressed payload",
            len: header.compressed_len,
            max: MAX_COMPRESSED_BYTES,
        });
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            version: Version::V2,
            flags: FLAG_FILES,
            compressed_len: 1234,
            uncompressed_len: 99_999,
            payload_hash: [0x5a; 32],
        }
    }

    #[test]
    fn layout_is_little_endian_at_fixed_offsets() {
        let b = sample().to_bytes();
        assert_eq!(&b[..8], b"ROAMSNAP");
        assert_eq!(&b[8..12], &[2, 0, 0, 0]);
        assert_eq!(&b[12..16], &[2, 0, 0, 0]);
        assert_eq!(&b[16..24], &1234u64.to_le_bytes());
        assert_eq!(&b[24..32], &99_999u64.to_le_bytes());
        assert_eq!(&b[32..64], &[0x5a; 32]);
        assert_eq!(&b[64..80], &blake3::hash(&b[..64]).as_bytes()[..16]);
        assert_eq!(peek_header(&b).unwrap(), sample());
    }

    #[test]
    fn refuses_bad_magic_and_short_input() {
        let b = sample().to_bytes();
        assert!(matches!(
            peek_header(b"ROAMSNAX"),
            Err(DecodeError::BadMagic { .. })
        ));
        assert!(matches!(
            peek_header(b"\x7fELF"),
            Err(DecodeError::BadMagic { .. })
        ));
        for n in 0..HEADER_LEN {
            assert!(
                matches!(
                    peek_header(&b[..n]),
                    Err(DecodeError::Truncated { what: "header", .. })
                ),
                "prefix {n}"
            );
        }
    }

    #[test]
    fn version_is_checked_before_checksum() {
        let mut b = sample().to_bytes();
        b[8] = 3;
        let e = peek_header(&b).unwrap_err();
        assert_eq!(
            e,
            DecodeError::UnsupportedVersion {
                found: Version { major: 3, minor: 0 },
                supported: Version::CURRENT
            }
        );
        assert!(e.to_string().contains("3.0") && e.to_string().contains("2.1"));
        for (major, minor) in [(2, 2), (1, 1), (0, 0)] {
            let mut b = sample().to_bytes();
            b[8] = major;
            b[10] = minor;
            assert!(
                matches!(peek_header(&b), Err(DecodeError::UnsupportedVersion { .. })),
                "{major}.{minor}"
            );
        }
        // The previous major is still read: its checksum is what fails here.
        let mut b = sample().to_bytes();
        b[8] = 1;
        assert_eq!(
            peek_header(&b),
            Err(DecodeError::ChecksumMismatch { what: "header" })
        );
    }

    #[test]
    fn refuses_any_flipped_header_bit() {
        let good = sample().to_bytes();
        for byte in 12..HEADER_LEN {
            let mut b = good;
            b[byte] ^= 0x01;
            assert_eq!(
                peek_header(&b),
                Err(DecodeError::ChecksumMismatch { what: "header" }),
                "byte {byte}"
            );
        }
    }

    #[test]
    fn refuses_unknown_flags_and_oversized_lengths() {
        let mut h = sample();
        h.flags = 1 << 7;
        assert!(matches!(
            peek_header(&h.to_bytes()),
            Err(DecodeError::Malformed { .. })
        ));
        let mut h = sample();
        h.uncompressed_len = MAX_PAYLOAD_BYTES + 1;
        assert!(matches!(
            peek_header(&h.to_bytes()),
            Err(DecodeError::TooLarge {
                what: "uncompressed payload",
                ..
            })
        ));
        let mut h = sample();
        h.compressed_len = u64::MAX;
        assert!(matches!(
            peek_header(&h.to_bytes()),
            Err(DecodeError::TooLarge {
                what: "compressed payload",
                ..
            })
        ));
    }
}
