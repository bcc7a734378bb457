//! Two page stores that live in this process: a file (roam's own local
//! swap, the baseline a board without a memory server has) and memory
//! (for tests, with a way to make it fail).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use roam_snapshot::PAGE_SIZE;

use super::PageStore;

/// Far pages in a file, at `index × 4 KiB`. The file is unlinked as soon
/// as it is created, so it goes away with the cell whatever happens.
pub struct FileStore {
    file: File,
    /// Which pages the file holds.
    held: Vec<bool>,
    what: String,
}

impl FileStore {
    /// A new, empty store in directory `dir`, for a memory of at most
    /// `pages` pages.
    pub fn create(dir: &Path, pages: usize) -> std::io::Result<FileStore> {
        let file = tempfile::tempfile_in(dir)?;
        Ok(FileStore {
            file,
            held: vec![false; pages],
            what: format!("swap file in {}", dir.display()),
        })
    }
}

impl PageStore for FileStore {
    fn put(&mut self, pages: &[(u32, &[u8])]) -> Result<(), String> {
        for &(p, bytes) in pages {
            let slot = self
                .held
                .get_mut(p as usize)
                .ok_or_else(|| format!("page {p} is beyond the store"))?;
            self.file
                .write_all_at(bytes, p as u64 * PAGE_SIZE as u64)
                .map_err(|e| format!("writing page {p}: {e}"))?;
            *slot = true;
        }
        Ok(())
    }

    fn get(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        let mut out = Vec::with_capacity(pages.len());
        for &p in pages {
            if !self.held.get(p as usize).copied().unwrap_or(false) {
                return Err(format!("page {p} was never stored"));
            }
            let mut page = vec![0u8; PAGE_SIZE];
            self.file
                .read_exact_at(&mut page, p as u64 * PAGE_SIZE as u64)
                .map_err(|e| format!("reading page {p}: {e}"))?;
            out.push((p, page));
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// Far pages in this process's heap: for tests. [`MemStore::breaker`]
/// makes every later call fail, as a memory server that died would.
#[derive(Default)]
pub struct MemStore {
    pages: HashMap<u32, Box<[u8]>>,
    broken: Arc<AtomicBool>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// A switch that breaks the store when set.
    pub fn breaker(&self) -> Arc<AtomicBool> {
        self.broken.clone()
    }

    fn check(&self) -> Result<(), String> {
        if self.broken.load(Ordering::Acquire) {
            return Err("the store is gone".into());
        }
        Ok(())
    }
}

impl PageStore for MemStore {
    fn put(&mut self, pages: &[(u32, &[u8])]) -> Result<(), String> {
        self.check()?;
        // Strict, for the tests: a batch names each page once.
        let mut seen = std::collections::HashSet::new();
        if let Some((p, _)) = pages.iter().find(|(p, _)| !seen.insert(*p)) {
            return Err(format!("page {p} twice in one put"));
        }
        for &(p, bytes) in pages {
            self.pages.insert(p, bytes.into());
        }
        Ok(())
    }

    fn get(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        self.check()?;
        pages
            .iter()
            .map(|&p| match self.pages.get(&p) {
                Some(b) => Ok((p, b.to_vec())),
                None => Err(format!("page {p} was never stored")),
            })
            .collect()
    }

    fn describe(&self) -> String {
        "memory store".into()
    }
}
