//! What the source does when post-copy breaks after the destination runs
//! the cell.
//!
//! Why this needs a rule: after `Running` the destination has run guest
//! code, but until `Complete` the source still holds the cell paused, with
//! all of its memory. Resuming it here is right only if the destination's
//! copy can no longer go on; resuming while it goes on would run the cell
//! twice. The destination's copy stops by itself (lost pages) when its
//! stream breaks, or after [`POST_COPY_IDLE`] without a message, unless it
//! already holds every page. So the source resumes when
//!
//! - the destination says its copy failed, or no longer knows the cell (it
//!   restarted), or
//! - the destination cannot be asked, not every data page went out (so its
//!   memory cannot be complete), and the idle limit has passed (so a
//!   destination cut off rather than dead has stopped its copy).
//!
//! Otherwise the cell is the destination's (it runs or ended there), or,
//! when every page went out and the destination cannot be asked, nobody can
//! tell: the source does not resume, and says so. `docs/failure-matrix.md`
//! lists the cases and their tests.

use std::time::Duration;

use super::pages::POST_COPY_IDLE;
use crate::client::{Client, ClientError};
use crate::types::CellState;

/// The source's decision.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Resume the paused cell here; why that is safe.
    Resume(String),
    /// Do not resume; where the cell is, or why nobody can tell.
    Stay(String),
}

/// Decide after post-copy broke. `client` reaches the destination's
/// control API with this node's credentials. `all_sent`: every data page of
/// the cell went into the stream.
pub(crate) async fn after_broken_post_copy(client: &Client, cell: &str, all_sent: bool) -> Verdict {
    let deadline = tokio::time::Instant::now() + POST_COPY_IDLE + Duration::from_secs(5);
    loop {
        let asked = tokio::time::timeout(Duration::from_secs(5), client.cell(cell)).await;
        let past = tokio::time::Instant::now() >= deadline;
        match asked {
            Ok(Ok(info)) => match info.state {
                CellState::Failed { error } => {
                    return Verdict::Resume(format!(
                        "the destination reports that its copy stopped ({error})"
                    ))
                }
                CellState::Running | CellState::Migrating if !past && !all_sent => {}
                CellState::Running | CellState::Migrating => {
                    return Verdict::Stay(if all_sent {
                        "the destination has every page and runs the cell".into()
                    } else {
                        format!(
                            "the destination still reports the cell running {} s after the \
                             stream broke; it is not resumed here",
                            (POST_COPY_IDLE + Duration::from_secs(5)).as_secs()
                        )
                    })
                }
                other => {
                    return Verdict::Stay(format!(
                        "the destination's copy went on and is now {}",
                        state_name(&other)
                    ))
                }
            },
            Ok(Err(ClientError::NotFound(_))) => {
                return Verdict::Resume(
                    "the destination no longer knows the cell (it restarted)".into(),
                )
            }
            // Unreachable, timed out, or an odd answer.
            _ if all_sent => {
                return Verdict::Stay(
                    "every page went out and the destination cannot be asked whether it has \
                     the cell; it is not resumed here, so that it never runs twice: ask the \
                     destination when it is back"
                        .into(),
                )
            }
            _ if past => {
                return Verdict::Resume(format!(
                    "the destination cannot be reached, never received all of the cell's \
                     memory, and has had {} s to notice the broken stream and stop its copy",
                    POST_COPY_IDLE.as_secs()
                ))
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn state_name(s: &CellState) -> String {
    match s {
        CellState::Exited { code } => format!("exited with status {code}"),
        CellState::Killed => "killed".into(),
        CellState::Moved { to } => format!("moved on to {to}"),
        other => format!("{other:?}").to_lowercase(),
    }
}
