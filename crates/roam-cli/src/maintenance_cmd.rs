//! `roam maintenance NODE`: declare when a node goes down for work, so
//! that the planner live-migrates its cells away beforehand and puts the
//! node back in service afterwards (`docs/control-plane.md`,
//! "Maintenance"); or cancel it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use roam_api::planner::{Maintenance, MaintenanceRequest};

use crate::auth_args::ClientAuthArgs;
use crate::human::{in_words, utc};
use crate::node_args::PlannerArg;
use crate::runtime;

/// `roam maintenance`.
#[derive(Args, Debug)]
pub struct MaintenanceArgs {
    /// The node.
    pub node: String,
    /// When the work begins, RFC 3339 (`2026-12-01T02:00:00Z`).
    #[arg(long, value_name = "TIME", conflicts_with_all = ["start_in", "cancel"])]
    pub at: Option<String>,
    /// When the work begins, from now (`90s`, `10m`, `2h`, `1d`).
    #[arg(long = "in", value_name = "DURATION", value_parser = duration, conflicts_with = "cancel")]
    pub start_in: Option<Duration>,
    /// How long the work lasts.
    #[arg(long = "for", value_name = "DURATION", value_parser = duration, default_value = "1h")]
    pub lasts: Duration,
    /// How long before the work the planner starts moving the node's cells
    /// away.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "5m")]
    pub lead: Duration,
    /// Cancel the node's window (a node the planner drained for it takes
    /// cells again).
    #[arg(long)]
    pub cancel: bool,
    #[command(flatten)]
    pub planner: PlannerArg,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
}

/// `90s`, `10m`, `1h30m`, `2d`: whole numbers, each with its unit.
pub fn duration(s: &str) -> Result<Duration, String> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => {
                return Err(format!(
                    "{s:?}: units are s, m, h and d (e.g. 90s, 10m, 1h30m)"
                ))
            }
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("{s:?}: a number must come before each unit"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("{s:?} is too long"))?;
    }
    if !digits.is_empty() || s.is_empty() {
        return Err(format!(
            "{s:?}: every number needs a unit (e.g. 90s, 10m, 1h30m)"
        ));
    }
    Ok(Duration::from_secs(total))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Unix ms of an RFC 3339 time.
fn parse_at(at: &str) -> Result<u64> {
    let t = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .with_context(|| {
            format!("--at {at:?}: expected an RFC 3339 time, e.g. 2026-12-01T02:00:00Z")
        })?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(ms).with_context(|| format!("--at {at:?} is before 1970"))
}

/// What a window means, for people.
pub fn describe(m: &Maintenance, now: u64) -> String {
    let drain = m.start_ms.saturating_sub(m.lead_ms);
    let when = if now < drain {
        format!("drains from {} ({})", utc(drain), in_words(drain, now))
    } else if now < m.start_ms {
        "draining now".to_string()
    } else {
        "under maintenance now".to_string()
    };
    format!(
        "maintenance from {} to {}; {when}",
        utc(m.start_ms),
        utc(m.end_ms)
    )
}

/// `roam maintenance`.
pub fn maintenance(a: MaintenanceArgs) -> Result<i32> {
    let p = crate::cluster_cmd::planner(&a.planner, &a.auth, "roam maintenance")?;
    runtime()?.block_on(async move {
        if a.cancel {
            let node = p.cancel_maintenance(&a.node).await?;
            println!(
                "{}: no maintenance window; the node is {}",
                node.name,
                crate::cluster_cmd::state_name(node.state)
            );
            return Ok(0);
        }
        let now = now_ms();
        let ms = |what: &str, d: Duration| {
            u64::try_from(d.as_millis()).with_context(|| format!("{what} is too long"))
        };
        let start_ms = match (&a.at, a.start_in) {
            (Some(at), _) => parse_at(at)?,
            (None, Some(d)) => now.saturating_add(ms("--in", d)?),
            (None, None) => bail!("say when the work begins: --at TIME or --in DURATION"),
        };
        let req = MaintenanceRequest {
            start_ms,
            end_ms: start_ms.saturating_add(ms("--for", a.lasts)?),
            lead_ms: ms("--lead", a.lead)?,
        };
        let node = p.declare_maintenance(&a.node, &req).await?;
        let m = node
            .maintenance
            .context("the planner did not keep the window")?;
        println!("{}: {}", node.name, describe(&m, now));
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_sums() {
        assert_eq!(duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(duration("2d").unwrap(), Duration::from_secs(172_800));
        for bad in ["", "10", "m", "5x", "1.5h", "99999999999999999999d"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn times_are_rfc_3339() {
        assert_eq!(parse_at("1970-01-01T00:01:00Z").unwrap(), 60_000);
        assert_eq!(
            parse_at("2026-12-01T03:00:00+01:00").unwrap(),
            1_796_090_400_000
        );
        assert!(parse_at("tomorrow").is_err());
        assert!(parse_at("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn a_window_reads_as_what_happens_next() {
        let m = Maintenance {
            start_ms: 1_796_090_400_000,
            end_ms: 1_796_094_000_000,
            lead_ms: 300_000,
            drained: false,
        };
        let before = describe(&m, m.start_ms - 3_600_000);
        assert_eq!(
            before,
            "maintenance from 2026-12-01 02:00:00 UTC to 2026-12-01 03:00:00 UTC; \
             drains from 2026-12-01 01:55:00 UTC (in 55 min)"
        );
        assert!(describe(&m, m.start_ms - 60_000).ends_with("draining now"));
        assert!(describe(&m, m.start_ms).ends_with("under maintenance now"));
    }
}
