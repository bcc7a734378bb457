//! A node's power model and the energy estimate it reports.
//!
//! Why a declared model and not a meter: most machines in an edge fleet
//! have no power sensor roam can read, and those that have one (RAPL on
//! x86 servers) count the whole package, not a program. Popcorn's energy
//! results come from a model of the same shape: a machine draws its idle
//! power while it is up, and a fixed power per busy core on top. The
//! operator declares it per node (`roam node --power
//! idle=50,busy=12,speed=1`); the node multiplies it by the CPU time it
//! measures and reports watts and joules in its heartbeat.
//!
//! `speed` is how much work one core of this node does in a second,
//! relative to the cluster's reference machine (1). A board whose cores
//! draw little but run an eighth as fast is not eight times as frugal: the
//! energy a unit of work costs on a node is `busy / speed`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Largest idle draw a node may declare, watts.
pub const MAX_IDLE_WATTS: f64 = 100_000.0;
/// Largest draw per busy core, watts.
pub const MAX_BUSY_WATTS: f64 = 10_000.0;
/// Most energy a node may report: a century at the largest draws.
pub const MAX_JOULES: f64 = 1e16;
/// Bounds of the relative speed.
pub const MIN_SPEED: f64 = 0.001;
/// Largest relative speed.
pub const MAX_SPEED: f64 = 1_000.0;

/// What a node declares: its draw idle and per busy core, and its speed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerModel {
    /// Draw while up and doing nothing, watts.
    pub idle_watts: f64,
    /// Extra draw per core kept busy, watts.
    pub busy_watts_per_core: f64,
    /// Work per core-second relative to the reference machine.
    pub speed: f64,
}

impl PowerModel {
    /// Joules one unit of work costs here beyond the idle draw: the busy
    /// draw of a core for the time it takes that core (`busy / speed`).
    /// What the energy policies rank nodes by.
    pub fn joules_per_work(&self) -> f64 {
        self.busy_watts_per_core / self.speed
    }

    /// Whether every figure is finite and within bounds.
    pub fn check(&self) -> Result<(), String> {
        let within = |what: &str, v: f64, lo: f64, hi: f64| {
            if v.is_finite() && (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(format!("{what} {v} is not between {lo} and {hi}"))
            }
        };
        within("idle", self.idle_watts, 0.0, MAX_IDLE_WATTS)?;
        within("busy", self.busy_watts_per_core, 0.0, MAX_BUSY_WATTS)?;
        within("speed", self.speed, MIN_SPEED, MAX_SPEED)
    }
}

impl fmt::Display for PowerModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "idle={},busy={},speed={}",
            self.idle_watts, self.busy_watts_per_core, self.speed
        )
    }
}

impl FromStr for PowerModel {
    type Err = String;

    /// `idle=W,busy=W[,speed=X]`, in any order; `speed` defaults to 1.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut idle, mut busy, mut speed) = (None, None, None);
        for part in s.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value (idle=W,busy=W[,speed=X])"))?;
            let value = value.trim().trim_end_matches(['W', 'w']);
            let v: f64 = value
                .parse()
                .map_err(|_| format!("{key}: {value:?} is not a number"))?;
            let slot = match key.trim() {
                "idle" => &mut idle,
                "busy" => &mut busy,
                "speed" => &mut speed,
                other => {
                    return Err(format!(
                        "unknown key {other:?}: the keys are idle, busy and speed"
                    ))
                }
            };
            if slot.replace(v).is_some() {
                return Err(format!("{} is given twice", key.trim()));
            }
        }
        let model = PowerModel {
            idle_watts: idle.ok_or("idle=W is missing (watts while idle)")?,
            busy_watts_per_core: busy.ok_or("busy=W is missing (watts per busy core)")?,
            speed: speed.unwrap_or(1.0),
        };
        model.check()?;
        Ok(model)
    }
}

/// What a node with a power model reports in each heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerReport {
    /// The model it declared.
    pub model: PowerModel,
    /// Estimated draw since its previous report, watts.
    pub watts: f64,
    /// Estimated energy since the node started, joules.
    pub joules: f64,
}

impl PowerReport {
    /// Whether the model and the figures are sane: finite, not negative,
    /// a draw no more than the model allows for `cores` cores, and at most
    /// [`MAX_JOULES`].
    pub fn check(&self, cores: usize) -> Result<(), String> {
        self.model.check()?;
        let most_watts =
            self.model.idle_watts + self.model.busy_watts_per_core * cores.max(1) as f64;
        if !(self.watts.is_finite() && (0.0..=most_watts * 1.01).contains(&self.watts)) {
            return Err(format!(
                "{} W is not between 0 and the model's most for {cores} cores, {most_watts} W",
                self.watts
            ));
        }
        if !(self.joules.is_finite() && (0.0..=MAX_JOULES).contains(&self.joules)) {
            return Err(format!(
                "{} J is not between 0 and {MAX_JOULES}",
                self.joules
            ));
        }
        Ok(())
    }
}

/// Watts for a person: `850 mW`, `12.5 W`, `1.2 kW`.
pub fn watts(w: f64) -> String {
    if w < 1.0 {
        format!("{:.0} mW", w * 1000.0)
    } else if w < 1000.0 {
        format!("{w:.1} W")
    } else {
        format!("{:.2} kW", w / 1000.0)
    }
}

/// Joules for a person: `420 J`, `3.6 kJ`, `1.20 MJ`.
pub fn joules(j: f64) -> String {
    if j < 1000.0 {
        format!("{j:.0} J")
    } else if j < 1e6 {
        format!("{:.1} kJ", j / 1000.0)
    } else {
        format!("{:.2} MJ", j / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_in_any_order_with_a_default_speed() {
        let m: PowerModel = "busy=12,idle=50W".parse().unwrap();
        assert_eq!(
            m,
            PowerModel {
                idle_watts: 50.0,
                busy_watts_per_core: 12.0,
                speed: 1.0
            }
        );
        let b: PowerModel = "idle=2,busy=1.5,speed=0.125".parse().unwrap();
        assert_eq!(b.joules_per_work(), 12.0);
        assert_eq!(b.to_string().parse::<PowerModel>().unwrap(), b);
    }

    #[test]
    fn bad_models_are_refused_with_the_reason() {
        for (text, why) in [
            ("idle=50", "busy=W is missing"),
            ("busy=3", "idle=W is missing"),
            ("idle=50,busy=3,speed=0", "speed 0 is not between"),
            ("idle=-1,busy=3", "idle -1 is not between"),
            ("idle=NaN,busy=3", "idle NaN is not between"),
            ("idle=inf,busy=3", "idle inf is not between"),
            ("idle=1,busy=3,watts=4", "unknown key \"watts\""),
            ("idle=1,idle=2,busy=3", "idle is given twice"),
            ("idle=1;busy=3", "is not a number"),
            ("idle", "is not key=value"),
        ] {
            let err = text.parse::<PowerModel>().unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn reports_beyond_the_model_are_refused() {
        let model: PowerModel = "idle=10,busy=5".parse().unwrap();
        let ok = PowerReport {
            model,
            watts: 20.0,
            joules: 100.0,
        };
        assert!(ok.check(2).is_ok());
        assert!(PowerReport { watts: 21.0, ..ok }.check(2).is_err());
        assert!(PowerReport { joules: 1e17, ..ok }.check(2).is_err());
        assert!(PowerReport { joules: -1.0, ..ok }.check(2).is_err());
        assert!(PowerReport {
            watts: f64::NAN,
            ..ok
        }
        .check(2)
        .is_err());
        let forged = PowerModel {
            speed: 0.0,
            ..model
        };
        assert!(PowerReport {
            model: forged,
            ..ok
        }
        .check(2)
        .is_err());
    }

    #[test]
    fn people_read_units() {
        assert_eq!(watts(0.85), "850 mW");
        assert_eq!(watts(12.54), "12.5 W");
        assert_eq!(watts(1234.0), "1.23 kW");
        assert_eq!(joules(420.2), "420 J");
        assert_eq!(joules(3600.0), "3.6 kJ");
    }
}
