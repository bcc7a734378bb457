//! Where the destination writes pages.
//!
//! The trait is small so that a node can point the decoder straight at a live
//! wasm linear memory (a `&mut [u8]`) and avoid an intermediate copy of the
//! whole image.

use crate::PAGE_SIZE;
use roam_snapshot::InitialImage;

/// All zeros, one page.
pub(crate) static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// A memory the decoder can read pages from and write pages into.
///
/// The decoder checks `i < page_count()` before calling any other method, and
/// always passes exactly [`PAGE_SIZE`] bytes to `write`.
pub trait PageTarget {
    /// Number of whole pages in the memory.
    fn page_count(&self) -> u32;
    /// The current contents of page `i` ([`PAGE_SIZE`] bytes).
    fn page(&self, i: u32) -> &[u8];
    /// Overwrite page `i`.
    fn write(&mut self, i: u32, data: &[u8]);
    /// Make page `i` all zeros.
    fn zero(&mut self, i: u32) {
        self.write(i, &ZERO_PAGE);
    }
    /// Make page `i` equal to the module's initial image page `i`.
    fn initial(&mut self, i: u32);
}

/// A [`PageTarget`] over a byte slice (a wasm memory, or a `Vec<u8>`), with
/// the module's initial image for `Initial` records.
#[derive(Debug)]
pub struct MemoryTarget<'a> {
    mem: &'a mut [u8],
    initial: &'a InitialImage,
}

impl<'a> MemoryTarget<'a> {
    /// Wrap `mem`; a trailing partial page is never written.
    pub fn new(mem: &'a mut [u8], initial: &'a InitialImage) -> Self {
        MemoryTarget { mem, initial }
    }
}

impl PageTarget for MemoryTarget<'_> {
    fn page_count(&self) -> u32 {
        (self.mem.len() / PAGE_SIZE).min(u32::MAX as usize) as u32
    }

    fn page(&self, i: u32) -> &[u8] {
        let o = i as usize * PAGE_SIZE;
        &self.mem[o..o + PAGE_SIZE]
    }

    fn write(&mut self, i: u32, data: &[u8]) {
        let o = i as usize * PAGE_SIZE;
        self.mem[o..o + PAGE_SIZE].copy_from_slice(data);
    }

    fn initial(&mut self, i: u32) {
        let src = self.initial.page(u64::from(i)).unwrap_or(&ZERO_PAGE);
        let o = i as usize * PAGE_SIZE;
        self.mem[o..o + PAGE_SIZE].copy_from_slice(src);
    }
}
