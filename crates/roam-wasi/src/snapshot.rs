//! `WasiCtx::save` and `WasiCtx::restore`: OS state to plain data and back.
//!
//! Exists because the fd table holds live host objects; saving records how
//! each was reached (preopen + relative path + offset), restoring walks the
//! same paths under the new machine's preopen directories.

use crate::budget::FdBudget;
use crate::ctx::{open_preopen, Clock, FdEntry, Handle, Origin, Preopen, Sink, WasiCtx};
use crate::interrupt::Interrupt;
use crate::net::NetHub;
use crate::state::{FdKind, FdState, OsState};
use cap_std::fs::{Dir, OpenOptions};
use rustix::fs::SeekFrom;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Why [`WasiCtx::save`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The current offset of an open file could not be read.
    #[error("cannot read the offset of fd {fd} ({path:?}): {source}; the file may have been replaced by a non-seekable object")]
    Offset {
        /// The guest fd.
        fd: u32,
        /// Its path relative to its preopen.
        path: String,
        /// The underlying error.
        #[source]
        source: rustix::io::Errno,
    },
}

/// Why [`WasiCtx::restore`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The guests of this process already hold every host fd they may.
    #[error("cannot reopen fd {fd}: the guests of this process already hold all {limit} host files they may; stop a cell or raise `ulimit -n`")]
    FdBudget {
        /// The guest fd.
        fd: u32,
        /// The budget's limit.
        limit: usize,
    },
    /// The state names a guest preopen the caller did not map to a host dir.
    #[error(
        "snapshot needs guest directory {guest:?} but no --dir maps it; add --dir HOST::{guest}"
    )]
    MissingPreopen {
        /// The guest path that is not covered.
        guest: String,
    },
    /// A mapped host directory could not be opened.
    #[error("cannot open host directory {host:?} for guest path {guest:?}: {source}")]
    OpenPreopen {
        /// Host path.
        host: PathBuf,
        /// Guest path.
        guest: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A file or directory that was open at save time cannot be reopened
    /// (deleted, renamed behind the program's back, or not copied over).
    #[error("cannot reopen fd {fd}: {path:?} under guest directory {guest:?}: {source}; copy the file to the new host (an open file that was unlinked cannot be restored)")]
    Reopen {
        /// The guest fd.
        fd: u32,
        /// Guest preopen path.
        guest: String,
        /// Path relative to the preopen.
        path: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Seeking a reopened file to its saved offset failed.
    #[error("cannot seek fd {fd} ({path:?}) to offset {offset}: {source}")]
    Seek {
        /// The guest fd.
        fd: u32,
        /// Path relative to the preopen.
        path: String,
        /// The saved offset.
        offset: u64,
        /// The underlying error.
        #[source]
        source: rustix::io::Errno,
    },
    /// The state refers to a preopen index it does not list.
    #[error("fd {fd} refers to preopen {index}, which the snapshot does not list; the snapshot is corrupt")]
    BadPreopenIndex {
        /// The guest fd.
        fd: u32,
        /// The bad index.
        index: u32,
    },
}

impl WasiCtx {
    /// Everything the guest can observe, as plain data.
    pub fn save(&self) -> Result<OsState, SaveError> {
        let mut fds = Vec::with_capacity(self.fds.len());
        for (&fd, e) in &self.fds {
            let kind = match (&e.handle, &e.origin) {
                (Handle::Stdin, _) => FdKind::Stdin,
                (Handle::Stdout, _) => FdKind::Stdout,
                (Handle::Stderr, _) => FdKind::Stderr,
                (Handle::Listener(l), _) => FdKind::Listener { listener: *l },
                (Handle::Socket(c), _) => FdKind::Socket { conn: *c },
                (_, Origin::Preopen(p)) => FdKind::PreopenDir { preopen: *p },
                (Handle::Dir(_), Origin::Path { preopen, path, .. }) => FdKind::Dir {
                    preopen: *preopen,
                    path: path.clone(),
                },
                (
                    Handle::File(f),
                    Origin::Path {
                        preopen,
                        path,
                        oflags,
                        read,
                        write,
                    },
                ) => {
                    let offset = rustix::fs::seek(f, SeekFrom::Current(0)).map_err(|source| {
                        SaveError::Offset {
                            fd,
                            path: path.clone(),
                            source,
                        }
                    })?;
                    FdKind::File {
                        preopen: *preopen,
                        path: path.clone(),
                        oflags: *oflags,
                        read: *read,
                        write: *write,
                        offset,
                    }
                }
                // A Dir/File handle always has a preopen or path origin.
                (_, Origin::Stdio | Origin::Net) => continue,
            };
            fds.push(FdState {
                fd,
                kind,
                rights_base: e.rights_base,
                rights_inheriting: e.rights_inheriting,
                fdflags: e.fdflags,
            });
        }
        tracing::debug!(fds = fds.len(), "saved OS state");
        Ok(OsState {
            args: self.args.clone(),
            env: self.env.clone(),
            preopens: self.preopens.iter().map(|p| p.guest.clone()).collect(),
            fds,
            monotonic_ns: self.clock.now_ns(),
            start_monotonic_ns: self.start_monotonic_ns,
            net: self.net.as_ref().map(|h| h.state()).unwrap_or_default(),
        })
    }

    /// Rebuild on this machine; `preopens` map guest paths to host dirs.
    /// Its host fds count in the process's [`FdBudget`].
    pub fn restore(
        state: OsState,
        preopens: Vec<Preopen>,
        interrupt: Arc<Interrupt>,
    ) -> Result<WasiCtx, RestoreError> {
        WasiCtx::restore_in(state, preopens, interrupt, FdBudget::process())
    }

    /// [`WasiCtx::restore`], its host fds counted in `budget`.
    pub fn restore_in(
        state: OsState,
        preopens: Vec<Preopen>,
        interrupt: Arc<Interrupt>,
        budget: Arc<FdBudget>,
    ) -> Result<WasiCtx, RestoreError> {
        let mut mapped = Vec::with_capacity(state.preopens.len());
        let mut roots = Vec::with_capacity(state.preopens.len());
        for guest in &state.preopens {
            let p = preopens.iter().find(|p| &p.guest == guest).ok_or_else(|| {
                RestoreError::MissingPreopen {
                    guest: guest.clone(),
                }
            })?;
            let dir = open_preopen(p).map_err(|source| RestoreError::OpenPreopen {
                host: p.host.clone(),
                guest: guest.clone(),
                source,
            })?;
            roots.push(dir);
            mapped.push(p.clone());
        }
        let mut fds = BTreeMap::new();
        for f in state.fds {
            let root = |index: u32| -> Result<&Dir, RestoreError> {
                roots
                    .get(index as usize)
                    .ok_or(RestoreError::BadPreopenIndex { fd: f.fd, index })
            };
            let reopen_err = |index: u32, path: &str, source: io::Error| RestoreError::Reopen {
                fd: f.fd,
                guest: state
                    .preopens
                    .get(index as usize)
                    .cloned()
                    .unwrap_or_default(),
                path: path.to_owned(),
                source,
            };
            let (handle, origin) = match f.kind {
                FdKind::Stdin => (Handle::Stdin, Origin::Stdio),
                FdKind::Stdout => (Handle::Stdout, Origin::Stdio),
                FdKind::Stderr => (Handle::Stderr, Origin::Stdio),
                FdKind::Listener { listener } => (Handle::Listener(listener), Origin::Net),
                FdKind::Socket { conn } => (Handle::Socket(conn), Origin::Net),
                FdKind::PreopenDir { preopen } => {
                    let d = root(preopen)?
                        .try_clone()
                        .map_err(|e| reopen_err(preopen, ".", e))?;
                    (Handle::Dir(d), Origin::Preopen(preopen))
                }
                FdKind::Dir { preopen, path } => {
                    let d = root(preopen)?
                        .open_dir(&path)
                        .map_err(|e| reopen_err(preopen, &path, e))?;
                    let origin = Origin::Path {
                        preopen,
                        path,
                        oflags: 0,
                        read: true,
                        write: false,
                    };
                    (Handle::Dir(d), origin)
                }
                FdKind::File {
                    preopen,
                    path,
                    oflags,
                    read,
                    write,
                    offset,
                } => {
                    let mut o = OpenOptions::new();
                    // CREAT/TRUNC/EXCL already happened before the save.
                    o.read(read || !write).write(write);
                    if f.fdflags & crate::types::fdflags::APPEND != 0 {
                        o.append(true);
                    }
                    let file = root(preopen)?
                        .open_with(&path, &o)
                        .map_err(|e| reopen_err(preopen, &path, e))?;
                    rustix::fs::seek(&file, SeekFrom::Start(offset)).map_err(|source| {
                        RestoreError::Seek {
                            fd: f.fd,
                            path: path.clone(),
                            offset,
                            source,
                        }
                    })?;
                    (
                        Handle::File(file),
                        Origin::Path {
                            preopen,
                            path,
                            oflags,
                            read,
                            write,
                        },
                    )
                }
            };
            let held = match handle {
                Handle::Dir(_) | Handle::File(_) => {
                    Some(budget.take().ok_or(RestoreError::FdBudget {
                        fd: f.fd,
                        limit: budget.limit(),
                    })?)
                }
                _ => None,
            };
            let entry = FdEntry {
                handle,
                origin,
                rights_base: f.rights_base,
                rights_inheriting: f.rights_inheriting,
                fdflags: f.fdflags,
                _held: held,
            };
            tracing::debug!(fd = f.fd, origin = ?entry.origin, "restored fd");
            fds.insert(f.fd, entry);
        }
        let net = if state.net.listeners.is_empty() && state.net.conns.is_empty() {
            None
        } else {
            let hub = NetHub::from_state(state.net);
            hub.attach(interrupt.clone());
            Some(hub)
        };
        Ok(WasiCtx {
            args: state.args,
            env: state.env,
            preopens: mapped,
            fds,
            clock: Clock::starting_at(state.monotonic_ns),
            start_monotonic_ns: state.start_monotonic_ns,
            interrupt,
            stdout: Sink::Inherit,
            stderr: Sink::Inherit,
            net,
            budget,
            quota: None,
        })
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
