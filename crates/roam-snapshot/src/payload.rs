//! The uncompressed payload's section structure and metadata record.
//!
//! Kept separate from encode/decode so both sides share one definition of
//! what goes where; the postcard field order of [`Meta`] is part of the format.

use serde::{Deserialize, Serialize};

use crate::memory::PageKind;
use crate::model::{GlobalValue, Origin, ThreadImage, UnwoundStack, MAX_THREADS};

/// Number of sections in a v1 payload.
pub(crate) const SECTION_COUNT: usize = 5;

/// Section names, in payload order (used in error messages).
pub(crate) const SECTIONS: [&str; SECTION_COUNT] = [
    "metadata section",
    "module section",
    "os-state section",
    "files section",
    "memory section",
];

/// The metadata section (postcard-encoded).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub module_hash: [u8; 32],
    pub origin: Origin,
    pub globals: Vec<GlobalValue>,
    pub stack: UnwoundStack,
    pub memory: MemoryMeta,
    /// Format 2.1: the other threads, encoded after the record above
    /// (so that a 2.0 metadata section is exactly the record).
    #[serde(skip)]
    pub threads: Vec<ThreadImage>,
}

impl Meta {
    /// The metadata section: the record, then the threads if any.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut out = postcard::to_allocvec(self)?;
        if !self.threads.is_empty() {
            out.extend_from_slice(&postcard::to_allocvec(&self.threads)?);
        }
        Ok(out)
    }

    /// Read a metadata section of format minor `minor`.
    pub(crate) fn from_bytes(bytes: &[u8], minor: u16) -> Result<Meta, crate::decode::DecodeError> {
        use crate::decode::DecodeError;
        const WHAT: &str = "metadata section";
        let (mut meta, rest): (Meta, _) = postcard::take_from_bytes(bytes)
            .map_err(|e| DecodeError::malformed(WHAT, e.to_string()))?;
        if !rest.is_empty() {
            if minor == 0 {
                return Err(DecodeError::malformed(
                    WHAT,
                    format!("{} trailing bytes", rest.len()),
                ));
            }
            let threads: Vec<ThreadImage> = crate::decode::postcard_exact(rest, "threads")?;
            if threads.is_empty() || threads.len() > MAX_THREADS {
                return Err(DecodeError::malformed(
                    "threads",
                    format!(
                        "{} threads (1 to {MAX_THREADS} when present)",
                        threads.len()
                    ),
                ));
            }
            meta.threads = threads;
        }
        Ok(meta)
    }
}

/// How to rebuild the page classification of the memory section.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct MemoryMeta {
    pub byte_len: u64,
    pub initial_digest: [u8; 32],
    /// Run-length encoding of the page kinds; runs are non-empty.
    pub runs: Vec<Run>,
}

/// `pages` consecutive pages of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Run {
    pub kind: PageKind,
    pub pages: u32,
}

/// Run-length encode page kinds.
pub(crate) fn runs_of(kinds: &[PageKind]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for &kind in kinds {
        match runs.last_mut() {
            Some(r) if r.kind == kind && r.pages < u32::MAX => r.pages += 1,
            _ => runs.push(Run { kind, pages: 1 }),
        }
    }
    runs
}

/// Expand runs into exactly `page_count` kinds, or explain why that is impossible.
pub(crate) fn expand_runs(runs: &[Run], page_count: u64) -> Result<Vec<PageKind>, String> {
    let mut total: u64 = 0;
    for r in runs {
        if r.pages == 0 {
            return Err("empty page run".into());
        }
        total += u64::from(r.pages);
        if total > page_count {
            return Err(format!(
                "page runs cover more than the {page_count} pages of memory"
            ));
        }
    }
    if total != page_count {
        return Err(format!(
            "page runs cover {total} pages, memory has {page_count}"
        ));
    }
    // page_count <= 2^20 (4 GiB / 4 KiB), checked by the caller.
    let mut kinds = Vec::with_capacity(page_count as usize);
    for r in runs {
        kinds.extend(std::iter::repeat_n(r.kind, r.pages as usize));
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use PageKind::*;

    #[test]
    fn runs_round_trip() {
        let kinds = [Zero, Zero, Data, Initial, Initial, Initial, Zero];
        let runs = runs_of(&kinds);
        assert_eq!(runs.len(), 4);
        assert_eq!(
            runs[1],
            Run {
                kind: Data,
                pages: 1
            }
        );
        assert_eq!(expand_runs(&runs, 7).unwrap(), kinds);
        assert!(runs_of(&[]).is_empty());
    }

    #[test]
    fn expand_refuses_inconsistent_runs() {
        let r = |kind, pages| Run { kind, pages };
        assert!(expand_runs(&[r(Zero, 0)], 0).is_err());
        assert!(expand_runs(&[r(Zero, 3)], 4).is_err());
        assert!(expand_runs(&[r(Zero, 3), r(Data, u32::MAX)], 4).is_err());
        assert_eq!(expand_runs(&[], 0).unwrap(), vec![]);
    }
}
