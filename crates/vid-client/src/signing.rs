//! Signing keys and playback tokens (issue 20): what a customer's server
//! needs to let a viewer play a `signed` playback ID.
//!
//! ```no_run
//! # async fn demo(client: &vid_client::Client, pb: &vid_core::PlaybackId) -> Result<(), Box<dyn std::error::Error>> {
//! use vid_core::playback::Audience;
//! let key = client.create_signing_key().await?; // keep key.private_key: it is shown once
//! let token = vid_client::sign_playback_token(&key.private_key, &key.id, pb, Audience::Video, std::time::Duration::from_secs(3600))?;
//! let url = format!("https://stream.example.com/play/{pb}.m3u8?token={token}");
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use vid_core::playback::Audience;
use vid_core::signing::{CreatedSigningKey, PlaybackClaims, SigningKey};
use vid_core::{PlaybackId, SigningKeyId};

use crate::client::{query, Client, ClientError, Page};

/// Why a token could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The private key is not an RSA private key in PEM (PKCS#8
    /// `BEGIN PRIVATE KEY`, as `POST /signing-keys` answers, or PKCS#1
    /// `BEGIN RSA PRIVATE KEY`).
    #[error("the private key is not an RSA private key in PEM: {0}")]
    InvalidKey(String),
    /// Signing failed (the key was refused by the RSA implementation).
    #[error("signing failed: {0}")]
    Signing(String),
    /// `now + expires_in` is past the largest `exp` (`u64` seconds since
    /// the Unix epoch, RFC 7519 §4.1.4 NumericDate).
    #[error("expires_in of {0} s is too long: the expiry is past the largest NumericDate")]
    ExpiresTooLate(u64),
}

/// A playback token (RFC 7519 JWT, RS256, header `kid` = `key_id`) for
/// `audience` of `playback_id`, expiring `expires_in` from now (whole
/// seconds, rounded down). Append it as `?token=<token>` to the playback URL.
///
/// Errors: [`SignError`] (`ExpiresTooLate` when `now + expires_in`
/// overflows, checked before the key is read).
pub fn sign_playback_token(
    private_key_pem: &str,
    key_id: &SigningKeyId,
    playback_id: &PlaybackId,
    audience: Audience,
    expires_in: Duration,
) -> Result<String, SignError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let exp = now.checked_add(expires_in.as_secs()).ok_or(SignError::ExpiresTooLate(expires_in.as_secs()))?;
    let claims = PlaybackClaims { sub: playback_id.to_string(), aud: audience.claim().to_owned(), exp, nbf: None };
    sign_claims(private_key_pem, key_id, &claims)
}

/// A token of exactly `claims` (RS256, header `kid` = `key_id`): for a
/// token with an `nbf`, or an `exp` at a given instant.
///
/// Errors: [`SignError`].
pub fn sign_claims(private_key_pem: &str, key_id: &SigningKeyId, claims: &PlaybackClaims) -> Result<String, SignError> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem.as_bytes()).map_err(|e| SignError::InvalidKey(e.to_string()))?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(key_id.to_string());
    jsonwebtoken::encode(&header, claims, &key).map_err(|e| SignError::Signing(e.to_string()))
}

impl Client {
    /// `POST /signing-keys` → `201`: a new RSA key pair; `private_key`
    /// (PKCS#8 PEM) is in this answer only.
    pub async fn create_signing_key(&self) -> Result<CreatedSigningKey, ClientError> {
        Ok(self.call::<(), _>(Method::POST, "/signing-keys", None, &[]).await?.0)
    }

    /// `GET /signing-keys?cursor=`: the tenant's keys, newest first, without key material.
    pub async fn list_signing_keys(&self, cursor: Option<&str>) -> Result<Page<SigningKey>, ClientError> {
        self.get(&format!("/signing-keys?{}", query(&[("cursor", cursor)]))).await
    }

    /// `GET /signing-keys/{id}`.
    pub async fn get_signing_key(&self, id: &SigningKeyId) -> Result<SigningKey, ClientError> {
        self.get(&format!("/signing-keys/{id}")).await
    }

    /// `DELETE /signing-keys/{id}` → `204`: tokens signed with it stop
    /// working from the next playback request on.
    ///
    /// Errors: [`ClientError::Api`] with `not_found` (unknown, deleted, or another tenant's).
    pub async fn delete_signing_key(&self, id: &SigningKeyId) -> Result<(), ClientError> {
        self.call::<(), serde_json::Value>(Method::DELETE, &format!("/signing-keys/{id}"), None, &[]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_past_the_largest_numeric_date_is_an_error_not_a_panic() {
        let (key, pb) = (SigningKeyId::generate(), PlaybackId::generate());
        let err = sign_playback_token("not a key", &key, &pb, Audience::Video, Duration::from_secs(u64::MAX)).unwrap_err();
        assert!(matches!(err, SignError::ExpiresTooLate(u64::MAX)), "{err:?}");
        // A sane expiry gets past the check to the key.
        let err = sign_playback_token("not a key", &key, &pb, Audience::Video, Duration::from_secs(3600)).unwrap_err();
        assert!(matches!(err, SignError::InvalidKey(_)), "{err:?}");
    }
}
