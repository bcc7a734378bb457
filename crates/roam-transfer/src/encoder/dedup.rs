//! The sequential dedup stage: what does the destination already have?
//!
//! Decisions depend on every earlier page of the stream (a `Copy` must point
//! at a page whose destination contents are known at that point), so they are
//! made one page at a time, in submission order, by one thread. Hashes were
//! computed in parallel beforehand, so this stage is only map lookups.
//!
//! The stage mirrors the destination: for every page this stream has written,
//! it records the content hash the destination will hold once the records so
//! far are applied, and (when delta is possible) a shared copy of the bytes.

use crate::store::{ChunkHash, Page, StoreSummary};
use roam_snapshot::InitialImage;
use std::collections::HashMap;
use std::sync::Arc;

/// What the destination will hold for a page once earlier records are applied.
struct DestPage {
    hash: ChunkHash,
    data: Option<Arc<Page>>,
}

/// The decision for one page.
pub(crate) enum Decision {
    /// The destination already has exactly this content for the page.
    Unchanged,
    Zero,
    Initial,
    Copy(u32),
    Stored(ChunkHash),
    /// Needs compression; `base` is the previous version if one is kept and
    /// the mode uses delta; `eligible` says whether one is kept at all (so the
    /// adapter can tell how much delta would apply in a non-delta mode).
    Compress {
        page: Arc<Page>,
        base: Option<Arc<Page>>,
        eligible: bool,
    },
}

pub(crate) struct Dedup {
    dest: HashMap<u32, DestPage>,
    /// For each content hash, one page whose destination content has it.
    holders: HashMap<ChunkHash, u32>,
    initial: HashMap<u32, ChunkHash>,
    summary: Option<StoreSummary>,
    keep_copies: bool,
}

impl Dedup {
    pub fn new(initial: &InitialImage, summary: Option<StoreSummary>, keep_copies: bool) -> Self {
        let mut map = HashMap::new();
        for i in 0..(initial.min_bytes() / crate::PAGE_SIZE as u64).min(u64::from(u32::MAX)) {
            if let Some(p) = initial.page(i) {
                map.insert(i as u32, *blake3::hash(p).as_bytes());
            }
        }
        Dedup {
            dest: HashMap::new(),
            holders: HashMap::new(),
            initial: map,
            summary: summary.filter(|s| !s.is_empty()),
            keep_copies,
        }
    }

    /// Decide how to send `page` (hash `hash`) for `index`, and record that
    /// the destination will hold it afterwards.
    pub fn decide(
        &mut self,
        index: u32,
        page: Box<Page>,
        hash: ChunkHash,
        zero: bool,
        delta: bool,
    ) -> Decision {
        let prev = self.dest.get(&index);
        if prev.is_some_and(|p| p.hash == hash) {
            return Decision::Unchanged;
        }
        let (decision, data) = if zero {
            (Decision::Zero, None)
        } else if self.initial.get(&index) == Some(&hash) {
            // Kept so a later small change to a data-segment page can be a delta.
            (Decision::Initial, self.keep_copies.then(|| Arc::from(page)))
        } else if let Some(&from) = self.holders.get(&hash) {
            let data = self.dest.get(&from).and_then(|d| d.data.clone());
            (Decision::Copy(from), data)
        } else if self.summary.as_ref().is_some_and(|s| s.contains(&hash)) {
            let data = self.keep_copies.then(|| Arc::from(page));
            (Decision::Stored(hash), data)
        } else {
            let kept = prev.and_then(|p| p.data.clone());
            let eligible = kept.is_some();
            let base = if delta { kept } else { None };
            let page: Arc<Page> = Arc::from(page);
            let data = self.keep_copies.then(|| page.clone());
            (
                Decision::Compress {
                    page,
                    base,
                    eligible,
                },
                data,
            )
        };
        self.set_dest(index, hash, data, !zero);
        decision
    }

    fn set_dest(&mut self, index: u32, hash: ChunkHash, data: Option<Arc<Page>>, holder: bool) {
        if let Some(old) = self.dest.insert(index, DestPage { hash, data }) {
            // The page no longer holds its old content: nothing may be copied
            // from it under the old hash any more.
            if self.holders.get(&old.hash) == Some(&index) {
                self.holders.remove(&old.hash);
            }
        }
        if holder {
            self.holders.entry(hash).or_insert(index);
        }
    }
}
