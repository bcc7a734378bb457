//! Link emulation for roam's tests and benchmarks: rate limits, one-way
//! delay, cuts and corruption on loopback TCP.
//!
//! Live migration has to work over slow, long and unreliable links, and its
//! benchmarks must be reproducible on a machine without `netem`. This crate
//! emulates such links in user space, on top of tokio:
//!
//! * [`parse_rate`] reads rates the way `tc` writes them (`"10mbit"`).
//! * [`TokenBucket`] is the rate-limiting arithmetic, exact and clock-free.
//! * [`Shaped`] rate-limits any [`tokio::io::AsyncWrite`].
//! * [`LinkProxy`] forwards TCP connections through a link with a rate and
//!   a delay per direction, and its [`LinkHandle`] cuts connections,
//!   corrupts a byte at a chosen offset and counts the bytes forwarded.
//!
//! Kernel-level shaping with network namespaces is described in
//! `docs/network-emulation.md`; it gives real TCP behaviour but needs root.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use roam_link::*;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tokio::net::{TcpListener, TcpStream};
//!
//! let server = TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let link = LinkConfig::symmetric(parse_rate("100mbit").unwrap(), Duration::from_millis(5));
//! let proxy = LinkProxy::start("127.0.0.1:0".parse().unwrap(),
//!                              server.local_addr().unwrap(), link).await.unwrap();
//! let mut client = TcpStream::connect(proxy.local_addr()).await.unwrap();
//! let (mut accepted, _) = server.accept().await.unwrap();
//! client.write_all(b"snapshot").await.unwrap();
//! let mut got = [0u8; 8];
//! accepted.read_exact(&mut got).await.unwrap();
//! assert_eq!(&got, b"snapshot");
//! assert_eq!(proxy.handle().bytes_forwarded(Direction::ClientToServer), 8);
//! proxy.shutdown().await;
//! # }
//! ```

#![deny(missing_docs)]

mod bucket;
mod config;
mod control;
mod pipe;
mod proxy;
mod rate;
mod shaped;

pub use bucket::TokenBucket;
pub use config::{Direction, DirectionConfig, LinkConfig};
pub use control::{AfterCut, LinkHandle};
pub use proxy::{LinkError, LinkProxy};
pub use rate::{parse_rate, Rate, RateParseError};
pub use shaped::Shaped;
