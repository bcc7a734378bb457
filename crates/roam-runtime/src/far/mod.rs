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
use std::time::Duration;

use roam_snapshot::PAGE_SIZE;

use crate::control::Control;
use crate::memory::LiveMemory;
use crate::uffd::{self, Uffd};

mod handler;
mod store;
use handler::Handler;
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
        let mut handler = Handler::new(shared.clone(), flags, store, base);
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
