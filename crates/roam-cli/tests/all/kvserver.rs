//! The `kvserver` workload against expected replies: natively (gcc), which
//! checks the server itself, and as a cell under `roam run --listen`, which
//! checks roam's sockets with the same script. The expected values come from
//! the script (a model map kept by the test, the digest computed by
//! `roam_testkit::resp::digest`), never from the server. Then Debian's
//! `redis-benchmark`, which nobody here wrote, runs against both.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roam_testkit::resp::benchmark::redis_benchmark;
use roam_testkit::resp::{digest, Client, Reply};

use crate::common::{self, Isa};

mod threaded;

const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A server process, killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    what: &'static str,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

impl Server {
    fn start(cmd: Command, addr: SocketAddr, what: &'static str) -> Server {
        Server::start_with(cmd, addr, what, Stdio::inherit())
    }

    /// Start, with the server's stderr going to `stderr`.
    fn start_with(mut cmd: Command, addr: SocketAddr, what: &'static str, stderr: Stdio) -> Server {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {what}: {e}"));
        let mut s = Server { child, addr, what };
        // The cell may first be prepared (Asyncify) and compiled: be patient.
        let start = Instant::now();
        loop {
            if let Some(status) = s.child.try_wait().unwrap() {
                panic!("the {what} exited before it served: {status}");
            }
            if Client::connect(addr, IO_TIMEOUT).is_ok() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "the {what} did not accept a connection on {addr} within 300 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn native() -> Option<Server> {
        let bin = common::repo_root().join("target/workloads/native/x86_64/kvserver");
        if !bin.exists() {
            roam_testkit::missing(&roam_testkit::NATIVE_WORKLOADS, "no native kvserver");
            return None;
        }
        let addr = free_addr();
        let mut cmd = Command::new(bin);
        cmd.arg("--listen").arg(addr.to_string());
        Some(Server::start(cmd, addr, "native kvserver"))
    }

    /// `module` as a cell under `roam run --listen`.
    fn cell(module: &Path, what: &'static str) -> Server {
        let addr = free_addr();
        let mut cmd = common::roam(Isa::X86_64);
        cmd.arg("run")
            .arg("--listen")
            .arg(addr.to_string())
            .arg(module);
        Server::start(cmd, addr, what)
    }

    fn client(&self) -> Client {
        Client::connect(self.addr, IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connecting to the {}: {e}", self.what))
    }
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn arr(items: Vec<Reply>) -> Reply {
    Reply::Array(Some(items))
}

/// Sends `args` and checks the reply; keeps `model` in step.
struct Script<'a> {
    c: &'a mut Client,
    what: &'a str,
}

impl Script<'_> {
    fn expect(&mut self, args: &[&str], want: Reply) {
        let got = self
            .c
            .cmd_str(args)
            .unwrap_or_else(|e| panic!("{}: {args:?}: {e}", self.what));
        assert_eq!(got, want, "{}: reply to {args:?}", self.what);
    }

    fn expect_err(&mut self, args: &[&str], prefix: &str) {
        match self.c.cmd_str(args) {
            Ok(Reply::Error(e)) if e.starts_with(prefix) => {}
            other => panic!(
                "{}: {args:?}: want an error {prefix:?}..., got {other:?}",
                self.what
            ),
        }
    }
}

/// The scripted sequence; returns the model of what the database holds.
fn run_script(server: &Server) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut c = server.client();
    let mut s = Script {
        c: &mut c,
        what: server.what,
    };
    s.expect(&["FLUSHALL"], Reply::ok());
    s.expect(&["PING"], Reply::Simple("PONG".into()));
    s.expect(&["PING", "hi there"], Reply::bulk("hi there"));
    s.expect(&["ECHO", "a\r\nb"], Reply::bulk("a\r\nb"));

    // SET and its conditions.
    s.expect(&["SET", "k", "v1"], Reply::ok());
    s.expect(&["SET", "k", "v2", "NX"], Reply::nil());
    s.expect(&["GET", "k"], Reply::bulk("v1"));
    s.expect(&["SET", "k", "v3", "XX"], Reply::ok());
    s.expect(&["SET", "absent", "x", "XX"], Reply::nil());
    s.expect(&["SET", "n", "1", "NX"], Reply::ok());
    s.expect(
        &["SET", "k", "x", "NX", "XX"],
        Reply::Error("ERR syntax error".into()),
    );
    s.expect_err(&["SET", "k", "x", "PX", "0"], "ERR invalid expire time");
    s.expect_err(
        &["SET", "k", "x", "EX", "ten"],
        "ERR value is not an integer",
    );
    s.expect(&["GET", "absent"], Reply::nil());
    model.insert(b("k"), b("v3"));
    model.insert(b("n"), b("1"));

    // Expiry on the monotonic clock.
    s.expect(&["SET", "short", "gone soon", "PX", "150"], Reply::ok());
    s.expect(&["SET", "long", "stays", "EX", "3600"], Reply::ok());
    model.insert(b("long"), b("stays"));
    match s.c.cmd_str(&["PTTL", "long"]).unwrap() {
        Reply::Int(ms) => assert!(ms > 0 && ms <= 3_600_000, "PTTL long = {ms}"),
        r => panic!("PTTL: {r:?}"),
    }
    s.expect(&["TTL", "k"], Reply::Int(-1));
    std::thread::sleep(Duration::from_millis(400));
    s.expect(&["GET", "short"], Reply::nil());
    s.expect(&["EXISTS", "short"], Reply::Int(0));
    s.expect(&["TTL", "short"], Reply::Int(-2));

    // MSET / MGET.
    s.expect(&["MSET", "a", "1", "b", "2", "c", "3"], Reply::ok());
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
        model.insert(b(k), b(v));
    }
    s.expect(
        &["MGET", "a", "b", "nokey", "c"],
        arr(vec![
            Reply::bulk("1"),
            Reply::bulk("2"),
            Reply::nil(),
            Reply::bulk("3"),
        ]),
    );
    s.expect_err(&["MSET", "a"], "ERR wrong number of arguments");

    // Counters.
    s.expect(&["INCR", "a"], Reply::Int(2));
    s.expect(&["INCRBY", "a", "10"], Reply::Int(12));
    s.expect(&["DECR", "a"], Reply::Int(11));
    s.expect(&["INCR", "fresh"], Reply::Int(1));
    s.expect(&["INCRBY", "neg", "-5"], Reply::Int(-5));
    model.insert(b("a"), b("11"));
    model.insert(b("fresh"), b("1"));
    model.insert(b("neg"), b("-5"));
    let not_int = Reply::Error("ERR value is not an integer or out of range".into());
    s.expect(&["INCR", "k"], not_int.clone());
    s.expect(&["INCRBY", "a", "1.5"], not_int.clone());
    s.expect(&["SET", "big", "9223372036854775807"], Reply::ok());
    model.insert(b("big"), b("9223372036854775807"));
    s.expect_err(
        &["INCR", "big"],
        "ERR increment or decrement would overflow",
    );
    s.expect(&["GET", "k"], Reply::bulk("v3"));

    // DEL / EXISTS.
    s.expect(&["DEL", "b", "nokey", "c"], Reply::Int(2));
    model.remove(&b("b"));
    model.remove(&b("c"));
    s.expect(&["EXISTS", "a", "b", "a"], Reply::Int(2));

    // Probes clients make.
    s.expect(&["CLIENT", "SETNAME", "kvtest"], Reply::ok());
    s.expect(&["CLIENT", "GETNAME"], Reply::bulk("kvtest"));
    s.expect(
        &["CONFIG", "GET", "save"],
        arr(vec![Reply::bulk("save"), Reply::bulk("")]),
    );
    assert!(matches!(s.c.cmd_str(&["COMMAND", "COUNT"]).unwrap(), Reply::Int(n) if n > 10));
    assert!(matches!(
        s.c.cmd_str(&["COMMAND", "DOCS"]).unwrap(),
        Reply::Array(Some(_))
    ));
    match s.c.cmd_str(&["INFO"]).unwrap() {
        Reply::Bulk(Some(t)) => assert!(String::from_utf8_lossy(&t).contains("redis_version:")),
        r => panic!("INFO: {r:?}"),
    }
    s.expect_err(&["NOSUCH", "x"], "ERR unknown command 'NOSUCH'");

    // Pipelining: 500 SETs and 500 GETs in one write each.
    let sets: Vec<Vec<Vec<u8>>> = (0..500)
        .map(|i| {
            vec![
                b("SET"),
                format!("p:{i}").into_bytes(),
                format!("value {i}").into_bytes(),
            ]
        })
        .collect();
    let replies = c.pipeline(&sets).unwrap();
    assert!(
        replies.iter().all(|r| *r == Reply::ok()),
        "{}: pipelined SETs",
        server.what
    );
    for i in 0..500 {
        model.insert(
            format!("p:{i}").into_bytes(),
            format!("value {i}").into_bytes(),
        );
    }
    let gets: Vec<Vec<Vec<u8>>> = (0..500)
        .map(|i| vec![b("GET"), format!("p:{i}").into_bytes()])
        .collect();
    for (i, r) in c.pipeline(&gets).unwrap().into_iter().enumerate() {
        assert_eq!(
            r,
            Reply::bulk(format!("value {i}")),
            "{}: pipelined GET {i}",
            server.what
        );
    }

    // Inline requests, pipelined too.
    c.send_raw(b"PING\r\nECHO inline\r\nEXISTS a k\r\n")
        .unwrap();
    assert_eq!(c.read_reply().unwrap(), Reply::Simple("PONG".into()));
    assert_eq!(c.read_reply().unwrap(), Reply::bulk("inline"));
    assert_eq!(c.read_reply().unwrap(), Reply::Int(2));

    // A second client sees the same data, interleaved with the first.
    let mut d = server.client();
    assert_eq!(d.cmd_str(&["GET", "p:7"]).unwrap(), Reply::bulk("value 7"));
    assert_eq!(c.cmd_str(&["SET", "shared", "yes"]).unwrap(), Reply::ok());
    assert_eq!(d.cmd_str(&["GET", "shared"]).unwrap(), Reply::bulk("yes"));
    model.insert(b("shared"), b("yes"));

    // The state, in one call each.
    assert_eq!(
        c.cmd_str(&["DBSIZE"]).unwrap(),
        Reply::Int(model.len() as i64),
        "{}: DBSIZE",
        server.what
    );
    let want = digest(model.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
    assert_eq!(
        c.cmd_str(&["ROAM.DIGEST"]).unwrap(),
        Reply::bulk(&want),
        "{}: ROAM.DIGEST",
        server.what
    );

    // QUIT answers, then the server closes.
    assert_eq!(d.cmd_str(&["QUIT"]).unwrap(), Reply::ok());
    assert!(
        d.closed_by_server().unwrap(),
        "{}: QUIT did not close",
        server.what
    );
    model
}

/// A malformed request gets a protocol error and the connection is closed;
/// the server goes on serving others.
fn protocol_errors_close_only_that_client(server: &Server) {
    let mut c = server.client();
    c.send_raw(b"*1\r\n$x\r\n").unwrap();
    match c.read_reply() {
        Ok(Reply::Error(e)) if e.contains("Protocol error") => {}
        r => panic!("{}: want a protocol error, got {r:?}", server.what),
    }
    assert!(c.closed_by_server().unwrap());
    let mut d = server.client();
    assert_eq!(d.cmd_str(&["PING"]).unwrap(), Reply::Simple("PONG".into()));
}

fn benchmark_runs_clean(server: &Server) {
    if !roam_testkit::have("redis-benchmark") {
        roam_testkit::missing(&roam_testkit::REDIS_TOOLS, "redis-benchmark is not on PATH");
        return;
    }
    let port = server.addr.port().to_string();
    let run = redis_benchmark(
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-c",
            "8",
            "-n",
            "2000",
            "-t",
            "set,get,incr,ping",
        ],
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", server.what));
    assert!(
        run.ok(),
        "{}: redis-benchmark failed: {:?} {:?}",
        server.what,
        run.status,
        run.errors
    );
    let names: Vec<&str> = run.tests.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["PING_INLINE", "PING_MBULK", "SET", "GET", "INCR"],
        "{}",
        server.what
    );
    // INCR on one key, 2000 times: the counter says so.
    let mut c = server.client();
    assert_eq!(
        c.cmd_str(&["GET", "counter:__rand_int__"]).unwrap(),
        Reply::bulk("2000"),
        "{}: redis-benchmark's INCRs",
        server.what
    );
}

#[test]
fn native_server_answers_the_script() {
    let Some(server) = Server::native() else {
        return;
    };
    run_script(&server);
    protocol_errors_close_only_that_client(&server);
    benchmark_runs_clean(&server);
}

#[test]
fn cell_under_roam_run_listen_answers_the_script() {
    let server = Server::cell(
        &common::workload("kvserver"),
        "kvserver cell under roam run --listen",
    );
    let model = run_script(&server);
    protocol_errors_close_only_that_client(&server);
    // The data of the script is still there after other clients came and went.
    let mut c = server.client();
    let want = digest(model.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
    assert_eq!(c.cmd_str(&["ROAM.DIGEST"]).unwrap(), Reply::bulk(&want));
    benchmark_runs_clean(&server);
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// The standalone rule: a checkpoint under `roam run --listen` keeps the
/// whole database, and a restore (on a new address) serves it again, with
/// expiry still counting on the monotonic clock; the connections open at
/// the checkpoint are reported to the program as reset, so it drops them.
#[test]
fn cell_keeps_its_data_across_checkpoint_and_restore() {
    keeps_its_data_across_checkpoint_and_restore(&common::workload("kvserver"), Isa::X86_64);
}

/// `module`'s server stopped into a snapshot on x86-64 with clients
/// connected, then restored on `to`: see the test above.
pub(crate) fn keeps_its_data_across_checkpoint_and_restore(module: &Path, to: Isa) {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("kv.roam");
    let addr = free_addr();
    let mut cmd = common::roam(Isa::X86_64);
    cmd.arg("run")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--snapshot")
        .arg(&snap)
        .arg(module);
    let mut server = Server::start(cmd, addr, "cell to checkpoint");
    let mut model = run_script(&server);
    let mut c = server.client();
    assert_eq!(
        c.cmd_str(&["SET", "ttl", "t", "PX", "600000"]).unwrap(),
        Reply::ok()
    );
    model.insert(b("ttl"), b("t"));
    // Two clients stay connected across the checkpoint.
    let mut open = server.client();
    assert_eq!(
        open.cmd_str(&["CLIENT", "SETNAME", "open"]).unwrap(),
        Reply::ok()
    );

    // SAFETY: kill(2) on the pid of a child this test started and still owns.
    assert_eq!(unsafe { kill(server.child.id() as i32, 15) }, 0);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "SIGTERM did not stop the cell"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "checkpoint-and-stop: {status}");
    assert!(snap.exists(), "no snapshot was written");

    let addr2 = free_addr();
    let mut cmd = common::roam(to);
    cmd.arg("restore")
        .arg(&snap)
        .arg("--listen")
        .arg(addr2.to_string());
    let restored = Server::start(cmd, addr2, "restored cell");
    let mut r = restored.client();
    assert_eq!(
        r.cmd_str(&["DBSIZE"]).unwrap(),
        Reply::Int(model.len() as i64)
    );
    let want = digest(model.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
    assert_eq!(r.cmd_str(&["ROAM.DIGEST"]).unwrap(), Reply::bulk(&want));
    match r.cmd_str(&["PTTL", "ttl"]).unwrap() {
        Reply::Int(ms) => assert!(ms > 0 && ms < 600_000, "PTTL after restore: {ms}"),
        other => panic!("PTTL after restore: {other:?}"),
    }
    assert_eq!(r.cmd_str(&["INCR", "a"]).unwrap(), Reply::Int(12));
    // The connections restored without a gateway were reset: the program
    // closed them, and only this client is left.
    let start = Instant::now();
    loop {
        let Reply::Bulk(Some(info)) = r.cmd_str(&["INFO", "clients"]).unwrap() else {
            panic!("INFO clients")
        };
        if String::from_utf8_lossy(&info).contains("connected_clients:1\r\n") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the restored connections are still open: {}",
            String::from_utf8_lossy(&info)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    benchmark_runs_clean(&restored);
}
