//! The two in-memory caches of one replica, both bounded.
//!
//! - [`LookupCache`]: playback-ID lookups (found or not) for at most
//!   `[playback] lookup_cache_ms` (default 1 s). That is the bound on how long
//!   a deleted playback ID keeps answering on a replica after the api deleted
//!   its row (and how long a video that just became ready may still answer
//!   404). At most `lookup_cache_entries` entries.
//! - [`ManifestCache`]: manifest objects (master and media playlists, MPDs)
//!   by storage key, never expiring: a ready video's manifests are immutable
//!   (the transcoder writes them once, before the video turns ready, under a
//!   prefix only that video uses). A deleted playback ID cannot reach them:
//!   every request looks the ID up first. At most `manifest_cache_bytes`
//!   bytes; past it, arbitrary entries are evicted.
//!
//! Both are plain maps behind a mutex held for a lookup or an insert only
//! (never across an await).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::store::Entry;

/// Recent playback-ID lookups (see the module docs).
pub struct LookupCache {
    ttl: Duration,
    max_entries: usize,
    map: Mutex<HashMap<String, (Instant, Option<Arc<Entry>>)>>,
}

impl LookupCache {
    /// A cache keeping answers for `ttl` (zero: nothing is kept), at most `max_entries`.
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        Self { ttl, max_entries, map: Mutex::new(HashMap::new()) }
    }

    /// The remembered answer for `id` if younger than the ttl: `Some(None)`
    /// is a remembered "no such playback ID".
    pub fn get(&self, id: &str) -> Option<Option<Arc<Entry>>> {
        if self.ttl.is_zero() {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, e)| e.clone())
    }

    /// Remembers `entry` for `id`, as of `looked_up_at` (the instant before
    /// the query was sent, so the bound holds from the read on).
    pub fn put(&self, id: &str, entry: Option<Arc<Entry>>, looked_up_at: Instant) {
        if self.ttl.is_zero() || self.max_entries == 0 {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= self.max_entries && !map.contains_key(id) {
            let ttl = self.ttl;
            map.retain(|_, (at, _)| at.elapsed() < ttl);
            if map.len() >= self.max_entries {
                map.clear();
            }
        }
        map.insert(id.to_owned(), (looked_up_at, entry));
    }
}

/// A stored manifest object.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Its bytes, as stored.
    pub body: Bytes,
    /// Its storage ETag (quoted), if the store sent one.
    pub etag: Option<String>,
}

/// Manifest objects by storage key (see the module docs).
pub struct ManifestCache {
    max_bytes: usize,
    inner: Mutex<(HashMap<String, Arc<Manifest>>, usize)>,
}

impl ManifestCache {
    /// A cache of at most `max_bytes` bytes of manifests (0: none kept).
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, inner: Mutex::new((HashMap::new(), 0)) }
    }

    /// The cached object under `key`.
    pub fn get(&self, key: &str) -> Option<Arc<Manifest>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.get(key).cloned()
    }

    /// Keeps `manifest` under `key`, evicting others past the byte bound; an
    /// object larger than an eighth of the bound is not kept.
    pub fn put(&self, key: &str, manifest: Arc<Manifest>) {
        let size = manifest.body.len() + key.len();
        if size > self.max_bytes / 8 {
            return;
        }
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, bytes) = &mut *guard;
        if let Some(old) = map.remove(key) {
            *bytes -= old.body.len() + key.len();
        }
        while *bytes + size > self.max_bytes {
            let Some(victim) = map.keys().next().cloned() else { break };
            if let Some(old) = map.remove(&victim) {
                *bytes -= old.body.len() + victim.len();
            }
        }
        map.insert(key.to_owned(), manifest);
        *bytes += size;
    }

    /// Bytes held (keys included).
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vid_core::playback::PlaybackPolicy;

    #[test]
    fn lookups_expire_after_the_ttl_and_the_map_stays_bounded() {
        let cache = LookupCache::new(Duration::from_millis(50), 2);
        let e = Arc::new(Entry { policy: PlaybackPolicy::Public, stream: None });
        cache.put("a", Some(e.clone()), Instant::now());
        cache.put("b", None, Instant::now());
        assert_eq!(cache.get("a"), Some(Some(e.clone())));
        assert_eq!(cache.get("b"), Some(None));
        assert_eq!(cache.get("c"), None);
        cache.put("c", None, Instant::now());
        assert!(cache.map.lock().unwrap().len() <= 2);
        cache.put("old", Some(e.clone()), Instant::now() - Duration::from_millis(60));
        assert_eq!(cache.get("old"), None, "older than the ttl");
        let off = LookupCache::new(Duration::ZERO, 10);
        off.put("a", Some(e), Instant::now());
        assert_eq!(off.get("a"), None);
    }

    #[test]
    fn manifests_stay_within_the_byte_bound() {
        let cache = ManifestCache::new(800);
        for i in 0..50 {
            cache.put(&format!("k{i:02}"), Arc::new(Manifest { body: Bytes::from(vec![b'x'; 90]), etag: None }));
            assert!(cache.bytes() <= 800, "{}", cache.bytes());
        }
        assert!(cache.get("k49").is_some(), "the newest is kept");
        cache.put("big", Arc::new(Manifest { body: Bytes::from(vec![b'x'; 200]), etag: None }));
        assert!(cache.get("big").is_none(), "over an eighth of the bound");
        let before = cache.bytes();
        cache.put("k49", Arc::new(Manifest { body: Bytes::from(vec![b'y'; 90]), etag: None }));
        assert_eq!(cache.bytes(), before, "replacing does not double count");
    }
}
