//! Live migration between nodes.
//!
//! The source drives ([`source`]); the destination follows ([`dest`]). The
//! message order per mode is in `docs/migration.md`. The rule that matters
//! most: *ownership passes exactly once*. The source keeps the paused cell
//! until the destination says `Running`; every failure before that resumes
//! the cell on the source. When the connection breaks after the source sent
//! the final state, the source asks the destination's control API to
//! resolve the migration: the destination answers `running` if it started
//! the cell, or promises never to start it and answers `aborted`.

use std::sync::PoisonError;

use crate::error::NodeError;
use crate::state::NodeInner;
use crate::types::MigrationStatus;

mod assemble;
pub(crate) mod dest;
pub(crate) mod far;
mod files;
mod pages;
mod postfail;
pub(crate) mod source;
mod stream;
pub(crate) mod transport;

/// The reading half of a migration connection (plain TCP or TLS).
pub(crate) type ReadHalf = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
/// The writing half of a migration connection (plain TCP or TLS).
pub(crate) type WriteHalf = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// The status of migration `id`, driven by this node.
pub(crate) fn status(n: &NodeInner, id: &str) -> Result<MigrationStatus, NodeError> {
    let m = n
        .migrations
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(id)
        .cloned();
    m.map(|m| m.status())
        .ok_or_else(|| NodeError::NotFound(format!("no migration {id} driven by this node")))
}

/// Put the non-zero pages of `mem` into the node's chunk store, so that a
/// later migration to this node (the same cell coming back, or another cell
/// of the same module arriving) can refer to them instead of sending them.
/// Runs off the migration's critical path. Returns chunks that were new.
pub(crate) fn remember(store: &roam_transfer::ChunkStore, mem: &roam_runtime::LiveMemory) -> usize {
    const AT_ONCE: usize = 256;
    let page = roam_snapshot::PAGE_SIZE;
    let mut buf = vec![0u8; AT_ONCE * page];
    let mut one = Box::new([0u8; roam_snapshot::PAGE_SIZE]);
    let mut new = 0;
    let mut i = 0;
    while i < mem.page_count() {
        let mut n = 0;
        while n < AT_ONCE && i < mem.page_count() {
            if mem.read_page(i, &mut one) && one.iter().any(|&b| b != 0) {
                buf[n * page..(n + 1) * page].copy_from_slice(&one[..]);
                n += 1;
            }
            i += 1;
        }
        new += store.insert_many(buf[..n * page].chunks(page));
    }
    new
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn unix_ms(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
