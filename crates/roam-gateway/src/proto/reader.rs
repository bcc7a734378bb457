//! Reading frames in batches: one `read` brings as many frames as the
//! socket has, and the caller handles every whole frame in the buffer
//! before reading again (the gateway applies them all under one lock).
//!
//! Why not [`super::read_frame`] in a loop: it allocates every payload and
//! copies it out of a buffered reader, and its caller cannot tell whether
//! more frames are already there. Here payloads are checked and handed out
//! in place; a frame larger than the buffer grows it, never past
//! [`MAX_FRAME`] plus the header, so the limits and checks of
//! [`Header::parse`] and [`Header::check`] hold as before.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::frame::{FrameError, Header, FRAME_HEADER, MAX_FRAME};

/// A frame reader with its own buffer.
pub struct FrameReader<R> {
    rd: R,
    buf: Vec<u8>,
    /// Unread bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// The capacity it keeps between large frames.
    base: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader over `rd` with a buffer of `capacity` bytes (at least one
    /// header).
    pub fn new(rd: R, capacity: usize) -> FrameReader<R> {
        let base = capacity.max(FRAME_HEADER);
        FrameReader {
            rd,
            buf: vec![0; base],
            start: 0,
            end: 0,
            base,
        }
    }

    /// The next whole frame already in the buffer, if any: its message
    /// type and payload (checked). A header over the limit, non-zero
    /// reserved bytes or a checksum mismatch is an error.
    pub fn next_buffered(&mut self) -> Result<Option<(u8, &[u8])>, FrameError> {
        let have = self.end - self.start;
        if have < FRAME_HEADER {
            return Ok(None);
        }
        let head: &[u8; FRAME_HEADER] = self.buf[self.start..self.start + FRAME_HEADER]
            .try_into()
            .expect("a header's length");
        let h = Header::parse(head)?;
        if have < FRAME_HEADER + h.len {
            return Ok(None);
        }
        let at = self.start + FRAME_HEADER;
        self.start = at + h.len;
        let payload = &self.buf[at..at + h.len];
        h.check(payload)?;
        Ok(Some((h.kind, payload)))
    }

    /// Wait for more bytes: at least one more byte is in the buffer when
    /// this returns `Ok`. [`FrameError::Closed`] if the peer closed between
    /// frames, an I/O error if it closed inside one.
    pub async fn fill(&mut self) -> Result<(), FrameError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > self.base {
                self.buf.truncate(self.base);
                self.buf.shrink_to(self.base);
            }
        }
        // Room for the whole of the frame in progress: its header says how
        // long it is (already checked against the limit).
        let have = self.end - self.start;
        let need = if have >= FRAME_HEADER {
            let head: &[u8; FRAME_HEADER] = self.buf[self.start..self.start + FRAME_HEADER]
                .try_into()
                .expect("a header's length");
            FRAME_HEADER + Header::parse(head)?.len
        } else {
            FRAME_HEADER
        };
        debug_assert!(need <= FRAME_HEADER + MAX_FRAME);
        if self.buf.len() - self.start < need || self.end == self.buf.len() {
            // Move the partial frame to the front, then grow if it still
            // does not fit (or the buffer is full of frames not taken yet).
            self.buf.copy_within(self.start..self.end, 0);
            self.end = have;
            self.start = 0;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            } else if self.end == self.buf.len() {
                self.buf.resize(self.end + self.base, 0);
            }
        }
        let n = self.rd.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Err(if self.start == self.end {
                FrameError::Closed
            } else {
                FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())
            });
        }
        self.end += n;
        Ok(())
    }

    /// The next frame, waiting for it if needed, as an owned payload.
    pub async fn read(&mut self) -> Result<(u8, Vec<u8>), FrameError> {
        loop {
            if let Some((kind, p)) = self.next_buffered()? {
                return Ok((kind, p.to_vec()));
            }
            self.fill().await?;
        }
    }
}
