//! Plain HTTP/1.0 clients for the control APIs of nodes and planners: the
//! tests check status codes and bodies that the `roam` commands would hide,
//! so they speak the API themselves, one connection per request.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use super::text;

/// `GET path` over HTTP/1.0: status and body.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = connect(addr)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    response(s)
}

/// `POST path` with a JSON body over HTTP/1.0: status and body.
pub fn http_post(addr: &str, path: &str, body: &Value) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = connect(addr)?;
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    response(s)
}

/// `GET base/path` as JSON (`base` may start with `http://`), `None` on any
/// failure.
pub fn http_json(base: &str, path: &str) -> Option<Value> {
    let addr = base.trim_start_matches("http://");
    let (st, body) = http_get(addr, path).ok()?;
    (st == 200)
        .then(|| serde_json::from_slice(&body).ok())
        .flatten()
}

/// One HTTP/1.0 request with any method and a raw body, which must get an
/// answer: status and body.
pub fn http_raw(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let sa: SocketAddr = addr.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    // The server may answer (and close) before reading a refused body.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {}", text(&buf)));
    let head = text(&buf[..end]);
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, buf[end + 4..].to_vec())
}

/// A connection to `addr` (`ip:port`) that gives up on a silent server.
fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let sa: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
    let s = TcpStream::connect_timeout(&sa, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// Read the whole answer (the server closes): status and body.
fn response(mut s: TcpStream) -> std::io::Result<(u16, Vec<u8>)> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((status, buf[end + 4..].to_vec()))
}
