//! Hostile peers and API clients are refused at the boundary, with a precise
//! error, before any identifier they chose touches a host path.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use roam_wire::{recv, send, CellSpec, Features, Hello, Mode, Msg, Offer};

use super::common::*;

/// A node on free loopback ports; returns (process, control, migrate).
fn start_node(dir: &Path) -> (Child, String, String) {
    let log = dir.join("node.log");
    let mut cmd = roam(Isa::X86_64);
    cmd.args(["node", "--listen", "127.0.0.1:0"])
        .args(["--migrate-listen", "127.0.0.1:0", "--name", "hostile-test"])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        let l = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = l.split("control http://").nth(1) {
            let mut w = rest.split_whitespace();
            let control = w.next().unwrap().to_string();
            let migrate = w.nth(1).unwrap().to_string();
            return (child, control, migrate);
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the node exited ({st}):\n{l}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "node did not start:\n{l}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One HTTP/1.0 request: status and body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

fn offer(cell_id: &str, migration_id: &str, dirs: &[&str]) -> Offer {
    Offer {
        migration_id: migration_id.into(),
        cell: CellSpec {
            id: cell_id.into(),
            module_hash: [0; 32],
            args: vec!["p".into()],
            env: vec![],
            dirs: dirs.iter().map(|d| d.to_string()).collect(),
            launched_unix_ms: 0,
            hops: 0,
            max_memory: 64 << 20,
            service: None,
            generation: None,
            cpu: Default::default(),
            far: None,
        },
        mode: Mode::StopAndCopy,
        module_len: 100,
        memory_bytes: 65536,
    }
}

/// Speak the migration protocol as a hostile source: a valid hello, then
/// `offer`. Returns what the node answers.
async fn propose(migrate: &str, offer: Offer) -> Msg {
    let sock = tokio::net::TcpStream::connect(migrate).await.unwrap();
    let (mut rd, mut wr) = sock.into_split();
    let hello = Hello::new("hostile-peer", "x86_64", Features::default());
    send(&mut wr, &Msg::Hello(hello)).await.unwrap();
    assert!(matches!(recv(&mut rd).await.unwrap(), Msg::Hello(_)));
    send(&mut wr, &Msg::Offer(offer)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), recv(&mut rd))
        .await
        .expect("the node answers the offer")
        .unwrap()
}

/// Every path under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn hostile_migration_peer_and_api_client_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, control, migrate) = start_node(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cases = [
        (
            offer("../../x", "m-1", &["/data"]),
            "cell id \"../../x\" is invalid",
        ),
        (
            offer("c-1", "../m", &["/data"]),
            "migration id \"../m\" is invalid",
        ),
        (
            offer("c-1", "m-1", &["../etc"]),
            "guest directory \"../etc\" is invalid",
        ),
    ];
    for (o, want) in cases {
        match rt.block_on(propose(&migrate, o)) {
            Msg::Abort { reason } => assert!(reason.contains(want), "{reason}"),
            m => panic!("expected an abort naming {want}, got {}", m.name()),
        }
    }

    let (st, body) = http(&control, "GET", "/v1/cells/..%2F..%2Fx", "");
    assert_eq!(st, 400, "{body}");
    assert!(
        body.contains("cell id \\\"../../x\\\" is invalid"),
        "{body}"
    );
    let (st, body) = http(&control, "POST", "/v1/cells/..%2F..%2Fx/kill", "");
    assert_eq!(st, 400, "{body}");
    let (st, body) = http(&control, "GET", "/v1/migrations/..%2Fm", "");
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("migration id"), "{body}");
    let hash = "0".repeat(64);
    let launch = format!(r#"{{"module":"{hash}","args":["p"],"dirs":["/data/../../etc"]}}"#);
    let (st, body) = http(&control, "POST", "/v1/cells", &launch);
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("guest directory"), "{body}");
    let launch = r#"{"module":"../../x","args":["p"]}"#;
    let (st, body) = http(&control, "POST", "/v1/cells", launch);
    assert_eq!(st, 400, "{body}");
    assert!(body.contains("module hash"), "{body}");

    let _ = child.kill();
    let _ = child.wait();
    let files = listing(dir.path());
    assert!(
        files
            .iter()
            .all(|f| f == "node.log" || f == "state" || f == "state/cells"),
        "the hostile input created {files:?}"
    );
}
