//! Per-cell resource limits: linear memory, tables, instances.
//!
//! Why: a cell is someone else's program, and on a node it shares the
//! machine with other cells. Without a cap a wasm32 program may grow its
//! memory to 4 GiB, and a cell that arrives by migration may bring any
//! memory size its peer declares. The cap is enforced in two places:
//!
//! - while the program runs, by a [`wasmtime::ResourceLimiter`] installed
//!   in the cell's store: a `memory.grow` past the cap returns -1 (so
//!   `malloc` returns NULL and the program decides what to do), never a
//!   trap and never an error of the host;
//! - before a restore or an incoming migration writes anything, by
//!   [`CellLimits::check_memory`]: a memory image larger than the cap is
//!   refused with an error that names both sizes.
//!
//! The memory creator ([`crate::memory`]) still reserves the full 4 GiB of
//! *address space* per memory (compiled code elides bounds checks against
//! that reservation), but the reservation is `PROT_NONE` and
//! `MAP_NORESERVE`: it costs no memory. Only the accessible prefix, which
//! the limiter bounds, is backed.

use crate::error::RestoreError;

/// Default [`crate::CellOptions::max_memory`]: 4 GiB, the most a wasm32 memory can
/// address, i.e. no limit beyond the architecture's.
pub const DEFAULT_MAX_MEMORY: u64 = 4 << 30;

/// Default [`CellLimits::max_table_elements`]: 1 Mi elements (8 MiB of
/// function references), far above what compiled C or Rust programs use.
pub const DEFAULT_MAX_TABLE_ELEMENTS: u64 = 1 << 20;

/// Limits of one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CellLimits {
    /// Most bytes of linear memory. Default [`DEFAULT_MAX_MEMORY`].
    pub max_memory: u64,
    /// Most elements per table. Default [`DEFAULT_MAX_TABLE_ELEMENTS`].
    pub max_table_elements: u64,
}

impl Default for CellLimits {
    fn default() -> Self {
        CellLimits {
            max_memory: DEFAULT_MAX_MEMORY,
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
        }
    }
}

impl CellLimits {
    /// The limits of a cell run with `opts`.
    pub(crate) fn of(opts: &crate::CellOptions) -> CellLimits {
        CellLimits {
            max_memory: opts.max_memory,
            ..CellLimits::default()
        }
    }

    /// Refuse a memory of `bytes` (from a snapshot or a migration peer)
    /// before anything is allocated for it.
    pub(crate) fn check_memory(&self, bytes: u64) -> Result<(), RestoreError> {
        if bytes > self.max_memory {
            return Err(RestoreError::OverLimit {
                bytes,
                limit: self.max_memory,
            });
        }
        Ok(())
    }
}

/// The store's limiter: refuses growth past the limits and says so once.
#[derive(Debug)]
pub(crate) struct Limiter {
    limits: CellLimits,
    warned: bool,
}

impl Limiter {
    pub(crate) fn new(limits: CellLimits) -> Limiter {
        Limiter {
            limits,
            warned: false,
        }
    }

    pub(crate) fn limits(&self) -> CellLimits {
        self.limits
    }

    fn refuse(&mut self, what: &str, current: usize, desired: usize, limit: u64) -> bool {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                current,
                desired,
                limit,
                "the program asked to grow its {what} past its limit; the growth fails \
                 (malloc returns NULL); raise the limit with --max-memory"
            );
        }
        false
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.limits.max_memory {
            return Ok(self.refuse("memory", current, desired, self.limits.max_memory));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.limits.max_table_elements {
            let limit = self.limits.max_table_elements;
            return Ok(self.refuse("table", current, desired, limit));
        }
        Ok(true)
    }

    // A cell's store holds exactly one instance of one module with two
    // memories: the program's and roam's one-page flag memory
    // (`crate::flag`).
    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        2
    }

    fn tables(&self) -> usize {
        8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn growth_past_the_limit_is_refused_not_an_error() {
        let mut l = Limiter::new(CellLimits {
            max_memory: 1 << 20,
            max_table_elements: 10,
        });
        assert!(l.memory_growing(0, 1 << 20, None).unwrap());
        assert!(!l.memory_growing(1 << 20, 2 << 20, None).unwrap());
        assert!(!l.memory_growing(1 << 20, 2 << 20, None).unwrap());
        assert!(l.table_growing(0, 10, None).unwrap());
        assert!(!l.table_growing(10, 11, None).unwrap());
    }

    #[test]
    fn oversized_image_is_refused_with_both_sizes() {
        let l = CellLimits {
            max_memory: 64 << 20,
            ..CellLimits::default()
        };
        assert!(l.check_memory(64 << 20).is_ok());
        let e = l.check_memory(65 << 20).unwrap_err().to_string();
        assert!(e.contains("68157440") && e.contains("67108864"), "{e}");
    }
}
