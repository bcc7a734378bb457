//! Path calls: open, mkdir, rmdir, unlink, rename, links, stat, utimes.
//!
//! Exists to resolve every guest path through `cap-std` relative to a
//! directory fd, so no path escapes its preopen (absolute paths, `..` and
//! symlinks pointing outside are refused), and to record for every opened fd
//! the preopen + relative path that `restore` will reopen.

use super::{check_relative, join_rel, write_filestat};
use crate::ctx::{FdEntry, Handle, Origin, WasiCtx};
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::{fdflags, fstflags, oflags, rights, LOOKUP_SYMLINK_FOLLOW};
use cap_fs_ext::{
    DirExt, FollowSymlinks, OpenOptionsFollowExt, OpenOptionsSyncExt, SystemTimeSpec,
};
use cap_std::fs::MetadataExt;
use cap_std::fs::{Dir, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, UNIX_EPOCH};

/// Arguments of `path_open` after decoding.
pub(crate) struct OpenArgs {
    pub(crate) dirflags: u32,
    pub(crate) path: String,
    pub(crate) oflags: u16,
    pub(crate) base: u64,
    pub(crate) inheriting: u64,
    pub(crate) fdflags: u16,
}

fn time_spec(ns: u64, set: bool, now: bool) -> Result<Option<SystemTimeSpec>, Errno> {
    match (set, now) {
        (true, true) => Err(Errno::INVAL),
        (_, true) => Ok(Some(SystemTimeSpec::SymbolicNow)),
        (true, false) => {
            let t = UNIX_EPOCH
                .checked_add(Duration::from_nanos(ns))
                .ok_or(Errno::OVERFLOW)?;
            Ok(Some(SystemTimeSpec::Absolute(
                cap_std::time::SystemTime::from_std(t),
            )))
        }
        (false, false) => Ok(None),
    }
}

impl WasiCtx {
    /// Opens `a.path` below directory `fd`; returns the new guest fd.
    pub(crate) fn path_open(&mut self, fd: u32, a: OpenArgs) -> Result<u32, Errno> {
        check_relative(&a.path)?;
        let parent_inh = self.entry(fd)?.rights_inheriting;
        let new_fd = self.check_fd_room()?;
        // Counted before the host open, so the budget is never passed.
        let held = self.budget.take().ok_or(Errno::NFILE)?;
        let (dir, preopen, base_path) = self.dir(fd, rights::PATH_OPEN)?;
        let follow = a.dirflags & LOOKUP_SYMLINK_FOLLOW != 0;
        let write = a.base & rights::WRITE_MODE != 0;
        let read = a.base & rights::READ_MODE != 0 || !write;
        let handle = if a.oflags & oflags::DIRECTORY != 0 {
            if a.oflags & (oflags::CREAT | oflags::EXCL | oflags::TRUNC) != 0 {
                return Err(Errno::INVAL);
            }
            if write {
                return Err(Errno::ISDIR);
            }
            Handle::Dir(if follow {
                dir.open_dir(&a.path)?
            } else {
                dir.open_dir_nofollow(&a.path)?
            })
        } else {
            if a.oflags & oflags::CREAT != 0 {
                self.with_right(fd, rights::PATH_CREATE_FILE)?;
            }
            if a.oflags & oflags::TRUNC != 0 {
                // witx: `path_filestat_set_size` on the directory is the
                // right to open with `oflags::trunc`.
                self.with_right(fd, rights::PATH_FILESTAT_SET_SIZE)?;
            }
            // A truncation gives the file's bytes back to the quota.
            let freed = if a.oflags & oflags::TRUNC != 0 {
                self.freed_by(dir, &a.path, true)
            } else {
                0
            };
            let f = open_file(dir, &a, read, write, follow)?;
            self.freed(freed);
            f
        };
        let mask = if matches!(handle, Handle::Dir(_)) {
            rights::DIR
        } else {
            rights::FILE
        };
        let entry = FdEntry {
            handle,
            origin: Origin::Path {
                preopen,
                path: join_rel(base_path, &a.path),
                oflags: a.oflags,
                read,
                write,
            },
            rights_base: a.base & parent_inh & mask,
            rights_inheriting: a.inheriting & parent_inh,
            fdflags: a.fdflags,
            _held: Some(held),
        };
        tracing::trace!(fd = new_fd, origin = ?entry.origin, "path_open");
        self.fds.insert(new_fd, entry);
        Ok(new_fd)
    }

    pub(crate) fn path_create_directory(&self, fd: u32, path: &str) -> Result<(), Errno> {
        check_relative(path)?;
        Ok(self
            .dir(fd, rights::PATH_CREATE_DIRECTORY)?
            .0
            .create_dir(path)?)
    }

    pub(crate) fn path_remove_directory(&self, fd: u32, path: &str) -> Result<(), Errno> {
        check_relative(path)?;
        Ok(self
            .dir(fd, rights::PATH_REMOVE_DIRECTORY)?
            .0
            .remove_dir(path)?)
    }

    pub(crate) fn path_unlink_file(&self, fd: u32, path: &str) -> Result<(), Errno> {
        check_relative(path)?;
        let dir = self.dir(fd, rights::PATH_UNLINK_FILE)?.0;
        let freed = self.freed_by(dir, path, false);
        dir.remove_file(path)?;
        self.freed(freed);
        Ok(())
    }

    pub(crate) fn path_rename(
        &mut self,
        fd: u32,
        old: &str,
        new_fd: u32,
        new: &str,
    ) -> Result<(), Errno> {
        check_relative(old)?;
        check_relative(new)?;
        let (od, op, obase) = self.dir(fd, rights::PATH_RENAME_SOURCE)?;
        let (nd, np, nbase) = self.dir(new_fd, rights::PATH_RENAME_TARGET)?;
        // A file the rename replaces gives its bytes back (unless it is
        // the file being renamed, under another link).
        let same = match (od.symlink_metadata(old), nd.symlink_metadata(new)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        let freed = if same {
            0
        } else {
            self.freed_by(nd, new, false)
        };
        od.rename(old, nd, new)?;
        self.freed(freed);
        let (from, to) = (join_rel(obase, old), join_rel(nbase, new));
        // Keep recorded paths of fds open under the renamed name current.
        for e in self.fds.values_mut() {
            if let Origin::Path { preopen, path, .. } = &mut e.origin {
                if *preopen != op {
                    continue;
                }
                if *path == from {
                    (*preopen, *path) = (np, to.clone());
                } else if let Some(rest) = path.strip_prefix(&format!("{from}/")) {
                    (*preopen, *path) = (np, format!("{to}/{rest}"));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn path_readlink(&self, fd: u32, path: &str) -> Result<Vec<u8>, Errno> {
        check_relative(path)?;
        let t = self
            .dir(fd, rights::PATH_READLINK)?
            .0
            .read_link_contents(path)?;
        Ok(t.as_os_str().as_bytes().to_vec())
    }

    pub(crate) fn path_symlink(&self, target: &str, fd: u32, link: &str) -> Result<(), Errno> {
        check_relative(link)?;
        if target.starts_with('/') {
            return Err(Errno::NOTCAPABLE);
        }
        Ok(self
            .dir(fd, rights::PATH_SYMLINK)?
            .0
            .symlink(target, link)?)
    }

    /// `path_link`: a hard link, both paths beneath their directory fds.
    ///
    /// The source is not followed if it is a symlink (the link itself is
    /// linked, as `linkat` without `AT_SYMLINK_FOLLOW` does); with
    /// `LOOKUP_SYMLINK_FOLLOW` it is resolved first, inside the sandbox
    /// (a target outside it gives `ENOTCAPABLE`). Linking across file
    /// systems gives `EXDEV`, as POSIX says, rather than the `ENOTCAPABLE` an
    /// escaping path gives.
    pub(crate) fn path_link(
        &self,
        fd: u32,
        flags: u32,
        old: &str,
        new_fd: u32,
        new: &str,
    ) -> Result<(), Errno> {
        check_relative(old)?;
        check_relative(new)?;
        if flags & !LOOKUP_SYMLINK_FOLLOW != 0 {
            return Err(Errno::INVAL);
        }
        let od = self.dir(fd, rights::PATH_LINK_SOURCE)?.0;
        let nd = self.dir(new_fd, rights::PATH_LINK_TARGET)?.0;
        let source = if flags & LOOKUP_SYMLINK_FOLLOW != 0 {
            // Resolved beneath `od`; the result names no symlink, so linking
            // it without following links the target.
            od.canonicalize(old)?
        } else {
            std::path::PathBuf::from(old)
        };
        let from_dev = od.symlink_metadata(&source)?.dev();
        let parent = match std::path::Path::new(new).parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        if nd.metadata(parent)?.dev() != from_dev {
            return Err(Errno::XDEV);
        }
        Ok(od.hard_link(&source, nd, new)?)
    }

    pub(crate) fn path_filestat_get(
        &self,
        mem: &mut Mem,
        fd: u32,
        flags: u32,
        path: &str,
        out: u32,
    ) -> Result<(), Errno> {
        check_relative(path)?;
        let d = self.dir(fd, rights::PATH_FILESTAT_GET)?.0;
        let m = if flags & LOOKUP_SYMLINK_FOLLOW != 0 {
            d.metadata(path)?
        } else {
            d.symlink_metadata(path)?
        };
        write_filestat(mem, out, &m)
    }

    pub(crate) fn path_filestat_set_times(
        &self,
        fd: u32,
        flags: u32,
        path: &str,
        t: (u64, u64, u16),
    ) -> Result<(), Errno> {
        check_relative(path)?;
        let (atim, mtim, fst) = t;
        if fst & !(fstflags::ATIM | fstflags::ATIM_NOW | fstflags::MTIM | fstflags::MTIM_NOW) != 0 {
            return Err(Errno::INVAL);
        }
        let a = time_spec(
            atim,
            fst & fstflags::ATIM != 0,
            fst & fstflags::ATIM_NOW != 0,
        )?;
        let m = time_spec(
            mtim,
            fst & fstflags::MTIM != 0,
            fst & fstflags::MTIM_NOW != 0,
        )?;
        let d = self.dir(fd, rights::PATH_FILESTAT_SET_TIMES)?.0;
        if flags & LOOKUP_SYMLINK_FOLLOW != 0 {
            d.set_times(path, a, m)?;
        } else {
            d.set_symlink_times(path, a, m)?;
        }
        Ok(())
    }
}

/// Open a non-directory (or, without O_DIRECTORY, possibly a directory).
fn open_file(
    dir: &Dir,
    a: &OpenArgs,
    read: bool,
    write: bool,
    follow: bool,
) -> Result<Handle, Errno> {
    let creat = a.oflags & oflags::CREAT != 0;
    let excl = a.oflags & oflags::EXCL != 0;
    let trunc = a.oflags & oflags::TRUNC != 0;
    let follow_mode = if follow {
        FollowSymlinks::Yes
    } else {
        FollowSymlinks::No
    };
    if trunc && !write {
        // Read-only with O_TRUNC: Linux truncates (when the file is
        // writable), and the portable OpenOptions refuse the pair with
        // EINVAL. Truncate through a throwaway write handle, then open as
        // asked. The guest's right to do so was checked by the caller.
        let mut t = OpenOptions::new();
        t.write(true).follow(follow_mode);
        if creat {
            if excl {
                t.create_new(true)
            } else {
                t.create(true)
            };
        } else {
            t.truncate(true);
        }
        let f = dir.open_with(&a.path, &t)?;
        if f.metadata()?.is_dir() {
            return Err(Errno::ISDIR);
        }
        drop(f);
    }
    if creat && !write && !trunc {
        // O_RDONLY|O_CREAT: create with a throwaway write handle first,
        // because the portable OpenOptions refuse create without write.
        let mut c = OpenOptions::new();
        c.write(true).follow(follow_mode);
        if excl {
            c.create_new(true)
        } else {
            c.create(true)
        };
        drop(dir.open_with(&a.path, &c)?);
    }
    let mut o = OpenOptions::new();
    o.read(read).write(write).follow(follow_mode);
    if write && creat {
        if excl {
            o.create_new(true)
        } else {
            o.create(true)
        };
    }
    // std's OpenOptions refuse truncate together with append (EINVAL), which
    // POSIX allows: open truncating, then switch to append mode.
    let append = a.fdflags & fdflags::APPEND != 0;
    o.truncate(trunc && write).append(append && !trunc);
    o.sync(a.fdflags & fdflags::SYNC != 0)
        .dsync(a.fdflags & fdflags::DSYNC != 0);
    o.rsync(a.fdflags & fdflags::RSYNC != 0);
    let file = dir.open_with(&a.path, &o)?;
    if append && trunc {
        let fl = rustix::fs::fcntl_getfl(&file)?;
        rustix::fs::fcntl_setfl(&file, fl | rustix::fs::OFlags::APPEND)?;
    }
    if file.metadata()?.is_dir() {
        return Ok(Handle::Dir(Dir::from_std_file(file.into_std())));
    }
    Ok(Handle::File(file))
}
