//! One thread per connection: blocking reads, every complete request in
//! the buffer run in order (pipelining), the batch's replies sent with one
//! write.
//!
//! Why blocking threads rather than an event loop: this is the program that
//! exercises wasi-threads under roam, with many threads each parked in a
//! blocking `fd_read`/`sock_accept` at any moment a checkpoint may come.
//! kvserver.c is the single-threaded, poll-based counterpart.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::commands::dispatch;
use crate::resp::{self, reply, Parse, MAX_QUERY};
use crate::server::{Registration, Server, Session};

/// Stack of a client thread: the code is shallow (no recursion) and the
/// buffers are on the heap, so 256 KiB is plenty. Under wasm every thread's
/// stack is carved out of the one shared linear memory.
const STACK: usize = 256 * 1024;
/// At least this much room is made in the input buffer before a read.
const READ_CHUNK: usize = 16 * 1024;
/// Replies are sent early, mid-batch, past this size: a long pipeline of
/// large GETs does not grow the output buffer without bound.
const OUT_FLUSH: usize = 1 << 20;
/// Buffers grown past this are given back once empty.
const KEEP: usize = 1 << 20;
/// A client that takes no reply bytes for this long is dropped (natively;
/// WASI has no socket timeouts, so there a stuck client keeps its thread).
const STALL: Duration = Duration::from_secs(60);

/// Hands a freshly accepted connection to a thread of its own, or turns it
/// away when `--max-clients` are connected or no thread can be started.
pub fn start(server: &'static Server, mut stream: TcpStream) {
    server.connections.fetch_add(1, Ordering::Relaxed);
    let Some(reg) = server.register(stream.as_raw_fd()) else {
        server.rejected.fetch_add(1, Ordering::Relaxed);
        let _ = stream.write_all(b"-ERR max number of clients reached\r\n");
        return;
    };
    // If the spawn fails, the closure (and the stream in it) is dropped by
    // `spawn`: the stream waits in this slot instead, so that the client
    // can still be told why it is being closed.
    let slot = Arc::new(Mutex::new(Some(stream)));
    let theirs = Arc::clone(&slot);
    let spawned = thread::Builder::new().stack_size(STACK).spawn(move || {
        let taken = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(theirs);
        if let Some(stream) = taken {
            serve(server, stream, reg);
        }
    });
    // The JoinHandle is dropped: the thread is detached and cleans up after
    // itself (its Registration frees its place in the client table).
    if let Err(e) = spawned {
        eprintln!("threads-kv: cannot start a thread for a client: {e}");
        if let Some(mut stream) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = stream.write_all(b"-ERR cannot start a thread for this client\r\n");
        }
    }
}

/// Serves one client until it closes the connection, sends QUIT or a
/// malformed request, or a read or write fails.
fn serve(server: &'static Server, mut stream: TcpStream, reg: Registration) {
    // Neither is supported under WASI (the calls fail there, harmlessly).
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(STALL));
    let mut sess = Session {
        id: reg.id,
        close: false,
    };
    let mut buf = vec![0u8; READ_CHUNK];
    let mut filled = 0;
    let mut out = Vec::with_capacity(READ_CHUNK);
    loop {
        if buf.len() - filled < READ_CHUNK {
            let len = (buf.len() * 2).max(filled + READ_CHUNK);
            buf.resize(len, 0);
        }
        match stream.read(&mut buf[filled..]) {
            // The client closed (or half-closed): the replies to everything
            // complete it sent are already out; a partial request is dropped.
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let used = match run_batch(server, &mut sess, &buf[..filled], &mut out, &mut stream) {
            Ok(used) => used,
            Err(_) => break,
        };
        if !out.is_empty() {
            if stream.write_all(&out).is_err() {
                break;
            }
            out.clear();
        }
        if sess.close {
            break;
        }
        buf.copy_within(used..filled, 0);
        filled -= used;
        if buf.len() > KEEP && filled < READ_CHUNK {
            buf.truncate(READ_CHUNK);
            buf.shrink_to_fit();
        }
        if out.capacity() > KEEP {
            out = Vec::with_capacity(READ_CHUNK);
        }
    }
    drop(reg);
}

/// Runs every complete request at the front of `input`, appending replies
/// to `out` (and sending them early if they pile up). Returns how many
/// bytes were used; a protocol error sets `sess.close` after its reply.
fn run_batch(
    server: &Server,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
    stream: &mut impl Write,
) -> io::Result<usize> {
    let mut argv: Vec<&[u8]> = Vec::new();
    let mut pos = 0;
    let mut commands = 0;
    while pos < input.len() && !sess.close {
        match resp::parse(&input[pos..], &mut argv) {
            Parse::Done(len) => {
                pos += len;
                if !argv.is_empty() {
                    dispatch(server, sess, &argv, out);
                    commands += 1;
                }
                if out.len() >= OUT_FLUSH {
                    stream.write_all(out)?;
                    out.clear();
                }
            }
            Parse::More => {
                if input.len() - pos > MAX_QUERY {
                    reply::error(
                        out,
                        "ERR Protocol error: request larger than the 128 MiB query limit",
                    );
                    sess.close = true;
                }
                break;
            }
            Parse::Error(msg) => {
                reply::error(out, &format!("ERR {msg}"));
                sess.close = true;
            }
        }
    }
    server.commands.fetch_add(commands, Ordering::Relaxed);
    Ok(pos)
}
