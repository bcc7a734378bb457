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

/// The policy the store names (`None`: none was ever set). An error for a
/// failed read, or for a name this planner does not know (a newer planner
/// may have set it).
async fn read(store: &dyn ClusterStore) -> Result<Option<&'static str>, String> {
    let Some(name) = store.setting(SETTING).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    match policy::by_name(&name) {
        Some(p) => Ok(Some(p.name())),
        None => Err(format!(
            "the store names placement policy {name:?}, which this planner does not know"
        )),
    }
}

/// The policy the store names, or the default when it names none or
/// cannot be read.
pub(crate) async fn stored(store: &dyn ClusterStore) -> &'static str {
    match read(store).await {
        Ok(Some(p)) => p,
        Ok(None) => DEFAULT_PLACEMENT,
        Err(e) => {
            tracing::warn!("{e}; using {DEFAULT_PLACEMENT}");
            DEFAULT_PLACEMENT
        }
    }
}

/// Follow the store's policy until aborted. A failed read keeps the copy.
pub(crate) async fn follow(n: Arc<Inner>) {
    loop {
        tokio::time::sleep(REFRESH).await;
        let p = match read(&*n.store).await {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!("cannot refresh the placement policy: {e}");
                continue;
            }
        };
        let mut cur = n.placement.write().unwrap_or_else(PoisonError::into_inner);
        if *cur != p {
            tracing::info!(placement = p, "placement policy changed by another planner");
            *cur = p;
        }
    }
}
