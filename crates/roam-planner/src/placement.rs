//! The placement policy in force, kept in the cluster store.
//!
//! Why in the store: with several planners, a policy set through one of
//! them must hold on all of them, and on a planner started later. Each
//! planner keeps a copy for its placements (a launch must not wait for a
//! store read) and refreshes it every [`REFRESH`]; setting a policy writes
//! the store first, then the local copy.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use roam_cluster::ClusterStore;

use crate::policy::{self, DEFAULT_PLACEMENT};
use crate::Inner;

/// The store setting that names the placement policy.
pub(crate) const SETTING: &str = "placement";

/// How often a planner re-reads the policy.
const REFRESH: Duration = Duration::from_secs(2);

/// The policy the store names, or the default when it names none (or one
/// this planner does not know: a newer planner may have set it).
pub(crate) async fn stored(store: &dyn ClusterStore) -> &'static str {
    match store.setting(SETTING).await {
        Ok(Some(name)) => match policy::by_name(&name) {
            Some(p) => p.name(),
            None => {
                tracing::warn!(
                    stored = %name,
                    "the store names a placement policy this planner does not know; using {DEFAULT_PLACEMENT}"
                );
                DEFAULT_PLACEMENT
            }
        },
        Ok(None) => DEFAULT_PLACEMENT,
        Err(e) => {
            tracing::warn!("cannot read the placement policy: {e}; using {DEFAULT_PLACEMENT}");
            DEFAULT_PLACEMENT
        }
    }
}

/// Follow the store's policy until aborted. A failed read keeps the copy.
pub(crate) async fn follow(n: Arc<Inner>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let name = match n.store.setting(SETTING).await {
            Ok(Some(name)) => name,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!("cannot refresh the placement policy: {e}");
                continue;
            }
        };
        let Some(p) = policy::by_name(&name) else {
            continue;
        };
        let mut cur = n.placement.write().unwrap_or_else(PoisonError::into_inner);
        if *cur != p.name() {
            tracing::info!(
                placement = p.name(),
                "placement policy changed by another planner"
            );
            *cur = p.name();
        }
    }
}
