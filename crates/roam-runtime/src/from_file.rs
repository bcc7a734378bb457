//! Restoring from a snapshot file without waiting for its memory.
//!
//! Why: a restore that reads every page before the program resumes costs
//! at least a copy of the whole memory (about 170 ms for 256 MiB on the
//! reference machine, target ≤ 50 ms). With a 2.0 file the program does
//! not need to wait: everything but the pages is read and checked, the
//! memory is made lazy ([`crate::lazy`], userfaultfd), and the program
//! rewinds at once. A page it touches first is served by reading the chunk
//! that holds it; a background thread reads the other chunks in file order
//! and installs them run by run, so the memory is complete soon after
//! either way.
//!
//! Every chunk is checked against its CRC before any of its pages is
//! installed. A chunk that fails (the file was damaged, truncated or
//! rewritten after it was opened) never yields a wrong page: the cell stops
//! at its next migration point with [`crate::RunError::PagesLost`] naming
//! the chunk, as a post-copy migration does when its source is lost.
//!
//! A 1.0 file, or a host without userfaultfd, restores by reading
//! everything first, as [`Cell::restore`] does.

use std::sync::Arc;

use roam_snapshot::{Opened, PageFile, Snapshot, PAGE_SIZE};
use roam_wasi::Preopen;

use crate::cell::{Cell, CellOptions};
use crate::error::RestoreError;
use crate::lazy::{LazyMemory, PageSource};
use crate::limits::CellLimits;
use crate::module::LoadedModule;
use crate::runtime::Runtime;

/// Serves faults: the whole chunk holding the faulting page.
struct ChunkSource {
    pages: PageFile,
    buf: Vec<u8>,
}

impl PageSource for ChunkSource {
    fn fetch(&mut self, want: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String> {
        let first = *want.first().ok_or("no page asked for")?;
        let i = self
            .pages
            .chunk_of(first)
            .ok_or_else(|| format!("page {first} is not stored in the snapshot file"))?;
        self.pages
            .read_chunk(i, &mut self.buf)
            .map_err(|e| chunk_error(i, &e))?;
        Ok(self
            .pages
            .chunk_pages(i)
            .iter()
            .zip(self.buf.chunks_exact(PAGE_SIZE))
            .map(|(&p, bytes)| (p, bytes.to_vec()))
            .collect())
    }
}

fn chunk_error(i: usize, e: &roam_snapshot::DecodeError) -> String {
    format!("memory chunk {i} of the snapshot file: {e}")
}

impl Cell {
    /// Rebuild a cell from a snapshot file opened with
    /// [`Snapshot::open_file`], ready to rewind into its migration point.
    ///
    /// A 2.0 file restores lazily when this host has userfaultfd: the cell
    /// is returned before its pages are read, with the [`LazyMemory`] that
    /// they fill (see the module docs). Otherwise (1.0 file, no
    /// userfaultfd) every page is read and written first, and no
    /// [`LazyMemory`] is returned.
    pub fn restore_file(
        rt: &Runtime,
        module: Arc<LoadedModule>,
        opened: &Opened,
        preopens: Vec<Preopen>,
        opts: CellOptions,
    ) -> Result<(Cell, Option<LazyMemory>), RestoreError> {
        // Before anything is allocated for the pages.
        crate::cell::check_module(opened.snapshot(), &module)?;
        CellLimits::of(&opts).check_memory(opened.snapshot().memory.byte_len())?;
        let (snapshot, pages) = match opened {
            Opened::Lazy { snapshot, pages } if crate::userfaultfd_available() => (snapshot, pages),
            Opened::Lazy { snapshot, pages } => {
                let whole = read_all(snapshot, pages)?;
                return Ok((Cell::restore(rt, module, &whole, preopens, opts)?, None));
            }
            Opened::Whole(snapshot) => {
                return Ok((Cell::restore(rt, module, snapshot, preopens, opts)?, None));
            }
        };
        if pages.initial_digest() != module.initial_image().digest() {
            return Err(RestoreError::Memory(
                "the module's initial memory image differs from the one the snapshot was \
                 captured against; restore with the same prepared module"
                    .into(),
            ));
        }
        let incoming = Cell::incoming(rt, module, opts)?;
        let source = ChunkSource {
            pages: pages.clone(),
            buf: Vec::new(),
        };
        let (cell, lazy) =
            incoming.finish_lazy(snapshot, preopens, pages.kinds().to_vec(), Box::new(source))?;
        let (p, l) = (pages.clone(), lazy.clone());
        std::thread::Builder::new()
            .name("roam-prefetch".into())
            .spawn(move || prefetch(&p, &l))
            .map_err(|e| RestoreError::Lazy(format!("spawning the page reader: {e}")))?;
        Ok((cell, Some(lazy)))
    }
}

/// Read every chunk into a complete snapshot (the fallback without
/// userfaultfd).
fn read_all(snapshot: &Snapshot, pages: &PageFile) -> Result<Snapshot, RestoreError> {
    let memory = pages
        .read_memory()
        .map_err(|e| RestoreError::Memory(format!("the snapshot file's memory: {e}")))?;
    Ok(Snapshot {
        memory,
        ..snapshot.clone()
    })
}

/// The background reader: every chunk not present yet, in file order,
/// installed run by run, until the memory is complete or nobody needs it.
fn prefetch(pages: &PageFile, lazy: &LazyMemory) {
    let mut buf = Vec::new();
    for i in 0..pages.chunk_count() {
        if lazy.is_settled() {
            return;
        }
        let held = pages.chunk_pages(i);
        if held.iter().all(|&p| lazy.has_page(p)) {
            continue;
        }
        if let Err(e) = pages.read_chunk(i, &mut buf) {
            lazy.fail(&chunk_error(i, &e));
            return;
        }
        for r in crate::lazy::runs(held) {
            let bytes = &buf[r.start * PAGE_SIZE..r.end * PAGE_SIZE];
            if let Err(e) = lazy.install_run(held[r.start], bytes) {
                lazy.fail(&format!("installing memory chunk {i}: {e}"));
                return;
            }
        }
    }
}
