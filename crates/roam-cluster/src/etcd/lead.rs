//! Leader election among planners, with etcd's election API: each planner
//! campaigns with its own lease under `<prefix>leader`; etcd makes the
//! oldest candidate the leader. A task keeps the lease alive; when a
//! keep-alive fails or etcd says the lease is gone (revoked, or it ran out
//! while this planner was cut off), the [`Leadership`] reports the loss.
//! Dropping the `Leadership` revokes the lease, so the next candidate leads
//! at once instead of after the TTL.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tokio::sync::watch;

use super::{backend, bounded, EtcdStore, CALL_TIMEOUT};
use crate::{Leadership, StoreResult};

/// The leader's lease: a leader cut off from etcd loses the lead within
/// this long, and a dead leader is replaced within it.
pub const LEADER_TTL: Duration = Duration::from_secs(6);

/// What keeps a lead: dropped with the [`Leadership`].
struct Hold {
    keeper: tokio::task::JoinHandle<()>,
    client: Client,
    lease: i64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.keeper.abort();
        // Give the lead up now rather than when the lease runs out.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let mut leases = self.client.lease_client();
            let lease = self.lease;
            rt.spawn(async move {
                let _ = tokio::time::timeout(CALL_TIMEOUT, leases.revoke(lease)).await;
            });
        }
    }
}

pub(super) async fn lead(store: &EtcdStore, id: &str) -> StoreResult<Leadership> {
    // Campaigning waits for as long as another planner leads, so it runs
    // on its own connection without the per-call timeout; HTTP/2 pings
    // still notice a dead etcd.
    let options = store.access.apply(
        ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true),
    );
    let client = bounded(
        &store.endpoints,
        "connect for the election",
        Client::connect(&store.endpoints, Some(options)),
    )
    .await?;
    let ttl = LEADER_TTL.as_secs() as i64;
    let lease = bounded(
        &store.endpoints,
        "grant the leader lease",
        client.lease_client().grant(ttl, None),
    )
    .await?
    .id();
    let (lost_tx, mut lost_rx) = watch::channel(false);
    let keeper = tokio::spawn(keep_alive(client.clone(), lease, lost_tx));
    let hold = Hold {
        keeper,
        client: client.clone(),
        lease,
    };
    let name = format!("{}leader", store.prefix);
    let mut election = client.election_client();
    let campaign = election.campaign(name, id.as_bytes().to_vec(), lease);
    tokio::select! {
        won = campaign => {
            won.map_err(|e| backend(&store.endpoints, "campaign", e))?;
        }
        _ = lost_rx.wait_for(|l| *l) => {
            return Err(backend(
                &store.endpoints,
                "campaign",
                "the candidate's lease was lost while waiting to lead",
            ));
        }
    }
    tracing::info!(planner = id, lease, "leading (etcd election)");
    Ok(Leadership::new(lost_rx, Box::new(hold)))
}

/// Renew `lease` every third of its TTL until a renewal fails or goes
/// unanswered for a third of the TTL, then say the lead is lost.
async fn keep_alive(client: Client, lease: i64, lost: watch::Sender<bool>) {
    let every = LEADER_TTL / 3;
    let why = match tokio::time::timeout(every, client.lease_client().keep_alive(lease)).await {
        Err(_) => "etcd did not answer the first keep-alive".to_string(),
        Ok(Err(e)) => e.to_string(),
        Ok(Ok((mut keeper, mut stream))) => loop {
            tokio::time::sleep(every).await;
            let renewal = tokio::time::timeout(every, async {
                keeper.keep_alive().await?;
                stream.message().await
            })
            .await;
            match renewal {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                Ok(Ok(_)) => break "etcd says the lease is gone".to_string(),
                Ok(Err(e)) => break e.to_string(),
                Err(_) => break "etcd did not answer a keep-alive".to_string(),
            }
        },
    };
    tracing::warn!(lease, "leadership lost: {why}");
    let _ = lost.send(true);
}
