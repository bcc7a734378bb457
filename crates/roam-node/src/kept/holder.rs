//! The holder's files: every kept checkpoint of a cell it holds, one file
//! per version, `state_dir/kept/{cell}.{generation}.{taken_ms}.{snapshot}.kept`.
//!
//! Why versions: a new checkpoint must not replace the one the planner's
//! record names until the planner has recorded the new one. If its
//! compare-and-swap fails (the cell moved meanwhile), the record still
//! names the old checkpoint, and a restore asks for it by name. So a PUT
//! adds a version; the planner's `commit` then removes the older ones. A
//! holder keeps the committed version and at most [`UNCONFIRMED`] newer
//! ones, and refuses a PUT older than the newest it has (a late retry
//! must not win over a newer checkpoint).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use roam_snapshot::PAGE_SIZE;

use super::file::{self, Head};
use super::store::{KeptError, Manifest, PageHash};

/// Versions newer than the committed one that a holder keeps.
pub(crate) const UNCONFIRMED: usize = 2;

/// The holder's store of kept checkpoints, under `state_dir/kept`.
pub(crate) struct Holder {
    dir: PathBuf,
}

/// One stored version of a cell's kept checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    generation: u64,
    taken_ms: u64,
    snapshot: String,
    path: PathBuf,
}

impl Version {
    /// Newer versions sort higher.
    fn key(&self) -> (u64, u64) {
        (self.generation, self.taken_ms)
    }
}

fn key_of(m: &Manifest) -> (u64, u64) {
    (m.generation.unwrap_or(0), m.taken_ms)
}

impl Holder {
    pub(crate) fn new(state_dir: &Path) -> Holder {
        Holder {
            dir: state_dir.join("kept"),
        }
    }

    /// Panics on an unchecked cell id: ids become file names.
    fn check(id: &str) {
        if let Err(e) = roam_wire::ident::check_cell_id(id) {
            panic!("bug: an unchecked cell id reached the file system: {e}");
        }
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeptError {
        let path = path.to_path_buf();
        move |source| KeptError::Io { path, source }
    }

    /// The file of one version.
    fn version_path(&self, id: &str, m: &Manifest) -> PathBuf {
        Self::check(id);
        self.dir.join(format!(
            "{id}.{}.{}.{}.kept",
            m.generation.unwrap_or(0),
            m.taken_ms,
            m.snapshot
        ))
    }

    /// Where the name of the committed version is kept.
    fn committed_path(&self, id: &str) -> PathBuf {
        Self::check(id);
        self.dir.join(format!("{id}.committed"))
    }

    /// Every stored version of `id`, oldest first.
    fn versions(&self, id: &str) -> Result<Vec<Version>, KeptError> {
        Self::check(id);
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Self::io(&self.dir)(e)),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(Self::io(&self.dir))?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(rest) = name.strip_suffix(".kept") else {
                continue;
            };
            if rest == id {
                // Kept by an older holder, one file per cell, the same
                // layout: its name is in its manifest.
                if let Some(v) = legacy(&e.path()) {
                    out.push(v);
                }
                continue;
            }
            let mut parts = rest.rsplitn(4, '.');
            let (Some(snapshot), Some(taken), Some(generation), Some(cell)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Ok(taken_ms), Ok(generation)) = (taken.parse(), generation.parse()) else {
                continue;
            };
            if cell != id || roam_wire::ident::parse_module_hash(snapshot).is_err() {
                continue;
            }
            out.push(Version {
                generation,
                taken_ms,
                snapshot: snapshot.to_string(),
                path: e.path(),
            });
        }
        out.sort_by_key(Version::key);
        Ok(out)
    }

    /// The committed version's name, if the planner committed one.
    fn committed(&self, id: &str) -> Option<String> {
        let s = std::fs::read_to_string(self.committed_path(id)).ok()?;
        let s = s.trim();
        roam_wire::ident::parse_module_hash(s).ok()?;
        Some(s.to_string())
    }

    /// A stored kept checkpoint of `id`, opened: the version named
    /// `snapshot`, or without a name the committed one, else the newest.
    /// (Open, it stays readable if a commit or prune removes it.)
    pub(crate) fn open(&self, id: &str, snapshot: Option<&str>) -> Result<Option<File>, KeptError> {
        let versions = self.versions(id)?;
        let want = snapshot.map(str::to_string).or_else(|| self.committed(id));
        let v = match want {
            Some(s) => versions.iter().find(|v| v.snapshot == s),
            None => versions.last(),
        };
        match v {
            Some(v) => File::open(&v.path).map(Some).map_err(Self::io(&v.path)),
            None => Ok(None),
        }
    }

    /// The newest stored version of `id` and its manifest, if it reads.
    fn newest(&self, id: &str, max: u64) -> Result<Option<(Version, File, Head)>, KeptError> {
        let Some(v) = self.versions(id)?.pop() else {
            return Ok(None);
        };
        let f = File::open(&v.path).map_err(Self::io(&v.path))?;
        let len = f.metadata().map_err(Self::io(&v.path))?.len();
        match file::read_head(&f, len, max) {
            Ok(h) => Ok(Some((v, f, h))),
            Err(e) => {
                // A damaged file: everything is sent again.
                tracing::warn!("kept checkpoint {} is damaged: {e}", v.path.display());
                Ok(None)
            }
        }
    }

    /// The hashes of `wanted` that the newest stored version of `id`
    /// lacks.
    pub(crate) fn missing(
        &self,
        id: &str,
        wanted: &[PageHash],
        max: u64,
    ) -> Result<Vec<PageHash>, KeptError> {
        let have: std::collections::HashSet<PageHash> = match self.newest(id, max)? {
            Some((_, _, h)) => h.m.sent.into_iter().collect(),
            None => Default::default(),
        };
        Ok(wanted
            .iter()
            .filter(|h| !have.contains(*h))
            .copied()
            .collect())
    }

    /// A temporary file in the holder's directory, for an upload or a
    /// download (created exclusively: never through a symbolic link),
    /// removed when dropped.
    pub(crate) fn temp(&self) -> Result<Temp, KeptError> {
        self.ensure_dir()?;
        let path = self.dir.join(format!(".{}.tmp", crate::ids::new_id("")));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(Self::io(&path))?;
        Ok(Temp {
            path: Some(path),
            file,
        })
    }

    /// Store the checkpoint uploaded to file `upload` as a new version:
    /// its new pages from the upload, the others from the newest stored
    /// version, read and checked one page at a time. Refused, keeping
    /// everything, if a hash does not match, if a page is in neither, or
    /// if it is older than the newest stored version.
    pub(crate) fn put(&self, id: &str, upload: &File, max: u64) -> Result<Manifest, KeptError> {
        let len = upload
            .metadata()
            .map_err(|e| KeptError::Malformed(e.to_string()))?
            .len();
        let head = file::read_head(upload, len, max)?;
        file::verify(upload, &head)?;
        let m = &head.m;
        let newest = self.newest(id, max)?;
        if let Some((v, _, h)) = &newest {
            if v.snapshot == m.snapshot {
                // A retry of the newest: nothing to do.
                return Ok(h.m.clone());
            }
            if key_of(m) < v.key() {
                return Err(KeptError::Stale(format!(
                    "checkpoint {} (generation {}, taken at {} ms) is older than checkpoint {} \
                     (generation {}, taken at {} ms), which this node already holds",
                    m.snapshot,
                    m.generation.unwrap_or(0),
                    m.taken_ms,
                    v.snapshot,
                    v.generation,
                    v.taken_ms
                )));
            }
        }
        // Where each page comes from: the upload wins over the old version.
        let mut by_hash: HashMap<PageHash, (&File, &Head, usize)> = HashMap::new();
        if let Some((_, f, h)) = &newest {
            for (k, hash) in h.m.sent.iter().enumerate() {
                by_hash.insert(*hash, (f, h, k));
            }
        }
        for (k, hash) in m.sent.iter().enumerate() {
            by_hash.insert(*hash, (upload, &head, k));
        }
        let mut from = Vec::with_capacity(m.pages.len());
        for (i, h) in &m.pages {
            from.push(*by_hash.get(h).ok_or_else(|| {
                KeptError::Malformed(format!("page {i} ({h}) was neither sent nor held here"))
            })?);
        }
        let mut stored = m.clone();
        stored.sent = m.pages.iter().map(|(_, h)| *h).collect();
        let (state, log) = file::state_and_log(upload, &head)?;
        let path = self.version_path(id, &stored);
        self.write_atomic(&path, |w| {
            w.write_all(&file::head_bytes(&stored, &state, &log))
                .map_err(|e| KeptError::Io {
                    path: path.clone(),
                    source: e,
                })?;
            let mut page = vec![0u8; PAGE_SIZE];
            for &(f, h, k) in &from {
                if std::ptr::eq(f, upload) {
                    // Checked by `verify` above.
                    file::read_page(f, h, k, &mut page)?;
                } else {
                    // The old version's pages are checked as they are read.
                    file::page(f, h, k, &mut page)?;
                }
                w.write_all(&page).map_err(|e| KeptError::Io {
                    path: path.clone(),
                    source: e,
                })?;
            }
            Ok(())
        })?;
        self.prune(id)?;
        Ok(stored)
    }

    /// The planner recorded version `snapshot` of `id`: older versions go.
    pub(crate) fn commit(&self, id: &str, snapshot: &str) -> Result<(), KeptError> {
        let versions = self.versions(id)?;
        let Some(v) = versions.iter().find(|v| v.snapshot == snapshot) else {
            return Err(KeptError::Unknown(format!(
                "no kept checkpoint {snapshot} of cell {id} on this node"
            )));
        };
        let path = self.committed_path(id);
        self.write_atomic(&path, |w| {
            w.write_all(snapshot.as_bytes()).map_err(Self::io(&path))
        })?;
        for old in versions.iter().filter(|o| o.key() < v.key()) {
            remove(&old.path);
        }
        Ok(())
    }

    /// Keep the committed version and the newest [`UNCONFIRMED`] others.
    fn prune(&self, id: &str) -> Result<(), KeptError> {
        let committed = self.committed(id);
        let versions = self.versions(id)?;
        let others: Vec<&Version> = versions
            .iter()
            .filter(|v| Some(&v.snapshot) != committed.as_ref())
            .collect();
        let drop = others.len().saturating_sub(UNCONFIRMED);
        for v in &others[..drop] {
            remove(&v.path);
        }
        Ok(())
    }

    /// The holder's directory, created if need be; refused if it is not a
    /// directory (a symbolic link).
    fn ensure_dir(&self) -> Result<(), KeptError> {
        std::fs::create_dir_all(&self.dir).map_err(Self::io(&self.dir))?;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(Self::io(&self.dir))?;
        if !meta.is_dir() {
            return Err(KeptError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other("not a directory (a symbolic link?)"),
            });
        }
        Ok(())
    }

    /// Write `path` with `fill`: into a new temporary file, synced, then
    /// renamed. On any error the temporary file goes and `path` is
    /// unchanged.
    fn write_atomic(
        &self,
        path: &Path,
        fill: impl FnOnce(&mut BufWriter<&File>) -> Result<(), KeptError>,
    ) -> Result<(), KeptError> {
        let mut tmp = self.temp()?;
        let mut w = BufWriter::with_capacity(1 << 16, &tmp.file);
        fill(&mut w)?;
        w.flush().map_err(Self::io(path))?;
        drop(w);
        tmp.file.sync_all().map_err(Self::io(path))?;
        let from = tmp
            .path
            .take()
            .expect("a temporary file has its path until renamed");
        std::fs::rename(&from, path).map_err(|source| {
            let _ = std::fs::remove_file(&from);
            KeptError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// A temporary file of the holder, removed when dropped unless renamed.
pub(crate) struct Temp {
    path: Option<PathBuf>,
    pub file: File,
}

impl Drop for Temp {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            remove(p);
        }
    }
}

/// The version in `path`, a checkpoint an older holder kept as
/// `{cell}.kept`, if its head reads.
fn legacy(path: &Path) -> Option<Version> {
    let f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    match file::read_head(&f, len, roam_snapshot::MAX_MEMORY_BYTES) {
        Ok(h) => Some(Version {
            generation: h.m.generation.unwrap_or(0),
            taken_ms: h.m.taken_ms,
            snapshot: h.m.snapshot,
            path: path.to_path_buf(),
        }),
        Err(e) => {
            tracing::warn!("kept checkpoint {} is damaged: {e}", path.display());
            None
        }
    }
}

/// Remove a file, logging rather than failing: a version left behind is
/// removed by the next prune.
fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("cannot remove {}: {e}", path.display());
        }
    }
}
