//! A rate-limited [`AsyncWrite`]: the sender side of a slow link.
//!
//! Migration code writes snapshots into a socket; wrapping that socket (or a
//! test sink) in [`Shaped`] makes it behave like a link of a given rate
//! without kernel help, so the same tests run on machines without `tc`.
//! The adaptor accepts a write immediately and then refuses the next one
//! until the link would have carried the previous bytes, which keeps the
//! inner writer's own buffering out of the pacing. It reads tokio's clock,
//! so tests under `#[tokio::test(start_paused = true)]` are deterministic.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

use crate::bucket::TokenBucket;
use crate::rate::Rate;

/// Token-bucket state shared by the adaptors: a bucket plus the tokio
/// instant its clock counts from.
#[derive(Debug)]
pub(crate) struct Pacer {
    bucket: TokenBucket,
    origin: Instant,
}

impl Pacer {
    /// `None` for an unlimited rate; `burst` defaults to
    /// [`Rate::default_burst`].
    pub(crate) fn new(rate: Rate, burst: Option<u64>) -> Option<Pacer> {
        let bits = rate.as_bits_per_sec()?;
        let burst = burst.or(rate.default_burst()).unwrap_or(1);
        let origin = Instant::now();
        Some(Pacer {
            bucket: TokenBucket::new(bits, burst, Duration::ZERO),
            origin,
        })
    }

    /// Largest chunk worth sending at once: the burst.
    pub(crate) fn chunk_limit(&self) -> usize {
        usize::try_from(self.bucket.burst_bytes()).unwrap_or(usize::MAX)
    }

    /// Accounts `bytes` sent now; returns when the link is free again.
    pub(crate) fn spend(&mut self, bytes: usize) -> Instant {
        let now = Instant::now();
        let wait = self.bucket.spend(now - self.origin, bytes as u64);
        now + wait
    }
}

/// An [`AsyncWrite`] that lets bytes through at most at a given [`Rate`],
/// with bursts of up to `burst` bytes.
#[derive(Debug)]
pub struct Shaped<W> {
    inner: W,
    pacer: Option<Pacer>,
    /// Set while the link is still busy with earlier bytes.
    busy: Option<Pin<Box<Sleep>>>,
}

impl<W> Shaped<W> {
    /// Wraps `inner`, limiting it to `rate` with the default burst
    /// ([`Rate::default_burst`]: 5 ms of traffic, at least 3000 bytes).
    pub fn new(inner: W, rate: Rate) -> Shaped<W> {
        Shaped::with_burst(inner, rate, None)
    }

    /// Wraps `inner` with an explicit burst in bytes (`None`: the default).
    pub fn with_burst(inner: W, rate: Rate, burst: Option<u64>) -> Shaped<W> {
        Shaped {
            inner,
            pacer: Pacer::new(rate, burst),
            busy: None,
        }
    }

    /// The wrapped writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The wrapped writer, mutably (writing to it directly bypasses the
    /// rate limit).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Unwraps the writer.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: AsyncWrite + Unpin> Shaped<W> {
    /// Waits until the link has carried everything accepted so far.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(sleep) = self.busy.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            self.busy = None;
        }
        Poll::Ready(())
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Shaped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_idle(cx));
        let Some(pacer) = this.pacer.as_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        let len = buf.len().min(pacer.chunk_limit());
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..len]))?;
        let free_at = pacer.spend(written);
        if free_at > Instant::now() {
            this.busy = Some(Box::pin(tokio::time::sleep_until(free_at)));
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    /// Waits until the last accepted bytes have "left the link", then shuts
    /// the inner writer down, so the peer never sees the end of the stream
    /// before the data could have arrived.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_idle(cx));
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn paces_a_long_transfer_exactly_in_virtual_time() {
        let rate = Rate::bits_per_sec(10_000_000).unwrap();
        let mut out = Shaped::new(Vec::new(), rate);
        let start = Instant::now();
        let data = vec![7u8; 2 << 20];
        out.write_all(&data).await.unwrap();
        out.shutdown().await.unwrap();
        let took = start.elapsed();
        // 2 MiB at 10 Mbit/s is 1.678 s; the initial 6250-byte burst is
        // free, the rest is paced: 1.6727 s, plus under 1 ms because tokio's
        // timer rounds the last sleep up to the millisecond (earlier
        // overshoots are paid back by the bucket, so they do not add up).
        let ms = took.as_millis();
        assert!((1672..=1673).contains(&ms), "{took:?}");
        assert_eq!(out.into_inner(), data);
    }

    #[tokio::test(start_paused = true)]
    async fn respects_an_explicit_burst() {
        let rate = Rate::bits_per_sec(8_000).unwrap(); // 1000 bytes/s
        let mut out = Shaped::with_burst(Vec::new(), rate, Some(100));
        let start = Instant::now();
        // One write call is cut to the burst.
        assert_eq!(out.write(&[0; 500]).await.unwrap(), 100);
        assert_eq!(start.elapsed(), Duration::ZERO);
        out.write_all(&[0; 400]).await.unwrap();
        out.flush().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        out.shutdown().await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_is_a_pass_through() {
        let mut out = Shaped::new(Vec::new(), Rate::UNLIMITED);
        let start = Instant::now();
        out.write_all(&[1; 1 << 20]).await.unwrap();
        out.shutdown().await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(out.get_ref().len(), 1 << 20);
    }
}
