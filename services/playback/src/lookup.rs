//! The one way a request reaches a playback ID's entry: the lookup cache
//! or PostgreSQL ([`crate::store::lookup`]), then the policy
//! ([`crate::token::authorize`]). Every route (streams, images) calls
//! [`resolve`] before touching storage.

use std::sync::Arc;
use std::time::Instant;

use actix_web::HttpRequest;
use vid_core::playback::{Audience, PlaybackPolicy};
use vid_core::PlaybackId;

use crate::error::PlaybackError;
use crate::state::AppState;
use crate::store::{self, Entry};

/// The playback ID's entry, from the lookup cache or PostgreSQL, once `req`
/// may open resources of `audience` through it ([`crate::token::authorize`]:
/// a signed ID's token verified, its grant kept in `req`'s extensions).
/// Errors: `NotFound` (no such ID; a `token` on a public ID),
/// `TokenRequired` and `TokenRefused` (a `signed` ID: checked before the
/// video's state, so a signed ID reveals nothing without a valid token),
/// `Unavailable`, `Internal`.
pub async fn resolve(state: &AppState, req: &HttpRequest, id: &PlaybackId, audience: Audience) -> Result<Arc<Entry>, PlaybackError> {
    let cached = state.lookups.get(id.as_str());
    crate::metrics::cache_lookup("id", cached.is_some());
    let entry = match cached {
        Some(entry) => entry,
        None => {
            let at = Instant::now();
            let entry = store::lookup(&state.db, id).await?.map(Arc::new);
            state.lookups.put(id.as_str(), entry.clone(), at);
            entry
        }
    };
    let entry = entry.ok_or(PlaybackError::NotFound)?;
    crate::token::authorize(state, req, id, entry.policy == PlaybackPolicy::Signed, audience).await?;
    Ok(entry)
}
