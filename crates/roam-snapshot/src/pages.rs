//! Where a memory image keeps its stored pages: on the heap, or in an
//! anonymous shared-memory file (a Linux memfd).
//!
//! Why a memfd: restoring a large memory by copying it costs a page fault
//! and a 4 KiB copy per page. A decoded image whose pages sit, page-aligned,
//! in a file can instead be *mapped* copy-on-write into the destination
//! linear memory: one `mmap` per run of stored pages, and each page costs
//! something only when the restored program first writes it. Decoding a
//! format v2 snapshot therefore writes the pages into a memfd, which stays
//! immutable once decoding has finished, so every private mapping of it
//! keeps seeing the decoded bytes. A freshly captured image stays on the
//! heap, where its buffer can be reused by the next checkpoint.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// Page storage of a [`crate::MemoryImage`].
#[derive(Clone)]
pub(crate) enum Store {
    /// On the heap; reusable as a capture buffer.
    Heap(Vec<u8>),
    /// In a memfd, immutable; mappable copy-on-write.
    Shared(Arc<SharedPages>),
}

impl PartialEq for Store {
    fn eq(&self, other: &Store) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Store {}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Heap(v) => write!(f, "Heap({} bytes)", v.len()),
            Store::Shared(s) => write!(f, "{s:?}"),
        }
    }
}

impl Store {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Store::Heap(v) => v,
            Store::Shared(s) => s.as_slice(),
        }
    }
}

/// A memfd of `len` bytes and a shared mapping of it. Written only while
/// uniquely owned (decoding), read-only afterwards.
pub struct SharedPages {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; after
// construction it is only written through `&mut self` (unique access), and
// shared access only reads.
unsafe impl Send for SharedPages {}
// SAFETY: as for `Send`: `&self` methods only read.
unsafe impl Sync for SharedPages {}

impl SharedPages {
    /// A zero-filled memfd of `len` bytes, mapped read-write. Nothing is
    /// allocated until pages are written.
    pub(crate) fn new(len: usize) -> io::Result<SharedPages> {
        // SAFETY: a plain system call with a NUL-terminated name and flags;
        // it returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"roam-snapshot-pages".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "page store too large"))?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if len == 0 {
            return Ok(SharedPages {
                fd,
                ptr: NonNull::dangling(),
                len,
            });
        }
        // SAFETY: a new shared mapping of the whole memfd at an address of
        // the kernel's choosing; it aliases nothing in this process.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr: NonNull<u8> =
            NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("null mapping"))?;
        // Every page is about to be written: allocating them in one call is
        // several times cheaper than a fault per page. Best effort (Linux
        // 5.14+; refused under some emulators, where faults do the same).
        // SAFETY: advice on the mapping just made; it changes no contents.
        unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
        Ok(SharedPages { fd, ptr, len })
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes (or is dangling with
        // `len == 0`) for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable while uniquely owned.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` guarantees no other
        // reference into the mapping exists.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The memfd: byte `i` of [`SharedPages::as_slice`] is at file offset `i`.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SharedPages {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: the mapping was made in `new` with this length and no
            // reference into it outlives `self`.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

impl std::fmt::Debug for SharedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPages")
            .field("fd", &self.fd.as_raw_fd())
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_pages_are_zeroed_writable_and_readable_through_the_fd() {
        let mut p = SharedPages::new(8192).unwrap();
        assert!(p.as_slice().iter().all(|&b| b == 0));
        p.as_mut_slice()[4096] = 7;
        let mut b = [0u8; 1];
        // SAFETY: pread into a 1-byte buffer from a descriptor we own.
        let n = unsafe { libc::pread(p.fd().as_raw_fd(), b.as_mut_ptr().cast(), 1, 4096) };
        assert_eq!((n, b[0]), (1, 7));
        let empty = SharedPages::new(0).unwrap();
        assert!(empty.as_slice().is_empty());
    }
}
