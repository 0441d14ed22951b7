//! Signing and verification of webhook deliveries.
//!
//! Our webhook dispatcher signs every delivery with this crate; receivers
//! (customers and our reference receiver) verify them with it. Two formats
//! are supported, both HMAC-SHA256 keyed with the decoded bytes of a
//! [`Secret`] (`whsec_<base64>`):
//!
//! ## `webhook-signature` (our default, [`Scheme::WebhookSignature`])
//!
//! ```text
//! Webhook-Id: evt_01HZY3K5Q7
//! Webhook-Signature: t=1700000000,v1=d6ef319d9233ec7702a85b20de501782b438d3bda9cc0fbe91b9b7242665a94b
//! ```
//!
//! * `t`: Unix time in seconds of the delivery attempt;
//! * `v1`: lowercase hex of HMAC-SHA256 over `"<t>.<raw body>"`. During a
//!   secret rotation there are several `v1` entries (new secret first); any
//!   one matching is enough. Unknown keys (`v0=`…) are ignored, and a space
//!   after each comma is tolerated.
//! * `Webhook-Id` is **not** covered by the signature in this format.
//!
//! ## Standard Webhooks ([`Scheme::StandardWebhooks`])
//!
//! As specified at <https://www.standardwebhooks.com/>:
//!
//! ```text
//! webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek
//! webhook-timestamp: 1614265330
//! webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
//! ```
//!
//! `v1` signatures are standard base64 of HMAC-SHA256 over
//! `"<webhook-id>.<webhook-timestamp>.<raw body>"`; several entries are
//! separated by spaces.
//!
//! ## Rules that apply to both
//!
//! * Verify the **raw** body bytes as received, before parsing JSON: a
//!   re-serialised body or an added trailing newline no longer verifies.
//! * Signatures are compared in constant time with [`ring::hmac::verify`].
//! * The timestamp must be within a tolerance (default 300 s, either
//!   direction) of the receiver's clock; a timestamp in milliseconds is
//!   reported as such ([`VerifyError::TimestampInMilliseconds`]).
//!
//! # Example
//!
//! ```
//! use vid_webhooks::{signature_headers, verify, Scheme, Secret};
//!
//! // Once, when the customer creates the endpoint: show `secret` to them.
//! let secret = Secret::generate();
//! let shown_once: String = secret.to_string(); // "whsec_…"
//!
//! // Dispatcher side.
//! let body = br#"{"type":"video.transcoded","data":{"video_id":"vid_01"}}"#;
//! let headers = signature_headers(Scheme::WebhookSignature, [&secret], "evt_01", 1_700_000_000, body);
//!
//! // Receiver side, with the secret the customer stored.
//! let stored = Secret::parse(&shown_once)?;
//! let verified = verify([&stored], &headers, body, 1_700_000_042)?;
//! assert_eq!(verified.message_id.as_deref(), Some("evt_01"));
//! assert_eq!(verified.timestamp, 1_700_000_000);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cargo features
//!
//! * `http`: implements [`Headers`] for `http::HeaderMap`.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod headers;
mod scheme;
mod secret;
mod sign;
mod verify;

pub use headers::{names, Headers};
pub use scheme::Scheme;
pub use secret::{Secret, SecretError, GENERATED_SECRET_BYTES, MIN_SECRET_BYTES, SECRET_PREFIX};
pub use sign::{sign_standard, sign_webhook_signature, signature_headers};
pub use verify::{verify, verify_now, Verified, Verifier, VerifyError, MAX_SIGNATURES, MILLISECOND_THRESHOLD};
