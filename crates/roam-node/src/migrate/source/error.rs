//! How a migration this node drives fails: in which phase, why, and what
//! became of the cell.
//!
//! Why typed: what the source does after a failure depends on these three
//! facts, not on the wording of a message. A refusal by the destination
//! after the final state went out is not a broken link, and a cell that
//! ended while it was moving must not be reported as still running.

use std::fmt;

/// Where a migration was when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Reaching the destination, the handshake, the offer.
    Connect,
    /// Sending the module, the destination's preparation.
    Prepare,
    /// Memory rounds while the cell runs.
    Rounds,
    /// Waiting for the cell to reach a migration point.
    Pause,
    /// The last pages, the files and the log, while paused.
    Final,
    /// The final state and the destination's answer.
    Commit,
    /// Serving pages after the cell started on the destination.
    PostCopy,
}

impl Phase {
    fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::Prepare => "prepare",
            Phase::Rounds => "rounds",
            Phase::Pause => "pause",
            Phase::Final => "final",
            Phase::Commit => "commit",
            Phase::PostCopy => "post-copy",
        }
    }
}

/// Why it failed.
#[derive(Debug, Clone)]
pub(crate) enum Cause {
    /// The destination said no (its `Abort`), with its reason: it will
    /// never start the cell for this migration.
    Refused(String),
    /// Anything else: a link that closed or went silent, a protocol error,
    /// a failure on this node.
    Failed(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused(why) => write!(f, "the destination refused: {why}"),
            Cause::Failed(why) => f.write_str(why),
        }
    }
}

impl From<String> for Cause {
    fn from(s: String) -> Cause {
        Cause::Failed(s)
    }
}

/// What became of the cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum After {
    /// It runs on here (it was never paused, or it resumed).
    Here,
    /// Its program ended on this node while it was being moved.
    Ended,
    /// It runs on the destination, although the migration did not finish
    /// cleanly (post-copy broke after the start).
    There,
}

/// A failed migration.
#[derive(Debug, Clone)]
pub(crate) struct MigrateError {
    pub phase: Phase,
    pub cause: Cause,
    pub after: After,
}

impl MigrateError {
    /// A failure after which the cell runs on here.
    pub(crate) fn here(phase: Phase, cause: impl Into<Cause>) -> MigrateError {
        MigrateError {
            phase,
            cause: cause.into(),
            after: After::Here,
        }
    }
}

impl fmt::Display for MigrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.after {
            After::Here => write!(f, "{}; the cell keeps running on this node", self.cause),
            After::Ended => write!(
                f,
                "the program ended on this node while it was being moved ({}); there is \
                 nothing left to move, and its output and exit status stay here",
                self.cause
            ),
            After::There => write!(f, "{}", self.cause),
        }
    }
}

impl MigrateError {
    /// The phase, for logs and metrics.
    pub(crate) fn phase_name(&self) -> &'static str {
        self.phase.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_says_where_the_cell_is() {
        let e = MigrateError::here(Phase::Commit, Cause::Refused("no room".into()));
        assert_eq!(
            e.to_string(),
            "the destination refused: no room; the cell keeps running on this node"
        );
        let e = MigrateError {
            after: After::Ended,
            ..MigrateError::here(Phase::Rounds, "link closed".to_string())
        };
        assert!(e.to_string().contains("program ended on this node"), "{e}");
        assert!(!e.to_string().contains("keeps running"), "{e}");
        assert_eq!(e.phase_name(), "rounds");
    }
}
