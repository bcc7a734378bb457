//! End-to-end tests of the proxy on loopback: exact forwarding, cuts,
//! corruption, delay, bounded buffering and shutdown.
//!
//! Timing assertions are lower bounds (a link may never be faster than
//! configured) with generous upper bounds, because this runs on small,
//! loaded CI machines; the exact arithmetic is tested in virtual time in the
//! unit tests.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use roam_link::{parse_rate, AfterCut, Direction, LinkConfig, LinkProxy, Rate};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const C2S: Direction = Direction::ClientToServer;
const S2C: Direction = Direction::ServerToClient;
const LIMIT: Duration = Duration::from_secs(30);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Deterministic, incompressible-looking test data.
fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

/// A server that echoes every connection until the client closes it.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A proxy in front of a bare listener, plus the listener, so a test holds
/// both ends.
async fn proxy_to_listener(config: LinkConfig) -> (LinkProxy, TcpListener) {
    let server = TcpListener::bind(loopback()).await.unwrap();
    let proxy = LinkProxy::start(loopback(), server.local_addr().unwrap(), config)
        .await
        .unwrap();
    (proxy, server)
}

async fn connect_pair(proxy: &LinkProxy, server: &TcpListener) -> (TcpStream, TcpStream) {
    let client = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let (accepted, _) = timeout(LIMIT, server.accept()).await.unwrap().unwrap();
    (client, accepted)
}

/// Reads until end of stream or error; returns what arrived and how it ended.
async fn read_to_end(s: &mut TcpStream) -> (Vec<u8>, io::Result<()>) {
    let mut got = Vec::new();
    let end = timeout(LIMIT, s.read_to_end(&mut got))
        .await
        .unwrap()
        .map(|_| ());
    (got, end)
}

/// Sends `payload` through an echo and checks it comes back intact.
async fn round_trip(addr: SocketAddr, payload: &[u8]) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let to_send = payload.to_vec();
    let sender = tokio::spawn(async move {
        w.write_all(&to_send).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    timeout(LIMIT, r.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    sender.await.unwrap();
    assert!(
        back == payload,
        "echo differs ({} vs {} bytes)",
        back.len(),
        payload.len()
    );
}

#[tokio::test]
async fn forwards_both_directions_exactly() {
    let echo = echo_server().await;
    for config in [
        LinkConfig::transparent(),
        LinkConfig::symmetric(parse_rate("400mbit").unwrap(), Duration::from_millis(3)),
        // A tiny in-flight bound forces many small chunks and back-pressure.
        LinkConfig {
            max_in_flight: Some(1000),
            ..LinkConfig::transparent()
        },
    ] {
        let proxy = LinkProxy::start(loopback(), echo, config).await.unwrap();
        let payload = data(3 << 20, 1);
        round_trip(proxy.local_addr(), &payload).await;
        round_trip(proxy.local_addr(), b"").await;
        let handle = proxy.handle();
        assert_eq!(handle.bytes_forwarded(C2S), payload.len() as u64);
        assert_eq!(handle.bytes_forwarded(S2C), payload.len() as u64);
        assert_eq!(handle.connections_accepted(), 2);
        assert_eq!(handle.bytes_corrupted(C2S), 0);
        proxy.shutdown().await;
        assert_eq!(handle.connections_active(), 0);
    }
}

#[tokio::test]
async fn half_close_is_propagated() {
    let (proxy, server) = proxy_to_listener(LinkConfig::transparent()).await;
    let (mut client, mut accepted) = connect_pair(&proxy, &server).await;
    client.write_all(b"request").await.unwrap();
    client.shutdown().await.unwrap();
    let (got, end) = read_to_end(&mut accepted).await;
    assert_eq!((got.as_slice(), end.is_ok()), (&b"request"[..], true));
    // The other direction is still open.
    accepted.write_all(b"reply").await.unwrap();
    drop(accepted);
    let (got, end) = read_to_end(&mut client).await;
    assert_eq!((got.as_slice(), end.is_ok()), (&b"reply"[..], true));
    proxy.shutdown().await;
}

/// Whether `s` sees the connection as closed: end of file or a reset.
async fn sees_closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match timeout(LIMIT, s.read(&mut buf))
            .await
            .expect("peer never saw the cut")
        {
            Ok(0) | Err(_) => return true,
            // Bytes that were already delivered before the cut.
            Ok(_) => continue,
        }
    }
}

#[tokio::test]
async fn cut_closes_both_sides_and_refuse_holds_until_restore() {
    let (proxy, server) = proxy_to_listener(LinkConfig::transparent()).await;
    let handle = proxy.handle();
    let (mut client, mut accepted) = connect_pair(&proxy, &server).await;
    client.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    accepted.read_exact(&mut buf).await.unwrap();

    handle.cut(AfterCut::Accept);
    assert!(sees_closed(&mut client).await);
    assert!(sees_closed(&mut accepted).await);
    // Writing into a reset connection fails sooner or later.
    let mut failed = false;
    for _ in 0..100 {
        if client.write_all(&[0; 4096]).await.is_err() {
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(failed, "writes into a cut connection kept succeeding");

    // After a plain cut, reconnecting works.
    let (mut client, mut accepted) = connect_pair(&proxy, &server).await;
    client.write_all(b"again").await.unwrap();
    let mut buf = [0u8; 5];
    accepted.read_exact(&mut buf).await.unwrap();

    // A partition: current connection dies, new ones are reset on arrival.
    handle.cut(AfterCut::Refuse);
    assert!(handle.is_refusing());
    assert!(sees_closed(&mut client).await);
    assert!(sees_closed(&mut accepted).await);
    let mut refused = TcpStream::connect(proxy.local_addr()).await.unwrap();
    assert!(sees_closed(&mut refused).await);
    assert_eq!(handle.connections_refused(), 1);
    // Nothing reached the server.
    assert!(timeout(Duration::from_millis(100), server.accept())
        .await
        .is_err());

    handle.restore();
    let (mut client, mut accepted) = connect_pair(&proxy, &server).await;
    client.write_all(b"back").await.unwrap();
    let mut buf = [0u8; 4];
    accepted.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"back");
    assert_eq!(handle.connections_accepted(), 3);
    proxy.shutdown().await;
}

/// Sends `len` bytes client to server on a fresh connection and returns
/// what the server received.
async fn send_through(proxy: &LinkProxy, server: &TcpListener, payload: &[u8]) -> Vec<u8> {
    let (mut client, mut accepted) = connect_pair(proxy, server).await;
    let to_send = payload.to_vec();
    let sender = tokio::spawn(async move {
        client.write_all(&to_send).await.unwrap();
        client.shutdown().await.unwrap();
        client
    });
    let (got, end) = read_to_end(&mut accepted).await;
    end.unwrap();
    drop(sender.await.unwrap());
    got
}

fn differing_offsets(a: &[u8], b: &[u8]) -> Vec<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i)
        .collect()
}

#[tokio::test]
async fn corruption_flips_exactly_one_byte_at_the_offset() {
    let (proxy, server) = proxy_to_listener(LinkConfig::transparent()).await;
    let handle = proxy.handle();
    let payload = data(300_000, 2);

    // Offsets at the start, inside and at the last byte of the stream.
    for offset in [0u64, 123_457, 299_999] {
        handle.corrupt_after(C2S, offset);
        let got = send_through(&proxy, &server, &payload).await;
        assert_eq!(differing_offsets(&payload, &got), vec![offset as usize]);
        assert_eq!(got[offset as usize], !payload[offset as usize]);
        // One-shot: the next connection is clean.
        assert_eq!(send_through(&proxy, &server, &payload).await, payload);
    }
    assert_eq!(handle.bytes_corrupted(C2S), 3);

    // Beyond the end of the stream: nothing happens, and the plan is spent.
    handle.corrupt_after(C2S, 1 << 40);
    assert_eq!(send_through(&proxy, &server, &payload).await, payload);

    // Every connection until cleared.
    handle.corrupt_each_after(C2S, 42);
    for _ in 0..2 {
        let got = send_through(&proxy, &server, &payload).await;
        assert_eq!(differing_offsets(&payload, &got), vec![42]);
    }
    handle.clear_corruption(C2S);
    assert_eq!(send_through(&proxy, &server, &payload).await, payload);
    assert_eq!(handle.bytes_corrupted(C2S), 5);
    assert_eq!(handle.bytes_corrupted(S2C), 0);
    proxy.shutdown().await;
}

#[tokio::test]
async fn corruption_applies_to_the_chosen_direction_only() {
    let echo = echo_server().await;
    let proxy = LinkProxy::start(loopback(), echo, LinkConfig::transparent())
        .await
        .unwrap();
    proxy.handle().corrupt_after(S2C, 1000);
    let payload = data(5000, 3);
    let mut s = TcpStream::connect(proxy.local_addr()).await.unwrap();
    s.write_all(&payload).await.unwrap();
    s.shutdown().await.unwrap();
    let (back, end) = read_to_end(&mut s).await;
    end.unwrap();
    assert_eq!(differing_offsets(&payload, &back), vec![1000]);
    assert_eq!(proxy.handle().bytes_corrupted(S2C), 1);
    assert_eq!(proxy.handle().bytes_corrupted(C2S), 0);
    proxy.shutdown().await;
}

/// Median of a few ping-pong round trips of one byte through `addr`.
async fn ping_pong(addr: SocketAddr, rounds: usize) -> Duration {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut times = Vec::new();
    for i in 0..rounds {
        let start = Instant::now();
        s.write_all(&[i as u8]).await.unwrap();
        let mut b = [0u8; 1];
        timeout(LIMIT, s.read_exact(&mut b)).await.unwrap().unwrap();
        assert_eq!(b[0], i as u8);
        times.push(start.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

#[tokio::test]
async fn delay_adds_the_latency_to_each_round_trip() {
    let echo = echo_server().await;
    let one_way = Duration::from_millis(40);
    let config = LinkConfig::symmetric(Rate::UNLIMITED, one_way);
    let proxy = LinkProxy::start(loopback(), echo, config).await.unwrap();
    let rtt = ping_pong(proxy.local_addr(), 5).await;
    assert!(
        rtt >= 2 * one_way,
        "round trip {rtt:?} is shorter than twice {one_way:?}"
    );
    assert!(
        rtt < 2 * one_way + Duration::from_secs(2),
        "round trip {rtt:?} far too long"
    );
    proxy.shutdown().await;

    // Asymmetric: only the return path is slow.
    let mut config = LinkConfig::transparent();
    config.server_to_client.delay = Duration::from_millis(60);
    let proxy = LinkProxy::start(loopback(), echo, config).await.unwrap();
    let rtt = ping_pong(proxy.local_addr(), 3).await;
    assert!(rtt >= Duration::from_millis(60), "round trip {rtt:?}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn delay_does_not_reduce_the_bandwidth() {
    // 4 MiB with 100 ms of one-way delay and no rate limit: if each chunk
    // waited its own delay in turn this would take minutes.
    let (proxy, server) = proxy_to_listener(LinkConfig::symmetric(
        Rate::UNLIMITED,
        Duration::from_millis(100),
    ))
    .await;
    let payload = data(4 << 20, 4);
    let start = Instant::now();
    assert_eq!(send_through(&proxy, &server, &payload).await, payload);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(100), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    proxy.shutdown().await;
}

/// The one coarse real-time check of the rate limit through real sockets
/// (the exact arithmetic is tested in virtual time).
#[tokio::test]
async fn rate_limit_holds_over_a_real_transfer() {
    let rate = parse_rate("10mbit").unwrap();
    let (proxy, server) = proxy_to_listener(LinkConfig::symmetric(rate, Duration::ZERO)).await;
    let payload = data(2 << 20, 5);
    let start = Instant::now();
    assert_eq!(send_through(&proxy, &server, &payload).await, payload);
    let took = start.elapsed().as_secs_f64();
    let ideal = (2 << 20) as f64 * 8.0 / 10e6; // 1.68 s
                                               // Never faster than the link (minus the initial burst); slower only by
                                               // what a loaded machine adds.
    assert!(took >= ideal * 0.85, "{took:.3} s is faster than 10 Mbit/s");
    assert!(
        took <= ideal * 2.0,
        "{took:.3} s is far slower than 10 Mbit/s"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn a_slow_receiver_does_not_make_the_proxy_buffer_everything() {
    let config = LinkConfig {
        max_in_flight: Some(64 << 10),
        ..LinkConfig::transparent()
    };
    let (proxy, server) = proxy_to_listener(config).await;
    let (client, _accepted_but_never_read) = connect_pair(&proxy, &server).await;
    let (_r, mut w) = client.into_split();
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0usize;
    // Write until the writes block for a while: everything the proxy and
    // the kernel buffer together is then in `written`.
    while let Ok(Ok(())) = timeout(Duration::from_millis(500), w.write_all(&chunk)).await {
        written += chunk.len();
        assert!(
            written < 256 << 20,
            "the proxy accepted 256 MiB for a receiver that never reads"
        );
    }
    let forwarded = proxy.handle().bytes_forwarded(C2S);
    assert!(
        forwarded < 64 << 20,
        "forwarded {forwarded} bytes to a receiver that never reads"
    );
    proxy.shutdown().await;
}

#[tokio::test]
async fn shutdown_resets_open_connections_and_stops_listening() {
    let (proxy, server) = proxy_to_listener(LinkConfig::transparent()).await;
    let handle = proxy.handle();
    let addr = proxy.local_addr();
    let (mut client, mut accepted) = connect_pair(&proxy, &server).await;
    assert_eq!(handle.connections_active(), 1);
    timeout(LIMIT, proxy.shutdown())
        .await
        .expect("shutdown hung");
    assert_eq!(handle.connections_active(), 0);
    assert!(sees_closed(&mut client).await);
    assert!(sees_closed(&mut accepted).await);
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
}

#[tokio::test]
async fn an_unreachable_target_resets_the_client() {
    // Bind then drop, so nothing listens on the target port.
    let target = TcpListener::bind(loopback())
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = LinkProxy::start(loopback(), target, LinkConfig::transparent())
        .await
        .unwrap();
    let mut client = TcpStream::connect(proxy.local_addr()).await.unwrap();
    assert!(sees_closed(&mut client).await);
    assert_eq!(proxy.handle().target_connect_failures(), 1);
    proxy.shutdown().await;
}

#[tokio::test]
async fn binding_a_busy_address_is_a_precise_error() {
    let busy = TcpListener::bind(loopback()).await.unwrap();
    let addr = busy.local_addr().unwrap();
    let err = LinkProxy::start(addr, addr, LinkConfig::transparent())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("cannot listen on {addr}: ")),
        "{err}"
    );
}
