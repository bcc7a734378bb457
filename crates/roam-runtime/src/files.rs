//! Carrying the sandbox directories inside a snapshot (`--with-files`).
//!
//! Why: a program's open files are reopened by path on restore. On another
//! machine those paths only exist if the files travel too. This module walks
//! each preopened directory into a [`FileTree`] and writes one back into the
//! directories given at restore. Entries are sorted so the same tree always
//! encodes to the same bytes. Paths from a snapshot are untrusted: any entry
//! with an absolute path or a `..` component is refused.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use roam_snapshot::{FileEntry, FileKind, FileTree};
use roam_wasi::Preopen;

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
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FilesError + '_ {
    move |source| FilesError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Walk every preopen into a tree.
pub fn capture(preopens: &[Preopen]) -> Result<FileTree, FilesError> {
    let mut entries = Vec::new();
    for p in preopens {
        walk(&p.host, &p.host, &p.guest, &mut entries)?;
    }
    Ok(FileTree { entries })
}

fn walk(root: &Path, dir: &Path, guest: &str, out: &mut Vec<FileEntry>) -> Result<(), FilesError> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
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
            FileKind::File {
                data: std::fs::read(&path).map_err(io(&path))?,
            }
        } else {
            continue; // sockets, fifos, devices do not travel
        };
        let is_dir = matches!(kind, FileKind::Dir);
        out.push(FileEntry {
            preopen: guest.to_string(),
            path: rel,
            kind,
            mode: meta.mode() & 0o7777,
            mtime_ns,
        });
        if is_dir {
            walk(root, &path, guest, out)?;
        }
    }
    Ok(())
}

/// Check that `rel` is a plain relative path.
fn safe_relative(rel: &str) -> Result<&Path, FilesError> {
    let p = Path::new(rel);
    let ok = !rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(p)
    } else {
        Err(FilesError::Escape(rel.to_string()))
    }
}

/// Write a tree into the directories given at restore. Existing files with
/// the same path are replaced; other files are left alone.
pub fn materialize(tree: &FileTree, preopens: &[Preopen]) -> Result<(), FilesError> {
    for e in &tree.entries {
        let rel = safe_relative(&e.path)?;
        let root = preopens
            .iter()
            .find(|p| p.guest == e.preopen)
            .ok_or_else(|| FilesError::NoPreopen(e.preopen.clone()))?;
        let path = root.host.join(rel);
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            let is_dir = meta.is_dir() && !meta.file_type().is_symlink();
            if !(is_dir && matches!(e.kind, FileKind::Dir)) {
                if is_dir {
                    std::fs::remove_dir_all(&path).map_err(io(&path))?;
                } else {
                    std::fs::remove_file(&path).map_err(io(&path))?;
                }
            }
        }
        match &e.kind {
            FileKind::Dir => std::fs::create_dir_all(&path).map_err(io(&path))?,
            FileKind::File { data } => std::fs::write(&path, data).map_err(io(&path))?,
            FileKind::Symlink { target } => {
                std::os::unix::fs::symlink(target, &path).map_err(io(&path))?
            }
        }
        if !matches!(e.kind, FileKind::Symlink { .. }) {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(e.mode))
                .map_err(io(&path))?;
        }
    }
    Ok(())
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
    fn capture_then_materialize_reproduces_the_tree() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("a/b")).unwrap();
        std::fs::write(src.path().join("a/b/f.txt"), b"hello").unwrap();
        std::fs::write(src.path().join("top"), b"x").unwrap();
        std::os::unix::fs::symlink("top", src.path().join("link")).unwrap();
        let tree = capture(&preopen(src.path())).unwrap();
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
}
