//! Carrying the sandbox directories inside a snapshot (`--with-files`).
//!
//! Why: a program's open files are reopened by path on restore. On another
//! machine those paths only exist if the files travel too. This module walks
//! each preopened directory into a [`FileTree`] and writes one back into the
//! directories given at restore. Entries are sorted so the same tree always
//! encodes to the same bytes.
//!
//! A tree from a snapshot file or a migration peer is hostile input, and
//! writing it is the one place where such input reaches the host's file
//! system. So [`materialize_with`] first checks the tree *as a whole* and
//! writes nothing if any entry is wrong:
//!
//! - every path is relative and made of normal components (no `..`, `.`,
//!   empty component, NUL), and appears once per preopen;
//! - every entry's parent is the preopen root or an *earlier* `Dir` entry of
//!   the same preopen, so nothing is ever written beneath a symlink or a file
//!   of the tree;
//! - modes carry no bits above `0o7777`; setuid, setgid and sticky bits are
//!   dropped (a snapshot must not plant a setuid file on the host);
//! - entry count, total file bytes, path length, depth and symlink target
//!   length stay under [`FileTreeLimits`].
//!
//! Writing then never follows a symlink: each directory is opened one
//! component at a time with `O_NOFOLLOW` beneath its preopen root (cap-std),
//! files are created with `O_CREAT|O_EXCL|O_NOFOLLOW`, and whatever already
//! sits at an entry's path on the host (a symlink planted there included) is
//! removed, not written through. Symlink *targets* are stored verbatim and may
//! point anywhere: the guest's WASI layer resolves them inside its sandbox,
//! and the writer here never traverses them.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use roam_snapshot::{FileEntry, FileKind, FileTree};
use roam_wasi::Preopen;

/// Caps on a file tree written at restore. Defaults are documented per
/// field; a node may choose its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileTreeLimits {
    /// Most entries (files, directories, symlinks) in the tree. Default 100 000.
    pub max_entries: usize,
    /// Most bytes of regular-file contents, all files together. Default 4 GiB.
    pub max_total_bytes: u64,
    /// Longest entry path, in bytes. Default 4096 (Linux `PATH_MAX`).
    pub max_path_len: usize,
    /// Most components in an entry path. Default 64.
    pub max_depth: usize,
    /// Longest symlink target, in bytes. Default 4096.
    pub max_symlink_target_len: usize,
}

impl FileTreeLimits {
    /// The defaults listed on each field.
    pub const DEFAULT: FileTreeLimits = FileTreeLimits {
        max_entries: 100_000,
        max_total_bytes: 4 << 30,
        max_path_len: 4096,
        max_depth: 64,
        max_symlink_target_len: 4096,
    };
}

impl Default for FileTreeLimits {
    fn default() -> Self {
        FileTreeLimits::DEFAULT
    }
}

/// Mode bits kept when writing: permissions only.
const KEPT_MODE_BITS: u32 = 0o777;

/// Reading or writing sandbox files failed.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// I/O on a file of the sandbox.
    #[error("{path}")]
    Io {
        /// The host path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot entry names a path outside its directory.
    #[error(
        "snapshot file entry `{0}` escapes its directory; the snapshot is corrupt or malicious"
    )]
    Escape(String),
    /// A snapshot entry belongs to a guest directory not given at restore.
    #[error("the snapshot carries files for guest directory {0}; pass --dir HOST::{0}")]
    NoPreopen(String),
    /// The tree is malformed: nothing was written.
    #[error(
        "snapshot file entry `{path}` of guest directory {preopen} is refused: {why}; \
         the snapshot is corrupt or malicious, and no file was written"
    )]
    BadEntry {
        /// Guest path of the preopen.
        preopen: String,
        /// The entry's path.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The sandbox exceeds a [`FileTreeLimits`] cap at a checkpoint:
    /// nothing more was read.
    #[error(
        "the sandbox holds more {what} than a checkpoint may carry: with {path} it is {found}, \
         over the limit of {limit}; the checkpoint is refused and the program runs on \
         (remove files, or raise the limit)"
    )]
    SandboxTooLarge {
        /// The entry that passed the cap.
        path: PathBuf,
        /// What was counted.
        what: &'static str,
        /// The count with that entry.
        found: u64,
        /// The cap.
        limit: u64,
    },
    /// The tree exceeds a [`FileTreeLimits`] cap: nothing was written.
    #[error(
        "the snapshot's file tree holds {found} {what}, over the limit of {limit}; \
         no file was written (raise the limit if the snapshot is trusted)"
    )]
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// The tree's value.
        found: u64,
        /// The cap.
        limit: u64,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FilesError + '_ {
    move |source| FilesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Walk every preopen into a tree, within `limits`' entry count and total
/// file bytes. File sizes are checked before a byte is read: a guest can
/// make a 1 TiB sparse file in an instant, and reading it whole would take
/// the host down. Over a limit, the checkpoint is refused, naming the file.
pub fn capture(preopens: &[Preopen], limits: &FileTreeLimits) -> Result<FileTree, FilesError> {
    let mut w = Walk {
        limits,
        entries: Vec::new(),
        bytes: 0,
    };
    for p in preopens {
        w.walk(&p.host, &p.host, &p.guest)?;
    }
    Ok(FileTree { entries: w.entries })
}

/// A capture's walk, with what it has counted so far.
struct Walk<'a> {
    limits: &'a FileTreeLimits,
    entries: Vec<FileEntry>,
    bytes: u64,
}

impl Walk<'_> {
    /// Room for `len` more bytes of files, counted.
    fn take(&mut self, path: &Path, len: u64) -> Result<(), FilesError> {
        let total = self.bytes.saturating_add(len);
        if total > self.limits.max_total_bytes {
            return Err(FilesError::SandboxTooLarge {
                path: path.to_path_buf(),
                what: "bytes of files",
                found: total,
                limit: self.limits.max_total_bytes,
            });
        }
        self.bytes = total;
        Ok(())
    }

    /// A file's contents, at most the `len` bytes counted for it (a file
    /// that grew since its size was read is refused, not read on).
    fn read(&self, path: &Path, len: u64) -> Result<Vec<u8>, FilesError> {
        let f = std::fs::File::open(path).map_err(io(path))?;
        let cap = usize::try_from(len).map_err(|_| FilesError::SandboxTooLarge {
            path: path.to_path_buf(),
            what: "bytes in one file",
            found: len,
            limit: usize::MAX as u64,
        })?;
        let mut data = Vec::with_capacity(cap);
        f.take(len.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(io(path))?;
        if data.len() as u64 > len {
            return Err(FilesError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other("the file grew while it was read"),
            });
        }
        Ok(data)
    }

    fn walk(&mut self, root: &Path, dir: &Path, guest: &str) -> Result<(), FilesError> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io(dir))?;
        names.sort();
        for name in names {
            let path = dir.join(&name);
            if self.entries.len() >= self.limits.max_entries {
                return Err(FilesError::SandboxTooLarge {
                    path,
                    what: "entries",
                    found: self.entries.len() as u64 + 1,
                    limit: self.limits.max_entries as u64,
                });
            }
            let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
            let rel = path
                .strip_prefix(root)
                .expect("walk stays under its root")
                .to_string_lossy()
                .into_owned();
            let mtime_ns =
                (meta.mtime().max(0) as u64) * 1_000_000_000 + meta.mtime_nsec().max(0) as u64;
            let kind = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(io(&path))?;
                FileKind::Symlink {
                    target: target.to_string_lossy().into_owned(),
                }
            } else if meta.is_dir() {
                FileKind::Dir
            } else if meta.is_file() {
                self.take(&path, meta.len())?;
                FileKind::File {
                    data: self.read(&path, meta.len())?,
                }
            } else {
                continue; // sockets, fifos, devices do not travel
            };
            let is_dir = matches!(kind, FileKind::Dir);
            self.entries.push(FileEntry {
                preopen: guest.to_string(),
                path: rel,
                kind,
                mode: meta.mode() & 0o7777,
                mtime_ns,
            });
            if is_dir {
                self.walk(root, &path, guest)?;
            }
        }
        Ok(())
    }
}

/// Check that `rel` is a plain relative path.
fn safe_relative(rel: &str) -> Result<(), FilesError> {
    let ok = !rel.is_empty()
        && rel
            .split('/')
            .all(|c| !matches!(c, "" | "." | "..") && !c.contains('\0'));
    if ok {
        Ok(())
    } else {
        Err(FilesError::Escape(rel.to_string()))
    }
}

/// Check the whole tree before anything is written. Returns, per entry, the
/// index of its preopen.
fn check(
    tree: &FileTree,
    preopens: &[Preopen],
    limits: &FileTreeLimits,
    parents: Parents,
) -> Result<Vec<usize>, FilesError> {
    let count = tree.entries.len();
    if count > limits.max_entries {
        return Err(FilesError::TooLarge {
            what: "entries",
            found: count as u64,
            limit: limits.max_entries as u64,
        });
    }
    let mut total = 0u64;
    let mut earlier: HashMap<(usize, &str), &FileKind> = HashMap::with_capacity(count);
    let mut roots = Vec::with_capacity(count);
    for e in &tree.entries {
        let root = preopens
            .iter()
            .position(|p| p.guest == e.preopen)
            .ok_or_else(|| FilesError::NoPreopen(e.preopen.clone()))?;
        let bad = |why: String| FilesError::BadEntry {
            preopen: e.preopen.clone(),
            path: e.path.chars().take(200).collect(),
            why,
        };
        if e.path.len() > limits.max_path_len {
            return Err(bad(format!(
                "its path is {} bytes, over the {}-byte limit",
                e.path.len(),
                limits.max_path_len
            )));
        }
        safe_relative(&e.path)?;
        let depth = e.path.split('/').count();
        if depth > limits.max_depth {
            return Err(bad(format!(
                "it is {depth} directories deep, over the limit of {}",
                limits.max_depth
            )));
        }
        if e.mode & !0o7777 != 0 {
            return Err(bad(format!("mode {:#o} has bits beyond 0o7777", e.mode)));
        }
        match &e.kind {
            FileKind::File { data } => {
                total = total.saturating_add(data.len() as u64);
                if total > limits.max_total_bytes {
                    return Err(FilesError::TooLarge {
                        what: "file bytes",
                        found: tree.total_file_bytes(),
                        limit: limits.max_total_bytes,
                    });
                }
            }
            FileKind::Symlink { target } => {
                if target.is_empty() || target.contains('\0') {
                    return Err(bad("its symlink target is empty or holds a NUL byte".into()));
                }
                if target.len() > limits.max_symlink_target_len {
                    return Err(bad(format!(
                        "its symlink target is {} bytes, over the {}-byte limit",
                        target.len(),
                        limits.max_symlink_target_len
                    )));
                }
            }
            FileKind::Dir => {}
        }
        if let Some((parent, _)) = e.path.rsplit_once('/') {
            match earlier.get(&(root, parent)) {
                Some(FileKind::Dir) => {}
                Some(FileKind::Symlink { .. }) => {
                    return Err(bad(format!(
                        "it lies beneath symlink entry `{parent}`, and writing through a \
                         symlink could leave the directory"
                    )))
                }
                Some(FileKind::File { .. }) => {
                    return Err(bad(format!("its parent `{parent}` is a file entry")))
                }
                None if parents == Parents::OnDisk => {}
                None => {
                    return Err(bad(format!(
                        "its parent `{parent}` is not an earlier directory entry of the tree"
                    )))
                }
            }
        }
        if earlier.insert((root, e.path.as_str()), &e.kind).is_some() {
            return Err(bad("it appears twice".into()));
        }
        roots.push(root);
    }
    Ok(roots)
}

/// Write a tree into the directories given at restore, with the default
/// [`FileTreeLimits`]. See [`materialize_with`].
pub fn materialize(tree: &FileTree, preopens: &[Preopen]) -> Result<(), FilesError> {
    materialize_with(tree, preopens, &FileTreeLimits::DEFAULT)
}

/// Write a tree into the directories given at restore. The tree is checked
/// as a whole first (see the module docs); a bad tree writes nothing.
/// Existing entries with the same path are replaced (never written through);
/// other files are left alone.
pub fn materialize_with(
    tree: &FileTree,
    preopens: &[Preopen],
    limits: &FileTreeLimits,
) -> Result<(), FilesError> {
    write_checked(tree, preopens, limits, Parents::InTree)
}

/// Where an entry's parent directory must come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parents {
    /// An earlier `Dir` entry of the same tree (a whole tree at restore).
    InTree,
    /// The tree, or a real directory already beneath the root (entries
    /// streamed one at a time by a migration). The writer opens every
    /// component without following symlinks, so a parent that is missing
    /// or is a symlink on disk fails the write instead of leaving the root.
    OnDisk,
}

/// Write one entry of a tree that arrives entry by entry (a migration
/// streams the sandbox files). The entry gets every check a whole tree
/// gets, except that its parent may be a directory written earlier.
pub fn materialize_entry(
    entry: FileEntry,
    preopens: &[Preopen],
    limits: &FileTreeLimits,
) -> Result<(), FilesError> {
    let tree = FileTree {
        entries: vec![entry],
    };
    write_checked(&tree, preopens, limits, Parents::OnDisk)
}

fn write_checked(
    tree: &FileTree,
    preopens: &[Preopen],
    limits: &FileTreeLimits,
    parents: Parents,
) -> Result<(), FilesError> {
    let roots = check(tree, preopens, limits, parents)?;
    let mut open_roots: HashMap<usize, Dir> = HashMap::new();
    let mut dirs: Vec<(usize, &FileEntry)> = Vec::new();
    let mut last_parent: Option<(usize, String, Dir)> = None;
    for (e, &r) in tree.entries.iter().zip(&roots) {
        let host = preopens[r].host.join(&e.path);
        if let std::collections::hash_map::Entry::Vacant(slot) = open_roots.entry(r) {
            let d = Dir::open_ambient_dir(&preopens[r].host, cap_std::ambient_authority())
                .map_err(io(&preopens[r].host))?;
            slot.insert(d);
        }
        let (parent_rel, name) = e.path.rsplit_once('/').unwrap_or(("", &e.path));
        let cached = matches!(&last_parent, Some((lr, lp, _)) if *lr == r && lp == parent_rel);
        if !cached {
            let d = open_beneath(&open_roots[&r], parent_rel).map_err(io(&host))?;
            last_parent = Some((r, parent_rel.to_string(), d));
        }
        let parent = &last_parent.as_ref().expect("set above").2;
        let is_dir = matches!(e.kind, FileKind::Dir);
        let kept = clear(parent, name, is_dir).map_err(io(&host))?;
        let mode = rustix::fs::Mode::from_raw_mode(e.mode & KEPT_MODE_BITS);
        match &e.kind {
            FileKind::Dir => {
                if !kept {
                    parent.create_dir(name).map_err(io(&host))?;
                }
                dirs.push((r, e));
            }
            FileKind::File { data } => {
                let mut o = OpenOptions::new();
                o.write(true).create_new(true).follow(FollowSymlinks::No);
                let mut f = parent.open_with(name, &o).map_err(io(&host))?;
                f.write_all(data).map_err(io(&host))?;
                rustix::fs::fchmod(&f, mode).map_err(|e| io(&host)(e.into()))?;
            }
            FileKind::Symlink { target } => parent.symlink(target, name).map_err(io(&host))?,
        }
    }
    // Directory modes last, deepest first, so a read-only directory of the
    // tree does not stop its own contents from being written.
    for (r, e) in dirs.into_iter().rev() {
        let host = preopens[r].host.join(&e.path);
        let d = open_beneath(&open_roots[&r], &e.path).map_err(io(&host))?;
        let mode = rustix::fs::Mode::from_raw_mode(e.mode & KEPT_MODE_BITS);
        // The handle is `O_PATH`, which `fchmod` refuses; "." names the
        // directory itself and involves no symlink.
        rustix::fs::chmodat(&d, ".", mode, rustix::fs::AtFlags::empty())
            .map_err(|e| io(&host)(e.into()))?;
    }
    Ok(())
}

/// Open the directory `rel` beneath `root`, one component at a time, never
/// following a symlink.
fn open_beneath(root: &Dir, rel: &str) -> std::io::Result<Dir> {
    let mut d = root.try_clone()?;
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        d = d.open_dir_nofollow(c)?;
    }
    Ok(d)
}

/// Make room for entry `name` in `parent`: an existing directory is kept if
/// the entry is a directory (returns true); anything else there, a symlink
/// included, is removed without being followed.
fn clear(parent: &Dir, name: &str, entry_is_dir: bool) -> std::io::Result<bool> {
    match parent.symlink_metadata(name) {
        Ok(m) if m.is_dir() => {
            if entry_is_dir {
                return Ok(true);
            }
            parent.remove_dir_all(name)?;
        }
        Ok(_) => parent.remove_file(name)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preopen(dir: &Path) -> Vec<Preopen> {
        vec![Preopen {
            host: dir.to_path_buf(),
            guest: "/data".into(),
        }]
    }

    #[test]
    fn a_huge_sparse_file_is_refused_before_it_is_read() {
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("a"), b"small").unwrap();
        // 1 TiB, no block of it on disk: reading it whole would take the
        // host's memory.
        let f = std::fs::File::create(src.path().join("b-huge")).unwrap();
        f.set_len(1 << 40).unwrap();
        let e = capture(&preopen(src.path()), &FileTreeLimits::DEFAULT).unwrap_err();
        match &e {
            FilesError::SandboxTooLarge { path, what, .. } => {
                assert!(path.ends_with("b-huge"), "{e}");
                assert_eq!(*what, "bytes of files");
            }
            _ => panic!("{e}"),
        }
        // Entries count too.
        let few = FileTreeLimits {
            max_entries: 1,
            ..FileTreeLimits::DEFAULT
        };
        std::fs::remove_file(src.path().join("b-huge")).unwrap();
        std::fs::write(src.path().join("c"), b"").unwrap();
        assert!(matches!(
            capture(&preopen(src.path()), &few),
            Err(FilesError::SandboxTooLarge {
                what: "entries",
                ..
            })
        ));
        assert_eq!(
            capture(&preopen(src.path()), &FileTreeLimits::DEFAULT)
                .unwrap()
                .entries
                .len(),
            2
        );
    }

    #[test]
    fn capture_then_materialize_reproduces_the_tree() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("a/b")).unwrap();
        std::fs::write(src.path().join("a/b/f.txt"), b"hello").unwrap();
        std::fs::write(src.path().join("top"), b"x").unwrap();
        std::os::unix::fs::symlink("top", src.path().join("link")).unwrap();
        let tree = capture(&preopen(src.path()), &FileTreeLimits::DEFAULT).unwrap();
        let paths: Vec<_> = tree.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "a/b", "a/b/f.txt", "link", "top"]);

        let dst = tempfile::tempdir().unwrap();
        std::fs::write(dst.path().join("top"), b"stale").unwrap();
        materialize(&tree, &preopen(dst.path())).unwrap();
        assert_eq!(
            std::fs::read(dst.path().join("a/b/f.txt")).unwrap(),
            b"hello"
        );
        assert_eq!(std::fs::read(dst.path().join("top")).unwrap(), b"x");
        assert_eq!(
            std::fs::read_link(dst.path().join("link")).unwrap(),
            Path::new("top")
        );
    }

    #[test]
    fn escaping_entries_are_refused() {
        let dst = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
            let tree = FileTree {
                entries: vec![FileEntry {
                    preopen: "/data".into(),
                    path: bad.into(),
                    kind: FileKind::File { data: vec![1] },
                    mode: 0o644,
                    mtime_ns: 0,
                }],
            };
            let err = materialize(&tree, &preopen(dst.path())).unwrap_err();
            assert!(matches!(err, FilesError::Escape(_)), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_preopen_is_named() {
        let dst = tempfile::tempdir().unwrap();
        let tree = FileTree {
            entries: vec![FileEntry {
                preopen: "/other".into(),
                path: "f".into(),
                kind: FileKind::Dir,
                mode: 0o755,
                mtime_ns: 0,
            }],
        };
        let err = materialize(&tree, &preopen(dst.path())).unwrap_err();
        assert!(err.to_string().contains("/other"));
    }

    #[test]
    fn streamed_entries_build_on_directories_written_before_but_never_through_a_symlink() {
        let dst = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let p = preopen(dst.path());
        let limits = FileTreeLimits::DEFAULT;
        materialize_entry(entry("a", FileKind::Dir), &p, &limits).unwrap();
        materialize_entry(file("a/f", b"streamed"), &p, &limits).unwrap();
        assert_eq!(std::fs::read(dst.path().join("a/f")).unwrap(), b"streamed");
        // A parent that is a symlink on disk is not followed.
        std::os::unix::fs::symlink(outside.path(), dst.path().join("l")).unwrap();
        materialize_entry(file("l/x", b"no"), &p, &limits).unwrap_err();
        assert!(!outside.path().join("x").exists());
        // A missing parent fails the write; nothing is created for it.
        materialize_entry(file("missing/x", b"no"), &p, &limits).unwrap_err();
        assert!(!dst.path().join("missing").exists());
        // Each entry still gets the path checks.
        let err = materialize_entry(file("../x", b"no"), &p, &limits).unwrap_err();
        assert!(matches!(err, FilesError::Escape(_)), "{err}");
    }

    fn entry(path: &str, kind: FileKind) -> FileEntry {
        FileEntry {
            preopen: "/data".into(),
            path: path.into(),
            mode: if matches!(kind, FileKind::Dir) {
                0o755
            } else {
                0o644
            },
            kind,
            mtime_ns: 0,
        }
    }
    fn file(path: &str, data: &[u8]) -> FileEntry {
        entry(
            path,
            FileKind::File {
                data: data.to_vec(),
            },
        )
    }
    fn link(path: &str, target: &Path) -> FileEntry {
        entry(
            path,
            FileKind::Symlink {
                target: target.to_string_lossy().into_owned(),
            },
        )
    }
    fn is_empty(dir: &Path) -> bool {
        std::fs::read_dir(dir).unwrap().next().is_none()
    }

    #[test]
    fn writing_beneath_a_symlink_entry_is_refused_and_nothing_is_written() {
        let outside = tempfile::tempdir().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let attacks = [
            // The `l -> /etc`, `l/cron.d/x` attack, with a directory entry
            // under the link as well as without one.
            vec![
                link("l", outside.path()),
                entry("l/cron.d", FileKind::Dir),
                file("l/cron.d/x", b"* * * * * root evil"),
            ],
            vec![link("l", outside.path()), file("l/x", b"evil")],
        ];
        for tree in attacks {
            let tree = FileTree { entries: tree };
            let err = materialize(&tree, &preopen(dst.path())).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains("beneath symlink entry `l`") && msg.contains("no file was written"),
                "{msg}"
            );
            assert!(is_empty(outside.path()), "wrote outside the sandbox");
            assert!(is_empty(dst.path()), "a refused tree wrote something");
        }
    }

    #[test]
    fn a_symlink_already_on_the_host_is_replaced_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("target"), b"keep").unwrap();
        let dst = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), dst.path().join("l")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), dst.path().join("f")).unwrap();

        // Without a directory entry for `l`, `l/x` is refused outright.
        let tree = FileTree {
            entries: vec![file("l/x", b"evil")],
        };
        let err = materialize(&tree, &preopen(dst.path())).unwrap_err();
        assert!(
            err.to_string().contains("not an earlier directory entry"),
            "{err}"
        );

        // With one, the host's link is replaced by a real directory.
        let tree = FileTree {
            entries: vec![
                file("f", b"new"),
                entry("l", FileKind::Dir),
                file("l/x", b"inside"),
            ],
        };
        materialize(&tree, &preopen(dst.path())).unwrap();
        let names: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["target"], "wrote outside the sandbox");
        assert_eq!(
            std::fs::read(outside.path().join("target")).unwrap(),
            b"keep"
        );
        let l = std::fs::symlink_metadata(dst.path().join("l")).unwrap();
        assert!(l.is_dir() && !l.file_type().is_symlink());
        assert_eq!(std::fs::read(dst.path().join("l/x")).unwrap(), b"inside");
        let f = std::fs::symlink_metadata(dst.path().join("f")).unwrap();
        assert!(f.is_file());
        assert_eq!(std::fs::read(dst.path().join("f")).unwrap(), b"new");
    }

    #[test]
    fn malformed_trees_are_refused_whole() {
        let dst = tempfile::tempdir().unwrap();
        let cases: Vec<(Vec<FileEntry>, &str)> = vec![
            (
                vec![file("a", b"1"), file("a/b", b"2")],
                "its parent `a` is a file entry",
            ),
            (
                vec![entry("a", FileKind::Dir), entry("a", FileKind::Dir)],
                "appears twice",
            ),
            (
                vec![file("b/c", b"1"), entry("b", FileKind::Dir)],
                "not an earlier directory entry",
            ),
            (
                vec![FileEntry {
                    mode: 0o100644,
                    ..file("m", b"")
                }],
                "has bits beyond 0o7777",
            ),
            (
                vec![entry(
                    "s",
                    FileKind::Symlink {
                        target: String::new(),
                    },
                )],
                "symlink target is empty",
            ),
        ];
        for (entries, why) in cases {
            let tree = FileTree {
                entries: entries.clone(),
            };
            let err = materialize(&tree, &preopen(dst.path())).unwrap_err();
            assert!(err.to_string().contains(why), "{entries:?}: {err}");
            assert!(is_empty(dst.path()));
        }
    }

    #[test]
    fn caps_are_enforced_before_writing() {
        let dst = tempfile::tempdir().unwrap();
        let tight = FileTreeLimits {
            max_entries: 2,
            max_total_bytes: 10,
            max_path_len: 8,
            max_depth: 2,
            max_symlink_target_len: 4,
        };
        let cases: Vec<(Vec<FileEntry>, &str)> = vec![
            (
                vec![file("a", b""), file("b", b""), file("c", b"")],
                "3 entries, over the limit of 2",
            ),
            (
                vec![file("a", b"123456"), file("b", b"123456")],
                "12 file bytes, over the limit of 10",
            ),
            (
                vec![file("abcdefghi", b"")],
                "9 bytes, over the 8-byte limit",
            ),
            (
                vec![entry("a", FileKind::Dir), entry("a/b", FileKind::Dir)],
                "",
            ),
            (
                vec![entry(
                    "s",
                    FileKind::Symlink {
                        target: "12345".into(),
                    },
                )],
                "symlink target is 5 bytes",
            ),
        ];
        for (entries, why) in cases {
            let tree = FileTree {
                entries: entries.clone(),
            };
            let r = materialize_with(&tree, &preopen(dst.path()), &tight);
            if why.is_empty() {
                r.unwrap();
                continue;
            }
            let err = r.unwrap_err();
            assert!(err.to_string().contains(why), "{entries:?}: {err}");
        }
        let deep = FileTree {
            entries: vec![
                entry("x", FileKind::Dir),
                entry("x/y", FileKind::Dir),
                file("x/y/z", b""),
            ],
        };
        let limits = FileTreeLimits {
            max_entries: 10,
            ..tight
        };
        let err = materialize_with(&deep, &preopen(dst.path()), &limits).unwrap_err();
        assert!(err.to_string().contains("3 directories deep"), "{err}");
        assert!(!dst.path().join("x").exists());
    }

    #[test]
    fn special_mode_bits_are_dropped_and_read_only_dirs_filled() {
        let dst = tempfile::tempdir().unwrap();
        let tree = FileTree {
            entries: vec![
                FileEntry {
                    mode: 0o555,
                    ..entry("ro", FileKind::Dir)
                },
                FileEntry {
                    mode: 0o6755,
                    ..file("ro/suid", b"x")
                },
            ],
        };
        materialize(&tree, &preopen(dst.path())).unwrap();
        let mode = |p: &str| std::fs::metadata(dst.path().join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("ro/suid"), 0o755);
        assert_eq!(mode("ro"), 0o555);
        std::fs::set_permissions(
            dst.path().join("ro"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
}
