//! `--listen`: a cell serves real TCP clients directly, without a gateway.
//!
//! The cell itself never owns a socket (its connections are plain data in
//! its OS state, see `roam_wasi::net`); this backend owns the host sockets
//! and pumps bytes between them and the cell's [`NetHub`]:
//!
//! - one thread per listener accepts clients and opens them in the hub;
//! - per connection, a reader delivers client bytes, never more than the
//!   window beyond what the program has consumed (so a fast client is held
//!   back by TCP, and memory stays bounded), and a writer sends the cell's
//!   output and confirms it delivered;
//! - one pump thread drains `take_outgoing` whenever the hub notifies.
//!
//! Client EOF becomes `peer_eof`, a broken connection `peer_reset`. On a
//! restore nothing of the old clients survives (their sockets died with the
//! old process): the hub's `reset_all` reports every restored connection to
//! the program as reset, and listeners are re-bound by position.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use roam_wasi::net::{ConnId, NetError, NetHub, NetOut};

/// Largest single read from a client.
const READ_CHUNK: usize = 64 * 1024;

/// Why `--listen` could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// The address could not be bound.
    #[error("--listen {addr}: cannot listen there: {source}; pick a free port or another address")]
    Bind {
        /// The address as given.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A restore got a different number of `--listen` than the snapshot has listeners.
    #[error("the snapshot has {have} listener(s) ({labels}) but --listen was given {given} time(s); give one --listen per listener, in the same order (listeners are matched by position)")]
    CountMismatch {
        /// Listeners in the snapshot.
        have: usize,
        /// Their labels (the addresses they had), comma-separated.
        labels: String,
        /// `--listen` flags given.
        given: usize,
    },
}

/// Bind every `--listen` address, in order.
pub fn bind(addrs: &[String]) -> Result<Vec<TcpListener>, ListenError> {
    addrs
        .iter()
        .map(|a| {
            TcpListener::bind(a.as_str()).map_err(|source| ListenError::Bind {
                addr: a.clone(),
                source,
            })
        })
        .collect()
}

/// The labels of freshly bound listeners: their actual addresses (so
/// `127.0.0.1:0` becomes the port the system picked).
pub fn labels(sockets: &[TcpListener]) -> Vec<String> {
    sockets
        .iter()
        .map(|s| {
            s.local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into())
        })
        .collect()
}

/// Pair the listeners of a restored hub with the new sockets, by position,
/// and apply the standalone restore rule (every connection is reset).
pub fn reattach(
    hub: &NetHub,
    sockets: Vec<TcpListener>,
) -> Result<Vec<(String, TcpListener)>, ListenError> {
    let labels = hub.listeners();
    if labels.len() != sockets.len() {
        return Err(ListenError::CountMismatch {
            have: labels.len(),
            labels: if labels.is_empty() {
                "none".into()
            } else {
                labels.join(", ")
            },
            given: sockets.len(),
        });
    }
    hub.reset_all();
    Ok(labels.into_iter().zip(sockets).collect())
}

/// What the pump hands a connection's writer.
enum Out {
    Data(u64, Vec<u8>),
    Shutdown,
    Close,
}

struct Conn {
    id: ConnId,
    stream: TcpStream,
    /// Client bytes the program has consumed (from `NetOut::Consumed`).
    consumed: Mutex<u64>,
    consumed_cv: Condvar,
    out: Mutex<VecDeque<Out>>,
    out_cv: Condvar,
    /// The connection is finished here (closed or broken): stop reading.
    done: AtomicBool,
}

struct Backend {
    hub: Arc<NetHub>,
    window: u64,
    conns: Mutex<HashMap<ConnId, Arc<Conn>>>,
    wake: Mutex<bool>,
    wake_cv: Condvar,
    next_id: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running backend of a cell's listeners.
pub struct Serving {
    hub: Arc<NetHub>,
}

impl Serving {
    /// The program exited: give clients the output it wrote, as an OS does
    /// for a process that exits with data in its sockets, waiting at most
    /// `limit` for slow readers. The sockets close when roam exits.
    pub fn flush(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let pending = self.hub.state().conns.iter().any(|c| !c.tx.is_empty());
            if !pending {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!("some clients did not read all the output within {limit:?}; it is dropped");
    }
}

/// Serve `listeners` (label, socket) for the cell behind `hub`, on
/// background threads that live as long as the process.
pub fn serve(hub: Arc<NetHub>, listeners: Vec<(String, TcpListener)>) -> Serving {
    // Fresh ids start above every restored connection's.
    let first = hub
        .resume_points()
        .iter()
        .map(|r| r.conn + 1)
        .max()
        .unwrap_or(1);
    let b = Arc::new(Backend {
        window: hub.window(),
        hub,
        conns: Mutex::new(HashMap::new()),
        wake: Mutex::new(true),
        wake_cv: Condvar::new(),
        next_id: AtomicU64::new(first),
    });
    let w = b.clone();
    b.hub.set_notify(Arc::new(move || w.wake()));
    let p = b.clone();
    std::thread::spawn(move || p.pump());
    for (label, sock) in listeners {
        let a = b.clone();
        std::thread::spawn(move || a.accept_loop(&label, sock));
    }
    Serving { hub: b.hub.clone() }
}

impl Backend {
    fn wake(&self) {
        *lock(&self.wake) = true;
        self.wake_cv.notify_one();
    }

    fn accept_loop(self: Arc<Self>, label: &str, sock: TcpListener) {
        for stream in sock.incoming() {
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(listener = label, "accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let Ok(reader) = stream.try_clone() else {
                continue;
            };
            let conn = Arc::new(Conn {
                id,
                stream,
                consumed: Mutex::new(0),
                consumed_cv: Condvar::new(),
                out: Mutex::new(VecDeque::new()),
                out_cv: Condvar::new(),
                done: AtomicBool::new(false),
            });
            lock(&self.conns).insert(id, conn.clone());
            if let Err(e) = self.hub.open(label, id, &peer) {
                // The client sees its connection closed at once.
                tracing::warn!(listener = label, %peer, "client refused: {e}");
                lock(&self.conns).remove(&id);
                continue;
            }
            let r = self.clone();
            let rc = conn.clone();
            std::thread::spawn(move || r.read_loop(&rc, reader));
            let w = self.clone();
            std::thread::spawn(move || w.write_loop(&conn));
        }
    }

    /// Client -> cell, within the window.
    fn read_loop(&self, c: &Conn, mut stream: TcpStream) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut off: u64 = 0;
        loop {
            let room = {
                let mut g = lock(&c.consumed);
                while *g + self.window <= off {
                    if c.done.load(Ordering::SeqCst) {
                        return;
                    }
                    g = c
                        .consumed_cv
                        .wait_timeout(g, Duration::from_millis(200))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                (*g + self.window - off) as usize
            };
            let n = match stream.read(&mut buf[..room.min(READ_CHUNK)]) {
                Ok(0) => {
                    let _ = self.hub.peer_eof(c.id, off);
                    return;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.gone(c.id);
                    return;
                }
            };
            match self.hub.deliver(c.id, off, &buf[..n]) {
                Ok(()) => off += n as u64,
                Err(NetError::UnknownConn(_)) => return,
                Err(e) => {
                    tracing::warn!(conn = c.id, "dropping the client: {e}");
                    self.gone(c.id);
                    return;
                }
            }
        }
    }

    /// Cell -> client, in order, confirming each chunk once written.
    fn write_loop(&self, c: &Conn) {
        let mut stream = &c.stream;
        loop {
            let item = {
                let mut q = lock(&c.out);
                loop {
                    if let Some(i) = q.pop_front() {
                        break i;
                    }
                    q = c.out_cv.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            match item {
                Out::Data(offset, bytes) => {
                    if stream.write_all(&bytes).is_err() {
                        self.gone(c.id);
                        return;
                    }
                    let _ = self.hub.delivered(c.id, offset + bytes.len() as u64);
                    // Output held back by the window may go now.
                    self.wake();
                }
                Out::Shutdown => {
                    let _ = c.stream.shutdown(Shutdown::Write);
                }
                Out::Close => {
                    c.done.store(true, Ordering::SeqCst);
                    let _ = c.stream.shutdown(Shutdown::Both);
                    lock(&self.conns).remove(&c.id);
                    c.consumed_cv.notify_all();
                    return;
                }
            }
        }
    }

    /// The client's connection broke: tell the cell, and stop reading it.
    fn gone(&self, id: ConnId) {
        self.hub.peer_reset(id);
        if let Some(c) = lock(&self.conns).get(&id) {
            c.done.store(true, Ordering::SeqCst);
            let _ = c.stream.shutdown(Shutdown::Both);
            c.consumed_cv.notify_all();
        }
    }

    /// Drain the hub whenever it has news; route each item to its connection.
    fn pump(&self) {
        loop {
            {
                let mut g = lock(&self.wake);
                while !*g {
                    g = self
                        .wake_cv
                        .wait_timeout(g, Duration::from_millis(500))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                *g = false;
            }
            for o in self.hub.take_outgoing() {
                let (id, item) = match o {
                    NetOut::Data {
                        conn,
                        offset,
                        bytes,
                    } => (conn, Out::Data(offset, bytes)),
                    NetOut::Consumed { conn, offset } => {
                        if let Some(c) = lock(&self.conns).get(&conn) {
                            *lock(&c.consumed) = offset;
                            c.consumed_cv.notify_all();
                        }
                        continue;
                    }
                    NetOut::Shutdown { conn, .. } => (conn, Out::Shutdown),
                    NetOut::Closed { conn } => (conn, Out::Close),
                };
                // Connections restored from a snapshot have no socket here.
                if let Some(c) = lock(&self.conns).get(&id) {
                    lock(&c.out).push_back(item);
                    c.out_cv.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Wait (bounded) until `f` holds.
    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !f() {
            assert!(Instant::now() < deadline, "{what}: not within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_fast_client_is_held_back_by_the_window() {
        let sock = TcpListener::bind("127.0.0.1:0").unwrap();
        let label = labels(std::slice::from_ref(&sock)).remove(0);
        let hub = NetHub::new(std::slice::from_ref(&label));
        let _serving = serve(hub.clone(), vec![(label.clone(), sock)]);
        let mut client = TcpStream::connect(label.as_str()).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        // Far more than the window and the kernel's socket buffers.
        let t = std::thread::spawn(move || {
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..64 {
                if client.write_all(&chunk).is_err() {
                    break;
                }
            }
            d.store(true, Ordering::SeqCst);
        });
        let window = hub.window() as usize;
        eventually("the window fills", || {
            hub.state()
                .conns
                .first()
                .is_some_and(|c| c.rx.len() == window)
        });
        // Nobody reads: the backend stops reading, the client stays blocked,
        // and the connection is not dropped.
        std::thread::sleep(Duration::from_millis(300));
        let st = hub.state();
        assert_eq!(st.conns.len(), 1);
        assert_eq!(st.conns[0].rx.len(), window);
        assert!(!st.conns[0].reset);
        assert!(!done.load(Ordering::SeqCst), "64 MiB went somewhere");
        // The blocked writer thread is left behind with the test's sockets.
        drop(t);
    }

    #[test]
    fn a_restore_matches_listeners_by_position_and_refuses_a_mismatch() {
        let hub = NetHub::new(&["10.0.0.1:1".into(), "10.0.0.1:2".into()]);
        let e = reattach(&hub, bind(&["127.0.0.1:0".into()]).unwrap()).unwrap_err();
        assert!(
            e.to_string()
                .contains("has 2 listener(s) (10.0.0.1:1, 10.0.0.1:2) but --listen was given 1"),
            "{e}"
        );
        let pairs = reattach(
            &hub,
            bind(&["127.0.0.1:0".into(), "127.0.0.1:0".into()]).unwrap(),
        )
        .unwrap();
        let old: Vec<&str> = pairs.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(old, ["10.0.0.1:1", "10.0.0.1:2"]);
        let e = bind(&["300.1.1.1:1".into()]).unwrap_err();
        assert!(e.to_string().contains("--listen 300.1.1.1:1"), "{e}");
    }
}
