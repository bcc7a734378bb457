//! The commit: the final state goes out, and the source learns whether the
//! cell runs on the destination. Ownership passes exactly once.
//!
//! Without a planner, the destination decides: `Running`, or an `Abort`
//! that promises it never starts the cell; after a broken link the
//! destination's resolve endpoint says which.
//!
//! With a planner, the cell's ownership key decides, and the destination
//! may have moved it before it gave up (its planner answer came too late).
//! So every failure after the final state, an `Abort` included, asks the
//! planner for the cell back; if the destination took it and then gave up
//! on it, the source takes it from the destination, which will never start
//! it. Only a cell this node owns again resumes here.

use std::time::Duration;

use roam_wire::{Final, Msg};

use super::error::Cause;
use super::link::{next, unexpected};
use super::modes::Ctx;
use crate::client::Client;
use crate::cluster::planner::{take_back, take_from, Back};
use crate::types::Resolution;

/// How a commit ended.
pub(super) enum Commit {
    /// The cell runs on the destination.
    There,
    /// It does not, and never will for this migration: it resumes here.
    Here(Cause),
    /// It runs on neither: another node owns it now.
    Elsewhere(String),
}

/// Send the final state and settle where the cell runs.
pub(super) async fn commit(ctx: &mut Ctx<'_>, fin: Final, to: &Client, dest: &str) -> Commit {
    ctx.m.phase("committing");
    if let Err(e) = ctx.stream.msg(Msg::Final(Box::new(fin))).await {
        // Not on the wire: the destination cannot start the cell.
        return Commit::Here(Cause::Failed(e));
    }
    let cause = match next(ctx.inbox, "the commit", Duration::from_secs(120)).await {
        Ok(Msg::Running) => return Commit::There,
        Ok(other) => unexpected(&other, "running"),
        Err(c) => c,
    };
    settle(ctx, to, dest, cause).await
}

/// The commit failed with `cause` after the final state went out.
async fn settle(ctx: &mut Ctx<'_>, to: &Client, dest: &str, cause: Cause) -> Commit {
    let (n, cell, migration) = (ctx.n, ctx.m.cell.clone(), ctx.m.id.clone());
    let refused = matches!(cause, Cause::Refused(_));
    if let (Some(_), Some(generation)) = (&n.planner, ctx.spec.generation) {
        tracing::warn!(cell = %cell, error = %cause, "the commit did not complete; asking the planner for the cell back");
        let set = |g: u64| {
            if let Some(c) = n.cells().get_mut(&cell) {
                c.spec.generation = Some(g);
            }
        };
        match take_back(n, &cell, generation).await {
            Back::Won(g) => {
                tracing::info!(cell = %cell, generation = g, "the planner gave the cell back: it resumes here");
                set(g);
                return Commit::Here(cause);
            }
            Back::Lost(why) => {
                // The destination owns it. It runs there unless it gave up
                // on it: an `Abort`, or `aborted` from its resolve endpoint,
                // is its promise never to start it.
                let gave_up =
                    refused || matches!(to.resolve(&migration).await, Ok(Resolution::Aborted));
                if !gave_up {
                    tracing::info!(cell = %cell, %why, "the destination owns the cell: it never resumes here");
                    return Commit::There;
                }
                tracing::warn!(cell = %cell, %why,
                    "the destination took the cell but will not start it; taking it back from there");
                return match take_from(n, &cell, dest, generation + 1).await {
                    Back::Won(g) => {
                        tracing::info!(cell = %cell, generation = g, "the cell came back: it resumes here");
                        set(g);
                        Commit::Here(cause)
                    }
                    Back::Lost(why) | Back::Unknown(why) => Commit::Elsewhere(format!(
                        "the destination took the cell and gave up on it, and it could not be \
                         taken back ({why}): the planner places it from its kept checkpoint"
                    )),
                };
            }
            Back::Unknown(why) => {
                tracing::warn!(cell = %cell, %why, "the planner cannot settle the commit; asking the destination");
            }
        }
    }
    if refused {
        return Commit::Here(cause);
    }
    // The connection broke after the final state went out: only the
    // destination knows whether it started the cell.
    tracing::warn!(cell = %cell, error = %cause, "commit interrupted; asking the destination to resolve");
    match to.resolve(&migration).await {
        Ok(Resolution::Running) => Commit::There,
        Ok(Resolution::Aborted) => Commit::Here(cause),
        // Unreachable: a dead destination runs nothing.
        Err(_) => Commit::Here(cause),
    }
}
