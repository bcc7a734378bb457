//! Which node may store or read which cell's kept checkpoints on this
//! holder.
//!
//! Why: under TLS every node certificate opens the node-to-node routes of
//! every other node. Without a further check, any node could store a
//! checkpoint for any cell on a holder (filling its disk, or becoming the
//! newest version) and read any cell's checkpoint back: the memory of a
//! cell it never ran. Only the planner knows which node owns a cell and
//! which node it restores a cell on, so the planner grants each access
//! just before it asks for it (`POST /v1/kept/{id}/grant`): to the owner,
//! to store; to the restoring node, to read one named version.
//!
//! A grant lasts [`LIFETIME`], time enough to *start* the request it was
//! made for; a request that started runs to its end however long its body
//! takes. Grants live in memory: a holder that restarts has none, and the
//! planner's next attempt grants again. Without TLS a caller has no
//! identity to check, and every caller the token admitted is trusted, as
//! on every other route (`docs/trust.md`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::NodeError;
pub(crate) use crate::types::KeptAccess as Access;

/// How long a grant lets its node start a request.
pub(crate) const LIFETIME: Duration = Duration::from_secs(300);
/// Grants held for one cell at once (the planner makes one per keep and
/// per restore attempt; older ones go first).
const PER_CELL: usize = 8;
/// Cells with live grants at once.
const CELLS: usize = 65_536;

#[derive(Debug, Clone)]
struct Grant {
    node: String,
    access: Access,
    /// For a read: the only version it may fetch.
    snapshot: Option<String>,
    until: Instant,
}

/// The grants of one holder.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    by_cell: Mutex<HashMap<String, Vec<Grant>>>,
}

impl Grants {
    /// Let `node` store (or read `snapshot` of) cell `cell`'s kept
    /// checkpoints for the next [`LIFETIME`]. The caller has checked the
    /// cell id, the node name and the snapshot name.
    pub(crate) fn grant(
        &self,
        cell: &str,
        node: &str,
        access: Access,
        snapshot: Option<&str>,
    ) -> Result<(), NodeError> {
        self.grant_at(Instant::now(), cell, node, access, snapshot)
    }

    fn grant_at(
        &self,
        now: Instant,
        cell: &str,
        node: &str,
        access: Access,
        snapshot: Option<&str>,
    ) -> Result<(), NodeError> {
        let mut map = self.by_cell.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(cell) && map.len() >= CELLS {
            map.retain(|_, g| {
                g.retain(|x| x.until > now);
                !g.is_empty()
            });
            if map.len() >= CELLS {
                return Err(NodeError::Conflict(format!(
                    "this holder has live grants for {CELLS} cells; try again when some expire"
                )));
            }
        }
        let g = map.entry(cell.to_string()).or_default();
        g.retain(|x| x.until > now);
        if g.len() >= PER_CELL {
            g.remove(0);
        }
        g.push(Grant {
            node: node.to_string(),
            access,
            snapshot: snapshot.map(str::to_string),
            until: now + LIFETIME,
        });
        Ok(())
    }

    /// May `node` do `access` on cell `cell` (reading `snapshot`, for a
    /// read) now? `node` is `None` without TLS: no identity, no check.
    pub(crate) fn check(
        &self,
        cell: &str,
        node: Option<&str>,
        access: Access,
        snapshot: Option<&str>,
    ) -> Result<(), NodeError> {
        self.check_at(Instant::now(), cell, node, access, snapshot)
    }

    fn check_at(
        &self,
        now: Instant,
        cell: &str,
        node: Option<&str>,
        access: Access,
        snapshot: Option<&str>,
    ) -> Result<(), NodeError> {
        let Some(node) = node else { return Ok(()) };
        let map = self.by_cell.lock().unwrap_or_else(|e| e.into_inner());
        let allowed = map.get(cell).is_some_and(|g| {
            g.iter().any(|x| {
                x.until > now
                    && x.node == node
                    && x.access == access
                    && (x.snapshot.is_none() || x.snapshot.as_deref() == snapshot)
            })
        });
        if allowed {
            return Ok(());
        }
        let what = match (access, snapshot) {
            (Access::Store, _) => "store a kept checkpoint of".to_string(),
            (Access::Read, Some(s)) => format!("read kept checkpoint {s} of"),
            (Access::Read, None) => "read the kept checkpoints of".to_string(),
        };
        Err(NodeError::Forbidden(format!(
            "node `{node}` may not {what} cell {cell} on this holder: the planner has not \
             granted it (it grants the cell's owner to store and the node it restores the \
             cell on to read, each for {} minutes before its request)",
            LIFETIME.as_secs() / 60
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const S2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn only_the_granted_node_stores_and_only_while_the_grant_lasts() {
        let g = Grants::default();
        let t = Instant::now();
        assert!(g.check_at(t, "c", Some("a"), Access::Store, None).is_err());
        g.grant_at(t, "c", "a", Access::Store, None).unwrap();
        g.check_at(t, "c", Some("a"), Access::Store, None).unwrap();
        // Another node, another cell, another access.
        assert!(g.check_at(t, "c", Some("b"), Access::Store, None).is_err());
        assert!(g.check_at(t, "d", Some("a"), Access::Store, None).is_err());
        assert!(g
            .check_at(t, "c", Some("a"), Access::Read, Some(S1))
            .is_err());
        // Until it expires.
        let later = t + LIFETIME + Duration::from_secs(1);
        let e = g.check_at(later, "c", Some("a"), Access::Store, None);
        assert!(matches!(e, Err(NodeError::Forbidden(_))), "{e:?}");
    }

    #[test]
    fn a_read_grant_opens_only_its_version() {
        let g = Grants::default();
        let t = Instant::now();
        g.grant_at(t, "c", "b", Access::Read, Some(S1)).unwrap();
        g.check_at(t, "c", Some("b"), Access::Read, Some(S1))
            .unwrap();
        assert!(g
            .check_at(t, "c", Some("b"), Access::Read, Some(S2))
            .is_err());
        assert!(g.check_at(t, "c", Some("b"), Access::Read, None).is_err());
        assert!(g.check_at(t, "c", Some("b"), Access::Store, None).is_err());
    }

    #[test]
    fn without_an_identity_nothing_is_checked() {
        let g = Grants::default();
        g.check("c", None, Access::Store, None).unwrap();
        g.check("c", None, Access::Read, Some(S1)).unwrap();
    }

    #[test]
    fn grants_are_bounded_per_cell_and_in_all() {
        let g = Grants::default();
        let t = Instant::now();
        for i in 0..PER_CELL + 3 {
            g.grant_at(t, "c", &format!("n{i}"), Access::Store, None)
                .unwrap();
        }
        // The oldest went first.
        assert!(g.check_at(t, "c", Some("n0"), Access::Store, None).is_err());
        let last = format!("n{}", PER_CELL + 2);
        g.check_at(t, "c", Some(&last), Access::Store, None)
            .unwrap();
        assert_eq!(g.by_cell.lock().unwrap()["c"].len(), PER_CELL);

        let g = Grants::default();
        for i in 0..CELLS {
            g.grant_at(t, &format!("c{i}"), "a", Access::Store, None)
                .unwrap();
        }
        let e = g.grant_at(t, "one-more", "a", Access::Store, None);
        assert!(matches!(e, Err(NodeError::Conflict(_))), "{e:?}");
        // Once the others expire, there is room again.
        let later = t + LIFETIME + Duration::from_secs(1);
        g.grant_at(later, "one-more", "a", Access::Store, None)
            .unwrap();
        assert_eq!(g.by_cell.lock().unwrap().len(), 1);
    }
}
