//! The accept loop's caps, over plain TCP: a client that sends its request
//! head too slowly is cut off, and at the connection cap a new client waits
//! until an open connection closes.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{serve, ConnLimits, Peer};

/// Serve a route answering the caller's address under `limits`; the
/// address.
async fn start(limits: ConnLimits) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = Router::new().route(
        "/who",
        get(
            |axum::extract::ConnectInfo(p): axum::extract::ConnectInfo<Peer>| async move {
                p.addr.to_string()
            },
        ),
    );
    tokio::spawn(serve(l, app, limits, std::future::pending()));
    addr
}

/// Send one request on `s` and read until the answer's body; the answer.
async fn ask(s: &mut TcpStream) -> String {
    s.write_all(b"GET /who HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    answer(s).await
}

/// Read until an answer's body (the caller's address) has come.
async fn answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("127.0.0.1:") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before answering");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_request_head_sent_too_slowly_is_cut_off() {
    let addr = start(ConnLimits {
        header_timeout: Duration::from_millis(300),
        ..ConnLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let answer = ask(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Then half a head, and nothing more: the server closes (with or
    // without a 408 first) instead of waiting for ever.
    s.write_all(b"GET /who HTTP/1.1\r\nhos").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the slow client is still connected after 5 s"
    );
}

#[tokio::test]
async fn at_the_connection_cap_a_new_client_waits_for_a_free_slot() {
    let addr = start(ConnLimits {
        max_connections: 2,
        ..ConnLimits::default()
    })
    .await;
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    ask(&mut a).await;
    ask(&mut b).await;
    // A third connects (the kernel's backlog takes it) but is not served
    // while a and b stay open.
    let mut c = TcpStream::connect(addr).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(800), ask(&mut c)).await;
    assert!(
        waiting.is_err(),
        "a third connection was served at a cap of 2"
    );
    drop(a);
    let served = tokio::time::timeout(Duration::from_secs(5), answer(&mut c)).await;
    assert!(
        served.is_ok(),
        "the third was not served once a slot was free"
    );
}
