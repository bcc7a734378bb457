//! Times as people read them, shared by the command line and the planner's
//! dashboard so that both write a date the same way.

/// Unix ms as a UTC date and time, `2026-12-01 02:00:00 UTC`.
pub fn utc(unix_ms: u64) -> String {
    let secs = i64::try_from(unix_ms / 1000).unwrap_or(i64::MAX);
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{secs} s after 1970 (out of range)"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_utc() {
        assert_eq!(super::utc(1_796_090_400_000), "2026-12-01 02:00:00 UTC");
        assert_eq!(super::utc(0), "1970-01-01 00:00:00 UTC");
        assert!(super::utc(u64::MAX).ends_with("(out of range)"));
    }
}
