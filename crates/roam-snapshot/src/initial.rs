//! The module's initial linear-memory image, kept sparse.
//!
//! Most of a program's memory at a checkpoint is either zero or still equal to
//! what the data segments put there at instantiation. Knowing that image lets
//! capture elide those pages and lets restore skip them entirely when the
//! destination memory is freshly instantiated.

use crate::PAGE_SIZE;

/// The module's initial memory contents (from its active data segments), sparse.
///
/// Only 4 KiB pages that contain at least one non-zero byte are kept; an
/// all-zero page is indistinguishable from untouched memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialImage {
    min_bytes: u64,
    /// Sorted page indices of the kept pages.
    indices: Vec<u64>,
    /// `indices.len() * PAGE_SIZE` bytes, page `k` belongs to `indices[k]`.
    pages: Vec<u8>,
    digest: [u8; 32],
}

impl InitialImage {
    /// Build the image of a memory of `min_bytes` initial bytes from active data
    /// segments `(offset, bytes)`, applied in order so later segments overwrite
    /// earlier ones (as instantiation does).
    pub fn new(min_bytes: u64, segments: Vec<(u64, Vec<u8>)>) -> Self {
        use std::collections::BTreeMap;
        let ps = PAGE_SIZE as u64;
        let mut map: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for (offset, bytes) in &segments {
            let mut pos = 0usize;
            while pos < bytes.len() {
                let abs = offset.saturating_add(pos as u64);
                let page = abs / ps;
                let in_page = (abs % ps) as usize;
                let n = (PAGE_SIZE - in_page).min(bytes.len() - pos);
                let buf = map.entry(page).or_insert_with(|| vec![0; PAGE_SIZE]);
                buf[in_page..in_page + n].copy_from_slice(&bytes[pos..pos + n]);
                pos += n;
            }
        }
        let mut indices = Vec::new();
        let mut pages = Vec::new();
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"roam initial image v1");
        for (idx, buf) in map {
            if crate::memory::is_zero(&buf) {
                continue;
            }
            hasher.update(&idx.to_le_bytes());
            hasher.update(&buf);
            indices.push(idx);
            pages.extend_from_slice(&buf);
        }
        InitialImage {
            min_bytes,
            indices,
            pages,
            digest: *hasher.finalize().as_bytes(),
        }
    }

    /// An image with no data (a module without active data segments).
    pub fn empty() -> Self {
        Self::new(0, Vec::new())
    }

    /// The initial memory size in bytes, as given to [`InitialImage::new`].
    pub fn min_bytes(&self) -> u64 {
        self.min_bytes
    }

    /// Number of non-zero 4 KiB pages in the image.
    pub fn page_count(&self) -> usize {
        self.indices.len()
    }

    /// A digest of the image's contents (not of `min_bytes`). A memory image
    /// records it at capture so restoring against a different module's image
    /// is refused instead of silently producing wrong memory.
    pub fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// The contents of page `index`, or `None` if that page is all zeros.
    pub fn page(&self, index: u64) -> Option<&[u8]> {
        let k = self.indices.binary_search(&index).ok()?;
        Some(&self.pages[k * PAGE_SIZE..(k + 1) * PAGE_SIZE])
    }

    /// The `k`-th kept page (in index order).
    pub(crate) fn page_at_slot(&self, k: usize) -> &[u8] {
        &self.pages[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]
    }

    /// The sorted indices of the non-zero pages.
    pub(crate) fn indices(&self) -> &[u64] {
        &self.indices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_segments_overwrite_earlier_and_span_pages() {
        let img = InitialImage::new(
            65536,
            vec![
                (4090, vec![1; 10]),
                (4094, vec![2; 1]),
                (3 * 4096, vec![0; 4096]),
            ],
        );
        // Pages 0 and 1 touched; page 3 is all zeros so it is dropped.
        assert_eq!(img.page_count(), 2);
        let p0 = img.page(0).unwrap();
        assert_eq!(&p0[4090..4096], &[1, 1, 1, 1, 2, 1]);
        assert!(p0[..4090].iter().all(|&b| b == 0));
        let p1 = img.page(1).unwrap();
        assert_eq!(&p1[..4], &[1, 1, 1, 1]);
        assert!(p1[4..].iter().all(|&b| b == 0));
        assert!(img.page(2).is_none());
        assert!(img.page(3).is_none());
        assert_eq!(img.min_bytes(), 65536);
    }

    #[test]
    fn digest_depends_on_content_only() {
        let a = InitialImage::new(65536, vec![(0, vec![5; 3])]);
        let b = InitialImage::new(131072, vec![(0, vec![5, 5]), (2, vec![5])]);
        let c = InitialImage::new(65536, vec![(0, vec![5, 5, 6])]);
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
        assert_ne!(a.digest(), InitialImage::empty().digest());
    }
}
