//! A memory image page by page, without a copy of the whole memory.
//!
//! A kept checkpoint travels as its non-zero pages, each named by its hash
//! (`roam-node`'s `kept` module). Materialising the whole memory to walk
//! it, and again to rebuild an image from pages, would cost one more copy
//! of the cell's memory at each end, on top of the image itself. These
//! walk the image in place, and build one from pages as they are read.

use super::{InitialCursor, MemoryImage, PageKind};
use crate::initial::InitialImage;
use crate::pages::Store;
use crate::{PAGE_SIZE, WASM_PAGE_SIZE};

impl MemoryImage {
    /// Every page of the memory that is not all zeros, in page order, as
    /// `(page index, its bytes)`: Data pages from the image, Initial pages
    /// from `initial`. Nothing is copied.
    ///
    /// Refused, as by [`MemoryImage::restore_into`], if `initial` is not
    /// the image the memory was captured against.
    pub fn nonzero_pages<'a>(
        &'a self,
        initial: &'a InitialImage,
    ) -> Result<impl Iterator<Item = (u64, &'a [u8])> + 'a, super::RestoreError> {
        if initial.digest() != self.initial_digest {
            return Err(super::RestoreError::InitialImageMismatch);
        }
        let mut cursor = InitialCursor::new(initial);
        for (i, kind) in self.kinds.iter().enumerate() {
            if *kind == PageKind::Initial && cursor.page(i as u64).is_none() {
                return Err(super::RestoreError::MissingInitialPage { page: i as u64 });
            }
        }
        let mut cursor = InitialCursor::new(initial);
        let mut stored = self.data.as_slice().chunks_exact(PAGE_SIZE);
        Ok(self.kinds.iter().enumerate().filter_map(move |(i, kind)| {
            let i = i as u64;
            let page = match kind {
                PageKind::Zero => None,
                // Checked above: every Initial page has its data.
                PageKind::Initial => cursor.page(i),
                PageKind::Data => stored.next().filter(|p| !super::is_zero(p)),
            };
            page.map(|p| (i, p))
        }))
    }
}

/// Builds a [`MemoryImage`] from the non-zero pages of a memory, given in
/// increasing page order; pages not given are zero. Each page is
/// classified as a capture would: zero, equal to the initial image, or
/// stored.
pub struct PageBuilder<'a> {
    byte_len: u64,
    initial: &'a InitialImage,
    cursor: InitialCursor<'a>,
    kinds: Vec<PageKind>,
    data: Vec<u8>,
    next: u64,
}

impl<'a> PageBuilder<'a> {
    /// A builder for a `byte_len`-byte memory (whole wasm pages, at most
    /// 4 GiB), with room reserved for `pages_hint` stored pages.
    pub fn new(
        byte_len: u64,
        initial: &'a InitialImage,
        pages_hint: usize,
    ) -> Result<PageBuilder<'a>, String> {
        if !byte_len.is_multiple_of(WASM_PAGE_SIZE) || byte_len > crate::MAX_MEMORY_BYTES {
            return Err(format!(
                "memory size {byte_len}: not whole wasm pages, or over 4 GiB"
            ));
        }
        let pages = (byte_len / PAGE_SIZE as u64) as usize;
        let mut data = Vec::new();
        data.reserve_exact(pages_hint.min(pages) * PAGE_SIZE);
        Ok(PageBuilder {
            byte_len,
            initial,
            cursor: InitialCursor::new(initial),
            kinds: vec![PageKind::Zero; pages],
            data,
            next: 0,
        })
    }

    /// Page `index` holds `page`. Indices must increase.
    pub fn add(&mut self, index: u64, page: &[u8]) -> Result<(), String> {
        if page.len() != PAGE_SIZE {
            return Err(format!(
                "page {index} is {} bytes, not {PAGE_SIZE}",
                page.len()
            ));
        }
        if index < self.next || index >= self.kinds.len() as u64 {
            return Err(format!(
                "page {index}: out of order, or past the end of a {}-byte memory",
                self.byte_len
            ));
        }
        self.next = index + 1;
        let kind = if super::is_zero(page) {
            PageKind::Zero
        } else if self.cursor.page(index) == Some(page) {
            PageKind::Initial
        } else {
            self.data.extend_from_slice(page);
            PageKind::Data
        };
        self.kinds[index as usize] = kind;
        Ok(())
    }

    /// The image.
    pub fn finish(self) -> MemoryImage {
        MemoryImage {
            byte_len: self.byte_len,
            initial_digest: self.initial.digest(),
            kinds: self.kinds,
            data: Store::Heap(self.data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> (Vec<u8>, InitialImage) {
        let mut mem = vec![0u8; 2 * WASM_PAGE_SIZE as usize];
        // An initial page left alone, one changed, one zeroed, data pages.
        let initial = InitialImage::new(
            mem.len() as u64,
            vec![
                (0, vec![7u8; PAGE_SIZE]),
                (PAGE_SIZE as u64, vec![8u8; PAGE_SIZE]),
                (2 * PAGE_SIZE as u64, vec![9u8; 10]),
            ],
        );
        mem[..PAGE_SIZE].fill(7);
        mem[PAGE_SIZE..2 * PAGE_SIZE].fill(1);
        mem[5 * PAGE_SIZE + 3] = 4;
        mem[20 * PAGE_SIZE..21 * PAGE_SIZE].fill(0xee);
        (mem, initial)
    }

    #[test]
    fn nonzero_pages_are_those_of_the_memory() {
        let (mem, initial) = image();
        let img = MemoryImage::capture(&mem, &initial);
        let got: Vec<(u64, Vec<u8>)> = img
            .nonzero_pages(&initial)
            .unwrap()
            .map(|(i, p)| (i, p.to_vec()))
            .collect();
        let want: Vec<(u64, Vec<u8>)> = mem
            .chunks(PAGE_SIZE)
            .enumerate()
            .filter(|(_, p)| p.iter().any(|&b| b != 0))
            .map(|(i, p)| (i as u64, p.to_vec()))
            .collect();
        assert_eq!(got, want);
        assert!(img.nonzero_pages(&InitialImage::empty()).is_err());
    }

    #[test]
    fn an_image_built_from_pages_equals_the_capture() {
        let (mem, initial) = image();
        let img = MemoryImage::capture(&mem, &initial);
        let mut b = PageBuilder::new(mem.len() as u64, &initial, 4).unwrap();
        for (i, p) in img.nonzero_pages(&initial).unwrap() {
            b.add(i, p).unwrap();
        }
        assert_eq!(b.finish(), img);
    }

    #[test]
    fn the_builder_refuses_pages_out_of_order_or_past_the_end() {
        let initial = InitialImage::empty();
        let len = WASM_PAGE_SIZE;
        let mut b = PageBuilder::new(len, &initial, 1).unwrap();
        let page = [1u8; PAGE_SIZE];
        b.add(3, &page).unwrap();
        assert!(b.add(3, &page).is_err());
        assert!(b.add(16, &page).is_err());
        assert!(b.add(4, &page[1..]).is_err());
        assert!(PageBuilder::new(len + 1, &initial, 0).is_err());
    }
}
