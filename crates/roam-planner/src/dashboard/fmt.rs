//! Escaping, and numbers for people: the helpers every view uses.
//!
//! Why one escaper: every string the views show may come from a node or
//! the store (a node's version, its addresses, an error a node reported, a
//! migration phase), and none of it is trusted. Every dynamic string goes
//! through [`esc`] before it reaches the page, whether as text or inside a
//! double-quoted attribute.

/// `s`, safe as HTML text and inside a double- or single-quoted attribute.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters have no business on the page.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Bytes for a person: `512 B`, `1.5 MiB`.
pub(crate) fn bytes(b: u64) -> String {
    crate::policy::human(b)
}

/// A duration in milliseconds for a person: `850 µs`, `35 ms`, `1.24 s`,
/// `2 min 5 s`.
pub(crate) fn ms(v: f64) -> String {
    if !v.is_finite() || v < 0.0 {
        return "–".into();
    }
    if v < 1.0 {
        format!("{:.0} µs", v * 1000.0)
    } else if v < 10.0 {
        format!("{v:.1} ms")
    } else if v < 1000.0 {
        format!("{v:.0} ms")
    } else if v < 60_000.0 {
        format!("{:.2} s", v / 1000.0)
    } else {
        let s = (v / 1000.0).round() as u64;
        format!("{} min {} s", s / 60, s % 60)
    }
}

/// How long before `now` Unix ms `then` was: `just now`, `12 s ago`,
/// `3 min ago`, `2 h ago`, `4 days ago`.
pub(crate) fn ago(then: u64, now: u64) -> String {
    if then == 0 {
        return "never".into();
    }
    let s = now.saturating_sub(then) / 1000;
    match s {
        0 => "just now".into(),
        1..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// Unix ms as a UTC date and time, `2025-03-01 14:02:07 UTC`.
pub(crate) fn date(unix_ms: u64) -> String {
    roam_api::human::utc(unix_ms)
}

/// `<time>` with the date as its title and "3 min ago" as its text.
pub(crate) fn when(then: u64, now: u64) -> String {
    if then == 0 {
        return "never".into();
    }
    format!(
        "<time title=\"{}\">{}</time>",
        esc(&date(then)),
        esc(&ago(then, now))
    )
}

/// A rate in bytes per second for a person: `12.5 MiB/s`.
pub(crate) fn rate(bytes_per_s: f64) -> String {
    if !bytes_per_s.is_finite() || bytes_per_s < 0.0 {
        return "–".into();
    }
    format!("{}/s", bytes(bytes_per_s as u64))
}

/// A horizontal bar `frac` full (0 to 1), as inline SVG (no style
/// attribute: the page's CSP allows none).
pub(crate) fn bar(frac: f64, class: &str) -> String {
    let w = (frac.clamp(0.0, 1.0) * 100.0).round();
    format!(
        "<svg class=\"bar\" viewBox=\"0 0 100 8\" preserveAspectRatio=\"none\" \
         aria-hidden=\"true\"><rect class=\"track\" width=\"100\" height=\"8\"/>\
         <rect class=\"{}\" width=\"{w}\" height=\"8\"/></svg>",
        esc(class)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn esc_leaves_no_markup() {
        let s = esc("<script>alert('x')</script>&\"\u{7}");
        assert_eq!(
            s,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\u{fffd}"
        );
    }

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(ms(0.5), "500 µs");
        assert_eq!(ms(3.25), "3.2 ms");
        assert_eq!(ms(35.4), "35 ms");
        assert_eq!(ms(1240.0), "1.24 s");
        assert_eq!(ms(125_000.0), "2 min 5 s");
        assert_eq!(ago(1_000, 1_500), "just now");
        assert_eq!(ago(1_000, 13_000), "12 s ago");
        assert_eq!(ago(0, 13_000), "never");
        assert_eq!(ago(1_000, 1_000 + 3 * 60_000 + 5), "3 min ago");
        assert_eq!(ago(1_000, 1_000 + 7_200_000), "2 h ago");
        assert_eq!(date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(date(1_709_251_327_000), "2024-03-01 00:02:07 UTC");
        assert_eq!(rate(1.5 * 1024.0 * 1024.0), "1.5 MiB/s");
    }
}
