//! The round-trip time of a node's path to its gateway, measured with
//! `Ping`/`Pong` on the link itself (protocol 3).
//!
//! Why on the link and not with ICMP or a side connection: a client's
//! request through the gateway crosses exactly this path, in this TCP
//! stream, through the same network path (a shaped or delayed line, the
//! gateway's batches), so what it measures is the part of a request's path
//! that depends on where the cell runs, on top of the client's own path to
//! the gateway. That is the signal the planner's
//! follow-the-client policy compares between nodes.
//!
//! Why the smallest of the last few samples: a ping that waited behind the
//! link's own traffic measures that node's load, not its distance, and the
//! node that serves a busy cell is the one whose link is loaded. Compared
//! by their medians, an idle node would always look nearer than the busy
//! owner, and a cell could move back and forth between two equally near
//! nodes. The minimum of [`WINDOW`] samples taken every [`PING_EVERY`] is
//! the path's floor; it falls with the first fast answer (a user who came
//! near) and rises once every answer of the window is slow (a user who
//! left), about a second later. A path that broke shows at once: see
//! [`Rtt::waiting`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How often the node pings the gateway.
pub const PING_EVERY: Duration = Duration::from_millis(250);
/// Round trips the estimate is the smallest of.
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
    /// The estimate to compare paths by: the smallest recent round trip,
    /// or the oldest unanswered ping's wait when that is already longer.
    pub fn estimate(&self) -> Duration {
        self.min.max(self.waiting)
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

    /// A new session: the pings sent on the old one will not be answered,
    /// and the path (or the gateway behind the address) may have changed.
    pub(crate) fn reset(&mut self) {
        self.outstanding.clear();
        self.samples.clear();
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
    fn the_estimate_is_the_floor_of_the_last_answers() {
        let mut p = Pings::default();
        let t0 = Instant::now();
        assert_eq!(p.rtt(t0), None);
        // A loaded link: 3 ms answers, one of 0.4 ms got through at once.
        for (i, us) in [3_000, 2_800, 400, 3_100, 2_900].into_iter().enumerate() {
            let at = t0 + ms(1000 * i as u64);
            let n = p.ping(at).unwrap();
            let d = Duration::from_micros(us);
            assert_eq!(p.pong(n, at + d), Some(d));
        }
        let r = p.rtt(t0 + ms(10_000)).unwrap();
        assert_eq!(r.min, Duration::from_micros(400));
        assert_eq!(r.median, Duration::from_micros(2_900));
        assert_eq!(
            r.estimate(),
            Duration::from_micros(400),
            "the path, not its load"
        );
        assert_eq!(r.samples, 5);
        assert_eq!(r.waiting, Duration::ZERO);
        // The path gets far: the floor holds while the fast answer is in
        // the window, and rises once the window holds only 50 ms ones.
        let far = |p: &mut Pings, k: u64| {
            let at = t0 + ms(20_000 + 1000 * k);
            let n = p.ping(at).unwrap();
            p.pong(n, at + ms(50));
        };
        far(&mut p, 0);
        far(&mut p, 1);
        assert_eq!(
            p.rtt(t0 + ms(30_000)).unwrap().estimate(),
            Duration::from_micros(400)
        );
        for k in 2..5 {
            far(&mut p, k);
        }
        assert_eq!(p.rtt(t0 + ms(30_000)).unwrap().estimate(), ms(50));
        // And near again with the first fast answer.
        let at = t0 + ms(26_000);
        let n = p.ping(at).unwrap();
        p.pong(n, at + ms(2));
        assert_eq!(p.rtt(t0 + ms(30_000)).unwrap().estimate(), ms(2));
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
        assert_eq!(r.min, ms(5));
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
        let n = p.ping(t0 + LOST_AFTER + ms(101)).unwrap();
        p.pong(n, t0 + LOST_AFTER + ms(105));
        assert!(p.rtt(t0 + LOST_AFTER + ms(105)).is_some());
        // A new session forgets the old path.
        p.reset();
        assert_eq!(p.rtt(t0 + LOST_AFTER + ms(200)), None);
        // An answer to a later ping drops the earlier ones (in order).
        let a = p.ping(t0).unwrap();
        let b = p.ping(t0 + ms(1)).unwrap();
        p.pong(b, t0 + ms(3));
        assert_eq!(p.pong(a, t0 + ms(4)), None);
    }
}
