//! One direction of a proxied connection: read, pace, delay, write.
//!
//! A real link has two distinct effects: serialisation (a byte cannot leave
//! before the link has carried the bytes before it, which is the rate) and
//! propagation (it arrives a fixed time after it left, which is the delay).
//! The reader half does the first: it reads a chunk, waits until the token
//! bucket says the chunk has left, and stamps it with its arrival time
//! (departure + delay). The writer half does the second: it sleeps until a
//! chunk's stamp and writes it. Chunks keep their order, and since each one
//! is stamped as it departs, the writer never adds gaps of its own: the
//! bandwidth is the configured rate whatever the delay.
//!
//! Memory is bounded by a byte semaphore: the reader takes permits for a
//! chunk before reading it and the writer returns them once it is written.
//! When the bound is reached the reader stops reading and TCP flow control
//! slows the sender, as a full router queue would.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::config::{Direction, DirectionConfig};
use crate::control::Shared;
use crate::shaped::Pacer;

/// Largest chunk read at once; small enough that pacing stays smooth at
/// low rates, large enough to keep system calls cheap at 1 Gbit/s.
const MAX_CHUNK: usize = 16 << 10;

/// What one direction needs besides its two sockets.
pub(crate) struct PipeSpec<'a> {
    pub dir: Direction,
    pub config: DirectionConfig,
    pub in_flight: usize,
    pub corrupt_at: Option<u64>,
    pub shared: &'a Shared,
}

/// Forwards `from` to `to` until `from` ends (then shuts `to` down) or
/// either side fails.
pub(crate) async fn pipe<R, W>(mut from: R, mut to: W, spec: PipeSpec<'_>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut pacer = Pacer::new(spec.config.rate, spec.config.burst);
    let chunk = MAX_CHUNK
        .min(spec.in_flight)
        .min(pacer.as_ref().map_or(usize::MAX, Pacer::chunk_limit))
        .max(1);
    // Permits are u32 in tokio; in_flight is at most 64 MiB unless a caller
    // asks for more, which the semaphore then caps.
    let budget = Semaphore::new(spec.in_flight.min(Semaphore::MAX_PERMITS));
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let delay = spec.config.delay;
    let (dir, shared) = (spec.dir, spec.shared);

    let budget = &budget;
    let reader = async move {
        let mut offset = 0u64;
        let mut corrupt_at = spec.corrupt_at;
        loop {
            let permits = budget
                .acquire_many(chunk as u32)
                .await
                .map_err(|_| io::Error::other("in-flight budget closed"))?;
            let mut buf = vec![0u8; chunk];
            let n = from.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            // Keep permits for the n bytes read; the writer returns them.
            permits.forget();
            budget.add_permits(chunk - n);
            if let Some(at) = corrupt_at {
                if at >= offset && at - offset < n as u64 {
                    buf[(at - offset) as usize] ^= 0xFF;
                    shared.note_corrupted(dir);
                    corrupt_at = None;
                }
            }
            offset += n as u64;
            let departed = match pacer.as_mut() {
                Some(p) => {
                    let free_at = p.spend(n);
                    tokio::time::sleep_until(free_at).await;
                    free_at
                }
                None => Instant::now(),
            };
            if tx.send((departed + delay, buf)).is_err() {
                // The writer stopped, which only happens on its error; that
                // error is what try_join reports.
                break;
            }
        }
        drop(tx);
        Ok::<(), io::Error>(())
    };

    let writer = async {
        while let Some((due, buf)) = rx.recv().await {
            if delay > Duration::ZERO {
                tokio::time::sleep_until(due).await;
            }
            to.write_all(&buf).await?;
            shared.note_forwarded(dir, buf.len());
            budget.add_permits(buf.len());
        }
        to.shutdown().await
    };

    tokio::try_join!(reader, writer).map(|_| ())
}
