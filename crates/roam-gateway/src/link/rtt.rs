//! The round-trip time of a node's path to its gateway, measured with
//! `Ping`/`Pong` on the link itself (protocol 3).
//!
//! Why on the link and not with ICMP or a side connection: a client's
//! request through the gateway crosses exactly this path, in this TCP
//! stream, behind whatever else the link carries. A `Ping` waits in the
//! same queues (the node's send buffer, a shaped or delayed line, the
//! gateway's batch), so what it measures is what a request pays on top of
//! the client's own path to the gateway. That is the signal the planner's
//! follow-the-client policy compares between nodes.
//!
//! Why the median of the last few samples: one sample caught behind a
//! migration's burst or a scheduler hiccup must not move a cell, and a
//! real change of path (a user who moved) must show within a couple of
//! seconds. An average would either lag or jump; the median of
//! [`WINDOW`] samples taken every [`PING_EVERY`] does neither.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often the node pings the gateway.
pub const PING_EVERY: Duration = Duration::from_millis(250);
/// Samples the estimate is the median of.
pub const WINDOW: usize = 5;
/// Pings that may wait for their answer at once; a path slower than
/// `MAX_OUTSTANDING × PING_EVERY` is sampled less often, not queued up.
const MAX_OUTSTANDING: usize = 8;
/// A ping unanswered this long is taken as lost. Its wait still counts:
/// see [`Rtt::waiting`].
const LOST_AFTER: Duration = Duration::from_secs(30);

/// What the node knows of its path to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rtt {
    /// Median of the last [`WINDOW`] round trips.
    pub median: Duration,
    /// Smallest of them.
    pub min: Duration,
    /// Round trips measured since the link started.
    pub samples: u64,
    /// How long the oldest unanswered ping has waited. A path that got
    /// much slower shows here before its answers arrive.
    pub waiting: Duration,
}

impl Rtt {
    /// The estimate to compare paths by: the median, or the oldest
    /// unanswered ping's wait when that is already longer.
    pub fn estimate(&self) -> Duration {
        self.median.max(self.waiting)
    }
}

/// Pings in flight and the last answers.
#[derive(Debug, Default)]
pub(crate) struct Pings {
    next: u64,
    outstanding: VecDeque<(u64, Instant)>,
    samples: VecDeque<Duration>,
    total: u64,
}

impl Pings {
    /// A nonce to send now, or `None` when too many are unanswered.
    pub(crate) fn ping(&mut self, now: Instant) -> Option<u64> {
        while self
            .outstanding
            .front()
            .is_some_and(|(_, at)| now.duration_since(*at) > LOST_AFTER)
        {
            self.outstanding.pop_front();
        }
        if self.outstanding.len() >= MAX_OUTSTANDING {
            return None;
        }
        self.next = self.next.wrapping_add(1);
        self.outstanding.push_back((self.next, now));
        Some(self.next)
    }

    /// The answer to `nonce` arrived: its round trip, if it was ours.
    /// A nonce never sent, or answered already, changes nothing.
    pub(crate) fn pong(&mut self, nonce: u64, now: Instant) -> Option<Duration> {
        let at = self.outstanding.iter().position(|(n, _)| *n == nonce)?;
        let (_, sent) = self.outstanding.remove(at)?;
        // Older pings than this one were lost or overtaken: answers come
        // in order on one stream.
        self.outstanding.drain(..at);
        let rtt = now.duration_since(sent);
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(rtt);
        self.total += 1;
        Some(rtt)
    }

    /// A new session: the pings sent on the old one will not be answered.
    pub(crate) fn reset(&mut self) {
        self.outstanding.clear();
    }

    /// The estimate, once there is a sample.
    pub(crate) fn rtt(&self, now: Instant) -> Option<Rtt> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v: Vec<Duration> = self.samples.iter().copied().collect();
        v.sort_unstable();
        Some(Rtt {
            median: v[v.len() / 2],
            min: v[0],
            samples: self.total,
            waiting: self
                .outstanding
                .front()
                .map_or(Duration::ZERO, |(_, at)| now.duration_since(*at)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_estimate_is_the_median_of_the_last_answers() {
        let mut p = Pings::default();
        let t0 = Instant::now();
        assert_eq!(p.rtt(t0), None);
        // 10, 12, 200 (one spike), 11, 13 ms.
        for (i, d) in [10, 12, 200, 11, 13].into_iter().enumerate() {
            let at = t0 + ms(1000 * i as u64);
            let n = p.ping(at).unwrap();
            assert_eq!(p.pong(n, at + ms(d)), Some(ms(d)));
        }
        let r = p.rtt(t0 + ms(10_000)).unwrap();
        assert_eq!(r.median, ms(12), "one spike does not move it");
        assert_eq!(r.min, ms(10));
        assert_eq!(r.samples, 5);
        assert_eq!(r.waiting, Duration::ZERO);
        // The path gets slow: three answers of 50 ms make the median 50.
        for i in 0..3 {
            let at = t0 + ms(20_000 + 1000 * i);
            let n = p.ping(at).unwrap();
            p.pong(n, at + ms(50));
        }
        assert_eq!(p.rtt(t0 + ms(30_000)).unwrap().median, ms(50));
    }

    #[test]
    fn an_unanswered_ping_raises_the_estimate_and_unknown_nonces_change_nothing() {
        let mut p = Pings::default();
        let t0 = Instant::now();
        let n = p.ping(t0).unwrap();
        p.pong(n, t0 + ms(5));
        assert_eq!(p.pong(n, t0 + ms(6)), None, "answered twice");
        assert_eq!(p.pong(999, t0 + ms(6)), None, "never sent");
        p.ping(t0 + ms(100)).unwrap();
        let r = p.rtt(t0 + ms(400)).unwrap();
        assert_eq!(r.median, ms(5));
        assert_eq!(r.waiting, ms(300));
        assert_eq!(r.estimate(), ms(300));
    }

    #[test]
    fn pings_in_flight_are_bounded_and_forgotten_by_a_new_session() {
        let mut p = Pings::default();
        let t0 = Instant::now();
        for i in 0..MAX_OUTSTANDING {
            assert!(p.ping(t0 + ms(i as u64)).is_some());
        }
        assert_eq!(p.ping(t0 + ms(100)), None);
        // Lost after LOST_AFTER: room again.
        assert!(p.ping(t0 + LOST_AFTER + ms(100)).is_some());
        p.reset();
        assert_eq!(p.rtt(t0).map(|r| r.waiting), None);
        // An answer to a later ping drops the earlier ones (in order).
        let a = p.ping(t0).unwrap();
        let b = p.ping(t0 + ms(1)).unwrap();
        p.pong(b, t0 + ms(3));
        assert_eq!(p.pong(a, t0 + ms(4)), None);
    }
}
