//! Bounded reading of the payload's length-prefixed sections.
//!
//! Separated from the rest of decoding because this is where untrusted
//! lengths meet allocation: every length is checked against a cap and the
//! remaining declared payload before any byte is read, and buffers grow only
//! with data actually decompressed.

use std::io::{self, Read};

use super::DecodeError;

/// Reads length-prefixed sections from the decompressed stream, never past
/// the declared uncompressed length.
pub(crate) struct Sections<'a> {
    dec: zstd::stream::read::Decoder<'static, &'a [u8]>,
    remaining: u64,
}

impl<'a> Sections<'a> {
    pub(crate) fn new(payload: &'a [u8], uncompressed_len: u64) -> Result<Self, DecodeError> {
        let dec = zstd::stream::read::Decoder::with_buffer(payload)
            .map_err(|e| DecodeError::malformed("compressed payload", e.to_string()))?;
        Ok(Sections {
            dec,
            remaining: uncompressed_len,
        })
    }

    /// Read one section of at most `max` bytes.
    pub(crate) fn section(&mut self, what: &'static str, max: u64) -> Result<Vec<u8>, DecodeError> {
        let mut len = [0u8; 8];
        self.read_exact(what, &mut len)?;
        let len = u64::from_le_bytes(len);
        if len > max {
            return Err(DecodeError::TooLarge { what, len, max });
        }
        if len > self.remaining {
            return Err(DecodeError::malformed(
                what,
                format!(
                    "{len} bytes declared, only {} left in the payload",
                    self.remaining
                ),
            ));
        }
        // Start small and let the buffer grow with real data (realloc of large
        // buffers is a page remap, not a copy, on common allocators).
        let mut out = Vec::with_capacity(len.min(1 << 20) as usize);
        (&mut self.dec)
            .take(len)
            .read_to_end(&mut out)
            .map_err(|e| stream_error(what, e))?;
        if (out.len() as u64) < len {
            return Err(ended_early(what, len, out.len() as u64));
        }
        self.remaining -= len;
        Ok(out)
    }

    fn read_exact(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), DecodeError> {
        if (buf.len() as u64) > self.remaining {
            return Err(DecodeError::malformed(
                what,
                "length prefix lies past the declared uncompressed length",
            ));
        }
        self.dec.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => ended_early(what, buf.len() as u64, 0),
            _ => stream_error(what, e),
        })?;
        self.remaining -= buf.len() as u64;
        Ok(())
    }

    /// Check that the declared length and the stream both end here.
    pub(crate) fn finish(mut self) -> Result<(), DecodeError> {
        if self.remaining != 0 {
            return Err(DecodeError::malformed(
                "payload",
                format!("{} declared bytes follow the last section", self.remaining),
            ));
        }
        let mut probe = [0u8; 1];
        match self.dec.read(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(DecodeError::malformed(
                "payload",
                "decompresses to more bytes than the header declares",
            )),
            Err(e) => Err(stream_error("payload", e)),
        }
    }
}

fn ended_early(what: &'static str, expected: u64, got: u64) -> DecodeError {
    DecodeError::malformed(
        what,
        format!("decompressed data ends after {got} of {expected} bytes"),
    )
}

fn stream_error(what: &'static str, e: io::Error) -> DecodeError {
    DecodeError::malformed(what, format!("zstd: {e}"))
}
