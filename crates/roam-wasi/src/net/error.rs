//! Why a backend's call on a hub was refused.
//!
//! Exists so a backend can tell a protocol violation (a gap, data beyond
//! the window or past the end of stream) from a connection the cell has
//! already forgotten, and say what to do next; nothing changes when a call
//! is refused.

use super::{ConnId, MAX_BACKLOG, MAX_CONNS, MAX_LABEL_LEN};

/// Why a backend call on a [`NetHub`] was refused. Nothing is changed when
/// one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// No open listener has this label.
    #[error("the cell has no open listener {0:?}; check the service name or listen address")]
    NoListener(String),
    /// The connection id is already in use.
    #[error("connection {0} already exists in this cell; the backend must use fresh ids")]
    DuplicateConn(ConnId),
    /// The connection is unknown (never opened, or closed and forgotten).
    #[error("connection {0} is unknown to this cell (closed and forgotten, or never opened); drop what is meant for it")]
    UnknownConn(ConnId),
    /// The cell holds [`MAX_CONNS`] connections already.
    #[error("the cell already holds {MAX_CONNS} connections; refuse the client")]
    TooManyConns,
    /// The listener's backlog is full.
    #[error("listener {0:?} has {MAX_BACKLOG} connections waiting to be accepted; refuse the client or retry later")]
    BacklogFull(String),
    /// The peer description is too long or contains NUL.
    #[error("peer description is over {MAX_LABEL_LEN} bytes or contains NUL")]
    BadPeer,
    /// Data starts after the end of what the cell has: bytes are missing.
    #[error("connection {conn}: data at offset {offset} leaves a gap, the cell has bytes up to {expected}; resend from {expected}")]
    Gap {
        /// The connection.
        conn: ConnId,
        /// Where the cell's input ends.
        expected: u64,
        /// Where the data started.
        offset: u64,
    },
    /// Data reaches beyond what the window allows.
    #[error("connection {conn}: data up to offset {end} exceeds the window, which ends at {limit}; wait for Consumed")]
    OverWindow {
        /// The connection.
        conn: ConnId,
        /// End of the refused data.
        end: u64,
        /// Read offset + window.
        limit: u64,
    },
    /// A stream offset overflowed u64.
    #[error("connection {0}: stream offset overflows")]
    OffsetOverflow(ConnId),
    /// Data or an end of stream that contradicts an earlier end of stream.
    #[error("connection {conn}: the client's stream already ended at {eof}; offset {offset} contradicts it")]
    AfterEof {
        /// The connection.
        conn: ConnId,
        /// The end already recorded.
        eof: u64,
        /// The offending offset.
        offset: u64,
    },
    /// An end of stream before bytes the cell already has.
    #[error("connection {conn}: end of stream at {offset} lies before the {have} bytes the cell already has")]
    EofBeforeData {
        /// The connection.
        conn: ConnId,
        /// The claimed end.
        offset: u64,
        /// Bytes received so far.
        have: u64,
    },
    /// A delivery confirmation for bytes the cell never wrote.
    #[error(
        "connection {conn}: delivered up to {offset}, but the program wrote only up to {written}"
    )]
    BeyondWritten {
        /// The connection.
        conn: ConnId,
        /// The claimed offset.
        offset: u64,
        /// What the program has written.
        written: u64,
    },
}
