//! The fault handler of far memory: one thread per cell that serves its
//! page faults, fetches far pages from the store and evicts down to the
//! budget (the policy is described in the parent module).
//!
//! Why a module of its own: everything here runs on the handler thread
//! and owns the per-page flags, while the parent holds what the program's
//! side and the node see (options, counters, attach and detach).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use roam_snapshot::PAGE_SIZE;

use super::{
    Eviction, FarMemory, PageStore, Shared, COPY_MODE_WP, DIRTY, FAULT_WRITE, REF, RESIDENT,
    STORED, WP,
};
use crate::uffd;

/// The fault handler's own state: only its thread touches it.
pub(super) struct Handler {
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
    pub(super) fn new(
        s: Arc<Shared>,
        flags: Vec<u8>,
        store: Box<dyn PageStore>,
        base: usize,
    ) -> Handler {
        let batch = s.opts.batch.max(1);
        Handler {
            s,
            flags,
            store,
            hand: 0,
            rng: 0x9E37_79B9_7F4A_7C15 ^ base as u64,
            batch,
            last_fault: None,
        }
    }

    pub(super) fn run(mut self) {
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
    pub(super) fn evict_if_over(&mut self) {
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
