//! The node's energy estimate from its declared power model (`roam node
//! --power`, see [`roam_api::power`]).
//!
//! The model is linear in CPU time, so the energy since the node started
//! is exact for the model whatever the sampling: `idle · uptime + busy ·
//! cpu_seconds`. The CPU time is the node process's own (every cell's
//! thread, migrations, compression, the API), read with `getrusage`: on a
//! machine shared with other programs, theirs is not the node's to count,
//! and several nodes on one machine (as in the tests and benchmarks) each
//! count their own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use roam_api::power::{PowerModel, PowerReport};

/// Reports closer together than this repeat the last draw instead of
/// dividing a few CPU ticks by a few milliseconds.
const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// Turns CPU time into watts and joules by the model.
#[derive(Debug)]
pub struct Meter {
    model: PowerModel,
    /// The cores the node offers: the most the draw counts as busy.
    cores: usize,
    started: Instant,
    cpu_at_start: Duration,
    /// The previous report's time, CPU time and draw.
    last: Mutex<(Instant, Duration, f64)>,
}

impl Meter {
    /// Start counting now, for a node that offers `cores` cores.
    pub fn new(model: PowerModel, cores: usize) -> Meter {
        let now = Instant::now();
        let cpu = process_cpu();
        Meter {
            model,
            cores: cores.max(1),
            started: now,
            cpu_at_start: cpu,
            last: Mutex::new((now, cpu, model.idle_watts)),
        }
    }

    /// The model, the draw since the previous report and the energy since
    /// the node started: what a heartbeat carries. Each report starts the
    /// interval of the next one's draw.
    pub fn report(&self) -> PowerReport {
        self.report_at(Instant::now(), process_cpu(), true)
    }

    /// The same without starting a new interval: for `/metrics`, so that
    /// scrapes do not cut the heartbeats' intervals short.
    pub fn peek(&self) -> PowerReport {
        self.report_at(Instant::now(), process_cpu(), false)
    }

    fn report_at(&self, now: Instant, cpu: Duration, advance: bool) -> PowerReport {
        let m = self.model;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (at, cpu_then, watts_then) = *last;
        let dt = now.saturating_duration_since(at);
        let watts = if dt < MIN_INTERVAL || !advance {
            watts_then
        } else {
            let busy = cpu.saturating_sub(cpu_then).as_secs_f64() / dt.as_secs_f64();
            let w = m.idle_watts + m.busy_watts_per_core * busy.min(self.cores as f64);
            *last = (now, cpu, w);
            w
        };
        let uptime = now.saturating_duration_since(self.started).as_secs_f64();
        let cpu_s = cpu.saturating_sub(self.cpu_at_start).as_secs_f64();
        PowerReport {
            model: m,
            watts,
            joules: m.idle_watts * uptime + m.busy_watts_per_core * cpu_s,
        }
    }
}

/// The machine's online CPUs.
pub(crate) fn online_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// User plus system CPU time of this process, all threads.
fn process_cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `struct rusage` into the pointer it is
    // given and nothing else; the buffer is zeroed and of the right type.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    if r != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised.
    let u = unsafe { u.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> PowerModel {
        "idle=10,busy=5".parse().unwrap()
    }

    #[test]
    fn energy_is_idle_over_uptime_plus_busy_over_cpu_time() {
        let m = Meter::new(model(), 2);
        let t0 = m.started;
        let r = m.report_at(
            t0 + Duration::from_secs(10),
            m.cpu_at_start + Duration::from_secs(4),
            true,
        );
        assert!((r.joules - (10.0 * 10.0 + 5.0 * 4.0)).abs() < 1e-9, "{r:?}");
        // Four CPU seconds in ten: 0.4 of a core busy on average.
        assert!((r.watts - (10.0 + 5.0 * 0.4)).abs() < 1e-9, "{r:?}");
        assert!(r.check(2).is_ok(), "{:?}", r.check(2));
    }

    #[test]
    fn close_reports_repeat_the_last_draw() {
        let m = Meter::new(model(), 2);
        let t0 = m.started;
        let cpu = m.cpu_at_start;
        let first = m.report_at(
            t0 + Duration::from_secs(1),
            cpu + Duration::from_secs(1),
            true,
        );
        let close = m.report_at(
            t0 + Duration::from_millis(1010),
            cpu + Duration::from_millis(1009),
            true,
        );
        assert_eq!(first.watts, close.watts);
        assert!(close.joules > first.joules);
        // A peek (a scrape) leaves the interval to the next report.
        let peek = m.report_at(
            t0 + Duration::from_secs(3),
            cpu + Duration::from_secs(3),
            false,
        );
        assert_eq!(peek.watts, first.watts);
        let next = m.report_at(
            t0 + Duration::from_secs(3),
            cpu + Duration::from_secs(2),
            true,
        );
        // One CPU second in the two since the first report: half a core.
        assert!((next.watts - (10.0 + 5.0 * 0.5)).abs() < 1e-9, "{next:?}");
    }

    #[test]
    fn the_process_cpu_time_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        assert!(process_cpu() > before, "{x}");
    }
}
