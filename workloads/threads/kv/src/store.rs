//! The keyspace: string keys to string values, split into a fixed number of
//! shards, each a `HashMap` behind its own `Mutex`.
//!
//! Why shards: every client has its own thread, and with one global lock
//! fifty clients doing SET/GET would take turns on it. A key always lives in
//! the shard picked by a fixed hash of its bytes, so single-key commands lock
//! one shard. Commands that touch several keys lock every shard involved,
//! and whole-keyspace commands (DBSIZE, FLUSHALL, ROAM.DIGEST) lock all of
//! them; locks are always taken in ascending shard order, so two such
//! commands can never wait on each other in a cycle.
//!
//! Expiry uses `Instant` (the monotonic clock, which roam keeps running
//! across a migration). An expired key is deleted when it is touched, and a
//! shard that has had keys with a TTL is swept now and then by the writes to
//! it, so keys that expire and are never read again do not pile up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Number of shards (a power of two). Enough to spread two or eight cores'
/// worth of clients; few enough that locking all of them is cheap.
pub const SHARDS: usize = 16;

/// One value and its expiry.
pub struct Entry {
    /// The value's bytes (counters are stored as their decimal text).
    pub value: Vec<u8>,
    /// When the key expires, on the monotonic clock; `None` = never. Set
    /// through `Shard::set_expiry`.
    pub expire_at: Option<Instant>,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        self.expire_at.is_some_and(|at| at <= now)
    }
}

/// One shard of the keyspace.
#[derive(Default)]
pub struct Shard {
    map: HashMap<Vec<u8>, Entry>,
    /// Set when a key of this shard gets a TTL; cleared by a sweep that
    /// finds none left. While clear, lookups need not check expiry twice.
    volatile: bool,
    /// Writes since the last sweep (see `note_write`).
    writes: usize,
    /// Keys deleted because they expired (reported by INFO).
    expired: u64,
}

impl Shard {
    /// The live entry of `key`; an expired one is deleted first.
    pub fn get(&mut self, key: &[u8], now: Instant) -> Option<&mut Entry> {
        if self.volatile && self.map.get(key).is_some_and(|e| e.expired(now)) {
            self.map.remove(key);
            self.expired += 1;
            return None;
        }
        self.map.get_mut(key)
    }

    /// Whether `key` is live.
    pub fn contains(&mut self, key: &[u8], now: Instant) -> bool {
        self.get(key, now).is_some()
    }

    /// Stores `key = value`. `keep_ttl` keeps the expiry of an existing key;
    /// otherwise the key has none (the caller may set one afterwards).
    pub fn set(&mut self, key: &[u8], value: &[u8], keep_ttl: bool, now: Instant) -> &mut Entry {
        self.note_write(now);
        let live = self.get(key, now).is_some();
        if live {
            // Reuse the key and the value's buffer, as Redis does for strings.
            let e = self.map.get_mut(key).expect("the key is live");
            e.value.clear();
            e.value.extend_from_slice(value);
            if !keep_ttl {
                e.expire_at = None;
            }
            return e;
        }
        self.map.entry(key.to_vec()).or_insert(Entry {
            value: value.to_vec(),
            expire_at: None,
        })
    }

    /// Gives `key` (if present) the expiry `at`. Expiries are set only
    /// here, so that the shard knows it has keys with a TTL.
    pub fn set_expiry(&mut self, key: &[u8], at: Option<Instant>) {
        if let Some(e) = self.map.get_mut(key) {
            e.expire_at = at;
            self.volatile |= at.is_some();
        }
    }

    /// Deletes `key`; whether it was live.
    pub fn remove(&mut self, key: &[u8], now: Instant) -> bool {
        let live = self.contains(key, now);
        if live {
            self.map.remove(key);
        }
        live
    }

    /// Counts a write, and sweeps the shard once the writes since the last
    /// sweep outnumber its keys: amortised O(1) per write, and memory held
    /// by expired keys stays within a constant factor of the live ones.
    fn note_write(&mut self, now: Instant) {
        self.writes += 1;
        if self.volatile && self.writes > self.map.len().max(1024) {
            self.sweep(now);
        }
    }

    /// Deletes every expired key of this shard.
    pub fn sweep(&mut self, now: Instant) {
        self.writes = 0;
        if !self.volatile {
            return;
        }
        let before = self.map.len();
        let mut any_ttl = false;
        self.map.retain(|_, e| {
            let keep = !e.expired(now);
            any_ttl |= keep && e.expire_at.is_some();
            keep
        });
        self.expired += (before - self.map.len()) as u64;
        self.volatile = any_ttl;
    }

    /// Live keys, after a sweep.
    pub fn len_live(&mut self, now: Instant) -> usize {
        self.sweep(now);
        self.map.len()
    }

    /// Deletes every key, giving the memory back.
    pub fn clear(&mut self) {
        self.map = HashMap::new();
        self.volatile = false;
        self.writes = 0;
    }

    /// Live entries (expired ones are skipped, not deleted).
    pub fn live(&self, now: Instant) -> impl Iterator<Item = (&Vec<u8>, &Entry)> {
        self.map.iter().filter(move |(_, e)| !e.expired(now))
    }

    /// Keys expired and deleted so far.
    pub fn expired_count(&self) -> u64 {
        self.expired
    }
}

/// The whole keyspace.
pub struct Store {
    shards: Vec<Mutex<Shard>>,
    /// Expired keys counted before the last `CONFIG RESETSTAT`.
    expired_base: AtomicU64,
}

/// A poisoned lock only means another client thread panicked while holding
/// it; the map itself is still consistent (no command leaves it half
/// changed across a panic point), so the other clients carry on.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shard of `key`: FNV-1a over its bytes, then SplitMix64's finaliser.
pub fn shard_of(key: &[u8]) -> usize {
    (mix64(fnv1a(0xcbf2_9ce4_8422_2325, key)) as usize) & (SHARDS - 1)
}

/// FNV-1a, 64 bits, continued from `h`.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finaliser (without its increment), as in kvserver.c.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Shards locked together for a command over several keys.
pub struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Shard>)>,
}

impl<'a> Locked<'a> {
    /// The (locked) shard holding `key`.
    pub fn shard(&mut self, key: &[u8]) -> &mut Shard {
        let i = shard_of(key);
        let k = self
            .guards
            .binary_search_by_key(&i, |(j, _)| *j)
            .expect("every key's shard was locked");
        &mut self.guards[k].1
    }

    /// Every locked shard, in shard order.
    pub fn all(&mut self) -> impl Iterator<Item = &mut Shard> + use<'_, 'a> {
        self.guards.iter_mut().map(|(_, g)| &mut **g)
    }
}

impl Store {
    /// An empty keyspace.
    pub fn new() -> Store {
        Store {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            expired_base: AtomicU64::new(0),
        }
    }

    /// Locks the shard of `key`.
    pub fn lock(&self, key: &[u8]) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(key)])
    }

    /// Locks the shards of all `keys`, in ascending order (see the module
    /// comment: a single global order rules out deadlocks).
    pub fn lock_keys<'k>(&self, keys: impl Iterator<Item = &'k [u8]>) -> Locked<'_> {
        let mut want = [false; SHARDS];
        for k in keys {
            want[shard_of(k)] = true;
        }
        let guards = (0..SHARDS)
            .filter(|&i| want[i])
            .map(|i| (i, lock(&self.shards[i])))
            .collect();
        Locked { guards }
    }

    /// Locks every shard, in order.
    pub fn lock_all(&self) -> Locked<'_> {
        Locked {
            guards: (0..SHARDS).map(|i| (i, lock(&self.shards[i]))).collect(),
        }
    }

    /// Expired keys deleted since the start (or the last reset).
    pub fn expired_keys(&self) -> u64 {
        let total: u64 = self.lock_all().all().map(|s| s.expired_count()).sum();
        total.wrapping_sub(self.expired_base.load(Ordering::Relaxed))
    }

    /// Restarts the count of expired keys (`CONFIG RESETSTAT`).
    pub fn reset_expired_keys(&self) {
        let total: u64 = self.lock_all().all().map(|s| s.expired_count()).sum();
        self.expired_base.store(total, Ordering::Relaxed);
    }

    /// ROAM.DIGEST (docs/workloads.md, "kvserver"): the sum modulo 2^64,
    /// over every live key, of mix64(fnv1a64(le32(len(key)) || key ||
    /// value)). A sum, so the order of the shards and of each map does not
    /// matter. All shards are locked at once: the digest is of one moment.
    pub fn digest(&self, now: Instant) -> u64 {
        let mut locked = self.lock_all();
        let mut sum = 0u64;
        for shard in locked.all() {
            for (k, e) in shard.live(now) {
                let len = (k.len() as u32).to_le_bytes();
                let h = fnv1a(fnv1a(fnv1a(0xcbf2_9ce4_8422_2325, &len), k), &e.value);
                sum = sum.wrapping_add(mix64(h));
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn digest_matches_the_documented_definition() {
        let s = Store::new();
        let now = Instant::now();
        assert_eq!(s.digest(now), 0);
        s.lock(b"k").set(b"k", b"v", false, now);
        // mix64(fnv1a(01 00 00 00 'k' 'v')), computed independently.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in [1u8, 0, 0, 0, b'k', b'v'] {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(s.digest(now), mix64(h));
    }

    #[test]
    fn expired_keys_are_invisible_and_swept() {
        let s = Store::new();
        let now = Instant::now();
        let mut sh = s.lock(b"a");
        sh.set(b"a", b"1", false, now);
        sh.set_expiry(b"a", Some(now + Duration::from_millis(5)));
        assert!(sh.contains(b"a", now));
        let later = now + Duration::from_millis(10);
        assert_eq!(sh.live(later).count(), 0);
        assert_eq!(sh.len_live(later), 0);
        assert!(!sh.contains(b"a", later));
        assert_eq!(sh.expired_count(), 1);
        assert!(!sh.volatile);
    }
}
