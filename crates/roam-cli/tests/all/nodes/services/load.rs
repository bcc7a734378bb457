//! The clients of the service tests: a writer of a known key set on one
//! long-lived connection, a loop of `redis-benchmark` runs, and the
//! expected `DBSIZE` and digest of what they wrote.
//!
//! Every client keeps its connection through the moves; an I/O error, an
//! unexpected reply or a redis-benchmark error is recorded, and the test
//! requires none.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::resp::{Conn, Reply};

/// Longest a reply may take: a cell moving to or from the node under qemu
/// holds its clients for seconds.
pub(crate) const REPLY_LIMIT: Duration = Duration::from_secs(120);

/// A connection to the gateway, with the reply limit.
pub(crate) fn connect(port: u16) -> std::io::Result<Conn> {
    let c = Conn::connect(&format!("127.0.0.1:{port}"))?;
    c.set_timeout(Some(REPLY_LIMIT))?;
    Ok(c)
}

/// The value the writer stores under key number `i` the `round`th time it
/// writes it: `len` bytes that do not compress and differ every round (so
/// a move carries them as they are: neither compression nor the
/// destination's store of pages it saw before shortens it).
pub(crate) fn value(i: u64, round: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut k = 0u64;
    while out.len() < len {
        let h = blake3::hash(format!("{i}/{round}/{k}").as_bytes());
        out.extend_from_slice(h.to_hex().as_bytes());
        k += 1;
    }
    out.truncate(len);
    out
}

/// The key of number `i`.
pub(crate) fn key(i: u64) -> Vec<u8> {
    format!("w:{i}").into_bytes()
}

/// What a writer did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Written {
    /// Keys `w:0 .. w:count` exist.
    pub count: u64,
    /// The writer's key set (`w:0 .. w:keys`, written round after round).
    pub keys: u64,
    /// SETs answered.
    pub sets: u64,
    /// Every failure seen (I/O, a wrong reply).
    pub errors: Vec<String>,
}

impl Written {
    /// The value key `i` holds now: the writer went through the keys in
    /// order, round after round, `sets` times in all.
    pub(crate) fn value_of(&self, i: u64, len: usize) -> Vec<u8> {
        value(i, round_of(i, self.sets, self.keys), len)
    }
}

/// The round of key `i`'s last write after `sets` SETs over `keys` keys.
fn round_of(i: u64, sets: u64, keys: u64) -> u64 {
    let times = sets / keys + u64::from(i < sets % keys);
    times.saturating_sub(1)
}

/// A thread that writes `w:0, w:1, ... w:keys-1`, then again from `w:0`
/// with the next round's values (the data set stays bounded and known), in
/// pipelined batches on one connection, and reads back an
/// earlier key after each batch, until stopped (and at least `min` SETs
/// were answered).
pub(crate) struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Written>,
    sets: Arc<AtomicU64>,
}

impl Writer {
    pub(crate) fn start(port: u16, len: usize, keys: u64, min: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let sets = Arc::new(AtomicU64::new(0));
        let (s, c) = (stop.clone(), sets.clone());
        let thread = std::thread::spawn(move || write_keys(port, len, keys, min, &s, &c));
        Writer { stop, thread, sets }
    }

    /// SETs answered so far.
    pub(crate) fn written(&self) -> u64 {
        self.sets.load(Ordering::SeqCst)
    }

    pub(crate) fn finish(self) -> Written {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the writer thread panicked")
    }
}

fn write_keys(
    port: u16,
    len: usize,
    keys: u64,
    min: u64,
    stop: &AtomicBool,
    sets: &AtomicU64,
) -> Written {
    const BATCH: u64 = 50;
    let mut w = Written {
        keys,
        ..Written::default()
    };
    let mut c = match connect(port) {
        Ok(c) => c,
        Err(e) => {
            w.errors.push(format!("writer: connect: {e}"));
            return w;
        }
    };
    while w.sets < min || !stop.load(Ordering::SeqCst) {
        let (from, round) = (w.sets % keys, w.sets / keys);
        let end = (from + BATCH).min(keys);
        let cmds: Vec<Vec<Vec<u8>>> = (from..end)
            .map(|i| vec![b"SET".to_vec(), key(i), value(i, round, len)])
            .collect();
        match c.pipeline(&cmds) {
            Ok(replies) => {
                for (k, r) in replies.iter().enumerate() {
                    if *r != Reply::Simple("OK".into()) {
                        w.errors
                            .push(format!("writer: SET w:{} answered {r:?}", from + k as u64));
                    }
                }
            }
            Err(e) => {
                w.errors.push(format!("writer: SET batch at w:{from}: {e}"));
                return w;
            }
        }
        w.sets += end - from;
        w.count = w.count.max(end);
        sets.store(w.sets, Ordering::SeqCst);
        // Read back a key written earlier.
        let i = end / 2;
        match c.cmd(&[&b"GET"[..], &key(i)]) {
            Ok(Reply::Bulk(Some(v))) if v == w.value_of(i, len) => {}
            Ok(r) => w.errors.push(format!("writer: GET w:{i} answered {r:?}")),
            Err(e) => {
                w.errors.push(format!("writer: GET w:{i}: {e}"));
                return w;
            }
        }
    }
    w
}

/// The digest `ROAM.DIGEST` answers for these pairs (docs/workloads.md):
/// the sum mod 2^64 over keys of mix64(fnv1a64(le32(klen) || key || value)).
pub(crate) fn digest<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> u64 {
    fn fnv1a(mut h: u64, b: &[u8]) -> u64 {
        for &x in b {
            h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
    fn mix64(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pairs.into_iter().fold(0u64, |sum, (k, v)| {
        let h = fnv1a(0xcbf2_9ce4_8422_2325, &(k.len() as u32).to_le_bytes());
        let h = fnv1a(fnv1a(h, k), v);
        sum.wrapping_add(mix64(h))
    })
}

/// What a loop of redis-benchmark runs did.
#[derive(Debug, Default, Clone)]
pub(crate) struct Benched {
    /// Runs that finished.
    pub runs: u64,
    /// INCR requests answered (each run sends exactly `-n` of them).
    pub incrs: u64,
    /// Requests per second of each test, per run.
    pub rates: Vec<String>,
    /// Every failure seen.
    pub errors: Vec<String>,
}

/// redis-benchmark runs, one after the other, each with new connections,
/// until stopped: clients that connect before, during and after moves.
pub(crate) struct BenchLoop {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Benched>,
    runs: Arc<Mutex<u64>>,
}

/// Requests per test and run, and concurrent clients.
const BENCH_N: u64 = 2000;
const BENCH_CLIENTS: &str = "10";
/// The tests of every run, as redis-benchmark names them in its CSV.
const BENCH_TESTS: [&str; 5] = ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR"];

impl BenchLoop {
    pub(crate) fn start(port: u16) -> BenchLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(Mutex::new(0));
        let (s, r) = (stop.clone(), runs.clone());
        let thread = std::thread::spawn(move || bench_runs(port, &s, &r));
        BenchLoop { stop, thread, runs }
    }

    /// Runs finished so far.
    pub(crate) fn runs(&self) -> u64 {
        *self.runs.lock().unwrap()
    }

    /// Stop after the run in progress; what all runs did.
    pub(crate) fn finish(self) -> Benched {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("the benchmark thread panicked")
    }
}

fn bench_runs(port: u16, stop: &AtomicBool, runs: &Mutex<u64>) -> Benched {
    let mut b = Benched::default();
    while !stop.load(Ordering::SeqCst) || b.runs == 0 {
        match bench_once(port) {
            Ok(rates) => {
                b.runs += 1;
                b.incrs += BENCH_N;
                b.rates.push(rates);
                *runs.lock().unwrap() = b.runs;
            }
            Err(e) => {
                b.errors
                    .push(format!("redis-benchmark run {}: {e}", b.runs + 1));
                return b;
            }
        }
    }
    b
}

/// One run; its CSV line of rates, or why it failed: a non-zero exit
/// (redis-benchmark 7 exits at the first error reply or broken
/// connection), an error line, or a test missing from the CSV.
fn bench_once(port: u16) -> Result<String, String> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", BENCH_CLIENTS, "-n", &BENCH_N.to_string()])
        .args(["-t", "set,get,incr,ping", "--csv"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| format!("cannot run: {e}"))?;
    let out = wait_output(child, Duration::from_secs(300))?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let all = format!("{stdout}{stderr}");
    if !out.status.success() {
        return Err(format!("exit {}: {all}", out.status));
    }
    if let Some(l) = all
        .lines()
        .find(|l| l.contains("Error") || l.contains("ERR") || l.contains("reset"))
    {
        return Err(format!("error line `{l}` in:\n{all}"));
    }
    let mut rates = Vec::new();
    for t in BENCH_TESTS {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("\"{t}\"")))
            .ok_or_else(|| format!("no result for {t} in:\n{all}"))?;
        let rps = line.split(',').nth(1).unwrap_or("?").trim_matches('"');
        rates.push(format!("{t}={rps}"));
    }
    Ok(rates.join(" "))
}

fn wait_output(
    mut child: std::process::Child,
    limit: Duration,
) -> Result<std::process::Output, String> {
    let start = Instant::now();
    loop {
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            return child.wait_with_output().map_err(|e| e.to_string());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "did not finish within {} s: {}{}",
                limit.as_secs(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The keys redis-benchmark's `-t set,get,incr,ping` leaves (it does not
/// randomise keys without `-r`): `key:__rand_int__`, whose value is
/// `set_value` (redis-benchmark 7 makes up a random 3-byte payload, so the
/// caller reads it back), and `counter:__rand_int__` = the INCRs it sent.
pub(crate) fn bench_keys(b: &Benched, set_value: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    if b.runs == 0 {
        return Vec::new();
    }
    vec![
        (b"key:__rand_int__".to_vec(), set_value.to_vec()),
        (
            b"counter:__rand_int__".to_vec(),
            b.incrs.to_string().into_bytes(),
        ),
    ]
}

#[test]
fn digest_of_nothing_is_zero_and_order_does_not_matter() {
    assert_eq!(digest(std::iter::empty()), 0);
    let (a, b): (&[u8], &[u8]) = (b"a", b"1");
    let (c, d): (&[u8], &[u8]) = (b"bb", b"22");
    assert_eq!(digest([(a, b), (c, d)]), digest([(c, d), (a, b)]));
    assert_ne!(digest([(a, b)]), digest([(a, d)]));
    // Rounds: 3 keys, 7 SETs: keys 0 was written 3 times, 1 and 2 twice.
    assert_eq!(
        (round_of(0, 7, 3), round_of(1, 7, 3), round_of(2, 7, 3)),
        (2, 1, 1)
    );
    assert_eq!(round_of(2, 6, 3), 1);
    // What the native kvserver answers for these keys.
    let bench = Benched {
        runs: 1,
        incrs: 2000,
        ..Benched::default()
    };
    let keys = bench_keys(&bench, b"xxx");
    assert_eq!(
        format!(
            "{:016x}",
            digest(keys.iter().map(|(k, v)| (&k[..], &v[..])))
        ),
        "0e61c393da700d5c"
    );
    let (a, one): (&[u8], &[u8]) = (b"a", b"1");
    assert_eq!(format!("{:016x}", digest([(a, one)])), "a3625301317f047d");
}
