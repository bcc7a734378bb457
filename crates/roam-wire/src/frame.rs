//! Length-prefixed, checksummed frames.
//!
//! A frame's length is checked against [`MAX_FRAME`] before any buffer is
//! allocated, so a hostile or corrupt peer cannot make a node allocate more
//! than that per frame. The CRC catches corruption on the path (a flipped
//! byte must never turn into a silently wrong page of program memory; the
//! pages themselves are also hashed end to end by the transfer pipeline).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest payload a frame may carry: 16 MiB.
pub const MAX_FRAME: usize = 16 << 20;

/// Bytes before each payload: length and CRC.
pub const FRAME_HEADER: usize = 8;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection cleanly between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// The length field exceeds [`MAX_FRAME`].
    #[error("frame of {len} bytes exceeds the {max}-byte limit; the peer is not a roam node of this protocol version or the stream is corrupt")]
    TooLarge {
        /// Announced length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The payload does not match its CRC.
    #[error("frame checksum mismatch (expected {expected:#010x}, computed {computed:#010x}): the stream was corrupted in transit")]
    Checksum {
        /// CRC in the header.
        expected: u32,
        /// CRC of the bytes received.
        computed: u32,
    },
    /// The payload is not a valid message.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Read one frame's payload.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Vec<u8>, FrameError> {
    let mut header = [0u8; FRAME_HEADER];
    let mut got = 0;
    while got < FRAME_HEADER {
        let n = r.read(&mut header[got..]).await?;
        if n == 0 {
            return Err(if got == 0 {
                FrameError::Closed
            } else {
                FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())
            });
        }
        got += n;
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let expected = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len as usize > MAX_FRAME {
        return Err(FrameError::TooLarge {
            len: len.into(),
            max: MAX_FRAME,
        });
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload).await?;
    let computed = crc32fast::hash(&payload);
    if computed != expected {
        return Err(FrameError::Checksum { expected, computed });
    }
    Ok(payload)
}

/// Write one frame. Returns the bytes written, header included.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    payload: &[u8],
) -> Result<usize, FrameError> {
    if payload.len() > MAX_FRAME {
        return Err(FrameError::TooLarge {
            len: payload.len() as u64,
            max: MAX_FRAME,
        });
    }
    let mut header = [0u8; FRAME_HEADER];
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    w.write_all(&header).await?;
    w.write_all(payload).await?;
    Ok(FRAME_HEADER + payload.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn roundtrip(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        let mut buf = Vec::new();
        write_frame(&mut buf, payload).await?;
        read_frame(&mut buf.as_slice()).await
    }

    #[tokio::test]
    async fn frames_roundtrip() {
        assert_eq!(roundtrip(b"hello").await.unwrap(), b"hello");
        assert_eq!(roundtrip(b"").await.unwrap(), b"");
    }

    #[tokio::test]
    async fn flipped_byte_is_a_checksum_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"some payload").await.unwrap();
        for i in FRAME_HEADER..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            let err = read_frame(&mut bad.as_slice()).await.unwrap_err();
            assert!(matches!(err, FrameError::Checksum { .. }), "{err}");
        }
    }

    #[tokio::test]
    async fn oversized_length_is_refused_before_allocating() {
        let mut buf = vec![0u8; FRAME_HEADER];
        buf[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = read_frame(&mut buf.as_slice()).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { .. }), "{err}");
    }

    #[tokio::test]
    async fn truncation_and_clean_close_are_told_apart() {
        let empty: &[u8] = &[];
        assert!(matches!(
            read_frame(&mut &*empty).await.unwrap_err(),
            FrameError::Closed
        ));
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abcdef").await.unwrap();
        buf.truncate(buf.len() - 2);
        assert!(matches!(
            read_frame(&mut buf.as_slice()).await.unwrap_err(),
            FrameError::Io(_)
        ));
    }
}
