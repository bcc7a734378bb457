//! Group commit for the embedded store. redb runs one write transaction at
//! a time and a durable commit waits for the disk, so one transaction per
//! call would cap the planner at the disk's fsyncs per second. Instead one
//! writer thread takes every write waiting, applies them in order inside
//! one transaction, and commits once: concurrent calls share an fsync.
//!
//! Each call still sees the effects of the calls before it in the batch
//! (a second compare-and-swap from the same revision loses, as it would
//! alone). A call that fails on its own terms (a conflict, a missing
//! record) writes nothing before it fails, so it does not disturb the
//! batch; a failure of the database itself aborts the whole batch and
//! every call in it gets that error.
//!
//! Every batch also writes the clock (`meta/clock_ms`), and the writer
//! writes it every second when idle, so that the next open knows until when
//! this planner kept the nodes' leases.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{Durability, WriteTransaction};

use super::{Inner, OrBackend, DURABLE_EVERY, META, META_CLOCK};
use crate::record::now_ms;
use crate::{StoreError, StoreResult};

/// The most calls one transaction carries.
const MAX_BATCH: usize = 512;

/// How long the writer waits for a call before it writes the clock anyway.
const TICK: Duration = Duration::from_secs(1);

/// What to tell a call once its batch is committed (or not).
type Finish = Box<dyn FnOnce(Result<(), &StoreError>) + Send>;

/// A call: run it in the batch's transaction (`None`: there is none, the
/// batch failed to begin), which says how to finish it and whether the
/// database failed under it.
struct Job {
    run: Run,
    durable: bool,
}

type Run = Box<dyn FnOnce(&Inner, Option<&WriteTransaction>) -> (Finish, bool) + Send>;

/// The writer thread and the way to it; dropping it waits for the thread
/// to finish its batch and let go of the database.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn start(inner: Arc<Inner>) -> StoreResult<Writer> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("roam-redb-writer".into())
            .spawn(move || {
                loop {
                    let mut batch = match rx.recv_timeout(TICK) {
                        Ok(first) => vec![first],
                        // Nothing to write: still record that the store
                        // is in use now (see the clock in the module docs).
                        Err(mpsc::RecvTimeoutError::Timeout) => Vec::new(),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    };
                    while batch.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(job) => batch.push(job),
                            Err(_) => break,
                        }
                    }
                    commit(&inner, batch);
                }
            })
            .map_err(|e| StoreError::Backend {
                backend: "redb",
                message: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Run `f` in a write transaction shared with other calls; durable
    /// when it returns if `durable` (otherwise within [`DURABLE_EVERY`]).
    pub(super) async fn write<T: Send + 'static>(
        &self,
        durable: bool,
        f: impl FnOnce(&Inner, &WriteTransaction) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let run = Box::new(move |inner: &Inner, txn: Option<&WriteTransaction>| {
            let result = txn.map(|txn| f(inner, txn));
            let failed_backend = matches!(result, Some(Err(StoreError::Backend { .. })));
            let finish: Finish = Box::new(move |commit: Result<(), &StoreError>| {
                let _ = tx.send(match (commit, result) {
                    (Ok(()), Some(result)) => result,
                    // The call's own failure says more than the batch's.
                    (Err(_), Some(Err(own @ StoreError::Backend { .. }))) => Err(own),
                    (Err(e), _) => Err(copy(e)),
                    (Ok(()), None) => Err(StoreError::Backend {
                        backend: "redb",
                        message: "the write did not run".into(),
                    }),
                });
            });
            (finish, failed_backend)
        });
        let stopped = || StoreError::Backend {
            backend: "redb",
            message: "the writer thread stopped (the store is closing)".into(),
        };
        self.jobs
            .as_ref()
            .ok_or_else(stopped)?
            .send(Job { run, durable })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A copy of a batch-wide error for each call of the batch.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Backend { backend, message } => StoreError::Backend {
            backend,
            message: message.clone(),
        },
        other => StoreError::Backend {
            backend: "redb",
            message: other.to_string(),
        },
    }
}

fn commit(inner: &Inner, batch: Vec<Job>) {
    let mut txn = match inner.db.begin_write().or_backend(inner) {
        Ok(txn) => txn,
        Err(e) => {
            for job in batch {
                let (finish, _) = (job.run)(inner, None);
                finish(Err(&e));
            }
            return;
        }
    };
    let durable = batch.iter().any(|j| j.durable) || {
        let mut last = inner.last_durable.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= DURABLE_EVERY {
            *last = Instant::now();
            true
        } else {
            false
        }
    };
    let mut finishes = Vec::with_capacity(batch.len());
    let clock = txn.open_table(META).or_backend(inner).and_then(|mut meta| {
        meta.insert(META_CLOCK, now_ms())
            .map(|_| ())
            .or_backend(inner)
    });
    let mut broken = clock.err();
    for job in batch {
        let (finish, failed_backend) = (job.run)(inner, Some(&txn));
        if failed_backend && broken.is_none() {
            broken = Some(inner.backend("a write failed; the batch it was in is rolled back"));
        }
        finishes.push(finish);
    }
    let outcome = match broken {
        Some(e) => {
            drop(txn);
            Err(e)
        }
        None => {
            let set = if durable {
                Ok(())
            } else {
                txn.set_durability(Durability::None).or_backend(inner)
            };
            set.and_then(|()| txn.commit().or_backend(inner))
        }
    };
    if durable && outcome.is_ok() {
        *inner.last_durable.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
    for finish in finishes {
        finish(outcome.as_ref().map(|_| ()));
    }
}
