//! Page codecs: how one 4 KiB page (or its XOR delta) is squeezed.
//!
//! Every page is compressed on its own rather than in large segments: a
//! record must be decodable without its neighbours so that batches can be
//! cut anywhere and post-copy requests can be answered one page at a time.
//! Decompression is bounded to exactly one page so a hostile record can never
//! make the destination allocate or write more than 4096 bytes.

use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// A compression algorithm and, for zstd, its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Codec {
    /// Bytes are sent as they are.
    None,
    /// LZ4 block format (`lz4_flex`): fast, modest ratio.
    Lz4,
    /// Zstandard at the given level (1..=19).
    Zstd(u8),
}

impl Codec {
    /// The byte that identifies this codec on the wire (levels are not sent:
    /// the decoder does not need them).
    pub fn wire_id(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd(_) => 2,
        }
    }

    /// Whether the codec's parameters are in range.
    pub fn is_valid(self) -> bool {
        !matches!(self, Codec::Zstd(l) if !(1..=19).contains(&l))
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Codec::None => f.write_str("none"),
            Codec::Lz4 => f.write_str("lz4"),
            Codec::Zstd(l) => write!(f, "zstd-{l}"),
        }
    }
}

/// Why a compressed page could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The codec byte is not one this version knows.
    #[error("unknown codec id {0} (known: 0 none, 1 lz4, 2 zstd)")]
    UnknownCodec(u8),
    /// The data does not expand to exactly one page.
    #[error("{codec} data expands to {got} bytes, a page is exactly 4096")]
    WrongSize {
        /// Codec name.
        codec: &'static str,
        /// Bytes produced (or the stored length for `none`).
        got: usize,
    },
    /// The decompressor rejected the data (corrupt, or larger than a page).
    #[error("{codec} data is corrupt or expands beyond 4096 bytes: {detail}")]
    Corrupt {
        /// Codec name.
        codec: &'static str,
        /// The decompressor's message.
        detail: String,
    },
}

/// Expand `data` (encoded with codec `id`) into `out`, which must end up fully
/// written with exactly one page.
pub fn decompress_page(id: u8, data: &[u8], out: &mut [u8; PAGE_SIZE]) -> Result<(), CodecError> {
    match id {
        0 => {
            if data.len() != PAGE_SIZE {
                return Err(CodecError::WrongSize {
                    codec: "none",
                    got: data.len(),
                });
            }
            out.copy_from_slice(data);
            Ok(())
        }
        1 => {
            let n =
                lz4_flex::block::decompress_into(data, out).map_err(|e| CodecError::Corrupt {
                    codec: "lz4",
                    detail: e.to_string(),
                })?;
            if n != PAGE_SIZE {
                return Err(CodecError::WrongSize {
                    codec: "lz4",
                    got: n,
                });
            }
            Ok(())
        }
        2 => {
            let mut d = zstd::bulk::Decompressor::new().map_err(|e| CodecError::Corrupt {
                codec: "zstd",
                detail: e.to_string(),
            })?;
            let n =
                d.decompress_to_buffer(data, &mut out[..])
                    .map_err(|e| CodecError::Corrupt {
                        codec: "zstd",
                        detail: e.to_string(),
                    })?;
            if n != PAGE_SIZE {
                return Err(CodecError::WrongSize {
                    codec: "zstd",
                    got: n,
                });
            }
            Ok(())
        }
        other => Err(CodecError::UnknownCodec(other)),
    }
}

/// A per-thread compressor that keeps its zstd contexts alive between pages
/// (creating a context per 4 KiB page would cost more than compressing it).
pub struct PageCompressor {
    zstd: Vec<Option<zstd::bulk::Compressor<'static>>>,
    buf: Vec<u8>,
}

impl Default for PageCompressor {
    fn default() -> Self {
        PageCompressor {
            zstd: (0..20).map(|_| None).collect(),
            buf: Vec::with_capacity(2 * PAGE_SIZE),
        }
    }
}

impl PageCompressor {
    /// Compress one page with `codec`. Returns the codec actually used and the
    /// bytes: when compression does not shrink the page it is sent as `None`,
    /// so no record payload ever exceeds a page.
    pub fn compress<'a>(&'a mut self, codec: Codec, page: &'a [u8]) -> (Codec, &'a [u8]) {
        debug_assert_eq!(page.len(), PAGE_SIZE);
        self.buf.clear();
        let ok = match codec {
            Codec::None => false,
            Codec::Lz4 => {
                self.buf
                    .resize(lz4_flex::block::get_maximum_output_size(PAGE_SIZE), 0);
                match lz4_flex::block::compress_into(page, &mut self.buf) {
                    Ok(n) => {
                        self.buf.truncate(n);
                        true
                    }
                    Err(_) => false,
                }
            }
            Codec::Zstd(level) => {
                let level = level.clamp(1, 19);
                let slot = &mut self.zstd[level as usize];
                if slot.is_none() {
                    *slot = zstd::bulk::Compressor::new(i32::from(level)).ok();
                }
                match slot {
                    Some(c) => {
                        self.buf.reserve(zstd::zstd_safe::compress_bound(PAGE_SIZE));
                        c.compress_to_buffer(page, &mut self.buf).is_ok()
                    }
                    None => false,
                }
            }
        };
        if ok && self.buf.len() < PAGE_SIZE {
            (codec, &self.buf)
        } else {
            (Codec::None, page)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..PAGE_SIZE).map(|i| (i / 7 % 13) as u8).collect()
    }

    #[test]
    fn every_codec_roundtrips_and_shrinks_compressible_pages() {
        let page = sample();
        let mut c = PageCompressor::default();
        for codec in [Codec::None, Codec::Lz4, Codec::Zstd(1), Codec::Zstd(19)] {
            let (used, bytes) = c.compress(codec, &page);
            let bytes = bytes.to_vec();
            assert_eq!(used, codec);
            if codec != Codec::None {
                assert!(bytes.len() < PAGE_SIZE / 4, "{codec}: {}", bytes.len());
            }
            let mut out = [0u8; PAGE_SIZE];
            decompress_page(used.wire_id(), &bytes, &mut out).unwrap();
            assert_eq!(&out[..], &page[..]);
        }
    }

    #[test]
    fn incompressible_pages_fall_back_to_none() {
        let mut x = 0x1234_5678_u32;
        let page: Vec<u8> = (0..PAGE_SIZE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let mut c = PageCompressor::default();
        assert_eq!(c.compress(Codec::Zstd(3), &page).0, Codec::None);
        assert_eq!(c.compress(Codec::Lz4, &page).0, Codec::None);
    }

    #[test]
    fn oversize_and_undersize_outputs_are_rejected() {
        let mut c = PageCompressor::default();
        let mut out = [0u8; PAGE_SIZE];
        let big = vec![1u8; 2 * PAGE_SIZE];
        let small = vec![1u8; 100];
        for codec in [Codec::Lz4, Codec::Zstd(3)] {
            let b = lz4_or_zstd(codec, &big);
            let e = decompress_page(codec.wire_id(), &b, &mut out).unwrap_err();
            assert!(matches!(e, CodecError::Corrupt { .. }), "{codec}: {e}");
            let s = lz4_or_zstd(codec, &small);
            let e = decompress_page(codec.wire_id(), &s, &mut out).unwrap_err();
            assert!(
                matches!(e, CodecError::WrongSize { got: 100, .. }),
                "{codec}: {e}"
            );
        }
        let _ = &mut c;
        assert_eq!(
            decompress_page(9, &[], &mut out),
            Err(CodecError::UnknownCodec(9))
        );
        assert!(matches!(
            decompress_page(0, &small, &mut out),
            Err(CodecError::WrongSize { got: 100, .. })
        ));
    }

    fn lz4_or_zstd(codec: Codec, data: &[u8]) -> Vec<u8> {
        match codec {
            Codec::Lz4 => lz4_flex::block::compress(data),
            _ => zstd::bulk::compress(data, 3).unwrap(),
        }
    }
}
