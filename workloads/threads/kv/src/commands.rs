//! The commands: what kvserver answers (docs/workloads.md, "kvserver"),
//! with the same replies and Redis's error texts, so the same test script
//! and the same `redis-benchmark` runs can be pointed at either server.
//!
//! Keyspace commands are here; server and connection commands (INFO,
//! CLIENT, COMMAND, CONFIG) are in `admin`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::admin;
use crate::resp::{parse_i64, reply, MAX_BULK};
use crate::server::{Server, Session};

const ERR_NOT_INT: &str = "ERR value is not an integer or out of range";
const ERR_SYNTAX: &str = "ERR syntax error";
const ERR_TOO_BIG: &str = "ERR string exceeds maximum allowed size";

/// `ERR wrong number of arguments for 'name' command`.
pub fn err_args(out: &mut Vec<u8>, name: &str) {
    reply::error(
        out,
        &format!("ERR wrong number of arguments for '{name}' command"),
    );
}

/// Runs one request (`argv` not empty), appending its reply to `out`.
pub fn dispatch(server: &Server, sess: &mut Session, argv: &[&[u8]], out: &mut Vec<u8>) {
    // Command names are matched upper-cased, from a small stack buffer: no
    // allocation per request.
    let mut buf = [0u8; 16];
    let name = argv[0];
    let cmd: &[u8] = if name.len() <= buf.len() {
        let b = &mut buf[..name.len()];
        b.copy_from_slice(name);
        b.make_ascii_uppercase();
        b
    } else {
        b""
    };
    let n = argv.len();
    // Checks the argument count; the error names the command in lower case.
    macro_rules! need {
        ($ok:expr, $name:expr) => {
            if !$ok {
                return err_args(out, $name);
            }
        };
    }
    let now = Instant::now();
    match cmd {
        b"GET" => {
            need!(n == 2, "get");
            match server.store.lock(argv[1]).get(argv[1], now) {
                Some(e) => reply::bulk(out, &e.value),
                None => reply::nil(out),
            }
        }
        b"SET" => {
            need!(n >= 3, "set");
            set(server, argv, out, now);
        }
        b"PING" => {
            need!(n <= 2, "ping");
            match argv.get(1) {
                Some(msg) => reply::bulk(out, msg),
                None => reply::simple(out, "PONG"),
            }
        }
        b"ECHO" => {
            need!(n == 2, "echo");
            reply::bulk(out, argv[1]);
        }
        b"INCR" | b"DECR" => {
            let incr = cmd == b"INCR";
            need!(n == 2, if incr { "incr" } else { "decr" });
            incr_by(server, argv[1], if incr { 1 } else { -1 }, out, now);
        }
        b"INCRBY" | b"DECRBY" => {
            let decr = cmd == b"DECRBY";
            need!(n == 3, if decr { "decrby" } else { "incrby" });
            let Some(by) = parse_i64(argv[2]) else {
                return reply::error(out, ERR_NOT_INT);
            };
            let by = if decr {
                match by.checked_neg() {
                    Some(b) => b,
                    None => return reply::error(out, "ERR decrement would overflow"),
                }
            } else {
                by
            };
            incr_by(server, argv[1], by, out, now);
        }
        b"DEL" | b"UNLINK" => {
            need!(n >= 2, if cmd == b"DEL" { "del" } else { "unlink" });
            let keys = &argv[1..];
            let mut locked = server.store.lock_keys(keys.iter().copied());
            let gone = keys
                .iter()
                .filter(|k| locked.shard(k).remove(k, now))
                .count();
            reply::int(out, gone as i64);
        }
        b"EXISTS" => {
            need!(n >= 2, "exists");
            let keys = &argv[1..];
            let mut locked = server.store.lock_keys(keys.iter().copied());
            let live = keys
                .iter()
                .filter(|k| locked.shard(k).contains(k, now))
                .count();
            reply::int(out, live as i64);
        }
        b"MGET" => {
            need!(n >= 2, "mget");
            let keys = &argv[1..];
            let mut locked = server.store.lock_keys(keys.iter().copied());
            reply::array(out, keys.len());
            for k in keys {
                match locked.shard(k).get(k, now) {
                    Some(e) => reply::bulk(out, &e.value),
                    None => reply::nil(out),
                }
            }
        }
        b"MSET" | b"MSETNX" => {
            let nx = cmd == b"MSETNX";
            need!(n >= 3 && n % 2 == 1, if nx { "msetnx" } else { "mset" });
            let pairs = &argv[1..];
            // All the shards involved stay locked: no client sees half of it.
            let mut locked = server.store.lock_keys(pairs.iter().step_by(2).copied());
            if nx
                && pairs
                    .chunks(2)
                    .any(|p| locked.shard(p[0]).contains(p[0], now))
            {
                return reply::int(out, 0);
            }
            for p in pairs.chunks(2) {
                locked.shard(p[0]).set(p[0], p[1], false, now);
            }
            if nx {
                reply::int(out, 1);
            } else {
                reply::ok(out);
            }
        }
        b"APPEND" => {
            need!(n == 3, "append");
            let mut shard = server.store.lock(argv[1]);
            let len = match shard.get(argv[1], now) {
                Some(e) if e.value.len() + argv[2].len() > MAX_BULK => {
                    return reply::error(out, ERR_TOO_BIG)
                }
                Some(e) => {
                    e.value.extend_from_slice(argv[2]);
                    e.value.len()
                }
                None => shard.set(argv[1], argv[2], false, now).value.len(),
            };
            reply::int(out, len as i64);
        }
        b"STRLEN" => {
            need!(n == 2, "strlen");
            let len = server
                .store
                .lock(argv[1])
                .get(argv[1], now)
                .map_or(0, |e| e.value.len());
            reply::int(out, len as i64);
        }
        b"TYPE" => {
            need!(n == 2, "type");
            let live = server.store.lock(argv[1]).contains(argv[1], now);
            reply::simple(out, if live { "string" } else { "none" });
        }
        b"TTL" | b"PTTL" => {
            let ms = cmd == b"PTTL";
            need!(n == 2, if ms { "pttl" } else { "ttl" });
            let v = match server.store.lock(argv[1]).get(argv[1], now) {
                None => -2,
                Some(e) => match e.expire_at {
                    None => -1,
                    Some(at) => {
                        let left = at.saturating_duration_since(now).as_millis() as i64;
                        // TTL rounds to the nearest second, as Redis does.
                        if ms {
                            left
                        } else {
                            (left + 500) / 1000
                        }
                    }
                },
            };
            reply::int(out, v);
        }
        b"EXPIRE" | b"PEXPIRE" => {
            let ms = cmd == b"PEXPIRE";
            let name = if ms { "pexpire" } else { "expire" };
            need!(n == 3, name);
            expire(server, argv, ms, name, out, now);
        }
        b"PERSIST" => {
            need!(n == 2, "persist");
            let mut shard = server.store.lock(argv[1]);
            let had = shard
                .get(argv[1], now)
                .is_some_and(|e| e.expire_at.is_some());
            if had {
                shard.set_expiry(argv[1], None);
            }
            reply::int(out, i64::from(had));
        }
        b"DBSIZE" => {
            need!(n == 1, "dbsize");
            // Exact: every shard is swept first, so no expired key counts.
            let mut locked = server.store.lock_all();
            let keys: usize = locked.all().map(|s| s.len_live(now)).sum();
            reply::int(out, keys as i64);
        }
        b"FLUSHALL" | b"FLUSHDB" => {
            need!(
                n <= 2,
                if cmd == b"FLUSHALL" {
                    "flushall"
                } else {
                    "flushdb"
                }
            );
            if n == 2
                && !argv[1].eq_ignore_ascii_case(b"SYNC")
                && !argv[1].eq_ignore_ascii_case(b"ASYNC")
            {
                return reply::error(out, ERR_SYNTAX);
            }
            server.store.lock_all().all().for_each(|s| s.clear());
            reply::ok(out);
        }
        b"ROAM.DIGEST" => {
            need!(n == 1, "roam.digest");
            reply::bulk(out, format!("{:016x}", server.store.digest(now)).as_bytes());
        }
        b"SELECT" => {
            need!(n == 2, "select");
            if argv[1] == b"0" {
                reply::ok(out);
            } else {
                reply::error(
                    out,
                    "ERR DB index is out of range (threads-kv has one database, 0)",
                );
            }
        }
        b"QUIT" => {
            reply::ok(out);
            sess.close = true;
        }
        b"INFO" => {
            need!(n <= 2, "info");
            admin::info(server, argv.get(1).copied(), out);
        }
        b"CLIENT" => {
            need!(n >= 2, "client");
            admin::client(server, sess, argv, out);
        }
        b"COMMAND" => admin::command(argv, out),
        b"CONFIG" => {
            need!(n >= 2, "config");
            admin::config(server, argv, out);
        }
        _ => unknown(argv, out),
    }
}

/// `ERR unknown command 'X', with args beginning with: 'a' 'b' `, with
/// unprintable bytes shown as `?` and long words cut, as kvserver does.
fn unknown(argv: &[&[u8]], out: &mut Vec<u8>) {
    let show = |w: &[u8], max: usize| -> String {
        w.iter()
            .take(max)
            .map(|&b| {
                if (b' '..=b'~').contains(&b) {
                    b as char
                } else {
                    '?'
                }
            })
            .collect()
    };
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        show(argv[0], 64)
    );
    for a in argv.iter().skip(1).take(3) {
        msg.push_str(&format!("'{}' ", show(a, 32)));
    }
    reply::error(out, &msg);
}

/// SET key value [NX|XX] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL] [GET], with
/// kvserver's rules for which options combine.
fn set(server: &Server, argv: &[&[u8]], out: &mut Vec<u8>, now: Instant) {
    let (mut nx, mut xx, mut keep, mut get) = (false, false, false, false);
    let mut at: Option<Instant> = None;
    let mut i = 3;
    while i < argv.len() {
        let a = argv[i];
        let is = |s: &str| a.eq_ignore_ascii_case(s.as_bytes());
        if is("NX") && !xx {
            nx = true;
        } else if is("XX") && !nx {
            xx = true;
        } else if is("KEEPTTL") && at.is_none() {
            keep = true;
        } else if is("GET") {
            get = true;
        } else if (is("EX") || is("PX") || is("EXAT") || is("PXAT"))
            && at.is_none()
            && !keep
            && i + 1 < argv.len()
        {
            let Some(v) = parse_i64(argv[i + 1]) else {
                return reply::error(out, ERR_NOT_INT);
            };
            let secs = is("EX") || is("EXAT");
            let invalid = "ERR invalid expire time in 'set' command";
            let Some(ms) = (if v <= 0 {
                None
            } else if secs {
                v.checked_mul(1000)
            } else {
                Some(v)
            }) else {
                return reply::error(out, invalid);
            };
            // EXAT/PXAT are Unix times: turn them into a delay from now on
            // the wall clock, then into an instant on the monotonic one.
            let delay = if is("EXAT") || is("PXAT") {
                let unix_ms = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                (ms - unix_ms).max(0)
            } else {
                ms
            };
            match now.checked_add(Duration::from_millis(delay as u64)) {
                Some(t) => at = Some(t),
                None => return reply::error(out, invalid),
            }
            i += 1;
        } else {
            return reply::error(out, ERR_SYNTAX);
        }
        i += 1;
    }
    let (key, value) = (argv[1], argv[2]);
    let mut shard = server.store.lock(key);
    let old = shard.get(key, now);
    let exists = old.is_some();
    if get {
        match old {
            Some(e) => reply::bulk(out, &e.value),
            None => reply::nil(out),
        }
    }
    if (nx && exists) || (xx && !exists) {
        if !get {
            reply::nil(out);
        }
        return;
    }
    shard.set(key, value, keep, now);
    if at.is_some() {
        shard.set_expiry(key, at);
    }
    if !get {
        reply::ok(out);
    }
}

/// INCR/DECR/INCRBY/DECRBY: the value must be a strict decimal i64; the
/// key keeps its TTL, as in Redis.
fn incr_by(server: &Server, key: &[u8], by: i64, out: &mut Vec<u8>, now: Instant) {
    let mut shard = server.store.lock(key);
    let v = match shard.get(key, now) {
        None => 0,
        Some(e) => match parse_i64(&e.value) {
            Some(v) => v,
            None => return reply::error(out, ERR_NOT_INT),
        },
    };
    let Some(v) = v.checked_add(by) else {
        return reply::error(out, "ERR increment or decrement would overflow");
    };
    shard.set(key, v.to_string().as_bytes(), true, now);
    reply::int(out, v);
}

/// EXPIRE/PEXPIRE key n: 1 if the key exists (a delay <= 0 deletes it),
/// 0 if not.
fn expire(server: &Server, argv: &[&[u8]], ms: bool, name: &str, out: &mut Vec<u8>, now: Instant) {
    let Some(v) = parse_i64(argv[2]) else {
        return reply::error(out, ERR_NOT_INT);
    };
    let key = argv[1];
    let mut shard = server.store.lock(key);
    if !shard.contains(key, now) {
        return reply::int(out, 0);
    }
    let invalid = format!("ERR invalid expire time in '{name}' command");
    let Some(d) = (if ms { Some(v) } else { v.checked_mul(1000) }) else {
        return reply::error(out, &invalid);
    };
    if d <= 0 {
        shard.remove(key, now);
        return reply::int(out, 1);
    }
    match now.checked_add(Duration::from_millis(d as u64)) {
        Some(at) => {
            shard.set_expiry(key, Some(at));
            reply::int(out, 1);
        }
        None => reply::error(out, &invalid),
    }
}
