//! Byte sizes as people write and read them (`64MiB`, `1.5 GiB`).
//!
//! Why here: every limit of a node and a cell is a size given on the
//! command line, and every refusal names the size in use and the size
//! allowed; one parser and one formatter keep both consistent.

/// A size that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is not a size: {why}; write a number with an optional unit, \
     e.g. 1048576, 512KiB, 64MiB, 2GiB (KB/MB/GB are powers of 1000)"
)]
pub struct SizeParseError {
    /// What was given.
    pub text: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// Parse `64MiB`, `64M` (both 64 × 2^20), `64MB` (64 × 10^6), `1.5GiB`,
/// `4096`. Units are case-insensitive; a space before the unit is allowed.
pub fn parse_size(text: &str) -> Result<u64, SizeParseError> {
    let err = |why| SizeParseError {
        text: text.to_string(),
        why,
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    if num.is_empty() {
        return Err(err("it does not start with a number"));
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1_000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(err(
                "the unit is not one of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB",
            ))
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| err("it is too large"));
    }
    let f: f64 = num.parse().map_err(|_| err("the number is malformed"))?;
    let bytes = (f * mult as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("it is too large"));
    }
    Ok(bytes as u64)
}

/// `12.3 MiB`, `512 B`, `2.0 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_spellings() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64m").unwrap(), 64 << 20);
        assert_eq!(parse_size("64 MB").unwrap(), 64_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
    }

    #[test]
    fn refuses_with_precise_errors() {
        for (bad, why) in [
            ("", "number"),
            ("MiB", "number"),
            ("12 parsecs", "unit"),
            ("1.2.3MiB", "malformed"),
            ("99999999999TiB", "too large"),
        ] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("64MiB"), "{e}");
        }
    }

    #[test]
    fn formats_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human(12_897_485), "12.3 MiB");
    }
}
