//! Control groups for cells: finding the hierarchy the node is in, and
//! making, filling and removing a group per cell under it.
//!
//! The layout, under the cgroup the node process is in (`BASE`):
//!
//! ```text
//!   BASE/                      the node's own threads stay here
//!   BASE/roam-NODE/            all cells of the node together, weight CELLS_WEIGHT
//!   BASE/roam-NODE/cell-ID/    one cell's thread, its weight and cap
//! ```
//!
//! cgroup v2 makes `roam-NODE` and each `cell-ID` *threaded* (a cell is a
//! thread of the node process, and v2 places whole processes in domain
//! groups); v1's `cpu` controller takes thread ids in `tasks` as it is.
//!
//! Everything is written through directory descriptors opened without
//! following symbolic links, and every name is built from a node name or
//! a cell id that has passed roam's identifier check, so no id can name a
//! path outside the node's own subtree. The paths themselves come from
//! the kernel (`/proc/self/mountinfo`, `/proc/self/cgroup`) and are read
//! as text that may be malformed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::CpuError;

/// Which cgroup hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// The unified hierarchy with the `cpu` controller.
    V2,
    /// A v1 hierarchy with the `cpu` controller mounted.
    V1,
}

/// The weight of all cells of a node together, in cgroup v2 units (a
/// thread at nice 0 weighs 100): a busy node thread gets four fifths of
/// its CPU whatever the cells do.
pub(crate) const CELLS_WEIGHT: u32 = 25;

/// The CFS period roam sets with a cap, microseconds (the kernel's
/// default).
pub(crate) const PERIOD_US: u64 = 100_000;

/// A cgroup v2 weight (1..=10000, 100 the default) as a v1 `cpu.shares`
/// (1024 the default), the way systemd converts them.
pub(crate) fn v1_shares(weight: u32) -> u64 {
    (u64::from(weight) * 1024 / 100).clamp(2, 262_144)
}

/// The CFS quota for a cap of `millicores` thousandths of a core.
pub(crate) fn quota_us(millicores: u32) -> u64 {
    u64::from(millicores) * PERIOD_US / 1000
}

/// The directory of the cgroup the node is in, in the hierarchy `v`, from
/// the text of `/proc/self/mountinfo` and `/proc/self/cgroup`. `None`:
/// no such hierarchy is mounted here, or the node's group is outside the
/// mount (a container that sees only part of the tree).
pub(crate) fn find(v: Version, mountinfo: &str, cgroup: &str) -> Option<PathBuf> {
    let own = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let ours = match v {
            Version::V2 => id == "0" && ctrls.is_empty(),
            Version::V1 => id != "0" && ctrls.split(',').any(|c| c == "cpu"),
        };
        ours.then_some(path)
    })?;
    mountinfo.lines().find_map(|l| {
        let (mount, fstype, opts) = parse_mount(l)?;
        let ours = match v {
            Version::V2 => fstype == "cgroup2",
            Version::V1 => fstype == "cgroup" && opts.split(',').any(|o| o == "cpu"),
        };
        if !ours {
            return None;
        }
        let rel = relative(&mount.0, own)?;
        Some(mount.1.join(rel))
    })
}

/// A mountinfo line's (root, mount point), file system type and super
/// options.
fn parse_mount(line: &str) -> Option<((String, PathBuf), &str, &str)> {
    let (pre, post) = line.split_once(" - ")?;
    let f: Vec<&str> = pre.split(' ').collect();
    let (root, point) = (unescape(f.get(3)?), unescape(f.get(4)?));
    let mut p = post.split(' ');
    let fstype = p.next()?;
    let _source = p.next()?;
    let opts = p.next()?;
    Some(((root, PathBuf::from(point)), fstype, opts))
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` (the node's cgroup) relative to the mount's `root`, if it is
/// under it and made only of plain components.
fn relative(root: &str, path: &str) -> Option<PathBuf> {
    let rest = if root == "/" {
        path
    } else if path == root {
        ""
    } else {
        path.strip_prefix(root).filter(|r| r.starts_with('/'))?
    };
    let rel: PathBuf = Path::new(rest.trim_start_matches('/')).to_path_buf();
    rel.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(rel)
}

/// The name of a node's subtree; `name` must have passed the node name
/// check.
pub(crate) fn node_group_name(name: &str) -> Result<String, CpuError> {
    roam_wire::ident::check_node_name(name).map_err(|e| CpuError::Name(e.to_string()))?;
    Ok(format!("roam-{name}"))
}

/// The name of a cell's group; the id is checked here, again.
pub(crate) fn cell_group_name(id: &str) -> Result<String, CpuError> {
    roam_wire::ident::check_cell_id(id).map_err(|e| CpuError::Name(e.to_string()))?;
    Ok(format!("cell-{id}"))
}

fn open_dir_at(dir: &OwnedFd, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn write_at(dir: &OwnedFd, name: &str, value: &str) -> Result<(), CpuError> {
    let io = |e: std::io::Error| CpuError::Write(name.to_string(), value.to_string(), e);
    // O_CREAT only makes a difference on a plain directory (the unit
    // tests' fake trees): a cgroup's control files exist or cannot be made.
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| io(e.into()))?;
    File::from(fd).write_all(value.as_bytes()).map_err(io)
}

fn read_at(dir: &OwnedFd, name: &str) -> Result<String, CpuError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| CpuError::Read(name.to_string(), e.into()))?;
    let mut s = String::new();
    File::from(fd)
        .take(64 << 10)
        .read_to_string(&mut s)
        .map_err(|e| CpuError::Read(name.to_string(), e))?;
    Ok(s)
}

fn mkdir_at(dir: &OwnedFd, name: &str) -> Result<(), CpuError> {
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(CpuError::Mkdir(name.to_string(), e.into())),
    }
}

/// The node's subtree in one hierarchy: its own group's directory and the
/// cells' parent, both open.
#[derive(Debug)]
pub(crate) struct Groups {
    pub(crate) version: Version,
    /// The node's own cgroup.
    base_path: PathBuf,
    base: OwnedFd,
    /// `roam-NODE`.
    node_name: String,
    node: OwnedFd,
}

/// One cell's group, made and holding the cell's thread.
#[derive(Debug)]
pub(crate) struct CellGroup {
    name: String,
    pub(crate) path: PathBuf,
    tid: i32,
}

impl Groups {
    /// Make (or take over) the node's subtree under `base`, the node's own
    /// cgroup in hierarchy `version`, and remove the empty cell groups a
    /// previous run of this node left (it was killed, or its groups could
    /// not be removed). Returns how many it removed too.
    pub(crate) fn setup(
        version: Version,
        base_path: &Path,
        node: &str,
    ) -> Result<(Groups, usize), CpuError> {
        let node_name = node_group_name(node)?;
        let base = rustix::fs::open(
            base_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| CpuError::Read(base_path.display().to_string(), e.into()))?;
        match version {
            Version::V2 => {
                let controllers = read_at(&base, "cgroup.controllers")?;
                if !controllers.split_whitespace().any(|c| c == "cpu") {
                    return Err(CpuError::NoController(base_path.to_path_buf()));
                }
            }
            Version::V1 => {
                read_at(&base, "cpu.shares")?;
            }
        }
        mkdir_at(&base, &node_name)?;
        let node_fd = open_dir_at(&base, &node_name)
            .map_err(|e| CpuError::Mkdir(node_name.clone(), e.into()))?;
        let g = Groups {
            version,
            base_path: base_path.to_path_buf(),
            base,
            node_name,
            node: node_fd,
        };
        match version {
            Version::V2 => {
                g.make_threaded(&g.node)?;
                // Unreadable reads as empty: the write then says what is wrong.
                let sub = |d| read_at(d, "cgroup.subtree_control").unwrap_or_default();
                if !has_cpu(&sub(&g.base)) {
                    write_at(&g.base, "cgroup.subtree_control", "+cpu")?;
                }
                write_at(&g.node, "cpu.weight", &CELLS_WEIGHT.to_string())?;
                if !has_cpu(&sub(&g.node)) {
                    write_at(&g.node, "cgroup.subtree_control", "+cpu")?;
                }
            }
            Version::V1 => {
                write_at(&g.node, "cpu.shares", &v1_shares(CELLS_WEIGHT).to_string())?;
            }
        }
        let removed = g.remove_empty_cells();
        Ok((g, removed))
    }

    /// The path of the cells' parent group.
    pub(crate) fn node_path(&self) -> PathBuf {
        self.base_path.join(&self.node_name)
    }

    fn make_threaded(&self, dir: &OwnedFd) -> Result<(), CpuError> {
        if read_at(dir, "cgroup.type").is_ok_and(|t| t.trim() == "threaded") {
            return Ok(());
        }
        write_at(dir, "cgroup.type", "threaded")
    }

    /// The file a thread id is written to, to move that thread.
    fn threads_file(&self) -> &'static str {
        match self.version {
            Version::V2 => "cgroup.threads",
            Version::V1 => "tasks",
        }
    }

    /// Make cell `id`'s group with `weight` and an optional cap, and move
    /// thread `tid` into it.
    pub(crate) fn enter(
        &self,
        id: &str,
        weight: u32,
        max_millicores: Option<u32>,
        tid: i32,
    ) -> Result<CellGroup, CpuError> {
        let name = cell_group_name(id)?;
        // Another node of the same name starting on this machine may remove
        // an empty group between its making and the thread's move: make it
        // once more then.
        let mut tries = 0;
        loop {
            tries += 1;
            match self.try_enter(&name, weight, max_millicores, tid) {
                Err(e) if tries < 2 && e.not_found() => continue,
                Err(e) => {
                    // Leave nothing half made behind.
                    let _ = rustix::fs::unlinkat(&self.node, name.as_str(), AtFlags::REMOVEDIR);
                    return Err(e);
                }
                Ok(()) => {
                    return Ok(CellGroup {
                        path: self.node_path().join(&name),
                        name,
                        tid,
                    })
                }
            }
        }
    }

    fn try_enter(
        &self,
        name: &str,
        weight: u32,
        max_millicores: Option<u32>,
        tid: i32,
    ) -> Result<(), CpuError> {
        mkdir_at(&self.node, name)?;
        let dir = open_dir_at(&self.node, name)
            .map_err(|e| CpuError::Mkdir(name.to_string(), e.into()))?;
        match self.version {
            Version::V2 => {
                self.make_threaded(&dir)?;
                write_at(&dir, "cpu.weight", &weight.to_string())?;
                let max = match max_millicores {
                    Some(m) => format!("{} {PERIOD_US}", quota_us(m)),
                    None => format!("max {PERIOD_US}"),
                };
                write_at(&dir, "cpu.max", &max)?;
            }
            Version::V1 => {
                write_at(&dir, "cpu.shares", &v1_shares(weight).to_string())?;
                let quota =
                    max_millicores.map_or_else(|| "-1".to_string(), |m| quota_us(m).to_string());
                write_at(&dir, "cpu.cfs_period_us", &PERIOD_US.to_string())?;
                write_at(&dir, "cpu.cfs_quota_us", &quota)?;
            }
        }
        write_at(&dir, self.threads_file(), &tid.to_string())
    }

    /// Move the cell's thread back into the node's own group and remove
    /// the cell's group. Called on the cell's thread as it ends.
    pub(crate) fn leave(&self, g: &CellGroup) -> Result<(), CpuError> {
        write_at(&self.base, self.threads_file(), &g.tid.to_string())?;
        rustix::fs::unlinkat(&self.node, g.name.as_str(), AtFlags::REMOVEDIR)
            .map_err(|e| CpuError::Remove(g.name.clone(), e.into()))
    }

    /// Remove every empty cell group (those of live cells hold a thread,
    /// and the kernel refuses to remove them). How many went.
    pub(crate) fn remove_empty_cells(&self) -> usize {
        let Ok(dir) = rustix::fs::Dir::read_from(self.node.as_fd()) else {
            return 0;
        };
        let mut removed = 0;
        for entry in dir.flatten() {
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            let Some(id) = name.strip_prefix("cell-") else {
                continue;
            };
            if roam_wire::ident::check_cell_id(id).is_err()
                || entry.file_type() != rustix::fs::FileType::Directory
            {
                continue;
            }
            if rustix::fs::unlinkat(&self.node, name, AtFlags::REMOVEDIR).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// At the node's end: remove the empty cell groups and, if that leaves
    /// it empty, the node's subtree.
    pub(crate) fn remove_all(&self) {
        self.remove_empty_cells();
        let _ = rustix::fs::unlinkat(&self.base, self.node_name.as_str(), AtFlags::REMOVEDIR);
    }
}

fn has_cpu(subtree_control: &str) -> bool {
    subtree_control
        .split_whitespace()
        .any(|c| c.trim_start_matches('+') == "cpu")
}
