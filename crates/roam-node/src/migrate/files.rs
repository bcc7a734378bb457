//! Sandbox files and the log, streamed in bounded chunks.
//!
//! Why: a frame holds at most 16 MiB, and a cell's files may be far larger;
//! and files that do not change should not cost downtime. So the source
//! walks the cell's sandbox directories and sends every entry as a
//! [`Msg::FileEntry`] header followed by [`Msg::FileData`] chunks of at
//! most [`CHUNK_MAX`] bytes. Pre-copy does a first pass while the cell
//! still runs and, once it is paused, a second pass that sends only what
//! changed (size, modification time, inode or kind differ) and what was
//! deleted. Stop-and-copy and post-copy do one pass during the pause. The
//! log goes last, in [`Msg::LogChunk`]s.
//!
//! A file read while the program writes it may be torn. The pass records
//! each file's metadata before reading it and checks it after: a file whose
//! metadata moved, or whose modification time is within [`UNSURE`] of the
//! read (file timestamps advance in clock ticks, so a write in the same
//! tick would not show), is sent again at the pause.
//!
//! The source reads through `cap-std` directories, so a program that swaps
//! a directory for a symlink mid-walk cannot make the node read outside the
//! sandbox. The destination checks every header against its caps before
//! writing, never takes more bytes than a header declared, and writes each
//! complete entry through [`roam_runtime::files::materialize`], the one
//! place that writes sandbox files.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::time::{SystemTime, UNIX_EPOCH};

use cap_std::fs::{Dir, MetadataExt};
use roam_wasi::Preopen;
use roam_wire::{FileHeader, FileKind, Msg, CHUNK_MAX};

use super::stream::Stream;
use crate::log::CellLog;
use crate::size::human;

/// A file modified this close to its read is sent again at the pause
/// (file timestamps advance by clock ticks of at most 10 ms).
const UNSURE: u64 = 100_000_000;

/// What identifies a version of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sig {
    kind: FileKind,
    mode: u32,
    mtime_ns: u64,
    ino: u64,
}

type Key = (String, String);

/// The source's side: what was sent, and how many bytes when.
pub(crate) struct FileSender {
    roots: Vec<(String, Dir)>,
    sent: HashMap<Key, Sig>,
    /// Entries read while they may have been changing.
    unsure: std::collections::HashSet<Key>,
    /// File bytes sent while the cell ran.
    pub before_pause: u64,
    /// File bytes sent during the pause.
    pub paused: u64,
}

fn io_err(what: &str, path: &str, e: std::io::Error) -> String {
    format!("cannot read the cell's sandbox file {what}{path}: {e}")
}

impl FileSender {
    /// Open the cell's sandbox directories (guest path, host path).
    pub(crate) fn open(preopens: &[Preopen]) -> Result<FileSender, String> {
        let roots = preopens
            .iter()
            .map(|p| {
                Dir::open_ambient_dir(&p.host, cap_std::ambient_authority())
                    .map(|d| (p.guest.clone(), d))
                    .map_err(|e| format!("cannot open {}: {e}", p.host.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(FileSender {
            roots,
            sent: HashMap::new(),
            unsure: Default::default(),
            before_pause: 0,
            paused: 0,
        })
    }

    /// Walk every directory: entry → signature, sorted (parents first).
    fn scan(&self) -> Result<BTreeMap<Key, Sig>, String> {
        let mut out = BTreeMap::new();
        for (guest, dir) in &self.roots {
            walk(dir, "", guest, &mut out)?;
        }
        Ok(out)
    }

    /// Send what is new or changed since the last pass, and what was
    /// removed. `paused`: the cell is paused (counts go to
    /// [`FileSender::paused`], and nothing read now can be torn).
    pub(crate) async fn pass(&mut self, stream: &Stream, paused: bool) -> Result<(), String> {
        let now = tokio::task::block_in_place(|| self.scan())?;
        // Removals first, children before parents.
        let gone: Vec<Key> = self
            .sent
            .keys()
            .filter(|k| !now.contains_key(*k))
            .cloned()
            .collect();
        let mut gone = gone;
        gone.sort();
        for (preopen, path) in gone.into_iter().rev() {
            self.sent.remove(&(preopen.clone(), path.clone()));
            stream.msg(Msg::FileRemoved { preopen, path }).await?;
        }
        for (key, sig) in now {
            let same = self.sent.get(&key) == Some(&sig) && !self.unsure.contains(&key);
            if same {
                continue;
            }
            self.unsure.remove(&key);
            let Some(sent) = self.send_entry(stream, &key, &sig, paused).await? else {
                // Removed since the walk (the program runs): the next pass
                // sees it gone, or back.
                continue;
            };
            if paused {
                self.paused += sent;
            } else {
                self.before_pause += sent;
            }
            self.sent.insert(key, sig);
        }
        Ok(())
    }

    async fn send_entry(
        &mut self,
        stream: &Stream,
        key: &Key,
        sig: &Sig,
        paused: bool,
    ) -> Result<Option<u64>, String> {
        let (preopen, path) = key;
        let header = |kind| {
            Msg::FileEntry(FileHeader {
                preopen: preopen.clone(),
                path: path.clone(),
                kind,
                mode: sig.mode,
                mtime_ns: sig.mtime_ns,
            })
        };
        let FileKind::File { len } = sig.kind else {
            stream.msg(header(sig.kind.clone())).await?;
            return Ok(Some(0));
        };
        let dir = &self
            .roots
            .iter()
            .find(|(g, _)| g == preopen)
            .expect("scanned roots")
            .1;
        let started = unix_ns();
        let mut f = match dir.open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(preopen, path, e)),
        };
        stream.msg(header(FileKind::File { len })).await?;
        // Exactly `len` bytes go out, whatever the file holds now: a file
        // that shrank is padded with zeros, one that grew is cut; both are
        // sent again at the pause.
        let mut left = len;
        let mut changed = false;
        let mut buf = vec![0u8; CHUNK_MAX];
        while left > 0 {
            let want = left.min(CHUNK_MAX as u64) as usize;
            let mut got = 0;
            while got < want {
                let n = tokio::task::block_in_place(|| f.read(&mut buf[got..want]))
                    .map_err(|e| io_err(preopen, path, e))?;
                if n == 0 {
                    buf[got..want].fill(0);
                    changed = true;
                    got = want;
                } else {
                    got += n;
                }
            }
            left -= want as u64;
            stream
                .msg(Msg::FileData {
                    bytes: buf[..want].to_vec(),
                })
                .await?;
        }
        if !paused {
            let after = dir.symlink_metadata(path).ok();
            let moved = after.is_none_or(|m| {
                m.len() != len || mtime_ns(&m) != sig.mtime_ns || m.ino() != sig.ino
            });
            if changed || moved || sig.mtime_ns.saturating_add(UNSURE) >= started {
                self.unsure.insert(key.clone());
            }
        }
        Ok(Some(len))
    }
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn mtime_ns(m: &cap_std::fs::Metadata) -> u64 {
    (m.mtime().max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(m.mtime_nsec().max(0) as u64)
}

fn walk(dir: &Dir, prefix: &str, guest: &str, out: &mut BTreeMap<Key, Sig>) -> Result<(), String> {
    let mut names = Vec::new();
    for e in dir.entries().map_err(|e| io_err(guest, prefix, e))? {
        let e = e.map_err(|e| io_err(guest, prefix, e))?;
        let name = e.file_name();
        match std::str::from_utf8(name.as_bytes()) {
            Ok(s) => names.push(s.to_string()),
            Err(_) => {
                return Err(format!(
                    "the sandbox {guest}{prefix} holds a file name that is not UTF-8 \
                     ({name:?}); it cannot travel"
                ))
            }
        }
    }
    names.sort();
    for name in names {
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        // The program may remove entries while the walk runs (pre-copy).
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let m = match dir.symlink_metadata(&name) {
            Ok(m) => m,
            Err(e) if gone(&e) => continue,
            Err(e) => return Err(io_err(guest, &rel, e)),
        };
        let ft = m.file_type();
        let kind = if ft.is_symlink() {
            let target = match dir.read_link_contents(&name) {
                Ok(t) => t,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(io_err(guest, &rel, e)),
            };
            FileKind::Symlink {
                target: target.to_string_lossy().into_owned(),
            }
        } else if ft.is_dir() {
            FileKind::Dir
        } else if ft.is_file() {
            FileKind::File { len: m.len() }
        } else {
            continue; // sockets, fifos, devices do not travel
        };
        let is_dir = kind == FileKind::Dir;
        out.insert(
            (guest.to_string(), rel.clone()),
            Sig {
                kind,
                mode: m.mode() & 0o7777,
                mtime_ns: mtime_ns(&m),
                ino: m.ino(),
            },
        );
        if is_dir {
            match dir.open_dir(&name) {
                Ok(sub) => walk(&sub, &rel, guest, out)?,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(io_err(guest, &rel, e)),
            }
        }
    }
    Ok(())
}

/// Send the log, in chunks, with its dropped-bytes count. Returns its size.
pub(crate) async fn send_log(stream: &Stream, log: &CellLog) -> Result<u64, String> {
    let (bytes, dropped) = (log.contents(), log.dropped());
    for c in bytes.chunks(CHUNK_MAX) {
        stream
            .msg(Msg::LogChunk {
                dropped,
                bytes: c.to_vec(),
            })
            .await?;
    }
    Ok(bytes.len() as u64)
}

/// The destination's receiver for an arriving cell, with the node's caps.
pub(crate) fn receiver(
    n: &crate::state::NodeInner,
    offer: &roam_wire::Offer,
) -> Result<FileReceiver, String> {
    let preopens = crate::cells::make_preopens(n, &offer.cell.id, &offer.cell.dirs)
        .map_err(|e| format!("cannot create the cell's directories: {e}"))?;
    let caps = TreeCaps {
        bytes: n.cfg.limits.max_files_bytes,
        entries: n.cfg.limits.max_file_entries,
    };
    Ok(FileReceiver::new(preopens, caps, &n.cfg.name))
}

/// The caps an arriving file tree must stay under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TreeCaps {
    pub bytes: u64,
    pub entries: u64,
}

/// A file being received: its header and the bytes so far.
struct Partial {
    header: FileHeader,
    len: u64,
    data: Vec<u8>,
}

/// The destination's side: checks and writes entries as they arrive.
pub(crate) struct FileReceiver {
    preopens: Vec<Preopen>,
    caps: TreeCaps,
    node: String,
    /// Size of every entry written (0 for directories and links).
    sizes: HashMap<Key, u64>,
    total: u64,
    partial: Option<Partial>,
}

impl FileReceiver {
    pub(crate) fn new(preopens: Vec<Preopen>, caps: TreeCaps, node: &str) -> FileReceiver {
        FileReceiver {
            preopens,
            caps,
            node: node.to_string(),
            sizes: HashMap::new(),
            total: 0,
            partial: None,
        }
    }

    /// All announced bytes arrived (checked before the cell starts).
    pub(crate) fn check_complete(&self) -> Result<(), String> {
        match &self.partial {
            Some(p) => Err(format!(
                "the source sent {} of the {} bytes of {}{} before the final state",
                p.data.len(),
                p.len,
                p.header.preopen,
                p.header.path
            )),
            None => Ok(()),
        }
    }

    fn root(&self, preopen: &str) -> Result<&Preopen, String> {
        self.preopens
            .iter()
            .find(|p| p.guest == preopen)
            .ok_or_else(|| {
                format!("the source sent a file for {preopen}, which is not one of the cell's directories")
            })
    }

    /// Apply one file message.
    pub(crate) fn apply(&mut self, m: Msg) -> Result<(), String> {
        match m {
            Msg::FileEntry(h) => self.entry(h),
            Msg::FileData { bytes } => self.data(&bytes),
            Msg::FileRemoved { preopen, path } => self.remove(&preopen, &path),
            m => Err(format!("`{}` is not a file message", m.name())),
        }
    }

    fn entry(&mut self, h: FileHeader) -> Result<(), String> {
        self.check_complete()?;
        self.root(&h.preopen)?;
        let key = (h.preopen.clone(), h.path.clone());
        let old = self.sizes.get(&key).copied();
        if old.is_none() && self.sizes.len() as u64 >= self.caps.entries {
            return Err(format!(
                "the cell's sandbox has more than {} entries, node {}'s limit \
                 (raise it with roam node --max-file-entries)",
                self.caps.entries, self.node
            ));
        }
        let len = match h.kind {
            FileKind::File { len } => len,
            _ => 0,
        };
        let total = self.total - old.unwrap_or(0) + len;
        if total > self.caps.bytes {
            return Err(format!(
                "the cell's files come to more than {} with {}{} ({}), over node {}'s limit of {} \
                 (raise it with roam node --max-files-size)",
                human(total),
                h.preopen,
                h.path,
                human(len),
                self.node,
                human(self.caps.bytes)
            ));
        }
        self.sizes.insert(key, len);
        self.total = total;
        if len == 0 {
            let kind = match &h.kind {
                FileKind::Dir => roam_snapshot::FileKind::Dir,
                FileKind::File { .. } => roam_snapshot::FileKind::File { data: Vec::new() },
                FileKind::Symlink { target } => roam_snapshot::FileKind::Symlink {
                    target: target.clone(),
                },
            };
            return self.write(&h, kind);
        }
        self.partial = Some(Partial {
            header: h,
            len,
            data: Vec::new(),
        });
        Ok(())
    }

    fn data(&mut self, bytes: &[u8]) -> Result<(), String> {
        let Some(p) = &mut self.partial else {
            return Err("the source sent file data without a file entry".into());
        };
        if p.data.len() as u64 + bytes.len() as u64 > p.len {
            return Err(format!(
                "the source sent more than the {} bytes it announced for {}{}",
                p.len, p.header.preopen, p.header.path
            ));
        }
        p.data.extend_from_slice(bytes);
        if p.data.len() as u64 == p.len {
            let p = self.partial.take().expect("checked above");
            return self.write(&p.header, roam_snapshot::FileKind::File { data: p.data });
        }
        Ok(())
    }

    fn write(&self, h: &FileHeader, kind: roam_snapshot::FileKind) -> Result<(), String> {
        let entry = roam_snapshot::FileEntry {
            preopen: h.preopen.clone(),
            path: h.path.clone(),
            kind,
            mode: h.mode,
            mtime_ns: h.mtime_ns,
        };
        // The node's caps are enforced per header as entries arrive; the
        // per-entry checks and the no-symlink writing are the runtime's.
        roam_runtime::files::materialize_entry(
            entry,
            &self.preopens,
            &roam_runtime::files::FileTreeLimits::DEFAULT,
        )
        .map_err(|e| format!("cannot write {}/{}: {e}", h.preopen, h.path))
    }

    fn remove(&mut self, preopen: &str, path: &str) -> Result<(), String> {
        self.check_complete()?;
        let root = self.root(preopen)?;
        let safe = !path.is_empty()
            && std::path::Path::new(path)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !safe {
            return Err(format!(
                "the source asked to remove `{path}`, which is not a plain relative path"
            ));
        }
        // Removal resolves beneath the sandbox directory (cap-std), never
        // through a symlink out of it.
        let dir = Dir::open_ambient_dir(&root.host, cap_std::ambient_authority())
            .map_err(|e| format!("cannot open {}: {e}", root.host.display()))?;
        let r = match dir.symlink_metadata(path) {
            Ok(m) if m.is_dir() => dir.remove_dir_all(path),
            Ok(_) => dir.remove_file(path),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {preopen}/{path}: {e}")),
        }
        let prefix = format!("{path}/");
        let gone: Vec<Key> = self
            .sizes
            .keys()
            .filter(|(p, q)| p == preopen && (*q == path || q.starts_with(&prefix)))
            .cloned()
            .collect();
        for k in gone {
            self.total -= self.sizes.remove(&k).unwrap_or(0);
        }
        Ok(())
    }
}
