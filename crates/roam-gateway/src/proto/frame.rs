//! Frames: a fixed 12-byte header, then the payload.
//!
//! | bytes | field | rule |
//! |------:|-------|------|
//! | 0..4  | payload length, u32 LE | at most [`MAX_FRAME`], checked before allocating |
//! | 4     | message type | see [`super::ToGateway`], [`super::ToNode`] |
//! | 5..8  | reserved | zero |
//! | 8..12 | CRC-32 (IEEE) of bytes 4..8 and the payload, u32 LE | must match |
//!
//! Why a checksum when TCP has one: TCP's 16-bit sum misses some
//! corruptions, and a flipped bit here would silently change a client's
//! bytes or a stream offset, which nothing downstream checks. Under TLS the
//! record MAC already covers it, so the CRC is redundant there but costs
//! about a microsecond per 64 KiB chunk; one frame format for both is
//! simpler to reason about and to fuzz.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest payload a frame may carry: 1 MiB.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of the header.
pub const FRAME_HEADER: usize = 12;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed.
    #[error("connection error")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection cleanly between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// The length field exceeds [`MAX_FRAME`].
    #[error("frame of {len} bytes exceeds the {max}-byte limit; the peer does not speak this protocol or the stream is corrupt")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The reserved header bytes are not zero.
    #[error("frame header has non-zero reserved bytes {0:02x?}; the peer does not speak this protocol version")]
    Reserved([u8; 3]),
    /// The frame does not match its CRC.
    #[error("frame checksum mismatch (header says {expected:#010x}, computed {computed:#010x}): the stream was corrupted in transit")]
    Checksum {
        /// CRC in the header.
        expected: u32,
        /// CRC of the bytes received.
        computed: u32,
    },
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Payload length (already checked against [`MAX_FRAME`]).
    pub len: usize,
    /// Message type.
    pub kind: u8,
    /// The CRC the header carries.
    pub crc: u32,
}

impl Header {
    /// Parse and check a header: length limit and reserved bytes. Nothing
    /// has been allocated yet when this fails.
    pub fn parse(b: &[u8; FRAME_HEADER]) -> Result<Header, FrameError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if len as usize > MAX_FRAME {
            return Err(FrameError::TooLarge {
                len: len.into(),
                max: MAX_FRAME,
            });
        }
        if b[5..8] != [0, 0, 0] {
            return Err(FrameError::Reserved([b[5], b[6], b[7]]));
        }
        Ok(Header {
            len: len as usize,
            kind: b[4],
            crc: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    /// Check the payload against the header's CRC.
    pub fn check(&self, payload: &[u8]) -> Result<(), FrameError> {
        let computed = crc(self.kind, payload);
        if computed != self.crc {
            return Err(FrameError::Checksum {
                expected: self.crc,
                computed,
            });
        }
        Ok(())
    }
}

fn crc(kind: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind, 0, 0, 0]);
    h.update(payload);
    h.finalize()
}

/// Append one frame (header and payload) to `out`.
///
/// # Panics
/// If `payload` is longer than [`MAX_FRAME`]: the encoders never make
/// such a payload (data is cut at [`super::MAX_DATA`], lists are bounded).
pub fn put_frame(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    assert!(payload.len() <= MAX_FRAME, "frame payload over MAX_FRAME");
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&crc(kind, payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Append one frame whose payload is the concatenation of `parts`, as
/// [`put_frame`] would for the joined payload, without joining them first.
///
/// # Panics
/// If the parts add up to more than [`MAX_FRAME`].
pub fn put_frame_parts(out: &mut Vec<u8>, kind: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    assert!(len <= MAX_FRAME, "frame payload over MAX_FRAME");
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind, 0, 0, 0]);
    for p in parts {
        h.update(p);
    }
    out.reserve(FRAME_HEADER + len);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    out.extend_from_slice(&h.finalize().to_le_bytes());
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// Read one frame: its message type and payload.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; FRAME_HEADER];
    let mut got = 0;
    while got < FRAME_HEADER {
        let n = r.read(&mut head[got..]).await?;
        if n == 0 {
            return Err(if got == 0 {
                FrameError::Closed
            } else {
                FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())
            });
        }
        got += n;
    }
    let h = Header::parse(&head)?;
    let mut payload = vec![0u8; h.len];
    r.read_exact(&mut payload).await?;
    h.check(&payload)?;
    Ok((h.kind, payload))
}

/// Write pre-encoded frames (from [`put_frame`]) and flush.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frames: &[u8]) -> std::io::Result<()> {
    w.write_all(frames).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_frame(&mut v, kind, payload);
        v
    }

    #[tokio::test]
    async fn roundtrip() {
        let v = frame(7, b"hello");
        assert_eq!(v.len(), FRAME_HEADER + 5);
        assert_eq!(
            read_frame(&mut v.as_slice()).await.unwrap(),
            (7, b"hello".to_vec())
        );
    }

    #[test]
    fn parts_make_the_same_frame_as_the_joined_payload() {
        for split in [0, 1, 5, 11] {
            let payload = b"hello, world";
            let mut v = Vec::new();
            put_frame_parts(&mut v, 9, &[&payload[..split], &payload[split..], b""]);
            assert_eq!(v, frame(9, payload), "split at {split}");
        }
    }

    #[tokio::test]
    async fn every_flipped_byte_is_caught() {
        let v = frame(3, b"some payload");
        for i in 4..v.len() {
            let mut bad = v.clone();
            bad[i] ^= 0x10;
            let e = read_frame(&mut bad.as_slice()).await.unwrap_err();
            assert!(
                matches!(e, FrameError::Checksum { .. } | FrameError::Reserved(_)),
                "byte {i}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn oversized_length_is_refused_before_allocating() {
        let mut v = frame(1, b"");
        v[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = read_frame(&mut v.as_slice()).await.unwrap_err();
        assert!(
            matches!(e, FrameError::TooLarge { len, .. } if len == u64::from(u32::MAX)),
            "{e}"
        );
    }

    #[tokio::test]
    async fn clean_close_and_truncation_differ() {
        let empty: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut &*empty).await,
            Err(FrameError::Closed)
        ));
        let v = frame(1, b"abc");
        assert!(matches!(
            read_frame(&mut &v[..v.len() - 1]).await,
            Err(FrameError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &v[..5]).await,
            Err(FrameError::Io(_))
        ));
    }
}
