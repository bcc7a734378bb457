//! The WASI context: fd table, args, env, clocks and output sinks.
//!
//! Exists to hold every piece of OS state the guest can observe in a form that
//! `save` can turn into plain data and `restore` can rebuild on another host.

use crate::budget::{FdBudget, HostFd};
use crate::interrupt::Interrupt;
use crate::net::{ConnId, NetHub};
use crate::types::rights;
use cap_std::fs::{Dir, File};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// A host directory made visible to the guest (`--dir HOST::GUEST`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preopen {
    /// Directory on this machine.
    pub host: PathBuf,
    /// The path the guest sees it as (e.g. `/data` or `.`).
    pub guest: String,
}

/// What the program starts with.
#[derive(Debug, Clone, Default)]
pub struct WasiConfig {
    /// argv, including the program name.
    pub args: Vec<String>,
    /// Environment variables.
    pub env: Vec<(String, String)>,
    /// Preopened directories, given fds 3, 4, ... in order.
    pub preopens: Vec<Preopen>,
    /// Listening sockets, by label (a service name behind a gateway, the
    /// address standalone), given the fds after the preopens, in order.
    pub listeners: Vec<String>,
}

/// Why [`WasiCtx::new`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A preopen's host directory could not be opened.
    #[error("cannot open host directory {host:?} for guest path {guest:?}: {source}; check that it exists and is a readable directory")]
    OpenPreopen {
        /// The host path.
        host: PathBuf,
        /// The guest path it was to appear as.
        guest: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The guests of this process already hold every host fd they may.
    #[error("the guests of this process already hold all {limit} host files they may (the open-file limit less a reserve for the host); stop a cell or raise `ulimit -n`")]
    FdBudget {
        /// The budget's limit.
        limit: usize,
    },
    /// A guest path was empty or contained NUL.
    #[error("guest path {0:?} for a preopen is invalid: give a non-empty path without NUL bytes")]
    BadGuestPath(String),
    /// A listener label is empty, too long, contains NUL, or repeats.
    #[error("listener label {0:?} is invalid: give distinct labels of 1 to {max} bytes without NUL", max = crate::net::MAX_LABEL_LEN)]
    BadListener(String),
    /// More listeners than a cell may have.
    #[error("{0} listeners requested; a cell may have at most {max}", max = crate::net::MAX_LISTENERS)]
    TooManyListeners(usize),
}

/// Receives what a guest writes to stdout and stderr, for embedders that
/// keep a program's output themselves (a node daemon keeps each cell's log).
pub trait OutputSink: Send + Sync {
    /// The guest wrote `data` to stderr (`stderr`) or stdout.
    fn write(&self, stderr: bool, data: &[u8]);
}

/// Where guest writes to stdout/stderr go.
#[derive(Clone, Default)]
pub(crate) enum Sink {
    /// The host process's own stream.
    #[default]
    Inherit,
    /// An in-memory buffer (tests, embedders that collect output).
    Buffer(Arc<Mutex<Vec<u8>>>),
    /// An embedder's sink.
    Shared(Arc<dyn OutputSink>),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sink::Inherit => "Inherit",
            Sink::Buffer(_) => "Buffer",
            Sink::Shared(_) => "Shared",
        })
    }
}

/// Output collected by [`WasiCtx::capture_output`].
#[derive(Debug, Clone, Default)]
pub struct CapturedOutput {
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl CapturedOutput {
    /// Everything the guest wrote to stdout so far.
    pub fn stdout(&self) -> Vec<u8> {
        self.stdout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    /// Everything the guest wrote to stderr so far.
    pub fn stderr(&self) -> Vec<u8> {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The guest's monotonic clock: continues from a saved reading after restore.
#[derive(Debug)]
pub(crate) struct Clock {
    base_ns: u64,
    origin: Instant,
}

impl Clock {
    pub(crate) fn starting_at(base_ns: u64) -> Clock {
        Clock {
            base_ns,
            origin: Instant::now(),
        }
    }
    pub(crate) fn now_ns(&self) -> u64 {
        let el = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.base_ns.saturating_add(el)
    }
}

/// The host object behind an fd.
#[derive(Debug)]
pub(crate) enum Handle {
    Stdin,
    Stdout,
    Stderr,
    Dir(Dir),
    File(File),
    /// Listener number n of the net state.
    Listener(u32),
    /// An accepted connection.
    Socket(ConnId),
}

/// How an fd came to be: what `restore` needs to recreate it.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    Stdio,
    /// A listener or connection; the handle says which.
    Net,
    Preopen(u32),
    Path {
        preopen: u32,
        path: String,
        oflags: u16,
        read: bool,
        write: bool,
    },
}

/// One open fd.
#[derive(Debug)]
pub(crate) struct FdEntry {
    pub(crate) handle: Handle,
    pub(crate) origin: Origin,
    pub(crate) rights_base: u64,
    pub(crate) rights_inheriting: u64,
    pub(crate) fdflags: u16,
    /// The host fd behind a file or directory, counted in the process's
    /// [`FdBudget`] until the entry is dropped.
    pub(crate) _held: Option<HostFd>,
}

impl FdEntry {
    pub(crate) fn stdio(handle: Handle) -> FdEntry {
        let r = if matches!(handle, Handle::Stdin) {
            rights::STDIN
        } else {
            rights::STDOUT
        };
        FdEntry {
            _held: None,
            handle,
            origin: Origin::Stdio,
            rights_base: r,
            rights_inheriting: 0,
            fdflags: 0,
        }
    }
    pub(crate) fn preopen(dir: Dir, index: u32, held: HostFd) -> FdEntry {
        FdEntry {
            _held: Some(held),
            handle: Handle::Dir(dir),
            origin: Origin::Preopen(index),
            rights_base: rights::DIR,
            rights_inheriting: rights::DIR | rights::FILE,
            fdflags: 0,
        }
    }
    pub(crate) fn listener(index: u32) -> FdEntry {
        FdEntry {
            _held: None,
            handle: Handle::Listener(index),
            origin: Origin::Net,
            rights_base: rights::LISTENER,
            rights_inheriting: rights::SOCKET,
            fdflags: 0,
        }
    }
    pub(crate) fn socket(conn: ConnId) -> FdEntry {
        FdEntry {
            _held: None,
            handle: Handle::Socket(conn),
            origin: Origin::Net,
            rights_base: rights::SOCKET,
            rights_inheriting: 0,
            fdflags: 0,
        }
    }
    /// The preopen index and the path relative to it, for directories.
    pub(crate) fn dir_location(&self) -> Option<(u32, &str)> {
        match &self.origin {
            Origin::Preopen(p) => Some((*p, "")),
            Origin::Path { preopen, path, .. } => Some((*preopen, path)),
            Origin::Stdio | Origin::Net => None,
        }
    }
}

/// A WASI preview 1 context whose state can be saved and restored.
#[derive(Debug)]
pub struct WasiCtx {
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) preopens: Vec<Preopen>,
    pub(crate) fds: BTreeMap<u32, FdEntry>,
    pub(crate) clock: Clock,
    pub(crate) start_monotonic_ns: u64,
    pub(crate) interrupt: Arc<Interrupt>,
    pub(crate) stdout: Sink,
    pub(crate) stderr: Sink,
    /// The cell's sockets, when it has listeners (or restored connections).
    pub(crate) net: Option<Arc<NetHub>>,
    /// Host fds held by the guests of this process (see [`FdBudget`]).
    pub(crate) budget: Arc<FdBudget>,
    /// The bytes the sandbox's files may add up to, if limited (see
    /// [`WasiCtx::set_disk_quota`]).
    pub(crate) quota: Option<crate::quota::Quota>,
}

/// Opens the host directory of a preopen (the one place ambient authority is used).
pub(crate) fn open_preopen(p: &Preopen) -> Result<Dir, std::io::Error> {
    Dir::open_ambient_dir(&p.host, cap_std::ambient_authority())
}

impl WasiCtx {
    /// A fresh context: stdio on fds 0-2, preopens on 3, 4, ... Its host
    /// fds count in the process's [`FdBudget`].
    pub fn new(cfg: WasiConfig, interrupt: Arc<Interrupt>) -> Result<WasiCtx, SetupError> {
        WasiCtx::new_in(cfg, interrupt, FdBudget::process())
    }

    /// [`WasiCtx::new`], its host fds counted in `budget`.
    pub fn new_in(
        cfg: WasiConfig,
        interrupt: Arc<Interrupt>,
        budget: Arc<FdBudget>,
    ) -> Result<WasiCtx, SetupError> {
        let mut fds = BTreeMap::new();
        fds.insert(0, FdEntry::stdio(Handle::Stdin));
        fds.insert(1, FdEntry::stdio(Handle::Stdout));
        fds.insert(2, FdEntry::stdio(Handle::Stderr));
        for (i, p) in cfg.preopens.iter().enumerate() {
            if p.guest.is_empty() || p.guest.contains('\0') {
                return Err(SetupError::BadGuestPath(p.guest.clone()));
            }
            let dir = open_preopen(p).map_err(|source| SetupError::OpenPreopen {
                host: p.host.clone(),
                guest: p.guest.clone(),
                source,
            })?;
            let held = budget.take().ok_or(SetupError::FdBudget {
                limit: budget.limit(),
            })?;
            fds.insert(3 + i as u32, FdEntry::preopen(dir, i as u32, held));
        }
        if cfg.listeners.len() > crate::net::MAX_LISTENERS {
            return Err(SetupError::TooManyListeners(cfg.listeners.len()));
        }
        for (i, l) in cfg.listeners.iter().enumerate() {
            let repeated = cfg.listeners[..i].contains(l);
            if repeated || crate::net::check_label("listener label", l, false).is_err() {
                return Err(SetupError::BadListener(l.clone()));
            }
            let fd = 3 + (cfg.preopens.len() + i) as u32;
            fds.insert(fd, FdEntry::listener(i as u32));
        }
        let net = if cfg.listeners.is_empty() {
            None
        } else {
            let hub = NetHub::new(&cfg.listeners);
            hub.attach(interrupt.clone());
            Some(hub)
        };
        let start = host_monotonic_ns();
        Ok(WasiCtx {
            args: cfg.args,
            env: cfg.env,
            preopens: cfg.preopens,
            fds,
            clock: Clock::starting_at(start),
            start_monotonic_ns: start,
            interrupt,
            stdout: Sink::Inherit,
            stderr: Sink::Inherit,
            net,
            budget,
            quota: None,
        })
    }

    /// Limit the bytes the sandbox's files may add up to (sizes as the
    /// guest sees them: a sparse file counts whole), counting what the
    /// preopens hold now. Past it, writes, truncations and allocations
    /// that would grow a file fail with `EDQUOT`.
    pub fn set_disk_quota(&mut self, limit: u64) {
        self.quota = Some(crate::quota::Quota::measure(&self.preopens, limit));
    }

    /// The disk quota and the bytes counted against it, if one is set.
    pub fn disk_quota(&self) -> Option<(u64, u64)> {
        self.quota.as_ref().map(|q| (q.limit(), q.used()))
    }

    /// The hub a network backend uses to feed and drain this cell's
    /// connections (`None` for a program without listeners). After
    /// [`WasiCtx::restore`] it is the restored hub, connections included.
    pub fn net(&self) -> Option<Arc<NetHub>> {
        self.net.clone()
    }

    /// The preopens, in fd order, with this machine's host paths.
    pub fn preopens(&self) -> &[Preopen] {
        &self.preopens
    }

    /// The interrupt this context's blocking calls watch.
    pub fn interrupt(&self) -> &Arc<Interrupt> {
        &self.interrupt
    }

    /// Send guest stdout/stderr to in-memory buffers instead of the host's
    /// streams (not part of the snapshot: a restored context inherits again).
    pub fn capture_output(&mut self) -> CapturedOutput {
        let c = CapturedOutput::default();
        self.stdout = Sink::Buffer(c.stdout.clone());
        self.stderr = Sink::Buffer(c.stderr.clone());
        c
    }

    /// Send guest stdout/stderr to `sink` (not part of the snapshot: a
    /// restored context inherits again until this is called).
    pub fn set_output(&mut self, sink: Arc<dyn OutputSink>) {
        self.stdout = Sink::Shared(sink.clone());
        self.stderr = Sink::Shared(sink);
    }

    /// The guest's monotonic clock now (ns).
    pub fn monotonic_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Lowest free fd number (POSIX rule; fully determined by the table).
    pub(crate) fn alloc_fd(&self) -> Option<u32> {
        (0..=u32::MAX).find(|n| !self.fds.contains_key(n))
    }
}

/// The host's CLOCK_MONOTONIC, used only to seed a fresh program's clock.
fn host_monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}
