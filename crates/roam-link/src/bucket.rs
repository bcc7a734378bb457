//! Token-bucket arithmetic, separated from any clock.
//!
//! The bucket is a pure function of "how much time has passed" so that its
//! accuracy can be tested exactly, without sleeping on a loaded machine; the
//! async adaptors feed it tokio's clock. Credit is kept in bit-nanoseconds
//! (one bit sent at one bit per second costs 10^9 of them), which makes the
//! refill `elapsed_ns * rate` exact in integers: no rounding error builds up
//! over a long transfer, whatever the rate.
//!
//! Sending is "pay after": a sender may spend down to a negative balance and
//! must then wait until the balance is back to zero. That models a link's
//! serialisation delay directly: the returned wait is the moment the last
//! bit of the chunk has left the wire.

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A token bucket over an abstract clock (`now` is any monotonic
/// [`Duration`] since an origin the caller chooses).
#[derive(Clone, Debug)]
pub struct TokenBucket {
    /// Bits per second.
    rate: u128,
    /// Capacity in bit-nanoseconds.
    capacity: i128,
    /// Balance in bit-nanoseconds; negative while a sent chunk is still
    /// "on the wire".
    credit: i128,
    /// Clock reading of the last refill.
    last: Duration,
}

impl TokenBucket {
    /// A full bucket refilling at `rate_bits_per_sec` (at least 1) with room
    /// for `burst_bytes` (at least 1), whose clock starts at `now`.
    pub fn new(rate_bits_per_sec: u64, burst_bytes: u64, now: Duration) -> TokenBucket {
        let rate = u128::from(rate_bits_per_sec.max(1));
        let capacity = (u128::from(burst_bytes.max(1)) * 8 * NANOS_PER_SEC) as i128;
        TokenBucket {
            rate,
            capacity,
            credit: capacity,
            last: now,
        }
    }

    /// The burst size in bytes.
    pub fn burst_bytes(&self) -> u64 {
        (self.capacity as u128 / 8 / NANOS_PER_SEC) as u64
    }

    fn refill(&mut self, now: Duration) {
        // A clock that goes backwards (it must not, but be safe) adds nothing.
        let elapsed = now.saturating_sub(self.last).as_nanos();
        self.last = self.last.max(now);
        let gained = elapsed.saturating_mul(self.rate).min(i128::MAX as u128) as i128;
        self.credit = self.credit.saturating_add(gained).min(self.capacity);
    }

    /// Whole bytes that may be sent at `now` without waiting.
    pub fn available(&mut self, now: Duration) -> u64 {
        self.refill(now);
        if self.credit <= 0 {
            0
        } else {
            (self.credit as u128 / 8 / NANOS_PER_SEC) as u64
        }
    }

    /// Records that `bytes` were sent at `now` and returns how long the
    /// sender must wait before sending more: zero while the balance stays
    /// non-negative, otherwise the time the link needs to carry the excess.
    /// Callers keep each chunk at most [`Self::burst_bytes`] long so the
    /// pacing stays smooth, but any size is accounted exactly.
    pub fn spend(&mut self, now: Duration, bytes: u64) -> Duration {
        self.refill(now);
        let cost = (u128::from(bytes) * 8 * NANOS_PER_SEC).min(i128::MAX as u128) as i128;
        self.credit = self.credit.saturating_sub(cost);
        self.wait(now)
    }

    /// How long from `now` until the balance is back to zero (the moment
    /// everything spent so far has been sent).
    pub fn wait(&mut self, now: Duration) -> Duration {
        self.refill(now);
        if self.credit >= 0 {
            return Duration::ZERO;
        }
        let deficit = self.credit.unsigned_abs();
        // Round up: waking a nanosecond late is harmless, early is not.
        let nanos = deficit.div_ceil(self.rate);
        Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn starts_full_and_refills_at_the_rate() {
        // 8 Mbit/s = 1 byte per microsecond, burst 1000 bytes.
        let mut b = TokenBucket::new(8_000_000, 1000, Duration::ZERO);
        assert_eq!(b.available(Duration::ZERO), 1000);
        assert_eq!(b.spend(Duration::ZERO, 1000), Duration::ZERO);
        assert_eq!(b.available(Duration::ZERO), 0);
        assert_eq!(b.available(Duration::from_micros(250)), 250);
        // The bucket never holds more than the burst.
        assert_eq!(b.available(Duration::from_secs(10)), 1000);
    }

    #[test]
    fn overspending_waits_exactly_for_the_excess() {
        let mut b = TokenBucket::new(8_000_000, 1000, Duration::ZERO);
        // 3000 bytes against a 1000-byte balance: 2000 bytes = 2 ms to repay.
        assert_eq!(b.spend(Duration::ZERO, 3000), 2 * MS);
        assert_eq!(b.wait(MS), MS);
        assert_eq!(b.wait(2 * MS), Duration::ZERO);
        assert_eq!(b.available(2 * MS), 0);
    }

    #[test]
    fn long_transfers_are_exact() {
        // 2 MiB at 10 Mbit/s in chunks of the burst, sending each chunk as
        // soon as allowed: the finish time must be (2 MiB - burst) / rate to
        // the nanosecond (rounded up once per wait), with no drift.
        let rate = 10_000_000u64;
        let burst = 6_250u64;
        let total = 2u64 << 20;
        let mut b = TokenBucket::new(rate, burst, Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut sent = 0;
        let mut chunks = 0u64;
        while sent < total {
            let chunk = burst.min(total - sent);
            now += b.spend(now, chunk);
            sent += chunk;
            chunks += 1;
        }
        let ideal_ns = ((total - burst) * 8) as u128 * NANOS_PER_SEC / rate as u128;
        let got_ns = now.as_nanos();
        assert!(got_ns >= ideal_ns, "{got_ns} < {ideal_ns}");
        assert!(
            got_ns <= ideal_ns + chunks as u128,
            "{got_ns} drifted from {ideal_ns}"
        );
        // 1.67 s: the figure the real-time test checks coarsely.
        assert_eq!(now.as_millis(), 1672);
    }

    #[test]
    fn odd_rates_do_not_drift() {
        // 3 bit/s: every byte costs 8/3 s; 300 single bytes take 800 s minus
        // the 1-byte burst.
        let mut b = TokenBucket::new(3, 1, Duration::ZERO);
        let mut now = Duration::ZERO;
        for _ in 0..300 {
            now += b.spend(now, 1);
        }
        let ideal = Duration::from_nanos(299 * 8 * 1_000_000_000 / 3);
        assert!(
            now >= ideal && now - ideal < Duration::from_micros(1),
            "{now:?} vs {ideal:?}"
        );
    }

    #[test]
    fn a_clock_going_backwards_adds_nothing() {
        let mut b = TokenBucket::new(8_000_000, 1000, 10 * MS);
        b.spend(10 * MS, 1000);
        assert_eq!(b.available(5 * MS), 0);
        assert_eq!(b.available(10 * MS + Duration::from_micros(100)), 100);
    }

    #[test]
    fn burst_is_reported_in_bytes() {
        assert_eq!(
            TokenBucket::new(1, 6250, Duration::ZERO).burst_bytes(),
            6250
        );
        assert_eq!(TokenBucket::new(0, 0, Duration::ZERO).burst_bytes(), 1);
    }
}
