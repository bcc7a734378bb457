//! A small blocking RESP2 client, for tests and benchmarks that talk to a
//! Redis-protocol server (the `kvserver` workload, natively, under
//! `roam run --listen` or behind `roam gateway`).
//!
//! Why our own: the tests must see every reply exactly as it came off the
//! wire (an error reply is data to compare, not an exception), pipeline
//! without a runtime, and bound every wait, so that a server that stops
//! answering fails a test instead of hanging it. Replies from the server are
//! untrusted input: lengths are checked before anything is allocated.
//!
//! [`benchmark`] runs Debian's `redis-benchmark` under a time bound and
//! parses its CSV output; [`digest`] computes the `ROAM.DIGEST` of a set of
//! keys independently of the server.

pub mod benchmark;

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest bulk string accepted in a reply (Redis's own limit).
pub const MAX_BULK: usize = 512 << 20;
/// Most elements accepted in one reply array.
pub const MAX_ARRAY: usize = 1 << 20;
/// Deepest nesting of arrays accepted.
pub const MAX_DEPTH: usize = 8;

/// One RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...` (the text after the `-`)
    Error(String),
    /// `:42`
    Int(i64),
    /// `$3\r\nabc` or the nil bulk `$-1` (`None`)
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` or the nil array `*-1` (`None`)
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// A bulk reply holding `s`.
    pub fn bulk(s: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(Some(s.as_ref().to_vec()))
    }

    /// The simple-string reply `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// The nil bulk reply.
    pub fn nil() -> Reply {
        Reply::Bulk(None)
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => write!(f, "+{s}"),
            Reply::Error(s) => write!(f, "-{s}"),
            Reply::Int(i) => write!(f, ":{i}"),
            Reply::Bulk(None) => write!(f, "(nil)"),
            Reply::Bulk(Some(b)) if b.len() > 64 => {
                write!(
                    f,
                    "{:?}... ({} bytes)",
                    String::from_utf8_lossy(&b[..64]),
                    b.len()
                )
            }
            Reply::Bulk(Some(b)) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Array(None) => write!(f, "(nil array)"),
            Reply::Array(Some(v)) => f.debug_list().entries(v).finish(),
        }
    }
}

/// Talking to a RESP server failed.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// Connecting, reading or writing failed (a timeout is `TimedOut` or `WouldBlock`).
    #[error("{what} failed: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The server closed the connection where a reply was expected.
    #[error("the server closed the connection before replying")]
    Closed,
    /// The reply is not RESP2, or over a limit; the connection is unusable.
    #[error("malformed reply: {0}")]
    Protocol(String),
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> RespError {
    move |source| RespError::Io { what, source }
}

/// The wire form of one request (a RESP multibulk array).
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A blocking connection to a RESP server. Every read and write is bounded
/// by the timeout given to [`Client::connect`].
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    /// Connects to `addr`; `timeout` bounds the connect and every later
    /// read and write.
    pub fn connect(addr: impl ToSocketAddrs, timeout: Duration) -> Result<Client, RespError> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(io_err("resolving the address"))?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address given");
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Client::from_stream(s, timeout),
                Err(e) => last = e,
            }
        }
        Err(RespError::Io {
            what: "connecting",
            source: last,
        })
    }

    /// Wraps a connected stream; `timeout` bounds every read and write.
    pub fn from_stream(stream: TcpStream, timeout: Duration) -> Result<Client, RespError> {
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(io_err("configuring the socket"))?;
        let writer = stream.try_clone().map_err(io_err("cloning the socket"))?;
        Ok(Client {
            reader: BufReader::with_capacity(64 * 1024, stream),
            writer,
        })
    }

    /// Sends one request and reads its reply.
    pub fn cmd(&mut self, args: &[&[u8]]) -> Result<Reply, RespError> {
        self.send(args)?;
        self.read_reply()
    }

    /// Like [`Client::cmd`], with string arguments.
    pub fn cmd_str(&mut self, args: &[&str]) -> Result<Reply, RespError> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd(&args)
    }

    /// Sends one request without waiting for its reply (pipelining: read the
    /// replies later with [`Client::read_reply`], in order).
    pub fn send(&mut self, args: &[&[u8]]) -> Result<(), RespError> {
        self.send_raw(&encode(args))
    }

    /// Sends bytes as they are (inline commands, malformed input for tests).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), RespError> {
        self.writer
            .write_all(bytes)
            .map_err(io_err("sending a request"))
    }

    /// Sends every request in one write, then reads one reply per request.
    pub fn pipeline(&mut self, requests: &[Vec<Vec<u8>>]) -> Result<Vec<Reply>, RespError> {
        let mut buf = Vec::new();
        for r in requests {
            let args: Vec<&[u8]> = r.iter().map(Vec::as_slice).collect();
            buf.extend_from_slice(&encode(&args));
        }
        self.send_raw(&buf)?;
        requests.iter().map(|_| self.read_reply()).collect()
    }

    /// Reads the next reply.
    pub fn read_reply(&mut self) -> Result<Reply, RespError> {
        read_reply(&mut self.reader, 0)
    }

    /// Whether the server has closed the connection: waits up to the
    /// timeout for EOF. Unread replies count as "not closed".
    pub fn closed_by_server(&mut self) -> Result<bool, RespError> {
        match self.reader.fill_buf() {
            Ok(b) => Ok(b.is_empty()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(true),
            Err(e) => Err(RespError::Io {
                what: "waiting for the server to close",
                source: e,
            }),
        }
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String, RespError> {
    let mut line = Vec::new();
    // A header line is short; bound it so garbage cannot grow it without end.
    let n = r
        .by_ref()
        .take(64 * 1024)
        .read_until(b'\n', &mut line)
        .map_err(io_err("reading a reply"))?;
    if n == 0 {
        return Err(RespError::Closed);
    }
    if !line.ends_with(b"\r\n") {
        return Err(RespError::Protocol(format!(
            "line without CRLF: {:?}",
            String::from_utf8_lossy(&line[..line.len().min(80)])
        )));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| RespError::Protocol("header is not UTF-8".into()))
}

fn parse_len(s: &str, max: usize) -> Result<Option<usize>, RespError> {
    let n: i64 = s
        .parse()
        .map_err(|_| RespError::Protocol(format!("bad length {s:?}")))?;
    match n {
        -1 => Ok(None),
        n if n < 0 => Err(RespError::Protocol(format!("negative length {n}"))),
        n if n as u64 > max as u64 => Err(RespError::Protocol(format!(
            "length {n} is over the limit of {max}"
        ))),
        n => Ok(Some(n as usize)),
    }
}

fn read_reply(r: &mut impl BufRead, depth: usize) -> Result<Reply, RespError> {
    let line = read_line(r)?;
    let (kind, rest) = line.split_at(line.len().min(1));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(
            rest.parse()
                .map_err(|_| RespError::Protocol(format!("bad integer {rest:?}")))?,
        ),
        "$" => match parse_len(rest, MAX_BULK)? {
            None => Reply::Bulk(None),
            Some(n) => {
                let mut b = vec![0u8; n + 2];
                r.read_exact(&mut b).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => RespError::Closed,
                    _ => RespError::Io {
                        what: "reading a bulk reply",
                        source: e,
                    },
                })?;
                if &b[n..] != b"\r\n" {
                    return Err(RespError::Protocol("bulk not followed by CRLF".into()));
                }
                b.truncate(n);
                Reply::Bulk(Some(b))
            }
        },
        "*" => match parse_len(rest, MAX_ARRAY)? {
            None => Reply::Array(None),
            Some(_) if depth >= MAX_DEPTH => {
                return Err(RespError::Protocol(format!(
                    "arrays nested deeper than {MAX_DEPTH}"
                )))
            }
            Some(n) => {
                let mut v = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    v.push(read_reply(r, depth + 1)?);
                }
                Reply::Array(Some(v))
            }
        },
        _ => {
            return Err(RespError::Protocol(format!(
                "unknown reply type in {:?}",
                &line[..line.len().min(80)]
            )))
        }
    })
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What `ROAM.DIGEST` answers for a database holding exactly `pairs`
/// (key, value), as 16 lowercase hex digits: the sum modulo 2^64, over the
/// keys, of SplitMix64's finaliser applied to FNV-1a 64 of
/// `le32(key length) || key || value` (see docs/workloads.md).
pub fn digest<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> String {
    let sum = pairs.into_iter().fold(0u64, |sum, (k, v)| {
        let len = u32::try_from(k.len()).expect("a key is shorter than 4 GiB");
        let h = fnv1a(fnv1a(0xcbf2_9ce4_8422_2325, &len.to_le_bytes()), k);
        sum.wrapping_add(mix64(fnv1a(h, v)))
    });
    format!("{sum:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Reply, RespError> {
        read_reply(&mut io::Cursor::new(bytes), 0)
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::ok());
        assert_eq!(parse(b"-ERR x\r\n").unwrap(), Reply::Error("ERR x".into()));
        assert_eq!(parse(b":-7\r\n").unwrap(), Reply::Int(-7));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::nil());
        assert_eq!(parse(b"$0\r\n\r\n").unwrap(), Reply::bulk(""));
        assert_eq!(parse(b"$3\r\na\r\n\r\n").unwrap(), Reply::bulk("a\r\n"));
        assert_eq!(
            parse(b"*2\r\n$1\r\nx\r\n*-1\r\n").unwrap(),
            Reply::Array(Some(vec![Reply::bulk("x"), Reply::Array(None)]))
        );
    }

    #[test]
    fn refuses_malformed_and_oversized_replies_before_allocating() {
        for bad in [
            &b"?x\r\n"[..],
            b"+OK\n",
            b":x\r\n",
            b"$-2\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*99999999\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(RespError::Protocol(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(parse(b""), Err(RespError::Closed)));
        assert!(matches!(parse(b"$5\r\nab"), Err(RespError::Closed)));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(matches!(
            parse(deep.as_bytes()),
            Err(RespError::Protocol(_))
        ));
    }

    #[test]
    fn encodes_a_multibulk_request() {
        assert_eq!(
            encode(&[b"SET", b"k", b""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn digest_is_order_independent_and_sensitive_to_every_byte() {
        let a = [(&b"k1"[..], &b"v1"[..]), (b"k2", b"v2")];
        let b = [(&b"k2"[..], &b"v2"[..]), (b"k1", b"v1")];
        assert_eq!(digest(a), digest(b));
        assert_eq!(digest([]), "0000000000000000");
        assert_ne!(
            digest(a),
            digest([(&b"k1"[..], &b"v1"[..]), (b"k2", b"v3")])
        );
        // The key length separates key from value.
        assert_ne!(
            digest([(&b"ab"[..], &b"c"[..])]),
            digest([(&b"a"[..], &b"bc"[..])])
        );
    }
}
