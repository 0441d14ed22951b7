//! The in-memory caches of one replica, all bounded.
//!
//! - [`LookupCache`]: playback-ID lookups (found or not) for at most
//!   `[playback] lookup_cache_ms` (default 1 s). That is the bound on how long
//!   a deleted playback ID keeps answering on a replica after the api deleted
//!   its row (and how long a video that just became ready may still answer
//!   404). At most `lookup_cache_entries` found ids plus a quarter as many
//!   unknown ones, each set least-recently-used first out, one entry at a
//!   time: a flood of made-up ids evicts only other made-up ids.
//! - [`ManifestCache`]: manifest objects (master and media playlists, MPDs)
//!   by storage key, never expiring: a ready video's manifests are immutable
//!   (the transcoder writes them once, before the video turns ready, under a
//!   prefix only that video uses). A deleted playback ID cannot reach them:
//!   every request looks the ID up first. At most `manifest_cache_bytes`
//!   bytes; past it, the least recently used are evicted.
//!
//!   A second instance holds kept frames and stored thumbnails (issue 20:
//!   immutable too, each written under its video's prefix), with its own
//!   budget (`image_cache_bytes`), so image traffic never evicts a manifest.
//!
//! - [`KeyCache`]: parsed signing keys (never whether a key exists).
//!
//! All are `lru` maps behind a mutex held for a lookup or an insert only
//! (never across an await).

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use jsonwebtoken::DecodingKey;
use lru::LruCache;
use vid_core::SigningKeyId;

use crate::error::PlaybackError;
use crate::store::Entry;

type Lookups = LruCache<String, (Instant, Option<Arc<Entry>>)>;

/// Recent playback-ID lookups (see the module docs).
pub struct LookupCache {
    ttl: Duration,
    /// `(found, unknown)`; `None` when caching is off.
    maps: Option<Mutex<(Lookups, Lookups)>>,
}

impl LookupCache {
    /// A cache keeping answers for `ttl` (zero: nothing is kept), at most
    /// `max_entries` found ids and `max_entries / 4` (at least 1) unknown ones.
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        let maps = match (ttl.is_zero(), NonZeroUsize::new(max_entries)) {
            (false, Some(found)) => {
                let unknown = NonZeroUsize::new(max_entries / 4).unwrap_or(NonZeroUsize::MIN);
                Some(Mutex::new((LruCache::new(found), LruCache::new(unknown))))
            }
            _ => None,
        };
        Self { ttl, maps }
    }

    /// The remembered answer for `id` if younger than the ttl: `Some(None)`
    /// is a remembered "no such playback ID".
    pub fn get(&self, id: &str) -> Option<Option<Arc<Entry>>> {
        let mut maps = self.maps.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        let (found, unknown) = &mut *maps;
        let hit = found.get(id).or_else(|| unknown.get(id))?;
        (hit.0.elapsed() < self.ttl).then(|| hit.1.clone())
    }

    /// Remembers `entry` for `id`, as of `looked_up_at` (the instant before
    /// the query was sent, so the bound holds from the read on).
    pub fn put(&self, id: &str, entry: Option<Arc<Entry>>, looked_up_at: Instant) {
        let Some(maps) = &self.maps else { return };
        let mut maps = maps.lock().unwrap_or_else(|p| p.into_inner());
        let (found, unknown) = &mut *maps;
        let (this, other) = if entry.is_some() { (found, unknown) } else { (unknown, found) };
        other.pop(id);
        this.put(id.to_owned(), (looked_up_at, entry));
    }

    /// Entries held: `(found, unknown)`.
    pub fn len(&self) -> (usize, usize) {
        self.maps.as_ref().map_or((0, 0), |m| {
            let m = m.lock().unwrap_or_else(|p| p.into_inner());
            (m.0.len(), m.1.len())
        })
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
    inner: Mutex<(LruCache<String, Arc<Manifest>>, usize)>,
}

impl ManifestCache {
    /// A cache of at most `max_bytes` bytes of immutable objects (manifests,
    /// or images; 0: none kept).
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, inner: Mutex::new((LruCache::unbounded(), 0)) }
    }

    /// The cached object under `key`.
    pub fn get(&self, key: &str) -> Option<Arc<Manifest>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.get(key).cloned()
    }

    /// Keeps `manifest` under `key`, evicting the least recently used past
    /// the byte bound; an object larger than an eighth of the bound is not kept.
    pub fn put(&self, key: &str, manifest: Arc<Manifest>) {
        let size = manifest.body.len() + key.len();
        if size > self.max_bytes / 8 {
            return;
        }
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, bytes) = &mut *guard;
        if let Some(old) = map.pop(key) {
            *bytes -= old.body.len() + key.len();
        }
        while *bytes + size > self.max_bytes {
            let Some((victim, old)) = map.pop_lru() else { break };
            *bytes -= old.body.len() + victim.len();
        }
        map.put(key.to_owned(), manifest);
        *bytes += size;
    }

    /// Bytes held (keys included).
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// Parsed public keys of signed playback (issue 20) by key id, each with
/// the PEM it was parsed from: a key is reparsed when its stored text
/// differs, and a key id the database no longer answers is never looked up
/// here (existence is asked of PostgreSQL on every request, so a deleted key
/// fails the next request). At most [`KeyCache::MAX_KEYS`] keys, least
/// recently used out first.
pub struct KeyCache {
    keys: Mutex<LruCache<String, (String, Arc<DecodingKey>)>>,
}

impl Default for KeyCache {
    fn default() -> Self {
        Self { keys: Mutex::new(LruCache::new(NonZeroUsize::new(Self::MAX_KEYS).unwrap_or(NonZeroUsize::MIN))) }
    }
}

impl KeyCache {
    /// Keys kept at most.
    pub const MAX_KEYS: usize = 10_000;

    /// The decoding key of `kid` whose stored PEM is `pem` (RS256 public key).
    /// Errors: `Internal` when the stored PEM is not an RSA public key.
    pub fn decoding_key(&self, kid: &SigningKeyId, pem: &str) -> Result<Arc<DecodingKey>, PlaybackError> {
        if let Some((stored, key)) = self.keys.lock().unwrap_or_else(|p| p.into_inner()).get(kid.as_str()) {
            if stored == pem {
                return Ok(key.clone());
            }
        }
        let key = Arc::new(
            DecodingKey::from_rsa_pem(pem.as_bytes())
                .map_err(|e| PlaybackError::Internal(format!("signing key {kid} does not parse: {e}")))?,
        );
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).put(kid.as_str().to_owned(), (pem.to_owned(), key.clone()));
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vid_core::playback::PlaybackPolicy;

    #[test]
    fn lookups_expire_after_the_ttl_and_the_map_stays_bounded() {
        let cache = LookupCache::new(Duration::from_secs(60), 2);
        let e = Arc::new(Entry { policy: PlaybackPolicy::Public, stream: None });
        cache.put("a", Some(e.clone()), Instant::now());
        cache.put("b", None, Instant::now());
        assert_eq!(cache.get("a"), Some(Some(e.clone())));
        assert_eq!(cache.get("b"), Some(None));
        assert_eq!(cache.get("c"), None);
        cache.put("c", None, Instant::now());
        assert_eq!(cache.len(), (1, 1), "unknown ids evict unknown ids only");
        assert_eq!(cache.get("a"), Some(Some(e.clone())), "the found id survives a flood of unknown ones");
        assert_eq!(cache.get("b"), None, "the older unknown id was evicted, one entry, not the map");
        cache.put("d", Some(e.clone()), Instant::now());
        cache.get("a");
        cache.put("f", Some(e.clone()), Instant::now());
        assert_eq!(cache.len().0, 2);
        assert_eq!(cache.get("d"), None, "least recently used found id out first");
        assert!(cache.get("a").is_some());
        cache.put("old", Some(e.clone()), Instant::now() - Duration::from_secs(61));
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
