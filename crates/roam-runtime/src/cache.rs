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
    /// else `$HOME/.cache/roam`, else `roam-cache-<uid>` under the system
    /// temp dir (this user's own, never one shared by every user).
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
        std::env::temp_dir().join(format!(
            "roam-cache-{}",
            rustix::process::geteuid().as_raw()
        ))
    }

    /// Open (and create) a cache rooted at `root`.
    ///
    /// Compiled code found in the cache is loaded and run as this user, so
    /// the cache must be this user's alone: `root` and its subdirectories
    /// must belong to this user and be writable by no one else. A cache
    /// anyone else can write to (a shared `/tmp/roam-cache`, a directory
    /// planted by another user) is refused, not used. Directories this
    /// creates are `0700`.
    pub fn open(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let root = root.into();
        let subs = ["modules", "prepared", "compiled", "verified"].map(|s| root.join(s));
        for dir in std::iter::once(&root).chain(&subs) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            check_private(dir)?;
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

/// `dir` must be a directory of this user that no one else can write to.
fn check_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}; compiled code in the cache runs as this user, so roam uses only a \
                 cache of this user's own: set ROAM_CACHE_DIR (or --cache-dir) to one",
                dir.display()
            ),
        ))
    };
    if !m.is_dir() {
        return refuse("is not a directory".into());
    }
    if m.uid() != me {
        return refuse(format!(
            "belongs to uid {}, not to this user (uid {me})",
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return refuse(format!(
            "is writable by other users (mode {:o}); `chmod go-w` it if it is yours",
            m.mode() & 0o7777
        ));
    }
    Ok(())
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
    fn a_cache_others_can_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let err = Cache::open(&shared).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("writable by other users"), "{err}");
        // A subdirectory planted writable inside a private root, too.
        let root = dir.path().join("mine");
        Cache::open(&root).unwrap();
        let compiled = root.join("compiled");
        std::fs::set_permissions(&compiled, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = Cache::open(&root).unwrap_err();
        assert!(err.to_string().contains("compiled"), "{err}");
        // What it creates is private.
        let fresh = dir.path().join("a/b/cache");
        Cache::open(&fresh).unwrap();
        for d in [fresh.clone(), fresh.join("modules")] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", d.display());
        }
    }

    #[test]
    fn a_cache_of_another_user_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        let me = rustix::process::geteuid().as_raw();
        // Only root can give a directory away; as anyone else, the
        // directory of another user is the temp dir's parent chain: `/`.
        let other = if me == 0 {
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            theirs
        } else {
            PathBuf::from("/")
        };
        let err = Cache::open(&other).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(err.to_string().contains("not to this user"), "{err}");
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
