//! The clients of the service tests: a writer of a known key set on one
//! long-lived connection, a loop of `redis-benchmark` runs, and the
//! expected `DBSIZE` and digest of what they wrote.
//!
//! Every client keeps its connection through the moves; an I/O error, an
//! unexpected reply or a redis-benchmark error is recorded, and the test
//! requires none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use roam_testkit::resp::{Client, Reply};

/// Longest a reply may take: a cell moving to or from the node under qemu
/// holds its clients for seconds.
pub(crate) const REPLY_LIMIT: Duration = Duration::from_secs(120);

/// A connection to the gateway, with the reply limit, and its local port.
pub(crate) fn connect(port: u16) -> Result<(Client, u16), String> {
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    let local = s.local_addr().map_or(0, |a| a.port());
    let c = Client::from_stream(s, REPLY_LIMIT).map_err(|e| e.to_string())?;
    Ok((c, local))
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
        Ok((c, _)) => c,
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
                    if *r != Reply::ok() {
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
        match c.cmd(&[b"GET", &key(i)]) {
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

pub(crate) use roam_testkit::resp::digest;

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

/// One run; its rates, or why it failed: a non-zero exit (redis-benchmark
/// 7 exits at the first error reply or broken connection), an error line,
/// or a test missing from its output.
fn bench_once(port: u16) -> Result<String, String> {
    let port = port.to_string();
    let args = ["-h", "127.0.0.1", "-p", &port, "-c", BENCH_CLIENTS];
    let n = BENCH_N.to_string();
    let args = [&args[..], &["-n", &n, "-t", "set,get,incr,ping"]].concat();
    let run = roam_testkit::resp::benchmark::redis_benchmark(&args, Duration::from_secs(300))
        .map_err(|e| e.to_string())?;
    if !run.ok() {
        return Err(format!("exit {}: {}", run.status, run.errors.join(" / ")));
    }
    BENCH_TESTS
        .iter()
        .map(|t| {
            run.test(t)
                .map(|r| format!("{t}={:.0}", r.rps))
                .ok_or_else(|| format!("no result for {t}: {:?}", run.tests))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.join(" "))
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

/// The digest computed here matches what the real server answered
/// (native kvserver, redis-cli): the expected values in the tests are
/// computed independently of the server.
#[test]
fn digest_matches_the_server_and_rounds_follow_the_writer() {
    assert_eq!(digest(std::iter::empty()), "0000000000000000");
    let bench = Benched {
        runs: 1,
        incrs: 2000,
        ..Benched::default()
    };
    let keys = bench_keys(&bench, b"xxx");
    assert_eq!(
        digest(keys.iter().map(|(k, v)| (&k[..], &v[..]))),
        "0e61c393da700d5c"
    );
    let (a, one): (&[u8], &[u8]) = (b"a", b"1");
    assert_eq!(digest([(a, one)]), "a3625301317f047d");
    // 3 keys, 7 SETs: key 0 was written 3 times, keys 1 and 2 twice.
    assert_eq!(
        (round_of(0, 7, 3), round_of(1, 7, 3), round_of(2, 7, 3)),
        (2, 1, 1)
    );
    assert_eq!(round_of(2, 6, 3), 1);
}
