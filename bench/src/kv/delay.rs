//! A TCP forwarder with a one-way delay that can change while it runs.
//!
//! Why it exists: T7 moves a user between two edges, so the delay between
//! the client side and each node must change over time, on loopback, with
//! no `netem`. `roam-link`'s proxy fixes its delay when it starts; this one
//! reads the delay (shared, in microseconds) each time it forwards a chunk.
//! Every chunk read at `t` is written at `t + delay` (the delay current when
//! it is written), in order; bandwidth is not limited.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running forwarder; stops accepting when dropped.
pub struct DelayProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    delay_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl DelayProxy {
    /// Forward connections on a fresh loopback port to `target`, each way
    /// delayed by `delay`.
    pub fn start(target: SocketAddr, delay: Duration) -> std::io::Result<DelayProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let delay_us = Arc::new(AtomicU64::new(delay.as_micros() as u64));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (delay_us.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(target) {
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            pump(&client, &server, d.clone());
                            pump(&server, &client, d.clone());
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(DelayProxy {
            addr,
            delay_us,
            stop,
        })
    }

    /// Change the one-way delay for bytes forwarded from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copy `from` -> `to` through a delay line (a reader and a writer thread).
fn pump(from: &TcpStream, to: &TcpStream, delay_us: Arc<AtomicU64>) {
    let (Ok(mut r), Ok(mut w)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (at, bytes) in rx {
            let due = at + Duration::from_micros(delay_us.load(Ordering::Relaxed));
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if w.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = w.shutdown(Shutdown::Write);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_in_order_with_the_current_delay() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let p = DelayProxy::start(target, Duration::from_millis(30)).unwrap();
        let mut c = TcpStream::connect(p.addr).unwrap();
        let t = Instant::now();
        c.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        assert!(
            t.elapsed() >= Duration::from_millis(60),
            "{:?}",
            t.elapsed()
        );
        p.set_delay(Duration::ZERO);
        c.write_all(b"again").unwrap();
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"again");
    }
}
