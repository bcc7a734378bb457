//! A cell's disk quota: the bytes its sandbox files may add up to.
//!
//! Why: a guest that writes without end fills the node's disk, and every
//! other cell's files and checkpoints with it; a guest that makes a 1 TiB
//! sparse file costs no disk but makes every later checkpoint and
//! migration of the cell impossible. So sizes are counted as the guest
//! sees them (a sparse file counts whole), starting from what the sandbox
//! holds when the context is made, and every operation that can make a
//! file longer asks for room first. Past the quota the guest gets
//! `EDQUOT` and the host keeps working. Shrinking and removing give room
//! back. A file with several links counts once; one removed while still
//! open gives its room back at once (its blocks stay until it is closed).

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ctx::Preopen;
use crate::errno::Errno;

/// The quota of one context.
#[derive(Debug)]
pub(crate) struct Quota {
    limit: u64,
    used: AtomicU64,
}

impl Quota {
    /// A quota of `limit` bytes over `preopens`, counting what they hold.
    pub(crate) fn measure(preopens: &[Preopen], limit: u64) -> Quota {
        let mut seen = HashSet::new();
        let mut used = 0u64;
        for p in preopens {
            used = used.saturating_add(tree_bytes(&p.host, &mut seen));
        }
        if used > limit {
            tracing::warn!(
                used,
                limit,
                "the sandbox already holds more than its quota; files can only shrink"
            );
        }
        Quota {
            limit,
            used: AtomicU64::new(used),
        }
    }

    /// The quota, bytes.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The bytes counted now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Room for a file to grow from `old` to `new` bytes, taken, or
    /// `EDQUOT`.
    pub(crate) fn grow(&self, old: u64, new: u64) -> Result<(), Errno> {
        let add = new.saturating_sub(old);
        if add == 0 {
            return Ok(());
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(add).filter(|&n| n <= self.limit)
            })
            .map(drop)
            .map_err(|_| Errno::DQUOT)
    }

    /// `by` bytes given back.
    pub(crate) fn shrink(&self, by: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(by))
            });
    }

    /// After an operation that took room for a file up to `reserved`
    /// bytes (at least its old size): it is `now` bytes long, and the
    /// count follows.
    pub(crate) fn settle(&self, reserved: u64, now: u64) {
        if now < reserved {
            self.shrink(reserved - now);
        } else if now > reserved {
            self.used.fetch_add(now - reserved, Ordering::AcqRel);
        }
    }
}

/// Bytes of the regular files under `dir`, each inode once.
fn tree_bytes(dir: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0u64;
    for e in entries.flatten() {
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            total = total.saturating_add(tree_bytes(&e.path(), seen));
        } else if m.is_file() && seen.insert((m.dev(), m.ino())) {
            total = total.saturating_add(m.len());
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_taken_and_given_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/b"), [0u8; 50]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("d/a-again")).unwrap();
        let p = vec![Preopen {
            host: dir.path().to_path_buf(),
            guest: "/data".into(),
        }];
        let q = Quota::measure(&p, 200);
        assert_eq!(q.used(), 150, "a linked file counts once");
        q.grow(0, 50).unwrap();
        assert_eq!(q.grow(0, 1), Err(Errno::DQUOT));
        // A write that reserved 50 but wrote 10.
        q.shrink(50);
        q.grow(10, 60).unwrap();
        q.settle(60, 20);
        assert_eq!(q.used(), 160);
        // Truncated below where it was.
        q.grow(20, 0).unwrap();
        q.settle(20, 0);
        assert_eq!(q.used(), 140);
    }
}
