//! The checkpoint request flag shared between the guest thread and others.
//!
//! Exists because a checkpoint can be requested (by a signal handler thread or
//! the runtime) while the guest sits in a blocking WASI call. Blocking calls
//! wait in short slices on this object, so a request wakes them promptly and
//! they can hand control to the runtime to unwind the guest stack.
//!
//! The same object carries *kicks*: a network backend delivering bytes to a
//! cell kicks its interrupt so a guest waiting in accept, recv or poll looks
//! again at once instead of at the end of its slice. A kick never asks for
//! a checkpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Wakes blocking calls when a checkpoint is requested.
#[derive(Debug, Default)]
pub struct Interrupt {
    requested: Mutex<Flags>,
    cond: Condvar,
    on_block: AtomicBool,
}

#[derive(Debug, Default)]
struct Flags {
    requested: bool,
    kicks: u64,
}

impl Interrupt {
    /// A fresh, un-requested interrupt, ready to share between threads.
    pub fn new() -> Arc<Interrupt> {
        Arc::new(Interrupt::default())
    }

    /// Request a checkpoint: sets the flag and wakes every waiter.
    pub fn request(&self) {
        let mut g = self
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        g.requested = true;
        self.cond.notify_all();
    }

    /// Wake every waiter without requesting a checkpoint (new input for
    /// the guest). Waiters started with [`Interrupt::kicks`] see the change.
    pub fn kick(&self) {
        let mut g = self
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        g.kicks = g.kicks.wrapping_add(1);
        self.cond.notify_all();
    }

    /// How many kicks so far; read it *before* checking for input, then
    /// pass it to [`Interrupt::wait_kick`] so no kick is lost in between.
    pub fn kicks(&self) -> u64 {
        self.requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .kicks
    }

    /// Wait up to `dur`, until requested, or until a kick after `seen`;
    /// true if a checkpoint was requested.
    pub fn wait_kick(&self, seen: u64, dur: Duration) -> bool {
        self.wait_until(dur, |g| g.kicks != seen)
    }

    /// Withdraw a request (the runtime does this once it has acted on it).
    pub fn clear(&self) {
        self.requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .requested = false;
    }

    /// Whether a checkpoint has been requested and not yet cleared.
    pub fn is_requested(&self) -> bool {
        self.requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .requested
    }

    /// Ask for a checkpoint the next time the program would block.
    pub fn set_on_block(&self, on: bool) {
        self.on_block.store(on, Ordering::SeqCst);
    }

    /// Whether "checkpoint when the program next blocks" is armed.
    pub fn on_block(&self) -> bool {
        self.on_block.load(Ordering::SeqCst)
    }

    /// Wait up to `dur` or until requested; true if interrupted.
    pub fn wait(&self, dur: Duration) -> bool {
        self.wait_until(dur, |_| false)
    }

    /// The one wait loop: returns true when a checkpoint is requested,
    /// false at the deadline or as soon as `woken` holds.
    fn wait_until(&self, dur: Duration, woken: impl Fn(&Flags) -> bool) -> bool {
        let deadline = Instant::now() + dur;
        let mut g = self
            .requested
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if g.requested {
                return true;
            }
            let now = Instant::now();
            if woken(&g) || now >= deadline {
                return false;
            }
            g = self
                .cond
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn wait_times_out_without_request() {
        let i = Interrupt::new();
        let t = Instant::now();
        assert!(!i.wait(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn request_from_other_thread_wakes_waiter() {
        let i = Interrupt::new();
        let j = i.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            j.request();
        });
        let t = Instant::now();
        assert!(i.wait(Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5));
        h.join().unwrap();
        assert!(i.is_requested());
        i.clear();
        assert!(!i.is_requested());
        assert!(!i.wait(Duration::ZERO));
    }

    #[test]
    fn kick_wakes_without_requesting() {
        let i = Interrupt::new();
        let seen = i.kicks();
        let j = i.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            j.kick();
        });
        assert!(!i.wait_kick(seen, Duration::from_secs(30)));
        assert_ne!(i.kicks(), seen);
        assert!(!i.is_requested());
        h.join().unwrap();
        // A kick that happened before the wait is not lost.
        let seen = i.kicks();
        i.kick();
        assert!(!i.wait_kick(seen, Duration::from_secs(30)));
    }

    #[test]
    fn on_block_flag_round_trips() {
        let i = Interrupt::new();
        assert!(!i.on_block());
        i.set_on_block(true);
        assert!(i.on_block());
    }
}
