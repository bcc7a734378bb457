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
use std::io::Write;
use std::path::{Path, PathBuf};

use super::store::{frame, unframe, Framed, KeptError, Manifest};

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

    /// A stored kept checkpoint of `id`: the version named `snapshot`, or
    /// without a name the committed one, else the newest.
    pub(crate) fn read(
        &self,
        id: &str,
        snapshot: Option<&str>,
    ) -> Result<Option<Vec<u8>>, KeptError> {
        let versions = self.versions(id)?;
        let want = snapshot.map(str::to_string).or_else(|| self.committed(id));
        let v = match want {
            Some(s) => versions.iter().find(|v| v.snapshot == s),
            None => versions.last(),
        };
        match v {
            Some(v) => std::fs::read(&v.path).map(Some).map_err(Self::io(&v.path)),
            None => Ok(None),
        }
    }

    /// The hashes of `wanted` that the newest stored version of `id`
    /// lacks.
    pub(crate) fn missing(
        &self,
        id: &str,
        wanted: &[String],
        max: u64,
    ) -> Result<Vec<String>, KeptError> {
        let newest = self.versions(id)?.pop();
        let have: std::collections::HashSet<String> = match newest {
            Some(v) => match std::fs::read(&v.path)
                .ok()
                .map(|b| unframe(&b, max).map(|f| f.m.sent))
            {
                Some(Ok(sent)) => sent.into_iter().collect(),
                // A damaged file: everything is sent again.
                _ => Default::default(),
            },
            None => Default::default(),
        };
        Ok(wanted
            .iter()
            .filter(|h| !have.contains(*h))
            .cloned()
            .collect())
    }

    /// Store a `PUT`'s checkpoint as a new version: its new pages from the
    /// body, the others from the newest stored version. Refused, keeping
    /// everything, if a page is in neither, or if it is older than the
    /// newest stored version.
    pub(crate) fn put(&self, id: &str, body: &[u8], max: u64) -> Result<Manifest, KeptError> {
        let Framed {
            mut m,
            state,
            log,
            pages: new,
        } = unframe(body, max)?;
        let versions = self.versions(id)?;
        if let Some(newest) = versions.last() {
            if newest.snapshot == m.snapshot {
                // A retry of the newest: nothing to do.
                let b = std::fs::read(&newest.path).map_err(Self::io(&newest.path))?;
                return Ok(unframe(&b, max)?.m);
            }
            if key_of(&m) < newest.key() {
                return Err(KeptError::Stale(format!(
                    "checkpoint {} (generation {}, taken at {} ms) is older than checkpoint {}                      (generation {}, taken at {} ms), which this node already holds",
                    m.snapshot,
                    m.generation.unwrap_or(0),
                    m.taken_ms,
                    newest.snapshot,
                    newest.generation,
                    newest.taken_ms
                )));
            }
        }
        let old = match versions.last() {
            Some(v) => Some(std::fs::read(&v.path).map_err(Self::io(&v.path))?),
            None => None,
        };
        let old = old.as_deref().and_then(|b| unframe(b, max).ok());
        let mut by_hash: HashMap<&str, &[u8]> = HashMap::new();
        if let Some(o) = &old {
            for (h, p) in o.m.sent.iter().zip(&o.pages) {
                by_hash.insert(h, p);
            }
        }
        for (h, p) in m.sent.iter().zip(&new) {
            by_hash.insert(h, p);
        }
        let mut pages = Vec::with_capacity(m.pages.len());
        for (i, h) in &m.pages {
            let p = by_hash.get(h.as_str()).ok_or_else(|| {
                KeptError::Malformed(format!("page {i} ({h}) was neither sent nor held here"))
            })?;
            pages.push(*p);
        }
        m.sent = m.pages.iter().map(|(_, h)| h.clone()).collect();
        let file = frame(&m, state, log, &pages);
        self.write_atomic(&self.version_path(id, &m), &file)?;
        self.prune(id)?;
        Ok(m)
    }

    /// The planner recorded version `snapshot` of `id`: older versions go.
    pub(crate) fn commit(&self, id: &str, snapshot: &str) -> Result<(), KeptError> {
        let versions = self.versions(id)?;
        let Some(v) = versions.iter().find(|v| v.snapshot == snapshot) else {
            return Err(KeptError::Unknown(format!(
                "no kept checkpoint {snapshot} of cell {id} on this node"
            )));
        };
        self.write_atomic(&self.committed_path(id), snapshot.as_bytes())?;
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

    /// Write `bytes` as `path`: into a new temporary file (never through a
    /// symbolic link: it is created exclusively), synced, then renamed.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), KeptError> {
        std::fs::create_dir_all(&self.dir).map_err(Self::io(&self.dir))?;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(Self::io(&self.dir))?;
        if !meta.is_dir() {
            return Err(KeptError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other("not a directory (a symbolic link?)"),
            });
        }
        let tmp = self.dir.join(format!(".{}.tmp", crate::ids::new_id("")));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(Self::io(&tmp))?;
        let written = f.write_all(bytes).and_then(|()| f.sync_all());
        if let Err(source) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(KeptError::Io { path: tmp, source });
        }
        std::fs::rename(&tmp, path).map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            KeptError::Io {
                path: path.to_path_buf(),
                source,
            }
        })?;
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
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
