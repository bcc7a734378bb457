//! The destination's side of the connection, as the source reads it.

use std::time::Duration;

use roam_wire::{recv, Msg};
use tokio::sync::mpsc;

use super::error::Cause;
use crate::migrate::ReadHalf;

/// Messages from the destination after the handshake.
pub(super) type Inbox = mpsc::Receiver<Result<Msg, String>>;

/// Read the destination's messages on a task of their own, so that the
/// source can send and listen at once.
pub(super) fn spawn_reader(mut rd: ReadHalf) -> Inbox {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let m = recv(&mut rd).await.map_err(|e| e.to_string());
            let end = m.is_err();
            if tx.send(m).await.is_err() || end {
                break;
            }
        }
    });
    rx
}

/// When the local side of a stream fails (the writer sees a closed
/// connection), the destination usually said why just before closing:
/// its reason, if it comes within half a second.
pub(super) async fn abort_reason(inbox: &mut Inbox) -> Option<Cause> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, inbox.recv()).await {
        if let Ok(Msg::Abort { reason }) = m {
            return Some(Cause::Refused(reason));
        }
    }
    None
}

/// The destination's next message within `limit`. Its `Abort` is a
/// [`Cause::Refused`].
pub(super) async fn next(inbox: &mut Inbox, during: &str, limit: Duration) -> Result<Msg, Cause> {
    match tokio::time::timeout(limit, inbox.recv()).await {
        Err(_) => Err(Cause::Failed(format!(
            "the destination did not answer during {during} within {} s",
            limit.as_secs()
        ))),
        Ok(None) => Err(Cause::Failed(format!(
            "the connection to the destination closed during {during}"
        ))),
        Ok(Some(Err(e))) => Err(Cause::Failed(format!("{during}: {e}"))),
        Ok(Some(Ok(Msg::Abort { reason }))) => Err(Cause::Refused(reason)),
        Ok(Some(Ok(m))) => Ok(m),
    }
}

/// `m` was not the message expected.
pub(super) fn unexpected(m: &Msg, instead_of: &str) -> Cause {
    Cause::Failed(format!(
        "protocol error: `{}` instead of {instead_of}",
        m.name()
    ))
}
