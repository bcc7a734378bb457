//! Far memory: a cell keeps at most a budget of its linear memory resident,
//! and the rest lives in a [`PageStore`] (a memory server on another node,
//! or a local file) until the program touches it again.
//!
//! Why: a board with little RAM can then run a program bigger than its
//! memory, paging to a server that has RAM to spare (HEXO's Netswap), where
//! roam would otherwise refuse the cell or the kernel would swap to a slow
//! local card.
//!
//! How, all through one userfaultfd on roam's own mapping of the memory,
//! registered for missing pages and write protection over its whole
//! reservation (so the pages a program grows into are covered too):
//!
//! * A page is **resident**, **far** (in the store only) or **untouched**.
//!   A fault on a far page fetches it with its far neighbours in one
//!   request; a run of faults in increasing order doubles the batch up to
//!   [`FarOptions::max_batch`] (sequential prefetch). An untouched page is
//!   mapped as the zero page.
//! * Pages that come from the store are installed **write-protected**: they
//!   are clean, equal to the store's copy. The first write faults once, the
//!   page becomes dirty and writable. A clean page is evicted for free.
//! * When more than the budget is resident, the handler evicts a batch of
//!   victims (clock, or random). A dirty victim is write-protected, copied,
//!   and sent to the store; only after the store has it is the page
//!   dropped (`MADV_DONTNEED`). A write that races with this waits on the
//!   write protection and is served as a fault on a far page afterwards,
//!   so no write is lost.
//! * Clock uses the only access information there is without hardware
//!   support: faults. A fetched page, and a page written after its
//!   reference bit was cleared, get the bit; the hand clears it and
//!   write-protects the page so that its next write is seen.
//!
//! Everything runs on the handler thread, so evictions and faults never
//! race each other. When the store fails, the cell stops at its next point
//! with [`crate::RunError::PagesLost`], and faults get zero pages so nothing
//! hangs, as for lost post-copy memory.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use roam_snapshot::PAGE_SIZE;

use crate::control::Control;
use crate::memory::LiveMemory;
use crate::uffd::{self, Uffd};

mod store;
pub use store::{FileStore, MemStore};

/// Where a cell's far pages are kept. Called from the fault-handler thread
/// only, while the program may wait on it.
pub trait PageStore: Send {
    /// Keep these pages (index, 4 KiB of bytes), replacing older copies.
    /// On `Ok` the store must be able to return them.
    fn put(&mut self, pages: &[(u32, &[u8])]) -> Result<(), String>;
    /// Return the pages asked for, every one of them (order free).
    fn get(&mut self, pages: &[u32]) -> Result<Vec<(u32, Vec<u8>)>, String>;
    /// A short description for logs and errors (`"memory server 10.0.0.2:7400"`).
    fn describe(&self) -> String;
}

/// Which resident page leaves when the budget is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Eviction {
    /// Second chance: pages fetched or written since the hand last passed
    /// are kept one more round.
    #[default]
    Clock,
    /// Any resident page, uniformly.
    Random,
}

impl std::str::FromStr for Eviction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clock" => Ok(Eviction::Clock),
            "random" => Ok(Eviction::Random),
            _ => Err(format!("unknown eviction policy {s:?} (clock, random)")),
        }
    }
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Eviction::Clock => "clock",
            Eviction::Random => "random",
        })
    }
}

/// The smallest budget: below this, one fetch batch and one eviction batch
/// would not fit side by side.
pub const MIN_LOCAL_PAGES: usize = 64;

/// How a far memory behaves.
#[derive(Debug, Clone, Copy)]
pub struct FarOptions {
    /// Resident pages at most (4 KiB each), at least [`MIN_LOCAL_PAGES`].
    pub local_pages: usize,
    /// Victim choice.
    pub eviction: Eviction,
    /// Pages per fetch after a jump (the faulting page and its far
    /// neighbours). One: a random access gains nothing from its neighbours,
    /// and a sequential run doubles the batch from its second fault on.
    pub batch: usize,
    /// Pages per fetch at most, reached by sequential faults.
    pub max_batch: usize,
    /// Pages sent to the store per eviction, at most (Netswap's 512).
    pub evict_batch: usize,
}

impl FarOptions {
    /// Defaults for a budget of `local_pages`.
    pub fn new(local_pages: usize) -> FarOptions {
        FarOptions {
            local_pages,
            eviction: Eviction::Clock,
            batch: 1,
            max_batch: 64,
            evict_batch: 512,
        }
    }
}

/// Setting up far memory failed.
#[derive(Debug, thiserror::Error)]
pub enum FarError {
    /// The kernel offers no userfaultfd with write protection here (e.g.
    /// under qemu-user).
    #[error("far memory needs userfaultfd with write protection: {0}")]
    Unsupported(String),
    /// The budget is below [`MIN_LOCAL_PAGES`].
    #[error("a local memory of {pages} pages is below the minimum of {MIN_LOCAL_PAGES} (256 KiB)")]
    BudgetTooSmall {
        /// Pages asked for.
        pages: usize,
    },
    /// A system call failed while setting up.
    #[error("setting up far memory: {0}")]
    Setup(String),
}

/// Counters of a far memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FarStats {
    /// Pages resident now.
    pub resident: u64,
    /// Most pages resident at once.
    pub resident_peak: u64,
    /// Pages whose only copy is in the store now.
    pub far: u64,
    /// Faults on far pages (the program waited for the store).
    pub far_faults: u64,
    /// Pages fetched from the store (faults and their neighbours).
    pub pages_in: u64,
    /// Pages written to the store.
    pub pages_out: u64,
    /// Clean pages dropped without writing (the store had them).
    pub clean_drops: u64,
    /// First writes to clean pages.
    pub write_faults: u64,
    /// Time the program waited on far faults, in all.
    pub fault_wait: Duration,
}

const RESIDENT: u8 = 1;
const STORED: u8 = 2;
const DIRTY: u8 = 4;
const WP: u8 = 8;
const REF: u8 = 16;

/// Fault flag: the access was a write.
const FAULT_WRITE: u64 = 1 << 0;
/// `UFFDIO_COPY` mode: install write-protected.
const COPY_MODE_WP: u64 = 1 << 1;

struct Shared {
    uffd: Uffd,
    mem: LiveMemory,
    base: usize,
    /// Bytes registered (the whole reservation).
    span: usize,
    opts: FarOptions,
    lost: Arc<OnceLock<String>>,
    control: Arc<Control>,
    stop: AtomicBool,
    resident: AtomicUsize,
    peak: AtomicUsize,
    far: AtomicUsize,
    far_faults: AtomicU64,
    pages_in: AtomicU64,
    pages_out: AtomicU64,
    clean_drops: AtomicU64,
    write_faults: AtomicU64,
    wait_ns: AtomicU64,
}

/// A handle to a cell's far memory: counters, and giving up on the store.
#[derive(Clone)]
pub struct FarMemory(Arc<Shared>);

/// Held by the cell: stops the handler when the cell goes away.
pub(crate) struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Release);
    }
}

/// Attach far memory to a cell's memory, its owner kept in `slot` (a
/// cell's, or a receiving cell's), unless the slot already holds one.
pub(crate) fn attach_into(
    slot: &mut Option<Owner>,
    mem: LiveMemory,
    opts: FarOptions,
    store: Box<dyn PageStore>,
    lost: Arc<OnceLock<String>>,
    control: Arc<Control>,
) -> Result<FarMemory, FarError> {
    if slot.is_some() {
        return Err(FarError::Setup(
            "the memory is already paged by roam (far or post-copy)".into(),
        ));
    }
    let (far, owner) = FarMemory::attach(mem, opts, store, lost, control)?;
    *slot = Some(owner);
    Ok(far)
}

impl FarMemory {
    /// Put the memory of a cell that is not running under far memory, with
    /// `store` for its far pages. Pages beyond the budget leave at once.
    pub(crate) fn attach(
        mem: LiveMemory,
        opts: FarOptions,
        store: Box<dyn PageStore>,
        lost: Arc<OnceLock<String>>,
        control: Arc<Control>,
    ) -> Result<(FarMemory, Owner), FarError> {
        if opts.local_pages < MIN_LOCAL_PAGES {
            return Err(FarError::BudgetTooSmall {
                pages: opts.local_pages,
            });
        }
        if let Some(why) = uffd::unavailable() {
            return Err(FarError::Unsupported(why));
        }
        let fd = Uffd::open(uffd::FEATURE_PAGEFAULT_FLAG_WP)
            .map_err(|e| FarError::Unsupported(e.to_string()))?;
        if fd.features & uffd::FEATURE_PAGEFAULT_FLAG_WP == 0 {
            return Err(FarError::Unsupported(
                "the kernel has no write-protect faults".into(),
            ));
        }
        let base = mem.map.base() as usize;
        let span = mem.map.capacity();
        let len = mem.len();
        // Which pages hold data now: the resident ones (the rest of the
        // memory has never been touched and reads as zero).
        let mut incore = vec![0u8; len / PAGE_SIZE];
        if len > 0 {
            // SAFETY: `[base, base + len)` is the accessible part of our
            // mapping, page-aligned; `incore` has one byte per page.
            let rc = unsafe { libc::mincore(base as *mut libc::c_void, len, incore.as_mut_ptr()) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                return Err(FarError::Setup(format!("mincore: {e}")));
            }
        }
        fd.register(base, span, uffd::MODE_MISSING | uffd::MODE_WP)
            .map_err(|e| FarError::Setup(format!("userfaultfd register: {e}")))?;
        let mut flags = vec![0u8; span / PAGE_SIZE];
        let mut resident = 0;
        for (f, c) in flags.iter_mut().zip(&incore) {
            if c & 1 != 0 {
                *f = RESIDENT | DIRTY;
                resident += 1;
            }
        }
        let shared = Arc::new(Shared {
            uffd: fd,
            mem,
            base,
            span,
            opts,
            lost,
            control,
            stop: AtomicBool::new(false),
            resident: AtomicUsize::new(resident),
            peak: AtomicUsize::new(resident),
            far: AtomicUsize::new(0),
            far_faults: AtomicU64::new(0),
            pages_in: AtomicU64::new(0),
            pages_out: AtomicU64::new(0),
            clean_drops: AtomicU64::new(0),
            write_faults: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        });
        let mut handler = Handler {
            s: shared.clone(),
            flags,
            store,
            hand: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ base as u64,
            batch: opts.batch.max(1),
            last_fault: None,
        };
        // Down to the budget before the program runs.
        handler.evict_if_over();
        std::thread::Builder::new()
            .name("roam-far".into())
            .spawn(move || handler.run())
            .map_err(|e| FarError::Setup(format!("spawning the fault handler: {e}")))?;
        Ok((FarMemory(shared.clone()), Owner(shared)))
    }

    /// Counters so far.
    pub fn stats(&self) -> FarStats {
        let s = &self.0;
        FarStats {
            resident: s.resident.load(Ordering::Relaxed) as u64,
            resident_peak: s.peak.load(Ordering::Relaxed) as u64,
            far: s.far.load(Ordering::Relaxed) as u64,
            far_faults: s.far_faults.load(Ordering::Relaxed),
            pages_in: s.pages_in.load(Ordering::Relaxed),
            pages_out: s.pages_out.load(Ordering::Relaxed),
            clean_drops: s.clean_drops.load(Ordering::Relaxed),
            write_faults: s.write_faults.load(Ordering::Relaxed),
            fault_wait: Duration::from_nanos(s.wait_ns.load(Ordering::Relaxed)),
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> FarOptions {
        self.0.opts
    }

    /// The store is gone: the cell stops at its next point with
    /// [`crate::RunError::PagesLost`] carrying `reason`.
    pub fn fail(&self, reason: &str) {
        self.0.fail(reason.to_string());
    }
}

impl std::fmt::Debug for FarMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FarMemory")
            .field("options", &self.0.opts)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Shared {
    fn fail(&self, reason: String) {
        if self.lost.set(reason).is_ok() {
            tracing::error!("far memory lost: {}", self.lost.get().map_or("", |s| s));
        }
        self.control.alarm();
    }

    fn addr(&self, page: usize) -> usize {
        self.base + page * PAGE_SIZE
    }
}

/// The fault handler's own state: only its thread touches it.
struct Handler {
    s: Arc<Shared>,
    flags: Vec<u8>,
    store: Box<dyn PageStore>,
    hand: usize,
    rng: u64,
    /// Pages per fetch now (grows on sequential faults).
    batch: usize,
    /// The page and batch end of the last far fault.
    last_fault: Option<(usize, usize)>,
}

impl Handler {
    fn run(mut self) {
        while !self.s.stop.load(Ordering::Acquire) {
            if !self.s.uffd.poll(10) {
                continue;
            }
            loop {
                match self.s.uffd.read() {
                    Ok(Some(f)) if f.event == uffd::EVENT_PAGEFAULT => {
                        let off = (f.address as usize).wrapping_sub(self.s.base);
                        if off < self.s.span {
                            self.serve(off / PAGE_SIZE, f.flags);
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        self.s.fail(format!("reading page faults failed: {e}"));
                        break;
                    }
                }
                self.evict_if_over();
            }
        }
        if let Err(e) = self.s.uffd.unregister(self.s.base, self.s.span) {
            tracing::error!("cannot unregister far memory: {e}");
        }
        tracing::debug!(mem = ?self.s.mem, stats = ?FarMemory(self.s.clone()).stats(), "far memory ends");
    }

    fn serve(&mut self, page: usize, fault: u64) {
        let f = self.flags[page];
        let lost = self.s.lost.get().is_some();
        if f & RESIDENT != 0 {
            if fault & uffd::PAGEFAULT_FLAG_WP != 0 && f & WP != 0 {
                // The first write since the page was clean or the hand
                // passed: it is now dirty and referenced.
                self.s.write_faults.fetch_add(1, Ordering::Relaxed);
                self.flags[page] = (f | DIRTY | REF) & !WP;
                if let Err(e) = self
                    .s
                    .uffd
                    .write_protect(self.s.addr(page), PAGE_SIZE, false)
                {
                    self.s.fail(format!("cannot unprotect page {page}: {e}"));
                }
            } else {
                // Served already (a neighbour of another fault).
                let _ = self.s.uffd.wake(self.s.addr(page), PAGE_SIZE);
            }
            return;
        }
        if f & STORED == 0 || lost {
            // Never touched (or nothing can be fetched any more): zeros.
            match self.s.uffd.zeropage(self.s.addr(page), PAGE_SIZE) {
                Ok(_) => self.make_resident(page, RESIDENT | DIRTY | REF),
                Err(e) => self
                    .s
                    .fail(format!("cannot map a zero page at {page}: {e}")),
            }
            return;
        }
        self.fetch(page, fault & FAULT_WRITE != 0);
    }

    /// Serve a fault on far page `page`: fetch it with its far neighbours.
    fn fetch(&mut self, page: usize, write: bool) {
        let at = Instant::now();
        // Sequential faults (this page follows the last batch) double the
        // batch; a jump halves it, so a few interleaved streams keep some
        // of it and random faults soon fetch one page each.
        self.batch = match self.last_fault {
            Some((last, end)) if page > last && page <= end + 1 => {
                (self.batch * 2).min(self.s.opts.max_batch.max(1))
            }
            _ => (self.batch / 2).max(self.s.opts.batch.max(1)),
        };
        let limit = self.s.opts.local_pages / 4;
        let batch = self.batch.min(limit.max(1));
        let pages_now = self.s.mem.len() / PAGE_SIZE;
        let mut want = vec![page as u32];
        let mut j = page + 1;
        while want.len() < batch && j < pages_now && j < page + 4 * batch {
            if self.flags[j] & (RESIDENT | STORED) == STORED {
                want.push(j as u32);
            }
            j += 1;
        }
        self.last_fault = Some((page, *want.last().unwrap_or(&(page as u32)) as usize));
        // The faulting page first, alone, so the program runs on while its
        // neighbours come (Fastswap): it waits for one page, not a batch.
        if let Err(why) = self.install(&want[..1], page, write) {
            return self.lose(page, why);
        }
        self.s.far_faults.fetch_add(1, Ordering::Relaxed);
        let ns = at.elapsed().as_nanos() as u64;
        self.s.wait_ns.fetch_add(ns, Ordering::Relaxed);
        if want.len() > 1 {
            if let Err(why) = self.install(&want[1..], page, write) {
                self.s.fail(why);
            }
        }
    }

    /// Fetch `want` (sorted, every page far) from the store and install
    /// each page; `page` is the faulting one, installed writable and dirty
    /// for a `write`.
    fn install(&mut self, want: &[u32], page: usize, write: bool) -> Result<(), String> {
        let got = self
            .store
            .get(want)
            .map_err(|e| format!("{}: {e}", self.store.describe()))?;
        let mut served = 0;
        for (p, bytes) in &got {
            let p = *p as usize;
            let asked = want.binary_search(&(p as u32)).is_ok();
            if !asked || bytes.len() != PAGE_SIZE || self.flags[p] & RESIDENT != 0 {
                return Err(format!(
                    "{} sent page {p}, which was not asked for",
                    self.store.describe()
                ));
            }
            // The faulting page of a write goes in writable and dirty;
            // everything else clean and write-protected.
            let dirty = p == page && write;
            let mode = if dirty { 0 } else { COPY_MODE_WP };
            // SAFETY: `bytes` is one readable page; the destination lies in
            // the registered range of our mapping, kept alive by `mem`.
            unsafe {
                self.s
                    .uffd
                    .copy_mode(self.s.addr(p), bytes.as_ptr(), PAGE_SIZE, mode)
            }
            .map_err(|e| format!("cannot install page {p}: {e}"))?;
            let f = if dirty { STORED | DIRTY } else { STORED | WP };
            self.make_resident(p, RESIDENT | REF | f);
            self.s.far.fetch_sub(1, Ordering::Relaxed);
            self.s.pages_in.fetch_add(1, Ordering::Relaxed);
            served += 1;
        }
        if served != want.len() {
            return Err(format!(
                "{} sent {served} of the {} pages asked",
                self.store.describe(),
                want.len()
            ));
        }
        Ok(())
    }

    /// The store failed: stop the cell, and unblock the program with a
    /// zero page (it stops at its next point and never uses it).
    fn lose(&mut self, page: usize, why: String) {
        self.s.fail(why);
        if self.s.uffd.zeropage(self.s.addr(page), PAGE_SIZE).is_ok() {
            self.make_resident(page, RESIDENT | DIRTY);
        }
    }

    fn make_resident(&mut self, page: usize, flags: u8) {
        self.flags[page] = flags;
        let n = self.s.resident.fetch_add(1, Ordering::Relaxed) + 1;
        self.s.peak.fetch_max(n, Ordering::Relaxed);
    }

    /// Over the budget: evict a batch, down to the budget less a little
    /// room, so that the next faults do not each evict again.
    fn evict_if_over(&mut self) {
        let budget = self.s.opts.local_pages;
        let resident = self.s.resident.load(Ordering::Relaxed);
        if resident <= budget || self.s.lost.get().is_some() {
            return;
        }
        let room = (budget / 8).min(self.s.opts.evict_batch);
        let n = (resident - budget + room).min(self.s.opts.evict_batch.max(1));
        let victims = self.victims(n);
        if let Err(e) = self.evict(&victims) {
            self.s.fail(format!("{}: {e}", self.store.describe()));
        }
    }

    fn victims(&mut self, n: usize) -> Vec<usize> {
        let pages = (self.s.mem.len() / PAGE_SIZE).min(self.flags.len());
        let mut out = Vec::with_capacity(n);
        if pages == 0 {
            return out;
        }
        match self.s.opts.eviction {
            Eviction::Clock => {
                // Two full turns at most: the first clears reference bits.
                let mut steps = 0;
                while out.len() < n && steps < 2 * pages {
                    let p = self.hand % pages;
                    self.hand = (p + 1) % pages;
                    steps += 1;
                    let f = self.flags[p];
                    if f & RESIDENT == 0 {
                        continue;
                    }
                    if f & REF != 0 {
                        // Second chance; see its next write.
                        let mut nf = f & !REF;
                        if f & WP == 0
                            && self
                                .s
                                .uffd
                                .write_protect(self.s.addr(p), PAGE_SIZE, true)
                                .is_ok()
                        {
                            nf |= WP;
                        }
                        self.flags[p] = nf;
                        continue;
                    }
                    out.push(p);
                }
            }
            Eviction::Random => {
                let resident = self.s.resident.load(Ordering::Relaxed);
                let mut tries = 0;
                while out.len() < n.min(resident) && tries < 64 * n {
                    tries += 1;
                    // xorshift64*
                    self.rng ^= self.rng >> 12;
                    self.rng ^= self.rng << 25;
                    self.rng ^= self.rng >> 27;
                    let p = (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as usize % pages;
                    if self.flags[p] & RESIDENT != 0 && !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        // The hand may pass a page twice in one call (two turns).
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Send the dirty victims to the store, then drop every victim.
    fn evict(&mut self, victims: &[usize]) -> Result<(), String> {
        let mut dirty: Vec<usize> = Vec::new();
        let mut zero: Vec<usize> = Vec::new();
        for &p in victims {
            let f = self.flags[p];
            if f & DIRTY != 0 || f & STORED == 0 {
                if f & WP == 0 {
                    // From here a write waits until the page is far, and
                    // is then served from the store's copy.
                    self.s
                        .uffd
                        .write_protect(self.s.addr(p), PAGE_SIZE, true)
                        .map_err(|e| format!("cannot write-protect page {p}: {e}"))?;
                    self.flags[p] |= WP;
                }
                dirty.push(p);
            }
        }
        let mut bytes = vec![0u8; dirty.len() * PAGE_SIZE];
        let mut kept = 0;
        for i in 0..dirty.len() {
            let p = dirty[i];
            let out = &mut bytes[kept * PAGE_SIZE..(kept + 1) * PAGE_SIZE];
            // SAFETY: page `p` is resident (its flags say so, and only this
            // thread drops pages) and write-protected, so the copy cannot
            // fault and sees a stable page.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.s.addr(p) as *const u8,
                    out.as_mut_ptr(),
                    PAGE_SIZE,
                )
            };
            if out.iter().all(|&b| b == 0) {
                // Zeros: the page goes back to untouched, and costs
                // nothing to bring back (a stale copy in the store is
                // never read again).
                zero.push(p);
            } else {
                dirty[kept] = p;
                kept += 1;
            }
        }
        dirty.truncate(kept);
        if !dirty.is_empty() {
            let pages: Vec<(u32, &[u8])> = dirty
                .iter()
                .enumerate()
                .map(|(i, &p)| (p as u32, &bytes[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]))
                .collect();
            self.store.put(&pages)?;
            self.s
                .pages_out
                .fetch_add(dirty.len() as u64, Ordering::Relaxed);
        }
        for &p in victims {
            // SAFETY: advice on one page of our mapping's registered range;
            // the store holds its bytes, and the next access faults and is
            // served from there.
            let rc = unsafe {
                libc::madvise(
                    self.s.addr(p) as *mut libc::c_void,
                    PAGE_SIZE,
                    libc::MADV_DONTNEED,
                )
            };
            if rc != 0 {
                return Err(format!("madvise: {}", std::io::Error::last_os_error()));
            }
            self.s.resident.fetch_sub(1, Ordering::Relaxed);
            if zero.binary_search(&p).is_ok() {
                self.flags[p] = 0;
                continue;
            }
            if self.flags[p] & DIRTY == 0 {
                self.s.clean_drops.fetch_add(1, Ordering::Relaxed);
            }
            self.flags[p] = STORED;
            self.s.far.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
