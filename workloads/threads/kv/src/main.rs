//! threads-kv - a multi-threaded Redis-protocol (RESP2) key-value server,
//! one thread per connection, for wasm32-wasip1-threads.
//!
//! It answers the same commands as workloads/c/kvserver.c (an event loop on
//! poll; docs/workloads.md, "kvserver"), with the same replies and the same
//! ROAM.DIGEST, so the same clients, test script and redis-benchmark runs
//! apply to both. What differs is the shape of the program: the main thread
//! blocks in `accept`, and each client has a thread blocked in `read`, all
//! sharing a sharded keyspace behind mutexes. Under roam this is a cell with
//! many threads, most of them parked in a blocking socket call.
//!
//! Listening socket: under WASI the program owns no socket; roam hands it
//! listening sockets as inherited fds (after the preopened directories), and
//! it takes the first fd whose type is a stream socket. Natively (tests, a
//! baseline) it binds `--listen HOST:PORT` itself.

mod admin;
mod commands;
mod conn;
mod resp;
mod server;
mod store;

use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use server::Server;

const DEFAULT_MAX_CLIENTS: usize = 256;

fn usage() -> ! {
    eprintln!(
        "usage: threads-kv [--listen [HOST:]PORT] [--max-clients N]\n  \
         --listen       native builds only: address to bind (default 127.0.0.1:6379);\n                 \
         under WASI the listening socket is inherited (roam run --listen ADDR)\n  \
         --max-clients  connections served at once, one thread each (default {DEFAULT_MAX_CLIENTS})"
    );
    std::process::exit(2)
}

/// Finds the inherited listening socket: the first fd, after stdio, whose
/// WASI filetype is SOCKET_STREAM.
#[cfg(target_os = "wasi")]
#[allow(unsafe_code)]
mod wasi {
    use std::net::TcpListener;
    use std::os::fd::FromRawFd;

    // std has no way to ask an fd's type under WASI: call the host directly.
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    extern "C" {
        fn fd_fdstat_get(fd: u32, out: *mut u8) -> u16;
    }

    /// `fdstat`: 24 bytes, filetype first. It holds u64 rights, so hosts
    /// may insist on 8-byte alignment.
    #[repr(C, align(8))]
    struct Fdstat([u8; 24]);

    const FILETYPE_SOCKET_STREAM: u8 = 6;

    /// The listener and its fd, if one was inherited.
    pub fn inherited_listener() -> Option<(TcpListener, u32)> {
        let fd = (3..64).find(|&fd| {
            let mut st = Fdstat([0; 24]);
            // SAFETY: `st` is a writable, 8-aligned 24-byte buffer, which is
            // what fd_fdstat_get writes; nothing else is touched.
            let errno = unsafe { fd_fdstat_get(fd, st.0.as_mut_ptr()) };
            errno == 0 && st.0[0] == FILETYPE_SOCKET_STREAM
        })?;
        // SAFETY: the fd is an open stream socket that nothing else in this
        // program owns; the listener takes ownership of it.
        Some((unsafe { TcpListener::from_raw_fd(fd as i32) }, fd))
    }
}

#[cfg(target_os = "wasi")]
fn open_listener(listen: Option<String>) -> Result<TcpListener, ExitCode> {
    if listen.is_some() {
        eprintln!(
            "threads-kv: --listen is for native builds; under roam give the address to \
             'roam run --listen ADDR' and the program inherits the socket"
        );
        return Err(ExitCode::from(2));
    }
    let Some((listener, fd)) = wasi::inherited_listener() else {
        eprintln!(
            "threads-kv: no listening socket among the inherited fds: run it with \
             'roam run --listen HOST:PORT' or behind a gateway with 'roam launch --service NAME'"
        );
        return Err(ExitCode::from(1));
    };
    eprintln!("threads-kv: listening on fd {fd}");
    Ok(listener)
}

#[cfg(not(target_os = "wasi"))]
fn open_listener(listen: Option<String>) -> Result<TcpListener, ExitCode> {
    let spec = listen.unwrap_or_else(|| "127.0.0.1:6379".into());
    // A bare port means the loopback address, as for kvserver.
    let addr = if spec.contains(':') {
        spec.replacen("localhost:", "127.0.0.1:", 1)
    } else {
        format!("127.0.0.1:{spec}")
    };
    match TcpListener::bind(&addr) {
        Ok(l) => {
            let shown = l.local_addr().map_or(addr, |a| a.to_string());
            eprintln!("threads-kv: listening on {shown}");
            Ok(l)
        }
        Err(e) => {
            eprintln!("threads-kv: cannot listen on {spec}: {e}");
            Err(ExitCode::from(1))
        }
    }
}

fn main() -> ExitCode {
    let mut listen = None;
    let mut max_clients = DEFAULT_MAX_CLIENTS;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--listen", Some(v)) => listen = Some(v),
            ("--max-clients", Some(v)) => {
                max_clients = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100_000).contains(n))
                    .unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    let listener = match open_listener(listen) {
        Ok(l) => l,
        Err(code) => return code,
    };
    // The accept loop blocks; a listener handed over in non-blocking mode
    // would make it spin.
    let _ = listener.set_nonblocking(false);
    let server: &'static Server = Box::leak(Box::new(Server::new(max_clients)));
    loop {
        match listener.accept() {
            Ok((stream, _)) => conn::start(server, stream),
            Err(e) => match e.kind() {
                ErrorKind::Interrupted | ErrorKind::ConnectionAborted => {}
                // Still non-blocking after all: wait a little instead of spinning.
                ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                // Out of fds or memory, say: back off, the clients that end
                // will free some.
                _ => {
                    eprintln!("threads-kv: accept: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            },
        }
    }
}
