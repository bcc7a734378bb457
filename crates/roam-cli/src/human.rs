//! Sizes, durations and times as the commands show them to people, in one
//! place so that every table and message writes them alike. Byte sizes are
//! `roam-node`'s formatter, the one its refusals use, so that a limit reads
//! the same in an error and in `roam cells`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `512 B`, `12.3 MiB`, `2.0 GiB`.
pub use roam_node::size::human as bytes;

/// A measured time: milliseconds below ten seconds (`812.4 ms`), else
/// seconds (`42.0 s`).
pub fn duration(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// A configured time in seconds: `5 s`, `2.5 s`.
pub fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// How long ago a time in milliseconds since the Unix epoch was: `4 s
/// ago`, `3 min ago`, `2 h ago`, `5 days ago`.
pub fn ago(ms: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ago_from(now, ms)
}

fn ago_from(now_ms: u64, ms: u64) -> String {
    format!("{} ago", span(now_ms.saturating_sub(ms) / 1000))
}

/// Whole seconds in the unit that suits them, rounded down: `4 s`, `3
/// min`, `2 h`, `5 days`.
fn span(s: u64) -> String {
    match s {
        0..=89 => format!("{s} s"),
        90..=5399 => format!("{} min", s / 60),
        5400..=129_599 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// A time in milliseconds since the Unix epoch, in UTC:
/// `2026-12-01 02:00:00 UTC`.
pub use roam_api::human::utc;

/// How far ahead a time in milliseconds is from `now_ms`: `in 40 s`, `in
/// 55 min`, `in 3 h`, `in 2 days`.
pub fn in_words(ms: u64, now_ms: u64) -> String {
    format!("in {}", span(ms.saturating_sub(now_ms) / 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_the_unit_that_suits_them() {
        assert_eq!(duration(Duration::from_micros(812_400)), "812.4 ms");
        assert_eq!(duration(Duration::from_secs(42)), "42.0 s");
        assert_eq!(secs(Duration::from_secs(5)), "5 s");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5 s");
    }

    #[test]
    fn ages_round_down_to_their_unit() {
        let now = 1_000_000_000;
        assert_eq!(ago_from(now, now - 4_000), "4 s ago");
        assert_eq!(ago_from(now, now + 4_000), "0 s ago");
        assert_eq!(ago_from(now, now - 200_000), "3 min ago");
        assert_eq!(ago_from(now, now - 7_200_000), "2 h ago");
        assert_eq!(ago_from(now, now - 5 * 86_400_000), "5 days ago");
    }

    #[test]
    fn times_read_in_utc_and_ahead() {
        assert_eq!(utc(1_796_090_400_000), "2026-12-01 02:00:00 UTC");
        assert_eq!(in_words(1_000_000 + 40_000, 1_000_000), "in 40 s");
        assert_eq!(in_words(1_000_000 + 3_300_000, 1_000_000), "in 55 min");
        assert_eq!(in_words(0, 1_000_000), "in 0 s");
    }

    #[test]
    fn sizes_are_roam_nodes() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 19), "1.5 MiB");
    }
}
