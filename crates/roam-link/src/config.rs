//! What an emulated link does to each direction of a connection.
//!
//! The two directions of a migration link are rarely alike (a snapshot flows
//! one way, acknowledgements the other), so rate, burst and delay are set per
//! direction; [`LinkConfig::symmetric`] covers the common case.

use std::time::Duration;

use crate::rate::Rate;

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the client that connected to the proxy towards the target.
    ClientToServer,
    /// From the target back to the client.
    ServerToClient,
}

impl Direction {
    /// Both directions, client-to-server first.
    pub const BOTH: [Direction; 2] = [Direction::ClientToServer, Direction::ServerToClient];

    pub(crate) fn index(self) -> usize {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }
}

/// Rate, burst and one-way delay of one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectionConfig {
    /// Bandwidth limit.
    pub rate: Rate,
    /// Token-bucket burst in bytes; `None` uses [`Rate::default_burst`].
    pub burst: Option<u64>,
    /// One-way latency: bytes the proxy reads at `t` are written to the
    /// other side no earlier than `t + delay` (plus their serialisation time
    /// at `rate`).
    pub delay: Duration,
}

impl DirectionConfig {
    /// No rate limit and no delay: a plain forwarder.
    pub const TRANSPARENT: DirectionConfig = DirectionConfig {
        rate: Rate::UNLIMITED,
        burst: None,
        delay: Duration::ZERO,
    };

    /// `rate` with the default burst and `delay`.
    pub fn new(rate: Rate, delay: Duration) -> DirectionConfig {
        DirectionConfig {
            rate,
            burst: None,
            delay,
        }
    }
}

impl Default for DirectionConfig {
    fn default() -> Self {
        DirectionConfig::TRANSPARENT
    }
}

/// Configuration of a [`LinkProxy`](crate::LinkProxy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Client to target.
    pub client_to_server: DirectionConfig,
    /// Target to client.
    pub server_to_client: DirectionConfig,
    /// Upper bound, in bytes, of the data held in flight per direction of a
    /// connection (read from one side, not yet written to the other). When
    /// it is full the proxy stops reading, so TCP flow control pushes back
    /// on the sender. `None`: twice the bandwidth-delay product, at least
    /// 256 KiB and at most 64 MiB (8 MiB for an unlimited rate with delay).
    pub max_in_flight: Option<usize>,
}

impl LinkConfig {
    /// The same rate and delay in both directions.
    pub fn symmetric(rate: Rate, delay: Duration) -> LinkConfig {
        let dir = DirectionConfig::new(rate, delay);
        LinkConfig {
            client_to_server: dir,
            server_to_client: dir,
            max_in_flight: None,
        }
    }

    /// A plain forwarder (useful for cuts and corruption alone).
    pub fn transparent() -> LinkConfig {
        LinkConfig::symmetric(Rate::UNLIMITED, Duration::ZERO)
    }

    /// The settings of one direction.
    pub fn direction(&self, dir: Direction) -> &DirectionConfig {
        match dir {
            Direction::ClientToServer => &self.client_to_server,
            Direction::ServerToClient => &self.server_to_client,
        }
    }

    /// The in-flight bound actually used for `dir` (see
    /// [`LinkConfig::max_in_flight`]).
    pub fn in_flight_limit(&self, dir: Direction) -> usize {
        if let Some(limit) = self.max_in_flight {
            return limit.max(1);
        }
        const MIN: u128 = 256 << 10;
        const MAX: u128 = 64 << 20;
        let d = self.direction(dir);
        let bdp = match d.rate.as_bits_per_sec() {
            Some(bits) => u128::from(bits) * d.delay.as_nanos() / 8 / 1_000_000_000,
            None if d.delay.is_zero() => 0,
            None => 4 << 20,
        };
        (2 * bdp).clamp(MIN, MAX) as usize
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig::transparent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_rate;

    #[test]
    fn in_flight_limit_follows_the_bandwidth_delay_product() {
        let ms = Duration::from_millis;
        let c = LinkConfig::symmetric(parse_rate("100mbit").unwrap(), ms(50));
        // 100 Mbit/s * 50 ms = 625 000 bytes; twice that.
        assert_eq!(c.in_flight_limit(Direction::ClientToServer), 1_250_000);
        let c = LinkConfig::symmetric(parse_rate("1mbit").unwrap(), ms(1));
        assert_eq!(c.in_flight_limit(Direction::ServerToClient), 256 << 10);
        let c = LinkConfig::symmetric(parse_rate("100gbit").unwrap(), ms(1000));
        assert_eq!(c.in_flight_limit(Direction::ServerToClient), 64 << 20);
        let c = LinkConfig::symmetric(Rate::UNLIMITED, ms(10));
        assert_eq!(c.in_flight_limit(Direction::ClientToServer), 8 << 20);
        let c = LinkConfig {
            max_in_flight: Some(0),
            ..LinkConfig::transparent()
        };
        assert_eq!(c.in_flight_limit(Direction::ClientToServer), 1);
    }
}
