//! Who may serve a service: the check of every `Serve` against the
//! planner's cell records (`roam gateway --planner`).
//!
//! Why: the control port admits any node of the cluster (under TLS, any
//! node certificate). Without this check a node that does not run the
//! service's cell (a rogue or compromised node) could send `Serve` at a
//! generation above the real one and receive every client's bytes. The
//! planner knows which node owns the cell that serves a service, at which
//! generation, so the gateway routes a service only to the node the planner
//! names, for that cell, at that generation.
//!
//! The gateway crate knows nothing of HTTP or of the planner's API: it
//! asks a [`ServeAuthority`], which `roam gateway` implements with the
//! planner's client. The rules:
//!
//! - A `Serve` that names the route the service already has (same node,
//!   cell and generation, as after a link that dropped and came back) was
//!   checked when it was first accepted, and is not asked again.
//! - A stale `Serve` (below the route's generation) is answered `Stale`
//!   without asking: it changes nothing anyway.
//! - Any other `Serve` would change the route. It is accepted only when the
//!   authority answers with exactly its node, cell and generation. An
//!   answer is cached for [`CACHE_FOR`] and reused for a `Serve` that
//!   matches it exactly, or that names a cell it lists at no newer a
//!   generation (refused: an owner change always raises the generation).
//!   A newer generation, or another cell, is always asked again.
//! - A mismatch is refused like a stale `Serve` (logged with the reason,
//!   answered `Stale`); the link stays.
//! - When the authority cannot answer (the planner is down), the gateway
//!   fails closed: the route does not change, and the node's link is closed
//!   with `Refused` and the reason. The node reconnects with backoff and
//!   serves again, so the check is retried until the planner answers; a
//!   restarted gateway, which has no route at all, admits no service until
//!   then.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an answer of the authority is reused for a `Serve` that
/// matches it exactly.
pub const CACHE_FOR: Duration = Duration::from_secs(2);

/// How long the gateway waits for the authority before it treats it as
/// unreachable.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Most cells one answer may list; more is refused as malformed.
pub const MAX_CELLS: usize = 1024;

/// One cell that may serve a service: the node that owns it, and at which
/// generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The cell's id.
    pub cell: String,
    /// The node that owns it (the name its node certificate carries).
    pub node: String,
    /// Its ownership generation.
    pub generation: u64,
}

/// Why the authority could not answer. Every case fails closed.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// No answer: not reachable, or timed out.
    #[error("the planner cannot be reached: {0}")]
    Unreachable(String),
    /// An answer that is an error (refused, not found, a bug).
    #[error("the planner refused the question: {0}")]
    Refused(String),
    /// An answer that does not say what it must.
    #[error("the planner's answer is malformed: {0}")]
    Malformed(String),
}

/// The future an authority returns.
pub type AuthorityFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Assignment>, AuthorityError>> + Send + 'a>>;

/// Who may serve a service: every cell that serves it now, with its owner
/// and generation (an empty list: no cell may).
pub trait ServeAuthority: std::fmt::Debug + Send + Sync + 'static {
    /// The cells that may serve `service` now.
    fn assignments<'a>(&'a self, service: &'a str) -> AuthorityFuture<'a>;
}

/// What the check decided about one `Serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Apply it (the state's own generation rule still applies).
    Accept,
    /// The authority names someone else: answer it as stale; the link
    /// stays. `current` is the generation the authority names for the
    /// service, if any.
    Mismatch { reason: String, current: u64 },
    /// The authority could not answer: keep the route, close the link.
    Unavailable(String),
}

/// The authority and its recent answers.
pub(crate) struct Checker {
    authority: Arc<dyn ServeAuthority>,
    cache: std::sync::Mutex<HashMap<String, (Instant, Vec<Assignment>)>>,
}

impl Checker {
    pub(crate) fn new(authority: Arc<dyn ServeAuthority>) -> Checker {
        Checker {
            authority,
            cache: std::sync::Mutex::default(),
        }
    }

    /// The verdict a fresh answer gives without asking: an exact match,
    /// or a `Serve` of a cell the answer lists at the same or a later
    /// generation that does not match it (every change of a cell's owner
    /// raises its generation, so that `Serve` can never become right; a
    /// node that sends many only costs the planner one question per
    /// [`CACHE_FOR`]). Anything else (a newer generation, another cell)
    /// is asked.
    fn cached(&self, service: &str, want: &Assignment) -> Option<Verdict> {
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (at, list) = cache.get(service)?;
        if at.elapsed() >= CACHE_FOR {
            return None;
        }
        let known = list
            .iter()
            .any(|a| a.cell == want.cell && a.generation >= want.generation);
        (list.contains(want) || known).then(|| verdict(service, want, list))
    }

    /// May `want.node` serve `service` with `want.cell` at
    /// `want.generation`?
    pub(crate) async fn check(&self, service: &str, want: &Assignment) -> Verdict {
        if let Some(v) = self.cached(service, want) {
            return v;
        }
        let asked = tokio::time::timeout(ASK_TIMEOUT, self.authority.assignments(service)).await;
        let list = match asked {
            Err(_) => {
                return Verdict::Unavailable(format!(
                    "the planner did not answer within {ASK_TIMEOUT:?}"
                ))
            }
            Ok(Err(e)) => return Verdict::Unavailable(e.to_string()),
            Ok(Ok(list)) if list.len() > MAX_CELLS => {
                return Verdict::Unavailable(
                    AuthorityError::Malformed(format!(
                        "{} cells for one service, more than {MAX_CELLS}",
                        list.len()
                    ))
                    .to_string(),
                )
            }
            Ok(Ok(list)) => list,
        };
        let verdict = verdict(service, want, &list);
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(service.to_string(), (Instant::now(), list));
        verdict
    }
}

/// Compare a `Serve` with the authority's answer.
fn verdict(service: &str, want: &Assignment, list: &[Assignment]) -> Verdict {
    if list.contains(want) {
        return Verdict::Accept;
    }
    let current = list.iter().map(|a| a.generation).max().unwrap_or(0);
    let reason = match list.iter().find(|a| a.cell == want.cell) {
        None if list.is_empty() => format!("the planner has no live cell for service {service}"),
        None => format!(
            "the planner says service {service} is served by {}, not cell {}",
            describe(list),
            want.cell
        ),
        Some(a) if a.node != want.node => format!(
            "the planner says cell {} is owned by node `{}` (generation {}), not `{}`",
            a.cell, a.node, a.generation, want.node
        ),
        Some(a) => format!(
            "the planner says cell {} is at generation {}, not {}",
            a.cell, a.generation, want.generation
        ),
    };
    Verdict::Mismatch { reason, current }
}

fn describe(list: &[Assignment]) -> String {
    list.iter()
        .take(4)
        .map(|a| {
            format!(
                "cell {} on `{}` at generation {}",
                a.cell, a.node, a.generation
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(cell: &str, node: &str, generation: u64) -> Assignment {
        Assignment {
            cell: cell.into(),
            node: node.into(),
            generation,
        }
    }

    #[derive(Debug, Default)]
    struct Counting {
        asked: std::sync::atomic::AtomicUsize,
    }

    impl ServeAuthority for Counting {
        fn assignments<'a>(&'a self, _: &'a str) -> AuthorityFuture<'a> {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(vec![a("c-1", "edge-a", 3)]) })
        }
    }

    #[tokio::test]
    async fn a_fresh_answer_is_reused_but_a_newer_generation_or_cell_is_asked() {
        let auth = Arc::new(Counting::default());
        let c = Checker::new(auth.clone());
        let asked = || auth.asked.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(c.check("kv", &a("c-1", "edge-a", 3)).await, Verdict::Accept);
        assert_eq!(asked(), 1);
        // The same answer again, and refusals that it settles.
        assert_eq!(c.check("kv", &a("c-1", "edge-a", 3)).await, Verdict::Accept);
        for want in [a("c-1", "rogue", 3), a("c-1", "rogue", 1)] {
            let v = c.check("kv", &want).await;
            assert!(matches!(v, Verdict::Mismatch { .. }), "{want:?}: {v:?}");
        }
        assert_eq!(asked(), 1);
        // A newer generation, or a cell the answer does not list, is asked.
        let v = c.check("kv", &a("c-1", "rogue", 4)).await;
        assert!(matches!(v, Verdict::Mismatch { .. }), "{v:?}");
        assert_eq!(asked(), 2);
        let v = c.check("kv", &a("c-2", "edge-b", 1)).await;
        assert!(matches!(v, Verdict::Mismatch { .. }), "{v:?}");
        assert_eq!(asked(), 3);
    }

    #[test]
    fn only_the_exact_owner_cell_and_generation_pass() {
        let list = [a("c-1", "edge-a", 3)];
        assert_eq!(
            verdict("kv", &a("c-1", "edge-a", 3), &list),
            Verdict::Accept
        );
        for (want, says) in [
            (a("c-1", "rogue", 3), "owned by node `edge-a`"),
            (a("c-1", "edge-a", 4), "at generation 3, not 4"),
            (a("c-1", "edge-a", 2), "at generation 3, not 2"),
            (a("c-9", "edge-a", 3), "not cell c-9"),
        ] {
            match verdict("kv", &want, &list) {
                Verdict::Mismatch { reason, current } => {
                    assert!(reason.contains(says), "{want:?}: {reason}");
                    assert_eq!(current, 3);
                }
                v => panic!("{want:?}: {v:?}"),
            }
        }
        match verdict("kv", &a("c-1", "edge-a", 0), &[]) {
            Verdict::Mismatch { reason, current } => {
                assert!(reason.contains("no live cell"), "{reason}");
                assert_eq!(current, 0);
            }
            v => panic!("{v:?}"),
        }
    }
}
