//! fd metadata: fdstat, filestat, prestat and their setters.
//!
//! Exists to answer libc's questions about an fd (type, flags, rights, size,
//! times, which preopen it is) with the exact witx struct layouts, and to
//! enforce that rights can only ever narrow.

use super::{write_filestat, write_filestat_type};
use crate::ctx::{Handle, Origin, Sink, WasiCtx};
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::{fdflags, filetype, fstflags, rights};
use rustix::fs::{Timespec, Timestamps};

/// File type reported for a stdio stream.
fn stdio_type(handle: &Handle, sink: &Sink) -> u8 {
    if matches!(sink, Sink::Buffer(_) | Sink::Shared(_)) && !matches!(handle, Handle::Stdin) {
        return filetype::UNKNOWN;
    }
    let fd = match handle {
        Handle::Stdin => rustix::stdio::stdin(),
        Handle::Stdout => rustix::stdio::stdout(),
        _ => rustix::stdio::stderr(),
    };
    match rustix::fs::fstat(fd) {
        Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_char_device() => {
            filetype::CHARACTER_DEVICE
        }
        _ => filetype::UNKNOWN,
    }
}

/// A witx timestamp argument as a `timespec`, honouring `*_NOW` and omission.
fn timespec(ns: u64, set: bool, now: bool) -> Result<Timespec, Errno> {
    match (set, now) {
        (true, true) => Err(Errno::INVAL),
        (false, true) => Ok(Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW as _,
        }),
        (false, false) => Ok(Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT as _,
        }),
        (true, false) => Ok(Timespec {
            tv_sec: (ns / 1_000_000_000) as _,
            tv_nsec: (ns % 1_000_000_000) as _,
        }),
    }
}

/// `futimens` arguments for the witx (atim, mtim, fstflags) triple.
pub(crate) fn timestamps(atim: u64, mtim: u64, fst: u16) -> Result<Timestamps, Errno> {
    if fst & !(fstflags::ATIM | fstflags::ATIM_NOW | fstflags::MTIM | fstflags::MTIM_NOW) != 0 {
        return Err(Errno::INVAL);
    }
    Ok(Timestamps {
        last_access: timespec(
            atim,
            fst & fstflags::ATIM != 0,
            fst & fstflags::ATIM_NOW != 0,
        )?,
        last_modification: timespec(
            mtim,
            fst & fstflags::MTIM != 0,
            fst & fstflags::MTIM_NOW != 0,
        )?,
    })
}

impl WasiCtx {
    pub(crate) fn fd_fdstat_get(&self, mem: &mut Mem, fd: u32, out: u32) -> Result<(), Errno> {
        let e = self.entry(fd)?;
        let ft = match &e.handle {
            Handle::File(f) => super::filetype_of(f.metadata()?.file_type()),
            Handle::Dir(_) => filetype::DIRECTORY,
            Handle::Listener(_) | Handle::Socket(_) => filetype::SOCKET_STREAM,
            h @ Handle::Stderr => stdio_type(h, &self.stderr),
            h => stdio_type(h, &self.stdout),
        };
        let mut b = [0u8; 24];
        b[0] = ft;
        b[2..4].copy_from_slice(&e.fdflags.to_le_bytes());
        b[8..16].copy_from_slice(&e.rights_base.to_le_bytes());
        b[16..24].copy_from_slice(&e.rights_inheriting.to_le_bytes());
        mem.write(out, &b)
    }

    pub(crate) fn fd_fdstat_set_flags(&mut self, fd: u32, flags: u16) -> Result<(), Errno> {
        let e = self.with_right(fd, rights::FD_FDSTAT_SET_FLAGS)?;
        if flags & !(fdflags::APPEND | fdflags::NONBLOCK) != 0 {
            // DSYNC/RSYNC/SYNC cannot be changed after open.
            return Err(Errno::NOTSUP);
        }
        if let Handle::File(f) = &e.handle {
            let mut fl = rustix::fs::fcntl_getfl(f)?;
            fl.set(rustix::fs::OFlags::APPEND, flags & fdflags::APPEND != 0);
            rustix::fs::fcntl_setfl(f, fl)?;
        }
        self.entry_mut(fd)?.fdflags = flags;
        Ok(())
    }

    pub(crate) fn fd_fdstat_set_rights(
        &mut self,
        fd: u32,
        base: u64,
        inheriting: u64,
    ) -> Result<(), Errno> {
        let e = self.entry_mut(fd)?;
        if base & !e.rights_base != 0 || inheriting & !e.rights_inheriting != 0 {
            return Err(Errno::NOTCAPABLE);
        }
        e.rights_base = base;
        e.rights_inheriting = inheriting;
        Ok(())
    }

    pub(crate) fn fd_filestat_get(&self, mem: &mut Mem, fd: u32, out: u32) -> Result<(), Errno> {
        match &self.with_right(fd, rights::FD_FILESTAT_GET)?.handle {
            Handle::File(f) => write_filestat(mem, out, &f.metadata()?),
            Handle::Dir(d) => write_filestat(mem, out, &d.dir_metadata()?),
            Handle::Listener(_) | Handle::Socket(_) => {
                write_filestat_type(mem, out, filetype::SOCKET_STREAM)
            }
            h @ Handle::Stderr => write_filestat_type(mem, out, stdio_type(h, &self.stderr)),
            h => write_filestat_type(mem, out, stdio_type(h, &self.stdout)),
        }
    }

    pub(crate) fn fd_filestat_set_size(&self, fd: u32, size: u64) -> Result<(), Errno> {
        let f = self.file(fd, rights::FD_FILESTAT_SET_SIZE)?;
        self.sized(f, |_| Ok(size), || Ok(f.set_len(size)?))
    }

    pub(crate) fn fd_filestat_set_times(
        &self,
        fd: u32,
        atim: u64,
        mtim: u64,
        fst: u16,
    ) -> Result<(), Errno> {
        let ts = timestamps(atim, mtim, fst)?;
        match &self.with_right(fd, rights::FD_FILESTAT_SET_TIMES)?.handle {
            Handle::File(f) => rustix::fs::futimens(f, &ts)?,
            Handle::Dir(d) => rustix::fs::futimens(d, &ts)?,
            _ => return Err(Errno::BADF),
        }
        Ok(())
    }

    fn preopen_name(&self, fd: u32) -> Result<&str, Errno> {
        match self.entry(fd)?.origin {
            Origin::Preopen(i) => self
                .preopens
                .get(i as usize)
                .map(|p| p.guest.as_str())
                .ok_or(Errno::BADF),
            _ => Err(Errno::BADF),
        }
    }

    pub(crate) fn fd_prestat_get(&self, mem: &mut Mem, fd: u32, out: u32) -> Result<(), Errno> {
        let name = self.preopen_name(fd)?;
        let mut b = [0u8; 8];
        b[4..8].copy_from_slice(&(name.len() as u32).to_le_bytes());
        mem.write(out, &b)
    }

    pub(crate) fn fd_prestat_dir_name(
        &self,
        mem: &mut Mem,
        fd: u32,
        ptr: u32,
        len: u32,
    ) -> Result<(), Errno> {
        let name = self.preopen_name(fd)?;
        if (len as usize) < name.len() {
            return Err(Errno::NAMETOOLONG);
        }
        mem.write(ptr, name.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_flags() {
        let t = timestamps(1_500_000_000, 0, fstflags::ATIM).unwrap();
        assert_eq!(
            (t.last_access.tv_sec, t.last_access.tv_nsec),
            (1, 500_000_000)
        );
        assert_eq!(t.last_modification.tv_nsec, rustix::fs::UTIME_OMIT as _);
        assert_eq!(
            timestamps(0, 0, fstflags::MTIM | fstflags::MTIM_NOW).unwrap_err(),
            Errno::INVAL
        );
        assert_eq!(timestamps(0, 0, 1 << 7).unwrap_err(), Errno::INVAL);
    }
}
