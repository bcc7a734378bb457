//! Modules in etcd: chunks of at most 1 MiB (etcd refuses requests over
//! 1.5 MiB by default), one put each, then the manifest. A reader starts
//! from the manifest, so it either finds no module or every chunk of it:
//! never half a module. A writer that dies midway leaves chunks without a
//! manifest; the next upload of the same module overwrites them. Bytes
//! read back are checked against the module's hash (`record.rs`).

use serde::{Deserialize, Serialize};

use super::EtcdStore;
use crate::record::{self, decode, encode};
use crate::{ModuleRecord, StoreError, StoreResult, MAX_MODULE_BYTES};

/// The largest chunk.
pub(crate) const CHUNK: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    bytes: u64,
    chunks: u32,
}

fn chunk_key(store: &EtcdStore, hash: &str, n: u32) -> String {
    store.key("modules", &format!("{hash}/{n}"))
}

pub(super) async fn put(store: &EtcdStore, hash: &str, bytes: &[u8]) -> StoreResult<()> {
    record::check_hash(hash)?;
    record::check_module_size(hash, bytes.len())?;
    record::check_module_name(hash, bytes)?;
    let manifest_key = store.key("manifests", hash);
    if store
        .get_one("read a module", &manifest_key)
        .await?
        .is_some()
    {
        return Ok(());
    }
    let mut chunks = 0u32;
    for (n, chunk) in bytes.chunks(CHUNK).enumerate() {
        let (key, value) = (chunk_key(store, hash, n as u32), chunk.to_vec());
        store
            .call("store a module chunk", |mut c| async move {
                c.put(key, value, None).await
            })
            .await?;
        chunks += 1;
    }
    let manifest = encode(&Manifest {
        bytes: bytes.len() as u64,
        chunks,
    })?;
    store
        .call("store a module manifest", |mut c| async move {
            c.put(manifest_key, manifest, None).await
        })
        .await?;
    Ok(())
}

pub(super) async fn get(store: &EtcdStore, hash: &str) -> StoreResult<Option<Vec<u8>>> {
    record::check_hash(hash)?;
    let manifest_key = store.key("manifests", hash);
    let Some((bytes, _)) = store.get_one("read a module", &manifest_key).await? else {
        return Ok(None);
    };
    let manifest: Manifest = decode(&manifest_key, &bytes)?;
    let corrupt = |message: String| StoreError::Corrupt {
        key: manifest_key.clone(),
        message,
    };
    // Check the manifest before allocating what it claims.
    if manifest.bytes > MAX_MODULE_BYTES as u64
        || u64::from(manifest.chunks) != manifest.bytes.div_ceil(CHUNK as u64)
    {
        return Err(corrupt(format!(
            "it claims {} bytes in {} chunks",
            manifest.bytes, manifest.chunks
        )));
    }
    let mut out = Vec::with_capacity(manifest.bytes as usize);
    // One chunk per call: each answer stays under gRPC's 4 MiB message
    // limit, and keys sort as strings ("10" before "2") anyway.
    for n in 0..manifest.chunks {
        let key = chunk_key(store, hash, n);
        let Some((chunk, _)) = store.get_one("read a module chunk", &key).await? else {
            return Err(corrupt(format!(
                "chunk {n} of {} is missing",
                manifest.chunks
            )));
        };
        let expected = (manifest.bytes as usize - out.len()).min(CHUNK);
        if chunk.len() != expected {
            return Err(corrupt(format!(
                "chunk {n} is {} bytes, not {expected}",
                chunk.len()
            )));
        }
        out.extend_from_slice(&chunk);
    }
    record::check_module_read(&manifest_key, hash, &out)?;
    Ok(Some(out))
}

pub(super) async fn list(store: &EtcdStore) -> StoreResult<Vec<ModuleRecord>> {
    let mut out = Vec::new();
    for (hash, bytes, _) in store.list("manifests", 0).await?.0 {
        let key = store.key("manifests", &hash);
        let manifest: Manifest = decode(&key, &bytes)?;
        out.push(ModuleRecord {
            hash,
            bytes: manifest.bytes,
        });
    }
    Ok(out)
}
