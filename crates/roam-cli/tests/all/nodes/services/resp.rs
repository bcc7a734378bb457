//! A minimal blocking RESP2 client: commands as arrays of bulk strings,
//! pipelining, every reply type.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// A connection.
pub(crate) struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

/// Longest bulk string or array accepted from the server.
const MAX_LEN: i64 = 64 << 20;

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

impl Conn {
    pub(crate) fn connect(addr: &str) -> std::io::Result<Conn> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Ok(Conn {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    /// This end's port.
    pub(crate) fn local_port(&self) -> u16 {
        self.w.local_addr().map_or(0, |a| a.port())
    }

    pub(crate) fn set_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.w.set_read_timeout(t)?;
        self.w.set_write_timeout(t)
    }

    fn encode<A: AsRef<[u8]>>(out: &mut Vec<u8>, args: &[A]) {
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            let a = a.as_ref();
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// Send one command and read its reply.
    pub(crate) fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Reply> {
        let mut buf = Vec::new();
        Conn::encode(&mut buf, args);
        self.w.write_all(&buf)?;
        self.read()
    }

    /// Send every command at once, then read their replies in order.
    pub(crate) fn pipeline<A: AsRef<[u8]>>(
        &mut self,
        cmds: &[Vec<A>],
    ) -> std::io::Result<Vec<Reply>> {
        let mut buf = Vec::new();
        for c in cmds {
            Conn::encode(&mut buf, c);
        }
        self.w.write_all(&buf)?;
        cmds.iter().map(|_| self.read()).collect()
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        if !l.ends_with("\r\n") {
            return Err(bad(format!("a reply line without CRLF: {l:?}")));
        }
        l.truncate(l.len() - 2);
        Ok(l)
    }

    fn len(s: &str) -> std::io::Result<i64> {
        let n: i64 = s.parse().map_err(|_| bad(format!("bad length {s:?}")))?;
        if n > MAX_LEN {
            return Err(bad(format!("length {n} is too large")));
        }
        Ok(n)
    }

    /// Read one reply.
    pub(crate) fn read(&mut self) -> std::io::Result<Reply> {
        let l = self.line()?;
        let (t, rest) = l.split_at(l.len().min(1));
        Ok(match t {
            "+" => Reply::Simple(rest.into()),
            "-" => Reply::Error(rest.into()),
            ":" => Reply::Int(
                rest.parse()
                    .map_err(|_| bad(format!("bad integer {rest:?}")))?,
            ),
            "$" => match Conn::len(rest)? {
                n if n < 0 => Reply::Bulk(None),
                n => {
                    let mut v = vec![0u8; n as usize + 2];
                    std::io::Read::read_exact(&mut self.r, &mut v)?;
                    if !v.ends_with(b"\r\n") {
                        return Err(bad("a bulk string without CRLF".into()));
                    }
                    v.truncate(n as usize);
                    Reply::Bulk(Some(v))
                }
            },
            "*" => match Conn::len(rest)? {
                n if n < 0 => Reply::Array(None),
                n => Reply::Array(Some((0..n).map(|_| self.read()).collect::<Result<_, _>>()?)),
            },
            _ => return Err(bad(format!("unknown reply {l:?}"))),
        })
    }
}
