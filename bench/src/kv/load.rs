//! Client load for the KV benchmarks: a dataset of known values, a probe
//! that measures the longest gap between replies, reader threads that count
//! throughput over time, and redis-benchmark run back to back.
//!
//! Why our own client next to redis-benchmark: redis-benchmark reports
//! averages per test, not *when* replies stopped, and it does not check
//! values. The probe issues `INCR` back to back on one connection and
//! requires every reply to be the previous one plus one, so a lost or
//! duplicated request is seen, and the longest silence between two replies
//! is the downtime a client saw. The readers `GET` random dataset keys and
//! compare every value.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roam_testkit::resp::benchmark::{redis_benchmark, BenchRun};
use roam_testkit::resp::{Client, Reply};

/// Resolution of the throughput timeline.
pub const BUCKET: Duration = Duration::from_millis(100);
const MAX_BUCKETS: usize = 10 * 3600;
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Dataset key `i`.
pub fn key(i: u64) -> Vec<u8> {
    format!("data:{i:09}").into_bytes()
}

/// Dataset value `i`, `len` bytes: a line of words with 8 pseudo-random
/// bytes in every 32, so it compresses like real records (not like zeros).
pub fn value(i: u64, len: usize) -> Vec<u8> {
    const WORDS: [&[u8]; 8] = [
        b"name", b"user", b"edge", b"cell", b"item", b"time", b"zone", b"node",
    ];
    let mut s = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if out.len() % 32 == 0 {
            out.extend_from_slice(&s.to_le_bytes());
        } else {
            out.extend_from_slice(WORDS[(s % 8) as usize]);
            out.push(b' ');
        }
    }
    out.truncate(len);
    out
}

/// SET every dataset key, pipelined in batches.
pub fn load_dataset(addr: std::net::SocketAddr, keys: u64, len: usize) -> anyhow::Result<()> {
    let mut c = Client::connect(addr, IO_TIMEOUT)?;
    let batch = 256u64;
    let mut i = 0;
    while i < keys {
        let n = batch.min(keys - i);
        let reqs: Vec<Vec<Vec<u8>>> = (i..i + n)
            .map(|k| vec![b"SET".to_vec(), key(k), value(k, len)])
            .collect();
        for (j, r) in c.pipeline(&reqs)?.into_iter().enumerate() {
            if r != Reply::ok() {
                bail!(
                    "SET {} answered {r:?}",
                    String::from_utf8_lossy(&key(i + j as u64))
                );
            }
        }
        i += n;
    }
    Ok(())
}

/// GET every dataset key; the number that are missing or wrong.
pub fn verify_dataset(addr: std::net::SocketAddr, keys: u64, len: usize) -> anyhow::Result<u64> {
    let mut c = Client::connect(addr, IO_TIMEOUT)?;
    let mut bad = 0;
    let mut i = 0;
    while i < keys {
        let n = 256u64.min(keys - i);
        let reqs: Vec<Vec<Vec<u8>>> = (i..i + n).map(|k| vec![b"GET".to_vec(), key(k)]).collect();
        for (j, r) in c.pipeline(&reqs)?.into_iter().enumerate() {
            if r != Reply::Bulk(Some(value(i + j as u64, len))) {
                bad += 1;
            }
        }
        i += n;
    }
    Ok(bad)
}

/// Replies per [`BUCKET`] since the load started.
pub struct Timeline {
    start: Instant,
    buckets: Vec<AtomicU64>,
}

impl Timeline {
    fn new(start: Instant) -> Timeline {
        Timeline {
            start,
            buckets: (0..MAX_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn tick(&self, at: Instant) {
        let k = (at.duration_since(self.start).as_millis() / BUCKET.as_millis()) as usize;
        if let Some(b) = self.buckets.get(k) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Seconds since the load started.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Average replies per second between `t0` and `t1` (seconds since start).
    pub fn rate(&self, t0: f64, t1: f64) -> f64 {
        let b = BUCKET.as_secs_f64();
        let (k0, k1) = ((t0 / b).floor() as usize, (t1 / b).ceil() as usize);
        let k1 = k1.min(self.buckets.len());
        if k1 <= k0 {
            return f64::NAN;
        }
        let n: u64 = self.buckets[k0..k1]
            .iter()
            .map(|x| x.load(Ordering::Relaxed))
            .sum();
        n as f64 / ((k1 - k0) as f64 * b)
    }
}

/// What the probe and readers saw.
#[derive(Default)]
pub struct Seen {
    /// Probe replies received.
    pub probe_ops: u64,
    /// (time since start s, gap ms) of every silence over 2 ms on the probe connection.
    pub probe_gaps: Vec<(f64, f64)>,
    /// (time, gap ms) of every silence over 2 ms on any reader connection.
    pub reader_gaps: Vec<(f64, f64)>,
    /// Failed requests: error replies, wrong values, lost connections (first 20 kept).
    pub errors: Vec<String>,
    /// All failed requests.
    pub error_count: u64,
    /// redis-benchmark runs: (start s, end s, result).
    pub bench: Vec<(f64, f64, Result<BenchRun, String>)>,
}

impl Seen {
    fn error(&mut self, e: String) {
        self.error_count += 1;
        if self.errors.len() < 20 {
            self.errors.push(e);
        }
    }

    /// Longest probe gap (ms) that ended within [t0, t1].
    pub fn longest_probe_gap(&self, t0: f64, t1: f64) -> f64 {
        longest(&self.probe_gaps, t0, t1)
    }

    /// Longest reader gap (ms) that ended within [t0, t1].
    pub fn longest_reader_gap(&self, t0: f64, t1: f64) -> f64 {
        longest(&self.reader_gaps, t0, t1)
    }

    /// redis-benchmark runs that failed, or reported errors.
    pub fn bench_failures(&self) -> Vec<String> {
        self.bench
            .iter()
            .filter_map(|(t0, _, r)| match r {
                Ok(run) if run.ok() => None,
                Ok(run) => Some(format!("run at {t0:.1} s: {} {:?}", run.status, run.errors)),
                Err(e) => Some(format!("run at {t0:.1} s: {e}")),
            })
            .collect()
    }
}

fn longest(gaps: &[(f64, f64)], t0: f64, t1: f64) -> f64 {
    gaps.iter()
        .filter(|(t, _)| *t >= t0 && *t <= t1)
        .map(|(_, g)| *g)
        .fold(0.0, f64::max)
}

/// The running load; [`Load::stop`] ends it.
pub struct Load {
    /// The throughput timeline.
    pub timeline: Arc<Timeline>,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// What to run.
pub struct LoadConfig {
    /// Where clients connect (the gateway, or the server).
    pub addr: std::net::SocketAddr,
    /// Reader threads (GET of random dataset keys, checked).
    pub readers: usize,
    /// Dataset size the readers draw from, and its value length.
    pub keys: u64,
    /// Value length of the dataset.
    pub value_len: usize,
    /// redis-benchmark arguments (without -h/-p), run back to back; none if empty.
    pub bench_args: Vec<String>,
}

impl Load {
    /// Start the probe, the readers and the redis-benchmark loop.
    pub fn start(cfg: LoadConfig) -> anyhow::Result<Load> {
        let start = Instant::now();
        let timeline = Arc::new(Timeline::new(start));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut probe = Client::connect(cfg.addr, IO_TIMEOUT).context("probe connect")?;
        if probe.cmd_str(&["SET", "probe:counter", "0"])? != Reply::ok() {
            bail!("the probe could not reset its counter");
        }
        {
            let (tl, seen, stop, addr) = (timeline.clone(), seen.clone(), stop.clone(), cfg.addr);
            threads.push(std::thread::spawn(move || {
                probe_loop(probe, addr, &tl, &seen, &stop)
            }));
        }
        for r in 0..cfg.readers {
            let (tl, seen, stop) = (timeline.clone(), seen.clone(), stop.clone());
            let (addr, keys, len) = (cfg.addr, cfg.keys, cfg.value_len);
            threads.push(std::thread::spawn(move || {
                reader_loop(addr, keys, len, r as u64, &tl, &seen, &stop)
            }));
        }
        if !cfg.bench_args.is_empty() {
            let (tl, seen, stop) = (timeline.clone(), seen.clone(), stop.clone());
            let port = cfg.addr.port().to_string();
            let host = cfg.addr.ip().to_string();
            let args = cfg.bench_args;
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut a: Vec<&str> = vec!["-h", &host, "-p", &port];
                    a.extend(args.iter().map(String::as_str));
                    let t0 = tl.now();
                    let r =
                        redis_benchmark(&a, Duration::from_secs(600)).map_err(|e| e.to_string());
                    seen.lock().unwrap().bench.push((t0, tl.now(), r));
                }
            }));
        }
        Ok(Load {
            timeline,
            seen,
            stop,
            threads,
        })
    }

    /// Stop every client and return what they saw.
    pub fn stop(self) -> (Arc<Timeline>, Seen) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let seen = std::mem::take(&mut *self.seen.lock().unwrap());
        (self.timeline, seen)
    }
}

fn probe_loop(
    mut c: Client,
    addr: std::net::SocketAddr,
    tl: &Timeline,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) {
    let mut last = Instant::now();
    let mut expect = 1i64;
    while !stop.load(Ordering::Relaxed) {
        let r = c.cmd_str(&["INCR", "probe:counter"]);
        let now = Instant::now();
        let gap = now.duration_since(last).as_secs_f64() * 1000.0;
        last = now;
        let mut s = seen.lock().unwrap();
        if gap > 2.0 {
            s.probe_gaps.push((tl.now(), gap));
        }
        match r {
            Ok(Reply::Int(v)) if v == expect => {
                s.probe_ops += 1;
                expect += 1;
                drop(s);
                tl.tick(now);
            }
            Ok(other) => {
                s.error(format!("probe INCR #{expect}: {other:?}"));
                if let Reply::Int(v) = other {
                    expect = v + 1;
                }
            }
            Err(e) => {
                s.error(format!("probe INCR #{expect}: {e}"));
                drop(s);
                // The connection is gone: that is a failure; reconnect to go on measuring.
                std::thread::sleep(Duration::from_millis(100));
                match Client::connect(addr, IO_TIMEOUT) {
                    Ok(n) => c = n,
                    Err(_) => continue,
                }
            }
        }
    }
}

fn reader_loop(
    addr: std::net::SocketAddr,
    keys: u64,
    len: usize,
    seed: u64,
    tl: &Timeline,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) {
    let mut s = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut client: Option<Client> = None;
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let c = match client.as_mut() {
            Some(c) => c,
            None => match Client::connect(addr, IO_TIMEOUT) {
                Ok(c) => client.insert(c),
                Err(e) => {
                    seen.lock().unwrap().error(format!("reader connect: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            },
        };
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let k = s % keys.max(1);
        let r = c.cmd(&[b"GET", &key(k)]);
        let now = Instant::now();
        let gap = now.duration_since(last).as_secs_f64() * 1000.0;
        last = now;
        if gap > 2.0 {
            seen.lock().unwrap().reader_gaps.push((tl.now(), gap));
        }
        match r {
            Ok(Reply::Bulk(Some(v))) if v == value(k, len) => tl.tick(now),
            Ok(other) => seen
                .lock()
                .unwrap()
                .error(format!("GET data:{k}: {other:?}")),
            Err(e) => {
                seen.lock().unwrap().error(format!("GET data:{k}: {e}"));
                client = None;
            }
        }
    }
}
