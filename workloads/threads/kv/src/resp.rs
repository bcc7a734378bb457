//! RESP2: parsing requests (multibulk and inline) and encoding replies.
//!
//! The parser works on a connection's input buffer as it is: it either finds
//! one complete request at the front (and says how many bytes it took), or
//! says more input is needed, or finds a protocol error. Arguments are
//! slices of the buffer, so a request is never copied. The limits are
//! kvserver's (docs/workloads.md, "Limits"): they bound what one client can
//! make the server buffer.

/// Largest argument (bulk string) of a request.
pub const MAX_BULK: usize = 64 << 20;
/// Most arguments in one request.
pub const MAX_ARGS: i64 = 1 << 20;
/// Largest request, in bytes.
pub const MAX_QUERY: usize = 128 << 20;
/// Longest inline request line.
pub const MAX_INLINE: usize = 64 << 10;

/// What [`parse`] found at the front of the input.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    /// One request, this many bytes long; its arguments are in `argv`
    /// (none for an empty line or `*0`, which are skipped).
    Done(usize),
    /// The request is not complete yet.
    More,
    /// Malformed: the text of the error (after `-ERR `); the connection is
    /// then closed, as Redis does, since the stream cannot be resynchronised.
    Error(&'static str),
}

/// Parses a whole argument as a signed 64-bit decimal, like Redis: no
/// spaces, no `+`, no leading zeros, no `-0`.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || (digits[0] == b'0' && (neg || digits.len() > 1)) {
        return None;
    }
    let mut v: i128 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i128::from(d - b'0');
    }
    i64::try_from(if neg { -v } else { v }).ok()
}

/// Reads `<integer>\r\n` at the front of `p`: `Ok(Some((value, length
/// including CRLF)))`, `Ok(None)` if incomplete, `Err` if malformed.
fn num_line(p: &[u8]) -> Result<Option<(i64, usize)>, ()> {
    let Some(nl) = p.iter().position(|&b| b == b'\n') else {
        return if p.len() > 32 { Err(()) } else { Ok(None) };
    };
    if nl == 0 || p[nl - 1] != b'\r' {
        return Err(());
    }
    let v = parse_i64(&p[..nl - 1]).ok_or(())?;
    Ok(Some((v, nl + 1)))
}

/// Parses one request at the front of `input` (not empty) into `argv`.
pub fn parse<'a>(input: &'a [u8], argv: &mut Vec<&'a [u8]>) -> Parse {
    argv.clear();
    if input.first() == Some(&b'*') {
        let (n, len) = match num_line(&input[1..]) {
            Ok(Some(x)) => x,
            Ok(None) => return Parse::More,
            Err(()) => return Parse::Error("Protocol error: invalid multibulk length"),
        };
        if n > MAX_ARGS {
            return Parse::Error("Protocol error: invalid multibulk length");
        }
        let mut p = 1 + len;
        for _ in 0..n.max(0) {
            match input.get(p) {
                None => return Parse::More,
                Some(b'$') => {}
                Some(_) => return Parse::Error("Protocol error: expected '$'"),
            }
            let (blen, len) = match num_line(&input[p + 1..]) {
                Ok(Some(x)) => x,
                Ok(None) => return Parse::More,
                Err(()) => return Parse::Error("Protocol error: invalid bulk length"),
            };
            let Some(blen) = usize::try_from(blen).ok().filter(|&b| b <= MAX_BULK) else {
                return Parse::Error("Protocol error: invalid bulk length");
            };
            p += 1 + len;
            if input.len() - p < blen + 2 {
                return Parse::More;
            }
            if &input[p + blen..p + blen + 2] != b"\r\n" {
                return Parse::Error("Protocol error: bulk not followed by CRLF");
            }
            argv.push(&input[p..p + blen]);
            p += blen + 2;
        }
        return Parse::Done(p);
    }
    // Inline: one line of words separated by spaces or tabs, no quoting
    // (what `PING\r\n` typed into telnet, or redis-benchmark's
    // PING_INLINE, sends).
    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
        return if input.len() > MAX_INLINE {
            Parse::Error("Protocol error: too big inline request")
        } else {
            Parse::More
        };
    };
    if nl > MAX_INLINE {
        return Parse::Error("Protocol error: too big inline request");
    }
    let line = input[..nl].strip_suffix(b"\r").unwrap_or(&input[..nl]);
    argv.extend(
        line.split(|&b| b == b' ' || b == b'\t')
            .filter(|w| !w.is_empty()),
    );
    Parse::Done(nl + 1)
}

/// Appends the decimal form of `v`.
fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

/// Reply encoders: each appends one RESP2 value to `out`.
pub mod reply {
    use super::push_int;

    /// `+OK`
    pub fn ok(out: &mut Vec<u8>) {
        out.extend_from_slice(b"+OK\r\n");
    }

    /// A simple string, `+s`.
    pub fn simple(out: &mut Vec<u8>, s: &str) {
        out.push(b'+');
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// An error, `-msg` (`msg` starts with its code, e.g. `ERR`).
    pub fn error(out: &mut Vec<u8>, msg: &str) {
        out.push(b'-');
        out.extend_from_slice(msg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// An integer, `:v`.
    pub fn int(out: &mut Vec<u8>, v: i64) {
        out.push(b':');
        push_int(out, v);
        out.extend_from_slice(b"\r\n");
    }

    /// A bulk string.
    pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
        out.push(b'$');
        push_int(out, b.len() as i64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
    }

    /// The nil bulk string, `$-1`.
    pub fn nil(out: &mut Vec<u8>) {
        out.extend_from_slice(b"$-1\r\n");
    }

    /// The header of an array of `n` values (the values follow).
    pub fn array(out: &mut Vec<u8>, n: usize) {
        out.push(b'*');
        push_int(out, n as i64);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(input: &[u8]) -> (Parse, Vec<Vec<u8>>) {
        let mut argv = Vec::new();
        let r = parse(input, &mut argv);
        (r, argv.iter().map(|a| a.to_vec()).collect())
    }

    #[test]
    fn multibulk_inline_and_pipelines() {
        let req = b"*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n*1\r\n$4\r\nPING\r\n";
        let (r, a) = args(req);
        assert_eq!(r, Parse::Done(23));
        assert_eq!(a, [b"GET".to_vec(), b"a\r\nb".to_vec()]);
        for cut in 0..23 {
            assert_eq!(args(&req[..cut]).0, Parse::More, "cut at {cut}");
        }
        let (r, a) = args(b"ECHO  hi\tthere\r\nPING\r\n");
        assert_eq!(r, Parse::Done(16));
        assert_eq!(a, [b"ECHO".to_vec(), b"hi".to_vec(), b"there".to_vec()]);
        assert_eq!(args(b"\r\n"), (Parse::Done(2), vec![]));
    }

    #[test]
    fn protocol_errors() {
        assert!(matches!(args(b"*1\r\n$x\r\n").0, Parse::Error(_)));
        assert!(matches!(args(b"*1\r\n+x\r\n").0, Parse::Error(_)));
        assert!(matches!(args(b"*2000000\r\n").0, Parse::Error(_)));
        assert!(matches!(args(b"*1\r\n$67108865\r\n").0, Parse::Error(_)));
        assert!(matches!(args(b"*1\r\n$1\r\nab\r\n").0, Parse::Error(_)));
        assert!(matches!(args(&[b'a'; MAX_INLINE + 1]).0, Parse::Error(_)));
    }

    #[test]
    fn integers_as_redis_reads_them() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-5"), Some(-5));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"01",
            b"-0",
            b"+1",
            b" 1",
            b"1.5",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_i64(bad), None, "{bad:?}");
        }
        let mut out = Vec::new();
        reply::int(&mut out, i64::MIN);
        assert_eq!(out, b":-9223372036854775808\r\n");
    }
}
