//! The on-disk cache: prepared modules by hash, and compiled machine code per
//! module hash and target ISA.
//!
//! Why: restoring a snapshot must find the module it was taken from (a
//! snapshot names its module by hash), and compiling with Cranelift costs
//! seconds under emulation, far more than the restore itself. Every entry is
//! written to a temporary file and renamed into place, so concurrent roam
//! processes never see half an entry.
//!
//! ```text
//! $ROAM_CACHE_DIR (default $XDG_CACHE_HOME/roam, ~/.cache/roam)
//!   modules/<blake3 of prepared module>.wasm
//!   prepared/<blake3 of source>-<options>.wasm   (`roam run` on an unprepared module)
//!   compiled/<module hash>-<isa>-<engine>.cwasm  (+ .blake3 integrity sidecar)
//!   verified/<module hash>-r<check revision>     (empty: the module passed
//!                                                 `check_prepared`)
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

/// A cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// The default location: `$ROAM_CACHE_DIR`, else `$XDG_CACHE_HOME/roam`,
    /// else `$HOME/.cache/roam`, else a directory under the system temp dir.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("ROAM_CACHE_DIR") {
            return PathBuf::from(d);
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return PathBuf::from(d).join("roam");
        }
        if let Some(h) = std::env::var_os("HOME") {
            return PathBuf::from(h).join(".cache").join("roam");
        }
        std::env::temp_dir().join("roam-cache")
    }

    /// Open (and create) a cache rooted at `root`.
    pub fn open(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        let root = root.into();
        for sub in ["modules", "prepared", "compiled", "verified"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        Ok(Cache { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Path of a prepared module by its hash.
    pub fn module_path(&self, hash: &[u8; 32]) -> PathBuf {
        self.root
            .join("modules")
            .join(format!("{}.wasm", hex(hash)))
    }

    /// Path of the prepared form of a source module under given options.
    pub fn prepared_path(&self, source_hash: &[u8; 32], options: &str) -> PathBuf {
        let opt = blake3::hash(options.as_bytes());
        self.root.join("prepared").join(format!(
            "{}-{}.wasm",
            hex(source_hash),
            &opt.to_hex()[..16]
        ))
    }

    /// Path of compiled code for a module, ISA and engine configuration.
    pub fn compiled_path(&self, hash: &[u8; 32], isa: &str, engine: u64) -> PathBuf {
        self.root
            .join("compiled")
            .join(format!("{}-{isa}-{engine:016x}.cwasm", hex(hash)))
    }

    /// Path of the mark that a prepared module passed
    /// [`roam_prepare::check_prepared`] at a given check revision.
    pub fn verified_path(&self, hash: &[u8; 32], check_revision: u32) -> PathBuf {
        self.root
            .join("verified")
            .join(format!("{}-r{check_revision}", hex(hash)))
    }

    /// Read an entry, if present.
    pub fn get(&self, path: &Path) -> Option<Vec<u8>> {
        std::fs::read(path).ok()
    }

    /// Write an entry atomically.
    pub fn put(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(&self.root);
        let mut tmp = tempfile_in(dir)?;
        tmp.1.write_all(bytes)?;
        tmp.1.sync_all()?;
        std::fs::rename(&tmp.0, path)
    }
}

/// Lower-case hex of a hash.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    for attempt in 0u32..100 {
        let name = format!(
            ".tmp-{}-{}-{attempt}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        );
        let p = dir.join(name);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok((p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "cannot create a temporary cache file",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_then_get_round_trips_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(dir.path()).unwrap();
        let p = cache.module_path(&[7; 32]);
        cache.put(&p, b"abc").unwrap();
        assert_eq!(cache.get(&p).unwrap(), b"abc");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("modules"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        assert!(cache.get(&cache.module_path(&[8; 32])).is_none());
    }

    #[test]
    fn keys_differ_per_isa_and_options() {
        let cache = Cache {
            root: PathBuf::from("/c"),
        };
        assert_ne!(
            cache.compiled_path(&[1; 32], "x86_64", 1),
            cache.compiled_path(&[1; 32], "aarch64", 1)
        );
        assert_ne!(
            cache.prepared_path(&[1; 32], "points=loops"),
            cache.prepared_path(&[1; 32], "points=functions")
        );
    }
}
