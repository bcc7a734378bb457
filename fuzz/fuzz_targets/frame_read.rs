//! A migration peer controls every byte of the stream, and how it is cut
//! into reads. The frame reader must return frames or an error, never
//! panic or allocate past `MAX_FRAME`, and every frame must decode to an
//! error or a message that re-encodes to the same value.
#![no_main]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use roam_wire::{read_frame, FrameError, Msg, MAX_FRAME};
use tokio::io::{AsyncRead, ReadBuf};

/// A stream that hands out its bytes in pieces whose sizes the fuzzer picks.
struct Pieces<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    next: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let size = match self.sizes.get(self.next % self.sizes.len().max(1)) {
            Some(&s) => usize::from(s) + 1,
            None => usize::MAX,
        };
        self.next += 1;
        let n = size.min(self.data.len()).min(buf.remaining());
        let (head, tail) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = tail;
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&cut, rest)) = input.split_first() else {
        return;
    };
    let (sizes, data) = rest.split_at((usize::from(cut) % 8).min(rest.len()));
    let mut stream = Pieces {
        data,
        sizes,
        next: 0,
    };
    let mut cx = Context::from_waker(Waker::noop());
    // At most one frame per 8 bytes of input can be read; bound the loop.
    for _ in 0..=data.len() / 8 {
        // The stream is always ready, so one poll finishes the read.
        let fut = std::pin::pin!(read_frame(&mut stream));
        let Poll::Ready(frame) = fut.poll(&mut cx) else {
            panic!("a read from a ready stream did not finish in one poll");
        };
        match frame {
            Ok(payload) => {
                assert!(payload.len() <= MAX_FRAME);
                if let Ok(msg) = Msg::decode(&payload) {
                    if let Msg::Hello(h) = &msg {
                        let _ = h.check();
                    }
                    let again = Msg::decode(&msg.encode().expect("a decoded message encodes"))
                        .expect("a re-encoded message decodes");
                    assert_eq!(again, msg);
                }
            }
            Err(FrameError::Closed) => break,
            Err(_) => break,
        }
    }
});
