//! One client connection: a reader that moves the client's bytes into the
//! gateway's buffer while there is room (TCP backpressure otherwise), and a
//! writer that writes the cell's bytes to the client and confirms them.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::state::ConnWake;
use super::Shared;
use crate::proto::{ConnId, MAX_DATA};

/// Serve one accepted client of `service` until both directions end.
pub(crate) async fn serve(shared: Arc<Shared>, service: String, sock: TcpStream, peer: String) {
    sock.set_nodelay(true).ok();
    let (id, wake) = shared.lock().new_conn(&service, peer.clone());
    tracing::debug!(conn = id, service, peer, "client connected");
    let (rd, wr) = sock.into_split();
    tokio::join!(
        reader(&shared, id, &wake, rd),
        writer(&shared, id, &wake, wr)
    );
    tracing::debug!(conn = id, service, peer, "client done");
}

async fn reader(shared: &Shared, id: ConnId, wake: &ConnWake, mut rd: OwnedReadHalf) {
    let mut buf = vec![0u8; MAX_DATA];
    loop {
        let room = {
            let mut s = shared.lock();
            match s.conns.get(&id) {
                Some(c) if !c.cell_closed && c.fail.is_none() => s.read_room(id),
                _ => return,
            }
        };
        if room == 0 {
            wake.read.notified().await;
            continue;
        }
        tokio::select! {
            r = rd.read(&mut buf[..room]) => match r {
                Ok(0) => {
                    shared.lock().client_eof(id);
                    return;
                }
                Ok(n) => shared.lock().client_data(id, &buf[..n]),
                Err(e) => {
                    tracing::debug!(conn = id, "client read failed: {e}");
                    shared.lock().remove(id, true);
                    return;
                }
            },
            _ = wake.read.notified() => {}
        }
    }
}

enum Step {
    /// The bytes are in the writer's buffer.
    Write,
    Shutdown,
    Close,
    Fail(Vec<u8>),
    Wait,
    Gone,
}

async fn writer(shared: &Shared, id: ConnId, wake: &ConnWake, mut wr: OwnedWriteHalf) {
    let mut shut = false;
    // Reused for every write: no allocation per reply.
    let mut b: Vec<u8> = Vec::new();
    let mut sample = super::report::Every::default();
    loop {
        let step = {
            let s = shared.lock();
            match s.conns.get(&id) {
                None => Step::Gone,
                Some(c) => {
                    if let Some(f) = &c.fail {
                        Step::Fail(f.clone())
                    } else if !c.down.is_empty() {
                        let n = c.down.len().min(MAX_DATA);
                        let (x, y) = c.down.as_slices();
                        b.clear();
                        b.extend_from_slice(&x[..n.min(x.len())]);
                        b.extend_from_slice(&y[..n - n.min(x.len())]);
                        Step::Write
                    } else if c.cell_closed {
                        Step::Close
                    } else if !shut && c.down_shut == Some(c.down_base) {
                        Step::Shutdown
                    } else {
                        Step::Wait
                    }
                }
            }
        };
        match step {
            Step::Write => match wr.write_all(&b).await {
                Ok(()) => {
                    let rtt = sample
                        .due()
                        .then(|| super::report::tcp_rtt(wr.as_ref()))
                        .flatten();
                    let mut s = shared.lock();
                    s.written(id, b.len());
                    if let (Some(rtt), Some(c)) = (rtt, s.conns.get_mut(&id)) {
                        c.rtt = Some(rtt);
                    }
                }
                Err(e) => {
                    tracing::debug!(conn = id, "client write failed: {e}");
                    shared.lock().remove(id, true);
                    return;
                }
            },
            Step::Shutdown => {
                shut = true;
                let _ = wr.shutdown().await;
            }
            Step::Close => {
                let _ = wr.shutdown().await;
                shared.lock().remove(id, false);
                return;
            }
            Step::Fail(msg) => {
                let _ = wr.write_all(&msg).await;
                let _ = wr.shutdown().await;
                shared.lock().remove(id, false);
                return;
            }
            Step::Wait => wake.write.notified().await,
            Step::Gone => return,
        }
    }
}
