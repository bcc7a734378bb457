//! Server and connection commands: INFO, CLIENT, COMMAND, CONFIG. These
//! are what redis-cli and redis-benchmark probe on connecting; they answer
//! as kvserver does.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::commands::err_args;
use crate::resp::reply;
use crate::server::{Server, Session};

/// Names listed by COMMAND LIST (and counted by COMMAND COUNT).
const COMMANDS: &[&str] = &[
    "ping",
    "echo",
    "get",
    "set",
    "del",
    "unlink",
    "exists",
    "incr",
    "decr",
    "incrby",
    "decrby",
    "mget",
    "mset",
    "msetnx",
    "dbsize",
    "flushall",
    "flushdb",
    "info",
    "client",
    "command",
    "config",
    "select",
    "quit",
    "ttl",
    "pttl",
    "expire",
    "pexpire",
    "persist",
    "type",
    "strlen",
    "append",
    "roam.digest",
];

/// INFO [section]: server, clients, memory, persistence, stats, keyspace.
pub fn info(server: &Server, section: Option<&[u8]>, out: &mut Vec<u8>) {
    let all = section.is_none_or(|s| {
        ["all", "everything", "default"]
            .iter()
            .any(|a| s.eq_ignore_ascii_case(a.as_bytes()))
    });
    let want = |name: &str| all || section.is_some_and(|s| s.eq_ignore_ascii_case(name.as_bytes()));
    let mut t = String::new();
    if want("server") {
        let _ = write!(
            t,
            "# Server\r\nredis_version:7.0.0\r\nroam_threads_kv:1\r\nredis_mode:standalone\r\n\
             arch_bits:{}\r\nmultiplexing_api:threads\r\nuptime_in_seconds:{}\r\n\r\n",
            usize::BITS,
            server.started.elapsed().as_secs()
        );
    }
    if want("clients") {
        let _ = write!(
            t,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n",
            server.clients().len(),
            server.max_clients
        );
    }
    // Memory and keyspace walk the whole keyspace under all locks: fine for
    // a command people type, and only done when asked for.
    let (keys, expires, bytes) = if want("memory") || want("keyspace") {
        let now = Instant::now();
        let mut locked = server.store.lock_all();
        let mut acc = (0u64, 0u64, 0u64);
        for shard in locked.all() {
            for (k, e) in shard.live(now) {
                acc.0 += 1;
                acc.1 += u64::from(e.expire_at.is_some());
                acc.2 += (k.len() + e.value.capacity()) as u64;
            }
        }
        acc
    } else {
        (0, 0, 0)
    };
    if want("memory") {
        let _ = write!(t, "# Memory\r\nused_memory:{bytes}\r\n\r\n");
    }
    if want("persistence") {
        t.push_str("# Persistence\r\nloading:0\r\naof_enabled:0\r\n\r\n");
    }
    if want("stats") {
        let _ = write!(
            t,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\
             rejected_connections:{}\r\nexpired_keys:{}\r\n\r\n",
            server.connections.load(Ordering::Relaxed),
            server.commands.load(Ordering::Relaxed),
            server.rejected.load(Ordering::Relaxed),
            server.store.expired_keys()
        );
    }
    if want("keyspace") {
        t.push_str("# Keyspace\r\n");
        if keys > 0 {
            let _ = write!(t, "db0:keys={keys},expires={expires},avg_ttl=0\r\n");
        }
    }
    reply::bulk(out, t.as_bytes());
}

/// COMMAND [DOCS|INFO|COUNT|LIST]. No command docs: redis-cli then uses its
/// built-in help.
pub fn command(argv: &[&[u8]], out: &mut Vec<u8>) {
    let sub = argv.get(1).map(|s| s.to_ascii_uppercase());
    match sub.as_deref() {
        None | Some(b"DOCS") => reply::array(out, 0),
        // nil per name, as for an unknown command.
        Some(b"INFO") => {
            reply::array(out, argv.len() - 2);
            argv[2..].iter().for_each(|_| reply::nil(out));
        }
        Some(b"COUNT") => reply::int(out, COMMANDS.len() as i64),
        Some(b"LIST") => {
            reply::array(out, COMMANDS.len());
            COMMANDS.iter().for_each(|c| reply::bulk(out, c.as_bytes()));
        }
        Some(_) => reply::error(
            out,
            "ERR unknown subcommand for 'command': try COMMAND COUNT, COMMAND LIST, COMMAND DOCS",
        ),
    }
}

fn client_line(id: u64, fd: i32, name: &[u8]) -> String {
    format!(
        "id={id} fd={fd} name={} db=0\n",
        String::from_utf8_lossy(name)
    )
}

/// CLIENT SETNAME | GETNAME | ID | INFO | LIST; SETINFO, NO-EVICT, NO-TOUCH
/// and REPLY answer OK (redis-cli and client libraries send them).
pub fn client(server: &Server, sess: &mut Session, argv: &[&[u8]], out: &mut Vec<u8>) {
    let sub = argv[1].to_ascii_uppercase();
    let n = argv.len();
    match sub.as_slice() {
        b"SETNAME" => {
            if n != 3 {
                return err_args(out, "client|setname");
            }
            let name = argv[2];
            if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
                return reply::error(
                    out,
                    "ERR Client names cannot contain spaces, newlines or special characters.",
                );
            }
            if name.len() > 63 {
                return reply::error(out, "ERR client name too long (at most 63 bytes)");
            }
            if let Some(c) = server.clients().get_mut(&sess.id) {
                c.name = name.to_vec();
            }
            reply::ok(out);
        }
        b"GETNAME" if n == 2 => match server.clients().get(&sess.id) {
            Some(c) if !c.name.is_empty() => reply::bulk(out, &c.name),
            _ => reply::nil(out),
        },
        b"ID" if n == 2 => reply::int(out, sess.id as i64),
        b"INFO" => {
            let line = match server.clients().get(&sess.id) {
                Some(c) => client_line(sess.id, c.fd, &c.name),
                None => client_line(sess.id, -1, b""),
            };
            reply::bulk(out, line.as_bytes());
        }
        b"LIST" => {
            let text: String = server
                .clients()
                .iter()
                .map(|(id, c)| client_line(*id, c.fd, &c.name))
                .collect();
            reply::bulk(out, text.as_bytes());
        }
        b"SETINFO" | b"NO-EVICT" | b"NO-TOUCH" | b"REPLY" => reply::ok(out),
        _ => reply::error(
            out,
            "ERR unknown subcommand for 'client': try CLIENT SETNAME, GETNAME, ID, INFO, LIST",
        ),
    }
}

/// CONFIG GET name... (the parameters clients probe, with the values of a
/// server without persistence; other names are left out, as Redis does for
/// unknown ones) and CONFIG RESETSTAT.
pub fn config(server: &Server, argv: &[&[u8]], out: &mut Vec<u8>) {
    const KNOWN: [(&str, &str); 4] = [
        ("save", ""),
        ("appendonly", "no"),
        ("databases", "1"),
        ("maxmemory", "0"),
    ];
    if argv.len() >= 3 && argv[1].eq_ignore_ascii_case(b"GET") {
        let found: Vec<(&str, &str)> = argv[2..]
            .iter()
            .flat_map(|a| {
                KNOWN
                    .iter()
                    .filter(|(k, _)| a.eq_ignore_ascii_case(k.as_bytes()))
            })
            .copied()
            .collect();
        reply::array(out, 2 * found.len());
        for (k, v) in found {
            reply::bulk(out, k.as_bytes());
            reply::bulk(out, v.as_bytes());
        }
    } else if argv.len() == 2 && argv[1].eq_ignore_ascii_case(b"RESETSTAT") {
        server.connections.store(0, Ordering::Relaxed);
        server.commands.store(0, Ordering::Relaxed);
        server.rejected.store(0, Ordering::Relaxed);
        server.store.reset_expired_keys();
        reply::ok(out);
    } else {
        reply::error(
            out,
            "ERR CONFIG SET and other CONFIG subcommands are not supported (threads-kv has no configuration)",
        );
    }
}
