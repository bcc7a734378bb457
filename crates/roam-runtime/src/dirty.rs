//! Which pages of a running cell's memory were written: the basis of
//! pre-copy migration (send everything, then only what changed, round after
//! round, while the program runs).
//!
//! Two methods:
//!
//! - **WriteProtect**: userfaultfd write protection. Every page is
//!   write-protected; the first write to a page blocks the writer, a
//!   handler thread marks the page dirty and lifts the protection, and the
//!   writer goes on. Later writes to that page cost nothing until the next
//!   collect protects it again. Cost: one fault per page per round.
//! - **Hash**: a 128-bit truncation of blake3 per page, compared with the
//!   previous round's. Works everywhere (qemu-user has no userfaultfd) but
//!   reads all of memory every round.
//!
//! The guarantee both give: a page written after [`DirtyTracker::collect`]
//! returns is reported by the next collect. So "collect, then copy the
//! reported pages" never loses a write: a write that lands before the copy
//! is copied, one that lands during or after it is reported again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use roam_snapshot::PAGE_SIZE;

use crate::memory::LiveMemory;
use crate::uffd::{self, Uffd};

/// How to find written pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackMethod {
    /// WriteProtect where userfaultfd works, else Hash (silently; logged at
    /// debug level).
    Auto,
    /// userfaultfd write protection; an error where it is unavailable.
    WriteProtect,
    /// Per-page hashes compared between rounds.
    Hash,
}

/// Dirty tracking could not start.
#[derive(Debug, thiserror::Error)]
pub enum TrackError {
    /// userfaultfd (or its write-protect mode) is not available on this
    /// host, e.g. under qemu-user. [`TrackMethod::Hash`] works there.
    #[error("write-protect dirty tracking is unavailable: {0}; use the hash method")]
    Unavailable(String),
    /// Registering or protecting the memory failed.
    #[error("cannot write-protect the cell's memory: {0}")]
    Protect(#[source] std::io::Error),
}

/// Tracks the pages a running cell writes. Dropping it stops tracking.
pub struct DirtyTracker {
    mem: LiveMemory,
    /// Pages in memory at the previous collect (or start).
    pages: u32,
    inner: Inner,
}

enum Inner {
    Wp(WpTracker),
    Hash(Vec<u128>),
}

impl DirtyTracker {
    /// Start tracking writes to `mem`.
    pub fn start(mem: &LiveMemory, method: TrackMethod) -> Result<DirtyTracker, TrackError> {
        let inner = match method {
            TrackMethod::Hash => Inner::Hash(Vec::new()),
            TrackMethod::WriteProtect => Inner::Wp(WpTracker::start(mem)?),
            TrackMethod::Auto => match WpTracker::start(mem) {
                Ok(t) => Inner::Wp(t),
                Err(e) => {
                    tracing::debug!("dirty tracking falls back to hashing: {e}");
                    Inner::Hash(Vec::new())
                }
            },
        };
        let mut t = DirtyTracker {
            mem: mem.clone(),
            pages: mem.page_count(),
            inner,
        };
        if let Inner::Hash(h) = &mut t.inner {
            *h = (0..t.pages).map(|i| hash_page(&t.mem, i)).collect();
        }
        Ok(t)
    }

    /// The method in use ([`TrackMethod::WriteProtect`] or
    /// [`TrackMethod::Hash`]).
    pub fn method(&self) -> TrackMethod {
        match self.inner {
            Inner::Wp(_) => TrackMethod::WriteProtect,
            Inner::Hash(_) => TrackMethod::Hash,
        }
    }

    /// The pages written since the previous collect (the first time: since
    /// start), including every page added by `memory.grow` since then, in
    /// increasing order; and re-arm. A write after this returns is reported
    /// by the next collect.
    pub fn collect(&mut self) -> Vec<u32> {
        let now = self.mem.page_count();
        let old = self.pages.min(now);
        let dirty = match &mut self.inner {
            Inner::Wp(t) => t.collect(old, now),
            Inner::Hash(hashes) => {
                let mut dirty = Vec::new();
                hashes.resize(now as usize, 0);
                for i in 0..now {
                    let h = hash_page(&self.mem, i);
                    if i >= old || hashes[i as usize] != h {
                        hashes[i as usize] = h;
                        dirty.push(i);
                    }
                }
                dirty
            }
        };
        self.pages = now;
        dirty
    }

    /// Copy page `index` for sending, as [`LiveMemory::read_page`] does.
    ///
    /// With the Hash method, copy pages through this method (the first full
    /// round too): it records the hash of the bytes actually copied, so a
    /// page written after the collect and written back to its old contents
    /// before the next one is still sent again. WriteProtect needs no such
    /// care, and this is a plain copy.
    pub fn read_page(&mut self, index: u32, out: &mut [u8; PAGE_SIZE]) -> bool {
        if !self.mem.read_page(index, out) {
            return false;
        }
        if let Inner::Hash(hashes) = &mut self.inner {
            if let Some(h) = hashes.get_mut(index as usize) {
                *h = hash_bytes(out);
            }
        }
        true
    }
}

impl std::fmt::Debug for DirtyTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyTracker")
            .field("method", &self.method())
            .field("pages", &self.pages)
            .finish()
    }
}

fn hash_bytes(page: &[u8; PAGE_SIZE]) -> u128 {
    // 128 bits of a cryptographic hash: a changed page goes unnoticed with
    // probability 2^-128, whatever the program writes.
    let h = blake3::hash(page);
    u128::from_le_bytes(h.as_bytes()[..16].try_into().expect("16 bytes"))
}

fn hash_page(mem: &LiveMemory, i: u32) -> u128 {
    let mut buf = [0u8; PAGE_SIZE];
    mem.read_page(i, &mut buf);
    hash_bytes(&buf)
}

/// Shared between the tracker and its fault-handler thread.
struct WpShared {
    uffd: Uffd,
    base: usize,
    /// One bit per page; the lock also orders "mark dirty, unprotect"
    /// against "take the marks, protect again".
    bits: Mutex<Vec<u64>>,
    stop: AtomicBool,
    unpopulated: bool,
}

struct WpTracker {
    shared: Arc<WpShared>,
    registered: usize,
    thread: Option<JoinHandle<()>>,
}

impl WpTracker {
    fn start(mem: &LiveMemory) -> Result<WpTracker, TrackError> {
        if !uffd::userfaultfd_available() {
            let why = match uffd::probe() {
                Err(e) => e.clone(),
                Ok(_) => "the host page size is not 4 KiB".to_string(),
            };
            return Err(TrackError::Unavailable(why));
        }
        let offered = uffd::probe().as_ref().copied().unwrap_or(0);
        if offered & uffd::FEATURE_PAGEFAULT_FLAG_WP == 0 {
            return Err(TrackError::Unavailable(
                "the kernel has no userfaultfd write-protect mode (Linux 5.7+)".into(),
            ));
        }
        let features = uffd::FEATURE_PAGEFAULT_FLAG_WP | (offered & uffd::FEATURE_WP_UNPOPULATED);
        let fd = Uffd::open(features).map_err(|e| TrackError::Unavailable(e.to_string()))?;
        let map = &mem.map;
        let (base, registered) = (map.base() as usize, map.capacity());
        fd.register(base, registered, uffd::MODE_WP)
            .map_err(TrackError::Protect)?;
        let shared = Arc::new(WpShared {
            uffd: fd,
            base,
            bits: Mutex::new(vec![0; registered / PAGE_SIZE / 64 + 1]),
            stop: AtomicBool::new(false),
            unpopulated: features & uffd::FEATURE_WP_UNPOPULATED != 0,
        });
        let len = mem.page_count() as usize * PAGE_SIZE;
        if let Err(e) = shared.protect(0, len) {
            let _ = shared.uffd.unregister(base, registered);
            return Err(TrackError::Protect(e));
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("roam-dirty".into())
            .spawn(move || s.serve())
            .map_err(TrackError::Protect)?;
        Ok(WpTracker {
            shared,
            registered,
            thread: Some(thread),
        })
    }

    fn collect(&mut self, old: u32, now: u32) -> Vec<u32> {
        let s = &self.shared;
        let mut bits = s.bits.lock().unwrap_or_else(|e| e.into_inner());
        let mut dirty = Vec::new();
        for (w, word) in bits.iter_mut().enumerate() {
            let mut b = std::mem::take(word);
            while b != 0 {
                let i = (w * 64) as u32 + b.trailing_zeros();
                b &= b - 1;
                if i < old {
                    dirty.push(i);
                }
            }
        }
        dirty.extend(old..now);
        // Protect again, in runs, before returning (and before the handler
        // can lift any protection: it needs the lock).
        let mut k = 0;
        while k < dirty.len() {
            let mut e = k + 1;
            while e < dirty.len() && dirty[e] == dirty[e - 1] + 1 {
                e += 1;
            }
            let (a, n) = (dirty[k] as usize, e - k);
            if let Err(err) = s.protect(a * PAGE_SIZE, n * PAGE_SIZE) {
                tracing::error!("cannot write-protect pages {a}..{}: {err}", a + n);
            }
            k = e;
        }
        drop(bits);
        dirty
    }
}

impl WpShared {
    /// Write-protect `[off, off + len)` of the memory.
    fn protect(&self, off: usize, len: usize) -> std::io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !self.unpopulated {
            // Without UFFD_FEATURE_WP_UNPOPULATED only present pages can be
            // protected: read one byte per page to map it (the shared zero
            // page for untouched ones).
            for p in (off..off + len).step_by(PAGE_SIZE) {
                // SAFETY: inside the accessible part of the mapping, which
                // the tracker's LiveMemory keeps alive.
                unsafe { std::ptr::read_volatile((self.base + p) as *const u8) };
            }
        }
        self.uffd.write_protect(self.base + off, len, true)
    }

    /// The fault-handler thread.
    fn serve(&self) {
        while !self.stop.load(Ordering::Acquire) {
            if !self.uffd.poll(20) {
                continue;
            }
            loop {
                let fault = match self.uffd.read() {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!("dirty tracking: reading faults failed: {e}");
                        return;
                    }
                };
                if fault.event != uffd::EVENT_PAGEFAULT {
                    continue;
                }
                let off = (fault.address as usize).saturating_sub(self.base) & !(PAGE_SIZE - 1);
                let page = off / PAGE_SIZE;
                let mut bits = self.bits.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(w) = bits.get_mut(page / 64) {
                    *w |= 1 << (page % 64);
                }
                let r = if fault.flags & uffd::PAGEFAULT_FLAG_WP != 0 {
                    self.uffd.write_protect(self.base + off, PAGE_SIZE, false)
                } else {
                    self.uffd.wake(self.base + off, PAGE_SIZE)
                };
                drop(bits);
                if let Err(e) = r {
                    tracing::error!("dirty tracking: cannot release page {page}: {e}");
                }
            }
        }
    }
}

impl Drop for WpTracker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let s = &self.shared;
        // Lift all protection (waking any writer that faulted after the
        // thread stopped), then unregister.
        let _ = s.uffd.write_protect(s.base, self.registered, false);
        let _ = s.uffd.unregister(s.base, self.registered);
    }
}
