//! Post-copy: a received cell runs at once, and its memory pages arrive
//! when first touched.
//!
//! Why: stop-and-copy makes the program wait for all of its memory to cross
//! the network. Post-copy moves only the small part of the state (globals,
//! stack, OS layer) before the program resumes on the destination; each
//! page still at the source is fetched on its first access, while a
//! prefetcher run by the caller pushes the rest in the background.
//!
//! How: every page of roam's own anonymous mapping is dropped
//! (`MADV_DONTNEED`) and the range is registered with userfaultfd in
//! missing mode. Pages equal to the module's initial image are installed at
//! once from the local module; zero pages are served as zero pages; a fault
//! on a data page makes the handler thread fetch it from the
//! [`PageSource`], together with up to `batch - 1` following data pages not
//! present yet (batches of 4-8 neighbours pay off: programs touch memory in
//! runs). When every data page is present the range is unregistered and
//! the thread ends.
//!
//! When the source is lost ([`LazyMemory::fail`], or a fetch error), the
//! program must not go on with wrong memory and must not hang: faults are
//! answered with zero pages to unblock it, and the cell's flag is raised so
//! that its next migration point stops it with
//! [`crate::RunError::PagesLost`] (a program that reaches no point stops
//! when it traps or exits, and its run still ends in that error).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use roam_snapshot::{PageKind, Snapshot, PAGE_SIZE};
use roam_wasi::Preopen;

use crate::cell::Cell;
use crate::control::Control;
use crate::error::RestoreError;
use crate::incoming::Incoming;
use crate::memory::LiveMemory;
use crate::module::LoadedModule;
use crate::uffd::{self, Uffd};

/// Default number of data pages fetched per fault (the faulting page and
/// its next missing data neighbours).
pub const DEFAULT_FETCH_BATCH: usize = 8;

/// Where the pages of a lazily received memory come from (the source node).
pub trait PageSource: Send {
    /// Fetch these pages (4 KiB each, by index). Blocking; called from the
    /// fault-handler thread while the program waits. May return more pages
    /// than asked, and must return at least the first one asked.
    fn fetch(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String>;
}

/// Installing a page into lazy memory failed.
#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    /// The page index is outside the memory, or the bytes are not a page.
    #[error("page {page} is not a {PAGE_SIZE}-byte page of this {pages}-page memory")]
    BadPage {
        /// The index.
        page: u32,
        /// Pages in the memory.
        pages: u32,
    },
    /// The kernel refused to install the page.
    #[error("cannot install page {page}: {source}")]
    Install {
        /// The index.
        page: u32,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Counters of a lazy memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LazyStats {
    /// Faults on data pages served by fetching from the source.
    pub faults_served: u64,
    /// Calls of [`PageSource::fetch`].
    pub fetch_calls: u64,
    /// Pages installed from fetches made for faults.
    pub pages_fetched: u64,
    /// Pages installed by [`LazyMemory::install`] (prefetch).
    pub pages_prefetched: u64,
    /// Total time faults on data pages waited for their page.
    pub fault_wait_total: Duration,
    /// Longest such wait.
    pub fault_wait_max: Duration,
}

struct Present {
    bits: Vec<bool>,
    missing_data: usize,
}

struct Shared {
    uffd: Uffd,
    mem: LiveMemory,
    base: usize,
    len: usize,
    kinds: Vec<PageKind>,
    present: Mutex<Present>,
    source: Mutex<Box<dyn PageSource>>,
    batch: usize,
    lost: Arc<OnceLock<String>>,
    control: Arc<Control>,
    stop: AtomicBool,
    registered: AtomicBool,
    faults: AtomicU64,
    fetch_calls: AtomicU64,
    fetched: AtomicU64,
    prefetched: AtomicU64,
    wait_ns: AtomicU64,
    wait_max_ns: AtomicU64,
}

/// A handle to a lazily received memory: install pages that arrive on
/// their own, see what is missing, give up. `Clone + Send + Sync`.
#[derive(Clone)]
pub struct LazyMemory(Arc<Shared>);

/// Held by the cell: stops the handler thread when the cell goes away.
pub(crate) struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

impl Incoming {
    /// Finish for post-copy: like [`Incoming::finish`], but the memory is
    /// not here yet (a memory image in `snapshot` is ignored). `kinds` describes every 4 KiB page of the final memory
    /// (its length sets the size); data pages come from `source` on first
    /// touch, in batches of [`DEFAULT_FETCH_BATCH`]. Needs userfaultfd on
    /// this host ([`crate::userfaultfd_available`]).
    pub fn finish_lazy(
        self,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        kinds: Vec<PageKind>,
        source: Box<dyn PageSource>,
    ) -> Result<(Cell, LazyMemory), RestoreError> {
        self.finish_lazy_with(snapshot, preopens, kinds, source, DEFAULT_FETCH_BATCH)
    }

    /// [`Incoming::finish_lazy`] with `batch` data pages per fetch (at
    /// least 1).
    pub fn finish_lazy_with(
        mut self,
        snapshot: &Snapshot,
        preopens: Vec<Preopen>,
        kinds: Vec<PageKind>,
        source: Box<dyn PageSource>,
        batch: usize,
    ) -> Result<(Cell, LazyMemory), RestoreError> {
        if let Some(why) = uffd::unavailable() {
            return Err(RestoreError::NoUserfaultfd(why));
        }
        let len = kinds.len() * PAGE_SIZE;
        self.grow_to(len as u64)?;
        let mem = self.live_memory();
        if mem.len() != len {
            return Err(RestoreError::Memory(format!(
                "{} page kinds given for a {}-byte memory",
                kinds.len(),
                mem.len()
            )));
        }
        let lazy = LazyMemory::setup(&mut self, mem, kinds, source, batch.max(1))?;
        // The snapshot's memory image, if any, is not written: the pages
        // come from `source`.
        let mut cell = Cell::finish_incoming(self, snapshot, preopens)?;
        cell.lazy = Some(Owner(lazy.0.clone()));
        Ok((cell, lazy))
    }
}

impl LazyMemory {
    fn setup(
        incoming: &mut Incoming,
        mem: LiveMemory,
        kinds: Vec<PageKind>,
        source: Box<dyn PageSource>,
        batch: usize,
    ) -> Result<LazyMemory, RestoreError> {
        let lazy_err = |what: &str, e: std::io::Error| RestoreError::Lazy(format!("{what}: {e}"));
        let (base, len) = (mem.map.base() as usize, mem.len());
        let fd = Uffd::open(0).map_err(|e| RestoreError::NoUserfaultfd(e.to_string()))?;
        // SAFETY: `[base, base + len)` is the accessible part of our own
        // private anonymous mapping; nothing runs in the cell, and no Rust
        // reference into it is alive (the Incoming is borrowed mutably).
        let rc = unsafe { libc::madvise(base as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(lazy_err("madvise", std::io::Error::last_os_error()));
        }
        fd.register(base, len, uffd::MODE_MISSING)
            .map_err(|e| lazy_err("userfaultfd register", e))?;
        let missing_data = kinds.iter().filter(|k| **k == PageKind::Data).count();
        let shared = Arc::new(Shared {
            uffd: fd,
            mem,
            base,
            len,
            present: Mutex::new(Present {
                bits: vec![false; kinds.len()],
                missing_data,
            }),
            kinds,
            source: Mutex::new(source),
            batch,
            lost: incoming.parts.store.data().lost.clone(),
            control: incoming.control.clone(),
            stop: AtomicBool::new(false),
            registered: AtomicBool::new(true),
            faults: AtomicU64::new(0),
            fetch_calls: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            wait_max_ns: AtomicU64::new(0),
        });
        // Initial-image pages are local: install them now.
        let module: &LoadedModule = &incoming.module;
        for (i, k) in shared.kinds.iter().enumerate() {
            if *k == PageKind::Initial {
                let zero = [0u8; PAGE_SIZE];
                let page = module.initial_image().page(i as u64).unwrap_or(&zero);
                shared
                    .copy_in(i as u32, page)
                    .map_err(|e| lazy_err("installing an initial page", e))?;
                shared.mark(i as u32);
            }
        }
        // The handler runs before the host writes the unwound stack into
        // memory (in `finish`), so those writes fault and are served.
        let s = shared.clone();
        std::thread::Builder::new()
            .name("roam-lazy".into())
            .spawn(move || s.serve())
            .map_err(|e| lazy_err("spawning the fault handler", e))?;
        Ok(LazyMemory(shared))
    }

    /// Install a page that arrived without a fault (background prefetch).
    /// A page already present is left as it is (not an error).
    pub fn install(&self, page: u32, bytes: &[u8]) -> Result<(), LazyError> {
        if bytes.len() != PAGE_SIZE {
            let pages = self.0.kinds.len() as u32;
            return Err(LazyError::BadPage { page, pages });
        }
        self.install_run(page, bytes).map(|_| ())
    }

    /// Install the run of pages starting at `first` from `bytes` (whole
    /// pages) in one step, leaving any page already present as it is.
    /// Returns how many pages were installed.
    pub fn install_run(&self, first: u32, bytes: &[u8]) -> Result<usize, LazyError> {
        let s = &self.0;
        let pages = s.kinds.len() as u32;
        let n = bytes.len() / PAGE_SIZE;
        if !bytes.len().is_multiple_of(PAGE_SIZE) || first as usize + n > pages as usize {
            return Err(LazyError::BadPage { page: first, pages });
        }
        if !s.registered.load(Ordering::Acquire) || s.all_present(first, n) {
            return Ok(0);
        }
        let dst = s.base + first as usize * PAGE_SIZE;
        // SAFETY: `bytes` is readable for its length; the destination pages
        // lie in the registered range of our mapping, kept alive by `mem`.
        let installed = match unsafe { s.uffd.copy_missing(dst, bytes.as_ptr(), bytes.len()) } {
            Ok(b) => b / PAGE_SIZE,
            // Completed (and unregistered) meanwhile: the pages are there.
            Err(_) if !s.registered.load(Ordering::Acquire) => return Ok(0),
            Err(source) => {
                return Err(LazyError::Install {
                    page: first,
                    source,
                })
            }
        };
        s.prefetched.fetch_add(installed as u64, Ordering::Relaxed);
        s.mark_run(first, n as u32);
        Ok(installed)
    }

    /// Whether page `page` is present (installed, or not a data page and
    /// served already). False for a page outside the memory.
    pub fn has_page(&self, page: u32) -> bool {
        (page as usize) < self.0.kinds.len() && self.0.is_present(page)
    }

    /// Whether the cell still waits for pages from the source: some data
    /// page is missing and the cell is still there. A cell that ended
    /// before every page arrived (a short program, or one that exited while
    /// post-copy was still pushing) needs none; one whose source was given
    /// up ([`LazyMemory::fail`]) still lacks them.
    pub fn needs_pages(&self) -> bool {
        let s = &self.0;
        let gone = s.stop.load(Ordering::Acquire) && s.lost.get().is_none();
        s.missing() > 0 && !gone
    }

    /// Whether nobody needs more pages: every data page is present, the
    /// source was given up ([`LazyMemory::fail`]), or the cell is gone.
    /// A background reader stops then.
    pub fn is_settled(&self) -> bool {
        let s = &self.0;
        s.stop.load(Ordering::Acquire) || s.lost.get().is_some() || s.missing() == 0
    }

    /// The data pages not present yet, in increasing order.
    pub fn missing_data_pages(&self) -> Vec<u32> {
        let p = self.0.present.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.0.kinds.len())
            .filter(|&i| self.0.kinds[i] == PageKind::Data && !p.bits[i])
            .map(|i| i as u32)
            .collect()
    }

    /// Whether every data page is present (the fault handler then stops).
    pub fn is_complete(&self) -> bool {
        self.0.missing() == 0
    }

    /// The source is gone: the cell stops at once with
    /// [`crate::RunError::PagesLost`] carrying `reason`; pending and later
    /// faults get zero pages so nothing hangs.
    pub fn fail(&self, reason: &str) {
        self.0.fail(reason.to_string());
    }

    /// Counters so far.
    pub fn stats(&self) -> LazyStats {
        let s = &self.0;
        LazyStats {
            faults_served: s.faults.load(Ordering::Relaxed),
            fetch_calls: s.fetch_calls.load(Ordering::Relaxed),
            pages_fetched: s.fetched.load(Ordering::Relaxed),
            pages_prefetched: s.prefetched.load(Ordering::Relaxed),
            fault_wait_total: Duration::from_nanos(s.wait_ns.load(Ordering::Relaxed)),
            fault_wait_max: Duration::from_nanos(s.wait_max_ns.load(Ordering::Relaxed)),
        }
    }
}

impl std::fmt::Debug for LazyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyMemory")
            .field("pages", &self.0.kinds.len())
            .field("missing_data", &self.0.missing())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The runs of consecutive pages in `pages` (increasing page indices), as
/// ranges of positions in it: each run can go in with one copy.
pub(crate) fn runs(pages: &[u32]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= pages.len() {
            return None;
        }
        let mut end = start + 1;
        while end < pages.len() && pages[end] == pages[end - 1] + 1 {
            end += 1;
        }
        let r = start..end;
        start = end;
        Some(r)
    })
}

impl Shared {
    fn missing(&self) -> usize {
        self.present
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .missing_data
    }

    /// Whether pages `first .. first + n` are all present (one lock).
    fn all_present(&self, first: u32, n: usize) -> bool {
        let p = self.present.lock().unwrap_or_else(|e| e.into_inner());
        p.bits[first as usize..first as usize + n]
            .iter()
            .all(|&b| b)
    }

    fn is_present(&self, page: u32) -> bool {
        self.present.lock().unwrap_or_else(|e| e.into_inner()).bits[page as usize]
    }

    fn mark(&self, page: u32) {
        self.mark_run(page, 1);
    }

    fn mark_run(&self, first: u32, n: u32) {
        let mut p = self.present.lock().unwrap_or_else(|e| e.into_inner());
        for page in first..first + n {
            if !std::mem::replace(&mut p.bits[page as usize], true)
                && self.kinds[page as usize] == PageKind::Data
            {
                p.missing_data -= 1;
            }
        }
    }

    fn copy_in(&self, page: u32, bytes: &[u8]) -> std::io::Result<bool> {
        debug_assert_eq!(bytes.len(), PAGE_SIZE);
        // SAFETY: `bytes` is a readable 4 KiB buffer; the destination page
        // lies in the registered range of our mapping, kept alive by `mem`.
        unsafe {
            self.uffd.copy(
                self.base + page as usize * PAGE_SIZE,
                bytes.as_ptr(),
                PAGE_SIZE,
            )
        }
    }

    fn fail(&self, reason: String) {
        if self.missing() == 0 {
            // Every page is here: the source is not needed any more.
            return;
        }
        if self.lost.set(reason).is_ok() {
            tracing::error!("lazy memory lost: {}", self.lost.get().map_or("", |s| s));
        }
        // The program stops at its next migration point.
        self.control.alarm();
    }

    /// Serve one fault at `page`.
    fn serve_fault(&self, page: u32) {
        let at = Instant::now();
        let i = page as usize;
        if self.lost.get().is_some() || self.kinds[i] != PageKind::Data {
            // Zero pages (and anything once the source is lost).
            if let Err(e) = self.uffd.zeropage(self.base + i * PAGE_SIZE, PAGE_SIZE) {
                self.fail(format!("cannot map a zero page at page {page}: {e}"));
            }
            return;
        }
        if self.is_present(page) {
            let _ = self.uffd.wake(self.base + i * PAGE_SIZE, PAGE_SIZE);
            return;
        }
        let mut want = vec![page];
        {
            let p = self.present.lock().unwrap_or_else(|e| e.into_inner());
            let end = (i + 1 + 8 * self.batch).min(self.kinds.len());
            for j in i + 1..end {
                if want.len() >= self.batch {
                    break;
                }
                if self.kinds[j] == PageKind::Data && !p.bits[j] {
                    want.push(j as u32);
                }
            }
        }
        let got = {
            let mut src = self.source.lock().unwrap_or_else(|e| e.into_inner());
            self.fetch_calls.fetch_add(1, Ordering::Relaxed);
            src.fetch(&want)
        };
        let mut served = false;
        match got {
            Err(e) => self.fail(format!("fetching page {page} failed: {e}")),
            Ok(pages) => {
                let valid = |(p, bytes): &(u32, Vec<u8>)| {
                    (*p as usize) < self.kinds.len()
                        && bytes.len() == PAGE_SIZE
                        && self.kinds[*p as usize] == PageKind::Data
                };
                if let Some((p, _)) = pages.iter().find(|x| !valid(x)) {
                    self.fail(format!("the source sent an invalid page {p}"));
                } else {
                    // Consecutive pages go in with one copy per run (a
                    // source may send a whole chunk of a file).
                    let indices: Vec<u32> = pages.iter().map(|(p, _)| *p).collect();
                    let mut run = Vec::new();
                    for r in runs(&indices) {
                        let (first, n) = (indices[r.start], r.len() as u32);
                        run.clear();
                        pages[r].iter().for_each(|(_, b)| run.extend_from_slice(b));
                        // SAFETY: `run` holds `n` pages; they lie in the
                        // registered range (checked above), kept alive by `mem`.
                        let installed = unsafe {
                            self.uffd.copy_missing(
                                self.base + first as usize * PAGE_SIZE,
                                run.as_ptr(),
                                run.len(),
                            )
                        };
                        match installed {
                            Ok(bytes) => {
                                self.fetched
                                    .fetch_add((bytes / PAGE_SIZE) as u64, Ordering::Relaxed);
                                self.mark_run(first, n);
                                served |= (first..first + n).contains(&page);
                            }
                            Err(e) => {
                                self.fail(format!("cannot install page {first}: {e}"));
                                break;
                            }
                        }
                    }
                }
                if !served && self.lost.get().is_none() {
                    self.fail(format!("the source did not send page {page}"));
                }
            }
        }
        if !served {
            // Unblock the program; it stops at its next epoch check.
            let _ = self.uffd.zeropage(self.base + i * PAGE_SIZE, PAGE_SIZE);
            return;
        }
        self.faults.fetch_add(1, Ordering::Relaxed);
        let ns = at.elapsed().as_nanos() as u64;
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
        self.wait_max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// The fault-handler thread: until every data page is present, or the
    /// cell is gone.
    fn serve(&self) {
        loop {
            if self.stop.load(Ordering::Acquire) || self.missing() == 0 {
                break;
            }
            if !self.uffd.poll(10) {
                continue;
            }
            loop {
                match self.uffd.read() {
                    Ok(Some(f)) if f.event == uffd::EVENT_PAGEFAULT => {
                        let off = (f.address as usize).wrapping_sub(self.base);
                        if off < self.len {
                            self.serve_fault((off / PAGE_SIZE) as u32);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        self.fail(format!("reading page faults failed: {e}"));
                        break;
                    }
                }
            }
        }
        // Every data page is here (or the cell is gone): zero pages still
        // missing are what the kernel fills in by itself once unregistered,
        // and unregistering wakes any fault still waiting.
        self.registered.store(false, Ordering::Release);
        if let Err(e) = self.uffd.unregister(self.base, self.len) {
            tracing::error!("cannot unregister lazy memory: {e}");
        }
        tracing::debug!(?self.mem, "lazy memory complete");
    }
}
