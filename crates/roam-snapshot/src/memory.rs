//! Linear memory as classified 4 KiB pages.
//!
//! A checkpoint must be cheap: copying hundreds of MiB that are mostly zero or
//! unchanged since instantiation wastes time and snapshot space. Capture
//! therefore classifies each page as Zero, Initial (equal to the module's
//! initial image) or Data, and stores only Data pages. Restore mirrors this and,
//! on a freshly instantiated memory, writes only what differs, so untouched
//! pages stay unmapped.

mod capture;
mod pages;

pub use pages::PageBuilder;

pub(crate) use capture::is_zero;
use capture::{capture_with, PARALLEL_MIN_BYTES};
use std::os::fd::BorrowedFd;

use serde::{Deserialize, Serialize};

use crate::initial::InitialImage;
use crate::pages::Store;
use crate::{PAGE_SIZE, WASM_PAGE_SIZE};

/// How one 4 KiB page of linear memory is represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PageKind {
    /// All bytes are zero; nothing stored.
    Zero,
    /// Equal to the (non-zero) page of the module's initial image; nothing stored.
    Initial,
    /// Stored verbatim in the snapshot.
    Data,
}

/// The linear memory of a snapshot, with zero and initial pages elided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryImage {
    byte_len: u64,
    initial_digest: [u8; 32],
    kinds: Vec<PageKind>,
    /// The Data pages, in page order, `PAGE_SIZE` bytes each.
    data: Store,
}

/// Why [`MemoryImage::restore_into`] refused to write.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RestoreError {
    /// The destination has the wrong length.
    #[error(
        "destination memory is {got} bytes but the snapshot memory is {expected} bytes; \
         grow the memory to exactly the snapshot size before restoring"
    )]
    SizeMismatch {
        /// The snapshot's memory size.
        expected: u64,
        /// The destination's size.
        got: u64,
    },
    /// The initial image is not the one the snapshot was captured against.
    #[error(
        "the module's initial memory image differs from the one the snapshot was captured \
         against; restore with the same prepared module the snapshot was taken from"
    )]
    InitialImageMismatch,
    /// A page marked Initial has no data in the initial image.
    #[error(
        "page {page} is marked as equal to the initial image, but the initial image has no \
         data there; the snapshot is corrupt, re-create it"
    )]
    MissingInitialPage {
        /// Index of the offending 4 KiB page.
        page: u64,
    },
}

impl MemoryImage {
    /// An image of a zero-length memory.
    pub fn empty() -> Self {
        MemoryImage {
            byte_len: 0,
            initial_digest: InitialImage::empty().digest(),
            kinds: Vec::new(),
            data: Store::Heap(Vec::new()),
        }
    }

    /// Classify every 4 KiB page of `memory` as Zero, Initial (equal to
    /// `initial`'s page) or Data (stored).
    ///
    /// # Panics
    /// If `memory.len()` is not a multiple of [`WASM_PAGE_SIZE`] or exceeds
    /// 4 GiB; a wasm32 linear memory always satisfies both.
    pub fn capture(memory: &[u8], initial: &InitialImage) -> MemoryImage {
        Self::capture_reusing(memory, initial, Vec::new())
    }

    /// Like [`MemoryImage::capture`], but stores the pages in `buffer`'s
    /// allocation (its contents are discarded). For large memories the page
    /// faults of a fresh allocation cost several times the copy itself, so
    /// periodic checkpoints should pass the previous image's
    /// [`MemoryImage::into_stored_data`].
    ///
    /// # Panics
    /// As [`MemoryImage::capture`].
    pub fn capture_reusing(memory: &[u8], initial: &InitialImage, buffer: Vec<u8>) -> MemoryImage {
        let threads = if memory.len() >= PARALLEL_MIN_BYTES {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
        } else {
            1
        };
        capture_with(memory, initial, buffer, threads)
    }

    /// An image of a `byte_len`-byte memory whose contents travel
    /// separately (a live migration streams the pages on their own): it
    /// records the size, so the rest of the snapshot validates, and every
    /// page as Zero. Restoring from it yields zeros; a receiver replaces it
    /// with the pages it got before use.
    ///
    /// # Panics
    /// If `byte_len` is not a multiple of [`WASM_PAGE_SIZE`].
    pub fn placeholder(byte_len: u64, initial: &InitialImage) -> MemoryImage {
        Self::placeholder_with_digest(byte_len, initial.digest())
    }

    /// [`MemoryImage::placeholder`] from the initial image's digest.
    pub(crate) fn placeholder_with_digest(byte_len: u64, initial_digest: [u8; 32]) -> MemoryImage {
        assert!(
            byte_len.is_multiple_of(WASM_PAGE_SIZE),
            "memory size {byte_len}"
        );
        MemoryImage {
            byte_len,
            initial_digest,
            kinds: vec![PageKind::Zero; (byte_len / PAGE_SIZE as u64) as usize],
            data: Store::Heap(Vec::new()),
        }
    }

    /// Give up the image, keeping the stored-page buffer for reuse (empty
    /// when the pages live in a shared, immutable page file).
    pub fn into_stored_data(self) -> Vec<u8> {
        match self.data {
            Store::Heap(v) => v,
            Store::Shared(_) => Vec::new(),
        }
    }

    /// A memory of `byte_len` bytes described by `pages` page kinds: whole
    /// wasm pages, one kind per 4 KiB.
    pub(crate) fn check_shape(byte_len: u64, pages: usize) -> Result<(), String> {
        if !byte_len.is_multiple_of(WASM_PAGE_SIZE) {
            return Err(format!(
                "memory size {byte_len} is not a multiple of 64 KiB"
            ));
        }
        if pages as u64 * PAGE_SIZE as u64 != byte_len {
            return Err(format!("{pages} page kinds for a {byte_len}-byte memory"));
        }
        Ok(())
    }

    /// Reassemble an image from decoded parts, checking their consistency.
    pub(crate) fn from_parts(
        byte_len: u64,
        initial_digest: [u8; 32],
        kinds: Vec<PageKind>,
        data: Store,
    ) -> Result<Self, String> {
        Self::check_shape(byte_len, kinds.len())?;
        let stored = kinds.iter().filter(|k| **k == PageKind::Data).count();
        let data_len = data.as_slice().len();
        if stored as u64 * PAGE_SIZE as u64 != data_len as u64 {
            return Err(format!(
                "{stored} stored pages but {data_len} bytes of page data"
            ));
        }
        Ok(MemoryImage {
            byte_len,
            initial_digest,
            kinds,
            data,
        })
    }

    /// Size of the memory in bytes (a multiple of [`WASM_PAGE_SIZE`]).
    pub fn byte_len(&self) -> u64 {
        self.byte_len
    }

    /// Number of pages stored verbatim.
    pub fn stored_pages(&self) -> usize {
        self.data.as_slice().len() / PAGE_SIZE
    }

    /// Number of all-zero pages.
    pub fn zero_pages(&self) -> usize {
        self.kinds.iter().filter(|k| **k == PageKind::Zero).count()
    }

    /// Number of pages equal to the initial image.
    pub fn initial_pages(&self) -> usize {
        self.kinds
            .iter()
            .filter(|k| **k == PageKind::Initial)
            .count()
    }

    /// The classification of every 4 KiB page, in order.
    pub fn page_kinds(&self) -> &[PageKind] {
        &self.kinds
    }

    /// The stored pages, concatenated in page order.
    pub fn stored_data(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The stored pages as a file that can be mapped copy-on-write: stored
    /// page `i` (in [`MemoryImage::data_runs`] numbering) is at file offset
    /// `i * PAGE_SIZE`. Present for images decoded from format v2, whose
    /// pages live in an immutable memfd; `None` for heap images (a fresh
    /// capture, a v1 file).
    pub fn stored_data_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.data {
            Store::Shared(s) => Some(s.fd()),
            Store::Heap(_) => None,
        }
    }

    /// The runs of consecutive Data pages, in order, as
    /// `(first memory page, first stored page, page count)`.
    pub fn data_runs(&self) -> Vec<(u64, u64, u64)> {
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        let mut stored = 0u64;
        for (i, kind) in self.kinds.iter().enumerate() {
            if *kind != PageKind::Data {
                continue;
            }
            match runs.last_mut() {
                Some((p, _, n)) if *p + *n == i as u64 => *n += 1,
                _ => runs.push((i as u64, stored, 1)),
            }
            stored += 1;
        }
        runs
    }

    /// Like [`MemoryImage::restore_into`] on a fresh memory, except that
    /// Data pages are left for the caller to fill (typically by mapping
    /// [`MemoryImage::stored_data_fd`] over them, run by run). Validates
    /// everything before writing.
    pub fn restore_except_data(
        &self,
        dst: &mut [u8],
        initial: &InitialImage,
    ) -> Result<(), RestoreError> {
        self.restore_with(dst, initial, true, false)
    }

    /// Digest of the initial image this memory was captured against.
    pub fn initial_digest(&self) -> [u8; 32] {
        self.initial_digest
    }

    /// Write the image into `dst` (len == `byte_len()`). If `dst_is_fresh`, dst
    /// already holds exactly the initial image and zeroes elsewhere (a freshly
    /// instantiated memory grown to size), so Initial pages and Zero pages
    /// outside the initial image are not touched.
    ///
    /// Everything is validated before the first byte of `dst` is written.
    pub fn restore_into(
        &self,
        dst: &mut [u8],
        initial: &InitialImage,
        dst_is_fresh: bool,
    ) -> Result<(), RestoreError> {
        self.restore_with(dst, initial, dst_is_fresh, true)
    }

    fn restore_with(
        &self,
        dst: &mut [u8],
        initial: &InitialImage,
        dst_is_fresh: bool,
        write_data: bool,
    ) -> Result<(), RestoreError> {
        if dst.len() as u64 != self.byte_len {
            return Err(RestoreError::SizeMismatch {
                expected: self.byte_len,
                got: dst.len() as u64,
            });
        }
        if initial.digest() != self.initial_digest {
            return Err(RestoreError::InitialImageMismatch);
        }
        let mut cursor = InitialCursor::new(initial);
        for (i, kind) in self.kinds.iter().enumerate() {
            if *kind == PageKind::Initial && cursor.page(i as u64).is_none() {
                return Err(RestoreError::MissingInitialPage { page: i as u64 });
            }
        }
        let mut cursor = InitialCursor::new(initial);
        let mut stored = self.data.as_slice().chunks_exact(PAGE_SIZE);
        for (i, (kind, page)) in self
            .kinds
            .iter()
            .zip(dst.chunks_exact_mut(PAGE_SIZE))
            .enumerate()
        {
            let init = cursor.page(i as u64);
            match kind {
                PageKind::Data => {
                    // from_parts/capture guarantee one stored page per Data kind.
                    let src = stored.next().expect("stored page count checked");
                    if write_data {
                        page.copy_from_slice(src);
                    }
                }
                PageKind::Initial if !dst_is_fresh => {
                    page.copy_from_slice(init.expect("initial pages checked above"));
                }
                PageKind::Initial => {}
                PageKind::Zero if dst_is_fresh && init.is_some() => page.fill(0),
                // Reading an untouched page is cheap; writing one commits it.
                PageKind::Zero if !dst_is_fresh && !is_zero(page) => page.fill(0),
                PageKind::Zero => {}
            }
        }
        Ok(())
    }
}

/// Walks an [`InitialImage`] in increasing page order without binary searches.
pub(crate) struct InitialCursor<'a> {
    image: &'a InitialImage,
    next: usize,
}

impl<'a> InitialCursor<'a> {
    pub(crate) fn new(image: &'a InitialImage) -> Self {
        InitialCursor { image, next: 0 }
    }

    /// The initial page `index`; calls must use non-decreasing indices.
    pub(crate) fn page(&mut self, index: u64) -> Option<&'a [u8]> {
        let idx = self.image.indices();
        while self.next < idx.len() && idx[self.next] < index {
            self.next += 1;
        }
        if idx.get(self.next) == Some(&index) {
            Some(self.image.page_at_slot(self.next))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests;
