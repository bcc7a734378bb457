//! Link rates and their human spelling.
//!
//! Benchmarks and scripts name link speeds the way `tc` does ("5mbit",
//! "1gbit"), so the emulator accepts the same spelling: one parser for the
//! command line, the test code and the documentation tables. Prefixes are
//! decimal (k = 1000), as in `tc` and in every link-speed datasheet. The
//! `tc` unit "bps" (which means *bytes* per second there) is refused rather
//! than guessed, because a factor of eight in a benchmark is worse than an
//! error message.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

/// A link rate in bits per second, or no limit at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate(Option<NonZeroU64>);

impl Rate {
    /// No rate limit: bytes pass as fast as the host moves them.
    pub const UNLIMITED: Rate = Rate(None);

    /// A limit of `bits` bits per second; `None` when `bits` is zero (a
    /// link that never sends is not a rate).
    pub fn bits_per_sec(bits: u64) -> Option<Rate> {
        NonZeroU64::new(bits).map(|b| Rate(Some(b)))
    }

    /// The limit in bits per second, or `None` when unlimited.
    pub fn as_bits_per_sec(self) -> Option<u64> {
        self.0.map(NonZeroU64::get)
    }

    /// Whether this rate places no limit.
    pub fn is_unlimited(self) -> bool {
        self.0.is_none()
    }

    /// The burst used when the caller does not choose one: 5 ms worth of
    /// bytes at this rate, but never less than two 1500-byte packets, so a
    /// slow link still sends whole frames. `None` when unlimited.
    pub fn default_burst(self) -> Option<u64> {
        self.as_bits_per_sec()
            .map(|bits| (bits / 8 / 200).max(2 * 1500))
    }
}

impl fmt::Display for Rate {
    /// Formats in the largest unit that divides the rate exactly, so
    /// `parse_rate(&rate.to_string()) == Ok(rate)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(bits) = self.as_bits_per_sec() else {
            return f.write_str("unlimited");
        };
        for (unit, scale) in [
            ("gbit", 1_000_000_000),
            ("mbit", 1_000_000),
            ("kbit", 1_000),
        ] {
            if bits % scale == 0 {
                return write!(f, "{}{unit}", bits / scale);
            }
        }
        write!(f, "{bits}bit")
    }
}

/// Why a rate string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateParseError {
    /// Nothing but whitespace.
    #[error("empty rate: expected a number and a unit such as \"10mbit\", or \"unlimited\"")]
    Empty,
    /// No digits before the unit.
    #[error("rate {input:?} has no number: expected e.g. \"10mbit\"")]
    MissingNumber {
        /// The whole input.
        input: String,
    },
    /// The number part is malformed (several dots, a dot with no digits).
    #[error("rate {input:?}: {number:?} is not a decimal number")]
    BadNumber {
        /// The whole input.
        input: String,
        /// The number part.
        number: String,
    },
    /// Digits but no unit: the caller must say bits, kbit, mbit or gbit.
    #[error(
        "rate {input:?} has no unit: write e.g. \"{input}mbit\" (units: bit, kbit, mbit, gbit)"
    )]
    MissingUnit {
        /// The whole input.
        input: String,
    },
    /// A byte-based unit, which `tc` spells like a bit-based one elsewhere.
    #[error(
        "rate {input:?}: unit {unit:?} counts bytes; use bit, kbit, mbit or gbit (8 bits per byte)"
    )]
    ByteUnit {
        /// The whole input.
        input: String,
        /// The unit as written.
        unit: String,
    },
    /// A unit that is not one of bit, kbit, mbit, gbit.
    #[error("rate {input:?}: unknown unit {unit:?} (units: bit, kbit, mbit, gbit)")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit as written.
        unit: String,
    },
    /// The rate is zero, or below one bit per second after scaling.
    #[error("rate {input:?} is below 1 bit/s; a link that never sends has no rate (use \"unlimited\" for no limit)")]
    Zero {
        /// The whole input.
        input: String,
    },
    /// The rate is fractional in bits per second.
    #[error("rate {input:?} is not a whole number of bits per second")]
    FractionalBits {
        /// The whole input.
        input: String,
    },
    /// The rate does not fit in 64 bits.
    #[error("rate {input:?} is too large (limit: 2^64-1 bit/s)")]
    TooLarge {
        /// The whole input.
        input: String,
    },
}

/// Parses a human rate: `unlimited`, or a decimal number followed by `bit`,
/// `kbit`, `mbit` or `gbit` (case-insensitive, optional space, decimal
/// prefixes: `1.5mbit` is 1 500 000 bit/s). `bit/s`-style suffixes such as
/// `mbps` are refused because `tc` reads them as bytes.
pub fn parse_rate(text: &str) -> Result<Rate, RateParseError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(RateParseError::Empty);
    }
    let input = trimmed.to_string();
    let lower = trimmed.to_ascii_lowercase();
    if lower == "unlimited" {
        return Ok(Rate::UNLIMITED);
    }
    let split = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (number, unit) = lower.split_at(split);
    let unit = unit.trim_start();
    if number.is_empty() {
        return Err(RateParseError::MissingNumber { input });
    }
    let scale: u128 = match unit {
        "" => return Err(RateParseError::MissingUnit { input }),
        "bit" => 1,
        "kbit" => 1_000,
        "mbit" => 1_000_000,
        "gbit" => 1_000_000_000,
        "bps" | "kbps" | "mbps" | "gbps" | "b" | "kb" | "mb" | "gb" | "byte" | "kbyte"
        | "mbyte" | "gbyte" => {
            return Err(RateParseError::ByteUnit {
                input,
                unit: unit.to_string(),
            })
        }
        _ => {
            return Err(RateParseError::UnknownUnit {
                input,
                unit: unit.to_string(),
            })
        }
    };
    let bad_number = || RateParseError::BadNumber {
        input: input.clone(),
        number: number.to_string(),
    };
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) if !f.contains('.') && (w, f) != ("", "") => (w, f),
        Some(_) => return Err(bad_number()),
        None => (number, ""),
    };
    // Exact decimal arithmetic: value = digits / 10^frac.len() * scale.
    let too_large = || RateParseError::TooLarge {
        input: input.clone(),
    };
    if whole.len() + frac.len() > 30 {
        return Err(too_large());
    }
    let digits: u128 = format!("{whole}{frac}").parse().map_err(|_| bad_number())?;
    let divisor = 10u128.pow(frac.len() as u32);
    let scaled = digits.checked_mul(scale).ok_or_else(too_large)?;
    if scaled % divisor != 0 {
        return if scaled < divisor {
            Err(RateParseError::Zero { input })
        } else {
            Err(RateParseError::FractionalBits { input })
        };
    }
    let bits = u64::try_from(scaled / divisor).map_err(|_| too_large())?;
    Rate::bits_per_sec(bits).ok_or(RateParseError::Zero { input })
}

impl FromStr for Rate {
    type Err = RateParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_rate(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(s: &str) -> u64 {
        parse_rate(s).unwrap().as_bits_per_sec().unwrap()
    }

    #[test]
    fn parses_the_documented_spellings() {
        assert_eq!(bits("5mbit"), 5_000_000);
        assert_eq!(bits("100Mbit"), 100_000_000);
        assert_eq!(bits("1gbit"), 1_000_000_000);
        assert_eq!(bits("250kbit"), 250_000);
        assert_eq!(bits("  64 bit "), 64);
        assert_eq!(bits("1.5mbit"), 1_500_000);
        assert_eq!(bits(".5kbit"), 500);
        assert_eq!(bits("10.mbit"), 10_000_000);
        assert_eq!(parse_rate("unlimited"), Ok(Rate::UNLIMITED));
        assert_eq!(parse_rate("Unlimited"), Ok(Rate::UNLIMITED));
        assert_eq!(
            "25mbit".parse::<Rate>().unwrap().as_bits_per_sec(),
            Some(25_000_000)
        );
    }

    #[test]
    fn refuses_with_precise_errors() {
        use RateParseError as E;
        let input = |s: &str| s.to_string();
        assert_eq!(parse_rate("  "), Err(E::Empty));
        assert_eq!(
            parse_rate("mbit"),
            Err(E::MissingNumber {
                input: input("mbit")
            })
        );
        assert_eq!(parse_rate("10"), Err(E::MissingUnit { input: input("10") }));
        assert_eq!(
            parse_rate("10mbps"),
            Err(E::ByteUnit {
                input: input("10mbps"),
                unit: input("mbps")
            })
        );
        assert_eq!(
            parse_rate("10furlong"),
            Err(E::UnknownUnit {
                input: input("10furlong"),
                unit: input("furlong")
            })
        );
        assert_eq!(
            parse_rate("1.2.3mbit"),
            Err(E::BadNumber {
                input: input("1.2.3mbit"),
                number: input("1.2.3")
            })
        );
        assert_eq!(
            parse_rate(".mbit"),
            Err(E::BadNumber {
                input: input(".mbit"),
                number: input(".")
            })
        );
        assert_eq!(
            parse_rate("0mbit"),
            Err(E::Zero {
                input: input("0mbit")
            })
        );
        assert_eq!(
            parse_rate("0.1bit"),
            Err(E::Zero {
                input: input("0.1bit")
            })
        );
        assert_eq!(
            parse_rate("1.5bit"),
            Err(E::FractionalBits {
                input: input("1.5bit")
            })
        );
        assert_eq!(
            parse_rate("99999999999gbit"),
            Err(E::TooLarge {
                input: input("99999999999gbit")
            })
        );
        let msg = parse_rate("10").unwrap_err().to_string();
        assert!(msg.contains("\"10mbit\""), "{msg}");
    }

    #[test]
    fn display_round_trips() {
        for s in ["5mbit", "1gbit", "250kbit", "1500kbit", "7bit", "unlimited"] {
            let rate = parse_rate(s).unwrap();
            assert_eq!(rate.to_string(), s);
            assert_eq!(parse_rate(&rate.to_string()), Ok(rate));
        }
    }

    #[test]
    fn default_burst_is_five_ms_but_at_least_two_packets() {
        assert_eq!(parse_rate("1gbit").unwrap().default_burst(), Some(625_000));
        assert_eq!(parse_rate("10mbit").unwrap().default_burst(), Some(6_250));
        assert_eq!(parse_rate("1mbit").unwrap().default_burst(), Some(3_000));
        assert_eq!(Rate::UNLIMITED.default_burst(), None);
    }
}
