//! roam's own linear-memory mappings, and [`LiveMemory`] handles to them.
//!
//! Why roam maps memory itself instead of letting wasmtime do it: live
//! migration needs to see a cell's memory from other threads while the
//! program runs (pre-copy rounds), to write-protect it page by page (dirty
//! tracking) and to empty it and fill it on demand (post-copy). All three
//! need the address and the length of the mapping, and need it to stay
//! mapped as long as anyone copies from it. A [`wasmtime::MemoryCreator`]
//! installed in the engine gives exactly that: every linear memory is an
//! anonymous private mapping that roam made, kept alive by an [`Arc`].
//!
//! Layout: wasmtime asks for a reservation (4 GiB on 64-bit hosts by
//! default) plus a guard region; all of it is mapped `PROT_NONE` and the
//! accessible prefix is made read-write with `mprotect` as memory grows, so
//! the base never moves and out-of-bounds accesses still fault where
//! wasmtime's compiled bounds checks expect them to. Copy-on-write
//! initialisation from the module image does not apply to host memories:
//! data segments are written at instantiation, as without a pool.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use roam_snapshot::PAGE_SIZE;
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// One mapping: `[base, base + capacity + guard)`, of which the first `len`
/// bytes are read-write.
pub(crate) struct Mapping {
    base: NonNull<u8>,
    capacity: usize,
    mapped: usize,
    len: AtomicUsize,
    /// A memory wasmtime mapped (a threaded program's shared memory), kept
    /// alive by this handle: its size is the memory's own, and roam never
    /// unmaps it.
    shared: Option<wasmtime::SharedMemory>,
}

// SAFETY: the mapping is plain process memory; the pointer is only an
// address. Every access through it is either wasmtime's (the owning store's
// thread) or a raw copy documented as racy in `LiveMemory`.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`; shared access only reads `len` (atomic) and copies
// bytes through raw pointers.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(minimum: usize, capacity: usize, guard: usize) -> Result<Mapping, String> {
        let page = host_page_size();
        let capacity = capacity.max(minimum).next_multiple_of(page);
        let mapped = capacity
            .checked_add(guard.next_multiple_of(page))
            .ok_or("memory reservation overflows the address space")?;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing; it aliases nothing.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "cannot reserve {mapped} bytes for a linear memory: {}",
                std::io::Error::last_os_error()
            ));
        }
        let map = Mapping {
            base: NonNull::new(ptr.cast()).ok_or("mmap returned a null mapping")?,
            capacity,
            mapped,
            len: AtomicUsize::new(0),
            shared: None,
        };
        map.grow_to(minimum)?;
        Ok(map)
    }

    /// A view of a shared memory, which wasmtime maps itself. Its base never
    /// moves and it never shrinks, so copies from it behave as from roam's
    /// own mappings; roam only reads it (and write-protects it while a
    /// migration tracks dirty pages).
    pub(crate) fn of_shared(memory: wasmtime::SharedMemory) -> Mapping {
        let data = memory.data();
        let base = NonNull::new(data.as_ptr() as *mut u8).unwrap_or(NonNull::dangling());
        // A shared memory is reserved up to its maximum, which it must
        // declare.
        let max_pages = memory.ty().maximum().unwrap_or(memory.ty().minimum());
        let capacity = usize::try_from(max_pages.saturating_mul(roam_snapshot::WASM_PAGE_SIZE))
            .unwrap_or(usize::MAX)
            .max(data.len());
        Mapping {
            base,
            capacity,
            mapped: 0,
            len: AtomicUsize::new(data.len()),
            shared: Some(memory),
        }
    }

    fn grow_to(&self, new_len: usize) -> Result<(), String> {
        let old = self.len.load(Ordering::Acquire);
        if new_len <= old {
            return Ok(());
        }
        if new_len > self.capacity {
            return Err(format!(
                "linear memory cannot grow to {new_len} bytes: {} are reserved",
                self.capacity
            ));
        }
        let page = host_page_size();
        let (from, to) = (old.next_multiple_of(page), new_len.next_multiple_of(page));
        if to > from {
            // SAFETY: `[from, to)` lies inside this mapping (to <= capacity),
            // and making reserved pages accessible invalidates no reference.
            let rc = unsafe {
                libc::mprotect(
                    self.base.as_ptr().add(from).cast(),
                    to - from,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            if rc != 0 {
                return Err(format!(
                    "cannot grow linear memory to {new_len} bytes: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        self.len.store(new_len, Ordering::Release);
        Ok(())
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        match &self.shared {
            Some(m) => m.data_size(),
            None => self.len.load(Ordering::Acquire),
        }
    }

    /// Bytes reserved for growth (without the guard region).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Allocate the pages of `[offset, offset + len)` now, in one call,
    /// because they are about to be written: cheaper than a fault per page.
    /// Best effort: ignored where the kernel refuses (before Linux 5.14,
    /// under some emulators).
    pub(crate) fn populate(&self, offset: usize, len: usize) {
        let page = host_page_size();
        let (from, to) = (offset / page * page, (offset + len).next_multiple_of(page));
        if len == 0 || to > self.len() {
            return;
        }
        // SAFETY: advice on a range inside this mapping's accessible prefix;
        // populating for writing does not change any byte.
        unsafe {
            libc::madvise(
                self.base.as_ptr().add(from).cast(),
                to - from,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }

    /// Map `len` bytes of `fd` from `file_offset`, copy-on-write, over
    /// `[offset, offset + len)` of the accessible memory, replacing its
    /// contents. The file must not change while mapped (roam maps only
    /// sealed-by-convention snapshot page files). On failure the range is
    /// left as zero-filled anonymous memory, so the caller can copy instead.
    pub(crate) fn map_private(
        &self,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
    ) -> std::io::Result<()> {
        let page = host_page_size();
        let bad = |what: &str| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, what));
        if self.shared.is_some() {
            return bad("a shared memory is wasmtime's mapping");
        }
        if !offset.is_multiple_of(page) || !len.is_multiple_of(page) || len == 0 {
            return bad("unaligned range");
        }
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return bad("range outside the accessible memory");
        }
        let Ok(file_offset) = libc::off_t::try_from(file_offset) else {
            return bad("file offset too large");
        };
        // SAFETY: `[offset, offset + len)` lies inside this mapping's
        // accessible prefix, which roam owns; MAP_FIXED replaces those pages
        // only. No Rust reference into linear memory is held across this
        // call by the caller (the memory is not yet running).
        let ptr = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED,
                fd.as_raw_fd(),
                file_offset,
            )
        };
        if ptr != libc::MAP_FAILED {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        // A failed MAP_FIXED may have unmapped the range: put anonymous
        // memory back.
        // SAFETY: as above, the range is ours.
        let anon = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if anon == libc::MAP_FAILED {
            return Err(std::io::Error::other(format!(
                "cannot map the snapshot pages ({e}) nor put anonymous memory back ({})",
                std::io::Error::last_os_error()
            )));
        }
        Err(e)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.shared.is_some() {
            // wasmtime's mapping: it unmaps it when the last handle goes.
            return;
        }
        // SAFETY: this mapping was made by `mmap` in `Mapping::new` with this
        // length, and the last reference to it is going away.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped) };
    }
}

/// The host page size (4 KiB on the hosts roam targets; 16/64 KiB on some
/// aarch64 kernels).
pub(crate) fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(PAGE_SIZE).max(PAGE_SIZE)
}

/// What wasmtime holds: the mapping, shared with [`LiveMemory`] handles.
struct HostMemory(Arc<Mapping>);

// SAFETY: the base is page aligned (mmap), never moves, `byte_size` bytes
// from it are read-write, and `capacity + guard` bytes are reserved, so
// growth up to `byte_capacity` keeps the base and accesses past the end
// fault.
unsafe impl LinearMemory for HostMemory {
    fn byte_size(&self) -> usize {
        self.0.len()
    }

    fn byte_capacity(&self) -> usize {
        self.0.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        self.0.grow_to(new_size).map_err(wasmtime::Error::msg)
    }

    fn as_ptr(&self) -> *mut u8 {
        self.0.base()
    }
}

/// The engine's memory creator: makes [`Mapping`]s and remembers them by
/// base address, so a cell can find the mapping behind its memory export.
#[derive(Default)]
pub(crate) struct Creator {
    maps: Mutex<Vec<Weak<Mapping>>>,
}

impl Creator {
    /// The live mapping whose base is `base`.
    pub(crate) fn find(&self, base: *mut u8) -> Option<Arc<Mapping>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.retain(|w| w.strong_count() > 0);
        maps.iter()
            .filter_map(Weak::upgrade)
            .find(|m| m.base() == base)
    }
}

// SAFETY: every memory returned is a fresh zero-filled anonymous mapping
// with the requested reservation and guard (see `HostMemory`).
unsafe impl MemoryCreator for Creator {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        // The whole reservation is mapped (PROT_NONE beyond the current
        // size): compiled code elides bounds checks against it, so it must
        // not be shortened to the memory's declared maximum.
        let capacity = reserved_size_in_bytes
            .or(maximum)
            .unwrap_or(1 << 32)
            .max(minimum);
        let map = Arc::new(Mapping::new(minimum, capacity, guard_size_in_bytes)?);
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.retain(|w| w.strong_count() > 0);
        maps.push(Arc::downgrade(&map));
        Ok(Box::new(HostMemory(map)))
    }
}

/// A handle to a cell's linear memory, usable from any thread while the
/// program runs: its current size and copies of its 4 KiB pages.
///
/// A copy taken while the program runs can race with the program's own
/// writes and yield a torn page (part before, part after a write). That is
/// expected: a migration copies a page only after a [`crate::DirtyTracker`]
/// collect, and any write that lands during or after the copy is reported
/// by the next collect, so the page is sent again. The final round happens
/// while the cell is paused, when no copy can tear.
///
/// The mapping stays valid as long as any handle exists, even after the
/// cell is dropped.
#[derive(Clone)]
pub struct LiveMemory {
    pub(crate) map: Arc<Mapping>,
}

impl LiveMemory {
    /// Current size in bytes (updated when the program grows its memory).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the memory has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current size in 4 KiB pages.
    pub fn page_count(&self) -> u32 {
        (self.len() / PAGE_SIZE) as u32
    }

    /// Copy page `index` into `out`. `false` when the page lies beyond the
    /// current size. See the type's documentation for races.
    pub fn read_page(&self, index: u32, out: &mut [u8; PAGE_SIZE]) -> bool {
        let start = index as usize * PAGE_SIZE;
        if start + PAGE_SIZE > self.len() {
            return false;
        }
        // SAFETY: the page lies inside the accessible prefix (len only
        // grows), the mapping is alive (we hold the Arc), and `out` is a
        // distinct host buffer. The source may be written concurrently by
        // the guest; the copy is then torn, which the type documents.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.base().add(start), out.as_mut_ptr(), PAGE_SIZE)
        };
        true
    }
}

impl std::fmt::Debug for LiveMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveMemory")
            .field("base", &self.map.base())
            .field("len", &self.len())
            .finish()
    }
}
