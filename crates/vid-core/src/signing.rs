//! Signing keys and signed playback tokens (issue 20).
//!
//! A tenant creates signing keys with `POST /signing-keys`: the api makes an
//! RSA key pair (2048 bits), keeps only the public half in `signing_keys`
//! and answers the private half once, as PEM ([`CreatedSigningKey`]). The
//! customer's server then signs short JWTs (RFC 7519, JWS RS256 per RFC 7518
//! §3.3) for one playback ID, and the player appends one to every URL of a
//! `signed` playback ID as `?token=<JWT>`:
//!
//! ```text
//! header   {"alg": "RS256", "typ": "JWT", "kid": "sk_…"}      kid: one of the tenant's signing keys
//! payload  {"sub": "pb_…", "aud": "v", "exp": 1767323045}     nbf optional; exp required
//! ```
//!
//! `aud` is a [`crate::playback::Audience`] claim (`v`, `t`, `s`, `g`).
//! The playback service refuses every other algorithm, a key of another
//! tenant, a deleted key, a token of another playback ID or audience, and
//! an expired or not yet valid token, each with its own problem code.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::SigningKeyId;

/// The one query parameter a playback URL of a signed ID takes: `?token=<JWT>`.
pub const TOKEN_PARAMETER: &str = "token";

/// The only JWS algorithm accepted (RFC 7518 §3.3: RSASSA-PKCS1-v1_5 with SHA-256).
pub const ALGORITHM: &str = "RS256";

/// Clock skew allowed on `exp` and `nbf`, in seconds, between the
/// customer's server that signs and the playback service that checks.
pub const LEEWAY_SECONDS: u64 = 30;

/// Size of the RSA modulus of the key pairs `POST /signing-keys` makes, in bits.
pub const KEY_BITS: u32 = 2048;

/// A signing key as `GET /signing-keys` lists it: never the private key
/// (it is not stored), and not the public key either (only the playback
/// service needs it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SigningKey {
    /// `sk_…`: the `kid` header of tokens signed with it.
    pub id: SigningKeyId,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
}

/// `POST /signing-keys` → `201`: the new key with its private half, shown
/// this once and never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedSigningKey {
    /// `sk_…`: the `kid` header of tokens signed with it.
    pub id: SigningKeyId,
    /// The RSA private key (2048 bits), PEM-encoded PKCS#8
    /// (`-----BEGIN PRIVATE KEY-----`, RFC 5958 / RFC 7468 §10). Keep it
    /// on your server: we cannot show it again.
    pub private_key: String,
    /// RFC 3339.
    pub created_at: DateTime<Utc>,
}

/// The claims of a playback token (RFC 7519 §4.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaybackClaims {
    /// `sub`: the playback ID (`pb_…`) the token opens.
    pub sub: String,
    /// `aud`: what it opens, `v`, `t`, `s` or `g` ([`crate::playback::Audience::claim`]).
    pub aud: String,
    /// `exp`: expiry, seconds since the Unix epoch (required).
    pub exp: u64,
    /// `nbf`: not valid before, seconds since the Unix epoch (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
}
