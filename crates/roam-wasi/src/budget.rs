//! Host file descriptors held for guests, counted over every cell of the
//! process.
//!
//! Why: a guest may hold up to [`MAX_FDS`](crate::ops) fds, and a node runs
//! many guests in one process. Without a shared count, a few guests that
//! open files in a loop take the whole of the process's `RLIMIT_NOFILE`,
//! and then the node itself cannot accept a connection, write a snapshot
//! or open a log: one cell takes down every other. So each host fd a guest
//! holds (a file or directory it opened or had restored, a preopen) takes a
//! ticket from one budget: the process's open-file limit, raised to its
//! hard limit at first use, less a reserve for the host's own files and
//! sockets. A guest past the budget gets `ENFILE` (the system-wide limit
//! in POSIX terms), and the host keeps working. Sockets are not counted
//! here: a cell's connections are bounded by its listeners' own limits.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// Fds the host keeps for itself: at least this many, or a quarter of the
/// limit when that is more.
const HOST_RESERVE: usize = 256;

/// A count of host fds held by guests, with a limit.
#[derive(Debug)]
pub struct FdBudget {
    limit: usize,
    held: AtomicUsize,
}

impl FdBudget {
    /// A budget of its own (tests, or a host that splits its limit).
    pub fn new(limit: usize) -> Arc<FdBudget> {
        Arc::new(FdBudget {
            limit,
            held: AtomicUsize::new(0),
        })
    }

    /// The process's budget. The first call raises the soft
    /// `RLIMIT_NOFILE` to the hard one and keeps a reserve for the host.
    pub fn process() -> Arc<FdBudget> {
        static PROCESS: OnceLock<Arc<FdBudget>> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let limit = raise_nofile();
                let reserve = HOST_RESERVE.max(limit / 4);
                let budget = limit.saturating_sub(reserve).max(16);
                tracing::info!(
                    open_files = limit,
                    guest_budget = budget,
                    "guests of this process may hold {budget} host files of its limit of {limit}"
                );
                FdBudget::new(budget)
            })
            .clone()
    }

    /// Most host fds guests may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Host fds guests hold now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// One more host fd for a guest, or `None` when the budget is spent.
    pub(crate) fn take(self: &Arc<Self>) -> Option<HostFd> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| HostFd(self.clone()))
    }
}

/// A host fd counted against a budget, returned when dropped (with the fd
/// entry that holds it).
#[derive(Debug)]
pub(crate) struct HostFd(Arc<FdBudget>);

impl Drop for HostFd {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Raise the soft open-file limit to the hard one; the limit then in force.
fn raise_nofile() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut r = getrlimit(Resource::Nofile);
    if let (Some(cur), max) = (r.current, r.maximum) {
        let want = max.unwrap_or(cur).min(1 << 20);
        if want > cur {
            let raised = rustix::process::Rlimit {
                current: Some(want),
                maximum: r.maximum,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => r.current = Some(want),
                Err(e) => {
                    tracing::warn!("cannot raise the open-file limit from {cur} to {want}: {e}")
                }
            }
        }
    }
    r.current
        .map_or(1 << 20, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_come_back_when_dropped() {
        let b = FdBudget::new(2);
        let one = b.take().unwrap();
        let two = b.take().unwrap();
        assert!(b.take().is_none());
        assert_eq!(b.held(), 2);
        drop(one);
        let three = b.take().unwrap();
        drop((two, three));
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn the_process_budget_leaves_the_host_a_reserve() {
        let b = FdBudget::process();
        let limit = usize::try_from(
            rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(1 << 20),
        )
        .unwrap();
        assert!(b.limit() < limit, "{} of {limit}", b.limit());
    }
}
