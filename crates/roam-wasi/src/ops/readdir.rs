//! `fd_readdir` with cookies that are plain indices.
//!
//! Exists because a directory cursor must survive a snapshot: entries are
//! listed in a deterministic order ("." and "..", then names sorted bytewise)
//! and the cookie of an entry is the index of the entry after it, so the
//! guest-held cookie alone says where reading continues, on any host.

use crate::ctx::WasiCtx;
use crate::errno::Errno;
use crate::mem::Mem;
use crate::types::{filetype, rights};
use cap_std::fs::Dir;
use rustix::fs::DirEntryExt;
use std::os::unix::ffi::OsStrExt;

/// One directory entry as the guest sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: Vec<u8>,
    pub(crate) ino: u64,
    pub(crate) ftype: u8,
}

/// All entries of `dir` in cookie order.
pub(crate) fn list(dir: &Dir) -> Result<Vec<Entry>, Errno> {
    use cap_std::fs::MetadataExt;
    let me = dir.dir_metadata()?;
    let mut names = Vec::new();
    for e in dir.entries()? {
        let e = e?;
        let ftype = e
            .file_type()
            .map(super::filetype_of)
            .unwrap_or(filetype::UNKNOWN);
        names.push(Entry {
            name: e.file_name().as_bytes().to_vec(),
            ino: e.ino(),
            ftype,
        });
    }
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = vec![
        Entry {
            name: b".".to_vec(),
            ino: me.ino(),
            ftype: filetype::DIRECTORY,
        },
        Entry {
            name: b"..".to_vec(),
            ino: 0,
            ftype: filetype::DIRECTORY,
        },
    ];
    out.extend(names);
    Ok(out)
}

/// The dirent stream starting at `cookie`, cut to at most `cap` bytes.
pub(crate) fn encode(entries: &[Entry], cookie: u64, cap: usize) -> Vec<u8> {
    let start = usize::try_from(cookie).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate().skip(start) {
        if out.len() >= cap {
            break;
        }
        out.extend_from_slice(&(i as u64 + 1).to_le_bytes());
        out.extend_from_slice(&e.ino.to_le_bytes());
        out.extend_from_slice(&(e.name.len() as u32).to_le_bytes());
        out.extend_from_slice(&[e.ftype, 0, 0, 0]);
        out.extend_from_slice(&e.name);
    }
    out.truncate(cap);
    out
}

impl WasiCtx {
    pub(crate) fn fd_readdir(
        &self,
        mem: &mut Mem,
        fd: u32,
        buf: u32,
        len: u32,
        cookie: u64,
        used: u32,
    ) -> Result<(), Errno> {
        let dir = self.dir(fd, rights::FD_READDIR)?.0;
        mem.slice(buf, len)?;
        let bytes = encode(&list(dir)?, cookie, len as usize);
        mem.write(buf, &bytes)?;
        mem.put_u32(used, bytes.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(entries: &[Entry]) -> Vec<&[u8]> {
        entries.iter().map(|e| e.name.as_slice()).collect()
    }

    /// Decode a dirent stream back into (d_next, name) pairs.
    fn decode(mut b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        while b.len() >= 24 {
            let next = u64::from_le_bytes(b[0..8].try_into().unwrap());
            let n = u32::from_le_bytes(b[16..20].try_into().unwrap()) as usize;
            if b.len() < 24 + n {
                break;
            }
            out.push((next, b[24..24 + n].to_vec()));
            b = &b[24 + n..];
        }
        out
    }

    #[test]
    fn sorted_listing_and_cookies_resume() {
        let t = tempfile::tempdir().unwrap();
        for n in ["zeta", "alpha", "mid"] {
            std::fs::write(t.path().join(n), n).unwrap();
        }
        std::fs::create_dir(t.path().join("sub")).unwrap();
        let d = Dir::open_ambient_dir(t.path(), cap_std::ambient_authority()).unwrap();
        let all = list(&d).unwrap();
        assert_eq!(
            names(&all),
            [&b"."[..], b"..", b"alpha", b"mid", b"sub", b"zeta"]
        );
        assert_eq!(all[4].ftype, filetype::DIRECTORY);
        assert_eq!(all[2].ftype, filetype::REGULAR_FILE);

        let full = decode(&encode(&all, 0, 4096));
        assert_eq!(
            full.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );

        // Read with a buffer that holds only a partial second entry, then resume
        // from the last complete entry's cookie, as libc does.
        let first = encode(&all, 0, 24 + 1 + 10);
        assert_eq!(first.len(), 35);
        let got = decode(&first);
        assert_eq!(got, vec![(1, b".".to_vec())]);
        let rest = decode(&encode(&all, got[0].0, 4096));
        assert_eq!(rest.first().unwrap().1, b"..");
        assert_eq!(rest.len(), 5);
        assert_eq!(decode(&encode(&all, 3, 4096))[0].1, b"mid");
        assert!(encode(&all, 6, 4096).is_empty());
        assert!(encode(&all, u64::MAX, 4096).is_empty());
    }
}
