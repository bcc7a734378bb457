//! Every etcd call bounded in time, and etcd-client's errors in words an
//! operator can act on: why a call failed, against which endpoints, and
//! (when connecting) what to change when etcd refused us.

use std::future::Future;

use super::CALL_TIMEOUT;
use crate::{StoreError, StoreResult};

/// Bound `fut` by [`CALL_TIMEOUT`]; its errors as backend errors.
pub(super) async fn bounded<T>(
    endpoints: &[String],
    what: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> StoreResult<T> {
    explained(endpoints, what, fut, |_| None).await
}

/// [`bounded`], adding `hint`'s advice to an error it recognises.
pub(super) async fn explained<T>(
    endpoints: &[String],
    what: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
    hint: impl FnOnce(&etcd_client::Error) -> Option<String>,
) -> StoreResult<T> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            let mut message = describe(&e);
            if let Some(hint) = hint(&e) {
                message.push_str("; ");
                message.push_str(&hint);
            }
            Err(backend(endpoints, what, message))
        }
        Err(_) => Err(backend(
            endpoints,
            what,
            format!(
                "no answer within {} s; is etcd running and reachable?",
                CALL_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// An etcd-client error in a few words: a gRPC status as its code and
/// message (not the whole metadata map), a transport error with its causes
/// (where a TLS failure says what was wrong with which certificate).
pub(super) fn describe(e: &etcd_client::Error) -> String {
    let mut out = match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        etcd_client::Error::TransportError(t) => std::error::Error::source(t),
        _ => None,
    };
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

pub(super) fn backend(endpoints: &[String], what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend {
        backend: "etcd",
        message: format!("{} ({what}): {e}", endpoints.join(",")),
    }
}
