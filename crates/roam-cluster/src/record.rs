//! How records are written, shared by both backends: JSON inside an
//! envelope that carries a format version, so that a roam reading a record
//! written by a newer roam says so instead of misreading it, and a damaged
//! record is [`StoreError::Corrupt`] naming its key, never a panic. Also the
//! identifier checks every key goes through before it is built: a cell id
//! or node name becomes part of a key, so it must not be able to reach
//! outside its place (`/`, `..`) or be unbounded.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{NodeRecord, StoreError, StoreResult, MAX_MODULE_BYTES};

/// The format version this roam writes and reads.
pub(crate) const FORMAT: u32 = 1;

/// The largest stored record we read back (a record is a few KiB; this
/// bounds what a damaged or hostile store can make us parse).
pub(crate) const MAX_RECORD_BYTES: usize = 16 << 20;

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    v: u32,
    record: &'a T,
}

#[derive(Deserialize)]
struct EnvelopeIn<T> {
    v: u32,
    record: Option<T>,
}

/// A node as stored: its record and, for the embedded store, its lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StoredNode {
    pub node: NodeRecord,
    /// The lease's length, milliseconds.
    pub ttl_ms: u64,
    /// When the lease runs out, Unix milliseconds (embedded store), or 0.
    #[serde(default)]
    pub expires_ms: u64,
    /// The etcd lease keeping the node's alive key (etcd store), or 0.
    #[serde(default)]
    pub lease: i64,
}

/// `record` as stored bytes; [`StoreError::Invalid`] if it is larger than
/// a record may be (it could not be read back).
pub(crate) fn encode<T: Serialize>(record: &T) -> StoreResult<Vec<u8>> {
    let bytes = serde_json::to_vec(&EnvelopeOut { v: FORMAT, record })
        .map_err(|e| StoreError::Invalid(format!("the record does not serialise: {e}")))?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(StoreError::Invalid(format!(
            "the record is {} bytes, more than the {} MiB a record may have",
            bytes.len(),
            MAX_RECORD_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// The record stored under `key`.
pub(crate) fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> StoreResult<T> {
    let corrupt = |message: String| StoreError::Corrupt {
        key: key.to_string(),
        message,
    };
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(corrupt(format!(
            "it is {} bytes, more than the {} MiB a record may have",
            bytes.len(),
            MAX_RECORD_BYTES >> 20
        )));
    }
    // The version first, so that a newer format is reported as such even
    // when its record no longer parses as ours.
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a roam record ({e})")))?;
    if version.v != FORMAT {
        return Err(corrupt(format!(
            "format version {}, this roam reads version {FORMAT}; run the roam that wrote it",
            version.v
        )));
    }
    let envelope: EnvelopeIn<T> =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("bad record ({e})")))?;
    debug_assert_eq!(envelope.v, FORMAT);
    envelope
        .record
        .ok_or_else(|| corrupt("the envelope holds no record".into()))
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn invalid(e: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(e.to_string())
}

/// Refuse a node name that could not be a key.
pub(crate) fn check_node(name: &str) -> StoreResult<()> {
    roam_wire::ident::check_node_name(name).map_err(invalid)
}

/// Refuse a cell id that could not be a key.
pub(crate) fn check_cell(id: &str) -> StoreResult<()> {
    roam_wire::ident::check_cell_id(id).map_err(invalid)
}

/// Refuse a module hash that is not 64 lowercase hex digits.
pub(crate) fn check_hash(hash: &str) -> StoreResult<()> {
    roam_wire::ident::parse_module_hash(hash)
        .map(|_| ())
        .map_err(invalid)
}

/// Refuse a module over [`MAX_MODULE_BYTES`].
pub(crate) fn check_module_size(hash: &str, len: usize) -> StoreResult<()> {
    if len > MAX_MODULE_BYTES {
        return Err(StoreError::Invalid(format!(
            "module {hash} is {} MiB, more than the {} MiB the repository takes; \
             strip debug sections or split the program",
            len >> 20,
            MAX_MODULE_BYTES >> 20
        )));
    }
    Ok(())
}

/// Refuse to store `bytes` under a `hash` that is not their BLAKE3 hash:
/// a misnamed module would be served to every node that asks for `hash`.
pub(crate) fn check_module_name(hash: &str, bytes: &[u8]) -> StoreResult<()> {
    match misnamed(hash, bytes) {
        Some(actual) => Err(StoreError::Invalid(format!(
            "module bytes hash to {actual}, not to the name {hash} they were given"
        ))),
        None => Ok(()),
    }
}

/// Check a module read back from the store against its name. The store's
/// backend (a file anyone with access can edit, or an etcd that other
/// clients write to) is not trusted to hand back what was put: bytes that
/// do not hash to `hash` are `Corrupt`, never passed on to a node.
pub(crate) fn check_module_read(key: &str, hash: &str, bytes: &[u8]) -> StoreResult<()> {
    match misnamed(hash, bytes) {
        Some(actual) => Err(StoreError::Corrupt {
            key: key.to_string(),
            message: format!(
                "its {} bytes hash to {actual}, not to {hash}: the stored module was changed",
                bytes.len()
            ),
        }),
        None => Ok(()),
    }
}

/// The BLAKE3 hash of `bytes`, when it is not `hash`.
fn misnamed(hash: &str, bytes: &[u8]) -> Option<blake3::Hash> {
    let actual = blake3::hash(bytes);
    (actual.to_hex().as_str() != hash).then_some(actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct R {
        a: u32,
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_corrupt() {
        let bytes = encode(&R { a: 7 }).unwrap();
        assert_eq!(decode::<R>("k", &bytes).unwrap(), R { a: 7 });
        for bad in [
            &b"garbage"[..],
            br#"{"v":1}"#,
            br#"{"v":1,"record":{"b":1}}"#,
            br#"{"v":2,"record":{"a":1}}"#,
            b"",
        ] {
            match decode::<R>("cells/x", bad) {
                Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "cells/x"),
                other => panic!("{:?} decoded as {other:?}", String::from_utf8_lossy(bad)),
            }
        }
        let newer = decode::<R>("k", br#"{"v":2,"record":{"z":[]}}"#).unwrap_err();
        assert!(newer.to_string().contains("format version 2"), "{newer}");
    }

    #[test]
    fn keys_refuse_what_could_escape_them() {
        for bad in ["", "a/b", "..", "a..b", "-x", &"x".repeat(65)] {
            assert!(
                matches!(check_cell(bad), Err(StoreError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(check_cell("c-1234").is_ok());
        assert!(check_node("edge-a").is_ok());
        assert!(check_node("edge/a").is_err());
        assert!(check_hash(&"ab".repeat(32)).is_ok());
        assert!(check_hash(&"AB".repeat(32)).is_err());
        assert!(check_module_size("h", MAX_MODULE_BYTES).is_ok());
        assert!(check_module_size("h", MAX_MODULE_BYTES + 1).is_err());
    }
}
