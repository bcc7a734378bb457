//! What happens in the cluster, as a stream: placements, migrations, kept
//! checkpoints, node deaths, restorations. `GET /v1/events` serves it as
//! server-sent events, one event name per kind and the event as JSON data,
//! for `roam` commands that wait on the cluster and a later dashboard.
//!
//! Why a broadcast channel: a slow reader must not hold the planner up; it
//! loses the oldest events instead and is told how many.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tokio::sync::broadcast;

/// Events kept for a slow reader before it loses the oldest.
pub const EVENT_BUFFER: usize = 1024;

/// One thing that happened.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Event {
    /// A node registered (again).
    NodeRegistered {
        /// Its name.
        node: String,
        /// Its ISA.
        isa: String,
    },
    /// A node's lease expired.
    NodeDeath {
        /// Its name.
        node: String,
        /// The cells it owned.
        cells: Vec<String>,
    },
    /// A node is being drained.
    Drain {
        /// Its name.
        node: String,
    },
    /// A drained node takes cells again.
    Undrain {
        /// Its name.
        node: String,
    },
    /// A cell was placed and started.
    Placement {
        /// The cell.
        cell: String,
        /// Where.
        node: String,
        /// The policy that chose it.
        policy: String,
    },
    /// A migration started, finished or failed.
    Migration {
        /// The cell.
        cell: String,
        /// From.
        from: String,
        /// To.
        to: String,
        /// The migration's id on the source.
        migration: String,
        /// `started`, `done` or `failed`.
        phase: String,
        /// Why it failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A checkpoint was kept.
    Checkpoint {
        /// The cell.
        cell: String,
        /// Its owner.
        owner: String,
        /// The node that keeps it.
        holder: String,
        /// The snapshot's hash.
        snapshot: String,
        /// Its size, bytes.
        bytes: u64,
        /// Bytes sent to the holder.
        sent_bytes: u64,
    },
    /// A cell was restored from its kept checkpoint on another node.
    Restore {
        /// The cell.
        cell: String,
        /// Its dead owner.
        from: String,
        /// Its new owner.
        to: String,
        /// The new generation.
        generation: u64,
        /// The snapshot it resumed from.
        snapshot: String,
    },
    /// A cell could not be restored.
    Lost {
        /// The cell.
        cell: String,
        /// Why.
        error: String,
    },
    /// A cell ended (killed through the planner).
    Killed {
        /// The cell.
        cell: String,
    },
    /// A cell's program ended on its owner: it exited or failed.
    Ended {
        /// The cell.
        cell: String,
        /// Where it ran.
        node: String,
        /// Its state now (`exited`, `failed` or `killed`), as in its record.
        state: roam_cluster::CellState,
    },
}

impl Event {
    /// The SSE event name: the kind.
    pub fn name(&self) -> &'static str {
        match self {
            Event::NodeRegistered { .. } => "node-registered",
            Event::NodeDeath { .. } => "node-death",
            Event::Drain { .. } => "drain",
            Event::Undrain { .. } => "undrain",
            Event::Placement { .. } => "placement",
            Event::Migration { .. } => "migration",
            Event::Checkpoint { .. } => "checkpoint",
            Event::Restore { .. } => "restore",
            Event::Lost { .. } => "lost",
            Event::Killed { .. } => "killed",
            Event::Ended { .. } => "ended",
        }
    }
}

/// The planner's event channel.
#[derive(Debug, Clone)]
pub struct Events {
    tx: broadcast::Sender<Event>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(EVENT_BUFFER).0,
        }
    }
}

impl Events {
    /// Publish `e` (to no one, if nobody listens).
    pub fn send(&self, e: Event) {
        tracing::info!(
            event = e.name(),
            "{}",
            serde_json::to_string(&e).unwrap_or_default()
        );
        let _ = self.tx.send(e);
    }

    /// A new reader, from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// The server-sent-event stream of a new reader.
    pub fn sse(&self) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
        let rx = self.subscribe();
        let s = stream::unfold(rx, |mut rx| async move {
            let ev = match rx.recv().await {
                Ok(e) => {
                    let data = serde_json::to_string(&e).unwrap_or_default();
                    SseEvent::default().event(e.name()).data(data)
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let data = format!("{{\"kind\":\"lagged\",\"missed\":{n}}}");
                    SseEvent::default().event("lagged").data(data)
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((Ok(ev), rx))
        });
        Sse::new(s).keep_alive(KeepAlive::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_their_kind_as_name_and_in_the_json() {
        let e = Event::Placement {
            cell: "c-1".into(),
            node: "a".into(),
            policy: "least-loaded".into(),
        };
        assert_eq!(e.name(), "placement");
        let v: serde_json::Value = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kind"], "placement");
        assert_eq!(v["node"], "a");
        let d = Event::NodeDeath {
            node: "a".into(),
            cells: vec![],
        };
        assert_eq!(serde_json::to_value(&d).unwrap()["kind"], d.name());
    }

    #[tokio::test]
    async fn a_reader_gets_what_is_sent_after_it_subscribed() {
        let ev = Events::default();
        ev.send(Event::Drain { node: "x".into() });
        let mut rx = ev.subscribe();
        ev.send(Event::Drain { node: "y".into() });
        match rx.recv().await.unwrap() {
            Event::Drain { node } => assert_eq!(node, "y"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
