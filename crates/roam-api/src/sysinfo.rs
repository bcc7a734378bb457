//! What a node reports about its machine: cores, memory, load.
//!
//! Read from `/proc` because that is what the planner needs and nothing
//! more; a dependency for three numbers is not worth it.

use serde::{Deserialize, Serialize};

/// The machine a node runs on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Machine {
    /// Online CPUs.
    pub cores: usize,
    /// Total memory, bytes.
    pub memory_total: u64,
    /// Memory available for new work, bytes (`MemAvailable`).
    pub memory_available: u64,
    /// One-minute load average.
    pub load1: f64,
}

impl Machine {
    /// Read it now.
    pub fn read() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            meminfo
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0.0);
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_total: field("MemTotal:"),
            memory_available: field("MemAvailable:"),
            load1,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_plausible_numbers() {
        let m = super::Machine::read();
        assert!(m.cores >= 1);
        assert!(m.memory_total >= m.memory_available && m.memory_total > 0);
    }
}
