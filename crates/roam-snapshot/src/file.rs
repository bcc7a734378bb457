//! Reading and writing snapshot files.
//!
//! A checkpoint that is interrupted half-way (crash, full disk, kill) must not
//! leave a truncated file where a good snapshot used to be. Writes therefore
//! go to a temporary file in the same directory, are fsynced, and are renamed
//! over the destination, then the directory is fsynced so the rename persists.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{
    DecodeError, EncodeError, EncodeOptions, PageFile, Snapshot, HEADER_LEN, MAX_COMPRESSED_BYTES,
};

/// Why a snapshot file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteFileError {
    /// Encoding failed; nothing was written.
    #[error("cannot encode the snapshot for {path}")]
    Encode {
        /// The destination.
        path: PathBuf,
        /// The encoding failure.
        #[source]
        source: EncodeError,
    },
    /// The file system refused; the destination is unchanged.
    #[error(
        "cannot write snapshot {path} (while {step}); check that the directory exists, is \
         writable and has free space"
    )]
    Io {
        /// The destination.
        path: PathBuf,
        /// What was being done.
        step: &'static str,
        /// The I/O failure.
        #[source]
        source: io::Error,
    },
}

/// Why a snapshot file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadFileError {
    /// The file could not be opened or read.
    #[error("cannot read snapshot {path}; check the path and its permissions")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O failure.
        #[source]
        source: io::Error,
    },
    /// The file's bytes are not a valid snapshot.
    #[error("{path} is not a valid snapshot")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoding failure.
        #[source]
        source: DecodeError,
    },
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Snapshot {
    /// Encode with default options and write atomically to `path`.
    /// Returns the number of bytes written.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<u64, WriteFileError> {
        self.write_file_with(path, &EncodeOptions::default())
    }

    /// Encode with `opts` and write atomically to `path` (temporary file in the
    /// same directory, fsync, rename, fsync of the directory).
    pub fn write_file_with(
        &self,
        path: impl AsRef<Path>,
        opts: &EncodeOptions,
    ) -> Result<u64, WriteFileError> {
        let path = path.as_ref();
        let bytes = self.encode(opts).map_err(|source| WriteFileError::Encode {
            path: path.to_path_buf(),
            source,
        })?;
        write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// Read and decode the snapshot file at `path`.
    pub fn read_file(path: impl AsRef<Path>) -> Result<Snapshot, ReadFileError> {
        Self::read_file_with_header(path).map(|(s, _)| s)
    }

    /// Like [`Snapshot::read_file`], also returning the header, e.g. for
    /// `snap.summary().with_header(&header)` to include on-disk sizes.
    pub fn read_file_with_header(
        path: impl AsRef<Path>,
    ) -> Result<(Snapshot, crate::Header), ReadFileError> {
        let path = path.as_ref();
        let (f, len, header) = open_header(path)?;
        read_opened(path, f, len, header)
    }
}

/// Decode the file `f` (of `len` bytes, `header` already read from it)
/// whole. Format v2 is read chunk by chunk, straight into its page file; v1
/// (one stream) is read whole, from the same open file.
fn read_opened(
    path: &Path,
    f: File,
    len: u64,
    header: crate::Header,
) -> Result<(Snapshot, crate::Header), ReadFileError> {
    let decode_err = |source| ReadFileError::Decode {
        path: path.to_path_buf(),
        source,
    };
    if header.version.major == 2 {
        return crate::v2::read_file(&header, f, len)
            .map(|s| (s, header))
            .map_err(decode_err);
    }
    let bytes = read_all(path, f, len)?;
    Snapshot::decode_with_header(&bytes).map_err(decode_err)
}

/// A snapshot file opened for restoring: see [`Snapshot::open_file`].
#[derive(Debug)]
pub enum Opened {
    /// Read and checked whole (format 1.0, which is one stream).
    Whole(Snapshot),
    /// Format 2.0: everything but the pages read and checked. The
    /// snapshot's memory is a [`crate::MemoryImage::placeholder`] of the
    /// right size; the pages are read from the still open file on demand,
    /// each chunk checked against its CRC when read.
    Lazy {
        /// The snapshot without its pages.
        snapshot: Snapshot,
        /// Its pages.
        pages: PageFile,
    },
}

impl Opened {
    /// The snapshot (in [`Opened::Lazy`], with a placeholder memory).
    pub fn snapshot(&self) -> &Snapshot {
        match self {
            Opened::Whole(s) | Opened::Lazy { snapshot: s, .. } => s,
        }
    }
}

impl Snapshot {
    /// Open the snapshot file at `path` for a restore that need not wait
    /// for its memory: a 2.0 file is checked like [`Snapshot::read_file`]
    /// checks it, except for the chunks' CRCs, which are checked when each
    /// chunk is read; a 1.0 file is read whole.
    pub fn open_file(path: impl AsRef<Path>) -> Result<(Opened, crate::Header), ReadFileError> {
        let path = path.as_ref();
        let (f, len, header) = open_header(path)?;
        if header.version.major != 2 {
            return read_opened(path, f, len, header).map(|(s, h)| (Opened::Whole(s), h));
        }
        let (snapshot, pages) =
            crate::v2::open_file(&header, f, len).map_err(|source| ReadFileError::Decode {
                path: path.to_path_buf(),
                source,
            })?;
        Ok((Opened::Lazy { snapshot, pages }, header))
    }
}

/// Open a file (capped as in [`open_capped`]) and read its header.
fn open_header(path: &Path) -> Result<(File, u64, crate::Header), ReadFileError> {
    let (mut f, len) = open_capped(path)?;
    let mut head = vec![0u8; HEADER_LEN.min(len as usize)];
    f.read_exact(&mut head)
        .map_err(|source| ReadFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let header = crate::peek_header(&head).map_err(|source| ReadFileError::Decode {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((f, len, header))
}

/// Open a file, refusing one larger than any valid snapshot.
fn open_capped(path: &Path) -> Result<(File, u64), ReadFileError> {
    let io_err = |source| ReadFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let f = File::open(path).map_err(io_err)?;
    let len = f.metadata().map_err(io_err)?.len();
    let max = HEADER_LEN as u64 + MAX_COMPRESSED_BYTES;
    if len > max {
        let source = DecodeError::TooLarge {
            what: "snapshot file",
            len,
            max,
        };
        return Err(ReadFileError::Decode {
            path: path.to_path_buf(),
            source,
        });
    }
    Ok((f, len))
}

/// Read all of `f` (`len` bytes, checked against the cap by
/// [`open_capped`]) from its start, never more than any valid snapshot holds.
fn read_all(path: &Path, mut f: File, len: u64) -> Result<Vec<u8>, ReadFileError> {
    let io_err = |source| ReadFileError::Io {
        path: path.to_path_buf(),
        source,
    };
    f.rewind().map_err(io_err)?;
    let max = HEADER_LEN as u64 + MAX_COMPRESSED_BYTES;
    let mut bytes = Vec::with_capacity(len as usize);
    Read::by_ref(&mut f)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    Ok(bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), WriteFileError> {
    let io_err = |step, source| WriteFileError::Io {
        path: path.to_path_buf(),
        step,
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io_err(
            "naming the temporary file",
            io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
        )
    })?;
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}.{n}", std::process::id()));
    let tmp = dir.join(tmp_name);

    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_err("creating the temporary file", e))?;
        f.write_all(bytes).map_err(|e| io_err("writing", e))?;
        f.sync_all().map_err(|e| io_err("syncing the file", e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| io_err("renaming into place", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Persist the rename. Directories cannot be opened for syncing everywhere;
    // where they can, a failure is real.
    #[cfg(unix)]
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("syncing the directory", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::sample_snapshot;

    #[test]
    fn write_then_read_round_trips_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.roam");
        fs::write(&path, b"old contents").unwrap();
        let (_, _, snap) = sample_snapshot(2, 20);
        let n = snap.write_file(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), n);
        assert_eq!(Snapshot::read_file(&path).unwrap(), snap);
        let (_, h) = Snapshot::read_file_with_header(&path).unwrap();
        assert_eq!(h.compressed_len + crate::HEADER_LEN as u64, n);
        // No temporary files left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.roam")]);
    }

    #[test]
    fn failures_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope/a.roam");
        let (_, _, snap) = sample_snapshot(1, 21);
        let e = snap.write_file(&missing).unwrap_err();
        assert!(matches!(e, WriteFileError::Io { .. }));
        assert!(e.to_string().contains("nope"));
        assert!(matches!(
            Snapshot::read_file(&missing),
            Err(ReadFileError::Io { .. })
        ));

        let junk = dir.path().join("junk");
        fs::write(&junk, b"not a snapshot at all").unwrap();
        assert!(matches!(
            Snapshot::read_file(&junk),
            Err(ReadFileError::Decode {
                source: DecodeError::BadMagic { .. },
                ..
            })
        ));

        let mut bad = snap;
        bad.module.embedded = Some(vec![1]);
        let target = dir.path().join("b.roam");
        assert!(matches!(
            bad.write_file(&target),
            Err(WriteFileError::Encode { .. })
        ));
        assert!(!target.exists());
    }
}
