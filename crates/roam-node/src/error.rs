//! What a node's operations answer when they cannot do what was asked.
//!
//! Why typed: the HTTP layer turns each kind into its status code
//! (`http::error`), and the core never has to know about HTTP. The message
//! is written for the person who asked, and says what to do where it can.

/// Why an operation on the node failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NodeError {
    /// The request itself is wrong (a bad id, an unknown option, a
    /// refused module); asking again the same way fails again.
    #[error("{0}")]
    BadRequest(String),
    /// The caller may not do this (the planner has not granted it).
    #[error("{0}")]
    Forbidden(String),
    /// What the request names is not on this node.
    #[error("{0}")]
    NotFound(String),
    /// The request fits, but not now: the cell is in another state, the
    /// node is full, an id is taken.
    #[error("{0}")]
    Conflict(String),
    /// The request body is over one of the node's caps.
    #[error("{0}")]
    TooLarge(String),
    /// Another node (a holder, a destination) could not be reached or
    /// failed.
    #[error("{0}")]
    Upstream(String),
    /// This node failed (a disk error, a task that died).
    #[error("{0}")]
    Internal(String),
}

impl NodeError {
    /// A bad request, from anything that displays.
    pub(crate) fn bad(msg: impl std::fmt::Display) -> NodeError {
        NodeError::BadRequest(msg.to_string())
    }

    /// An internal failure, from anything that displays.
    pub(crate) fn internal(msg: impl std::fmt::Display) -> NodeError {
        NodeError::Internal(msg.to_string())
    }
}

impl From<tokio::task::JoinError> for NodeError {
    fn from(e: tokio::task::JoinError) -> NodeError {
        NodeError::Internal(format!("a task of the node failed: {e}"))
    }
}
