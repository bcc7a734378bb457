//! Host-side implementations of the WASI calls, on `WasiCtx` + guest memory.
//!
//! Exists to keep the OS logic independent of wasmtime's calling glue (see
//! `linker`), so it can be read and tested on its own. Each call returns
//! `Result<_, Errno>`; nothing here panics on guest input.

pub(crate) mod args;
pub(crate) mod fd;
pub(crate) mod fdstat;
pub(crate) mod path;
pub(crate) mod poll;
pub(crate) mod readdir;
pub(crate) mod sock;

use crate::ctx::{FdEntry, Handle, WasiCtx};
use crate::errno::Errno;
use crate::interrupt::Interrupt;
use crate::mem::Mem;
use crate::types::filetype;
use cap_std::fs::{Dir, File, Metadata, MetadataExt};
use std::time::{Duration, Instant};

/// Result of a call that may block: done, hand over to `WasiView::suspend`,
/// or wait and then try again.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Done(Errno),
    Suspend,
    /// Nothing to take yet: wait for this, then run another [`Round`].
    Wait(Wait),
}

/// What a blocking call waits for between two rounds.
///
/// A blocking call is a series of rounds, each a non-blocking attempt, with
/// the wait between them done by the caller rather than inside the call.
/// That is what lets the threads of one program share a context behind a
/// lock: the linker drops the lock while it waits (`linker::blocking`), so
/// one thread blocked in `accept` or a sleep does not stop the others'
/// calls. A context used alone waits in place ([`WasiCtx::in_place`]).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(crate) enum Wait {
    /// Until the interrupt is kicked after `seen` (new input), requested,
    /// or `slice` has passed.
    Kick { seen: u64, slice: Duration },
    /// Until stdin has data, or this long.
    Stdin(Duration),
}

impl Wait {
    pub(crate) fn wait(self, interrupt: &Interrupt) {
        match self {
            Wait::Kick { seen, slice } => {
                interrupt.wait_kick(seen, slice);
            }
            Wait::Stdin(d) => {
                fd::stdin_ready(d);
            }
        }
    }
}

/// Where a blocking call is: when it began (relative timeouts count from
/// there), and whether this is its first round (only the first may hand
/// over to a checkpoint-on-block).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round {
    pub started: Instant,
    pub first: bool,
}

impl Round {
    pub(crate) fn new() -> Round {
        Round {
            started: Instant::now(),
            first: true,
        }
    }

    pub(crate) fn next(self) -> Round {
        Round {
            first: false,
            ..self
        }
    }
}

impl From<Result<(), Errno>> for Outcome {
    fn from(r: Result<(), Errno>) -> Outcome {
        Outcome::Done(r.err().unwrap_or(Errno::SUCCESS))
    }
}

/// Most fds a guest may hold open at once.
pub(crate) const MAX_FDS: usize = 4096;

impl Outcome {
    /// A write's outcome as a result: it never hands over to a checkpoint.
    #[cfg(test)]
    pub(crate) fn written(self) -> Result<(), Errno> {
        match self {
            Outcome::Done(e) if e == Errno::SUCCESS => Ok(()),
            Outcome::Done(e) => Err(e),
            Outcome::Suspend | Outcome::Wait(_) => Err(Errno::INTR),
        }
    }
}

impl WasiCtx {
    #[cfg(test)]
    /// Run a blocking call's rounds to the end, waiting in place between
    /// them (the context is not shared, or the caller holds it anyway).
    pub(crate) fn in_place(
        &mut self,
        mut round: impl FnMut(&mut WasiCtx, Round) -> Outcome,
    ) -> Outcome {
        let mut r = Round::new();
        loop {
            match round(self, r) {
                Outcome::Wait(w) => {
                    w.wait(&self.interrupt.clone());
                    r = r.next();
                }
                o => return o,
            }
        }
    }

    pub(crate) fn entry(&self, fd: u32) -> Result<&FdEntry, Errno> {
        self.fds.get(&fd).ok_or(Errno::BADF)
    }

    pub(crate) fn entry_mut(&mut self, fd: u32) -> Result<&mut FdEntry, Errno> {
        self.fds.get_mut(&fd).ok_or(Errno::BADF)
    }

    /// The entry, if it carries `right`.
    pub(crate) fn with_right(&self, fd: u32, right: u64) -> Result<&FdEntry, Errno> {
        let e = self.entry(fd)?;
        if e.rights_base & right != right {
            return Err(Errno::NOTCAPABLE);
        }
        Ok(e)
    }

    /// A regular-file fd carrying `right`.
    pub(crate) fn file(&self, fd: u32, right: u64) -> Result<&File, Errno> {
        match &self.with_right(fd, right)?.handle {
            Handle::File(f) => Ok(f),
            Handle::Dir(_) => Err(Errno::ISDIR),
            _ => Err(Errno::SPIPE),
        }
    }

    /// Run `op` on file `f`, which may make it as long as `want(its size
    /// now)`. Under a disk quota the room is taken first (`EDQUOT` past
    /// it) and the count then follows the size the file has after.
    pub(crate) fn sized<T>(
        &self,
        f: &File,
        want: impl FnOnce(u64) -> Result<u64, Errno>,
        op: impl FnOnce() -> Result<T, Errno>,
    ) -> Result<T, Errno> {
        let Some(q) = &self.quota else {
            return op();
        };
        let old = f.metadata()?.len();
        let reserved = want(old)?.max(old);
        q.grow(old, reserved)?;
        let r = op();
        let now = f.metadata().map_or(reserved, |m| m.len());
        q.settle(reserved, now);
        r
    }

    /// The size of regular file `path` under `dir` that removing or
    /// truncating it would give back to the quota (0 without a quota, for
    /// anything else, or for a file with other links).
    pub(crate) fn freed_by(&self, dir: &Dir, path: &str, whole_inode: bool) -> u64 {
        if self.quota.is_none() {
            return 0;
        }
        match dir.symlink_metadata(path) {
            Ok(m) if m.is_file() && (whole_inode || m.nlink() == 1) => m.len(),
            _ => 0,
        }
    }

    /// Give `bytes` back to the quota.
    pub(crate) fn freed(&self, bytes: u64) {
        if let Some(q) = &self.quota {
            q.shrink(bytes);
        }
    }

    /// A directory fd carrying `right`, with its preopen index and relative path.
    pub(crate) fn dir(&self, fd: u32, right: u64) -> Result<(&Dir, u32, &str), Errno> {
        let e = self.with_right(fd, right)?;
        match (&e.handle, e.dir_location()) {
            (Handle::Dir(d), Some((p, path))) => Ok((d, p, path)),
            _ => Err(Errno::NOTDIR),
        }
    }
}

/// Refuse paths that cannot be relative to a directory fd.
pub(crate) fn check_relative(path: &str) -> Result<(), Errno> {
    if path.is_empty() {
        return Err(Errno::NOENT);
    }
    if path.starts_with('/') {
        return Err(Errno::NOTCAPABLE);
    }
    if path.contains('\0') {
        return Err(Errno::INVAL);
    }
    Ok(())
}

/// `base/rel` for recording where a file lives relative to its preopen.
pub(crate) fn join_rel(base: &str, rel: &str) -> String {
    if base.is_empty() {
        rel.to_owned()
    } else {
        format!("{base}/{rel}")
    }
}

pub(crate) fn filetype_of(ft: cap_std::fs::FileType) -> u8 {
    use cap_std::fs::FileTypeExt;
    if ft.is_dir() {
        filetype::DIRECTORY
    } else if ft.is_file() {
        filetype::REGULAR_FILE
    } else if ft.is_symlink() {
        filetype::SYMBOLIC_LINK
    } else if ft.is_char_device() {
        filetype::CHARACTER_DEVICE
    } else if ft.is_block_device() {
        filetype::BLOCK_DEVICE
    } else if ft.is_socket() {
        filetype::SOCKET_STREAM
    } else {
        filetype::UNKNOWN
    }
}

fn ns(secs: i64, nsec: i64) -> u64 {
    (secs.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nsec.max(0) as u64)
}

/// Write a 64-byte `filestat` at `ptr`.
pub(crate) fn write_filestat(mem: &mut Mem, ptr: u32, m: &Metadata) -> Result<(), Errno> {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&m.dev().to_le_bytes());
    b[8..16].copy_from_slice(&m.ino().to_le_bytes());
    b[16] = filetype_of(m.file_type());
    b[24..32].copy_from_slice(&m.nlink().to_le_bytes());
    b[32..40].copy_from_slice(&m.size().to_le_bytes());
    b[40..48].copy_from_slice(&ns(m.atime(), m.atime_nsec()).to_le_bytes());
    b[48..56].copy_from_slice(&ns(m.mtime(), m.mtime_nsec()).to_le_bytes());
    b[56..64].copy_from_slice(&ns(m.ctime(), m.ctime_nsec()).to_le_bytes());
    mem.write(ptr, &b)
}

/// Write a `filestat` with only the file type set (stdio).
pub(crate) fn write_filestat_type(mem: &mut Mem, ptr: u32, ft: u8) -> Result<(), Errno> {
    let mut b = [0u8; 64];
    b[16] = ft;
    mem.write(ptr, &b)
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod layout_tests;

#[cfg(test)]
mod link_tests;

#[cfg(test)]
mod sock_tests;
