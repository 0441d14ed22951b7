//! Producing signature header values (used by the dispatcher).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::hmac;

use crate::headers::names;
use crate::scheme::Scheme;
use crate::secret::Secret;

/// The bytes covered by a `webhook-signature` (our format) signature:
/// `"<timestamp text>.<raw body>"`.
pub(crate) fn ours_signed_content(timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(timestamp.len() + 1 + body.len());
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

/// The bytes covered by a Standard Webhooks signature:
/// `"<msg id>.<timestamp text>.<raw body>"`.
pub(crate) fn standard_signed_content(msg_id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(msg_id.len() + timestamp.len() + 2 + body.len());
    content.extend_from_slice(msg_id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

/// Signs `body` in our `webhook-signature` format and returns the complete
/// value of the `Webhook-Signature` header.
///
/// The value is `t=<timestamp>,v1=<sig>[,v1=<sig>…]` where each `<sig>` is the
/// lowercase hex (64 characters) of HMAC-SHA256, keyed with the decoded bytes
/// of a secret, over the bytes `"<timestamp>.<body>"` (the decimal timestamp,
/// a dot, then `body` exactly as it will be sent).
///
/// * `secrets`: one `v1` entry is emitted per secret, in iteration order.
///   During a rotation pass the **new secret first, then the old one**; a
///   receiver accepts the delivery if any entry matches any secret it holds.
///   An empty iterator yields `t=<timestamp>` alone, which never verifies.
/// * `timestamp`: Unix time in **seconds** (not milliseconds) of this delivery
///   attempt; must be non-negative. Re-sign on every retry so the receiver's
///   replay window applies to the attempt, not to the original event.
/// * `body`: the exact bytes of the HTTP request body. Sign what you send; do
///   not re-serialise JSON between signing and sending.
///
/// Send the delivery id alongside as `Webhook-Id: evt_…` (see
/// [`signature_headers`]); in this format the id is **not** covered by the
/// signature.
///
/// # Examples
///
/// ```
/// use vid_webhooks::{sign_webhook_signature, Secret};
///
/// let new = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let header = sign_webhook_signature([&new], 1_700_000_000, br#"{"event":"video.ready","id":"vid_01"}"#);
/// assert_eq!(
///     header,
///     "t=1700000000,v1=d6ef319d9233ec7702a85b20de501782b438d3bda9cc0fbe91b9b7242665a94b",
/// );
///
/// // During a rotation: new secret first, then the old one.
/// let old = Secret::generate();
/// let header = sign_webhook_signature([&new, &old], 1_700_000_000, b"{}");
/// assert_eq!(header.matches(",v1=").count(), 2);
/// # Ok::<(), vid_webhooks::SecretError>(())
/// ```
#[must_use]
pub fn sign_webhook_signature<'a, I>(secrets: I, timestamp: i64, body: &[u8]) -> String
where
    I: IntoIterator<Item = &'a Secret>,
{
    debug_assert!(timestamp >= 0, "webhook timestamps are non-negative");
    let ts = timestamp.to_string();
    let content = ours_signed_content(&ts, body);
    let mut header = format!("t={ts}");
    for secret in secrets {
        let tag = hmac::sign(secret.key(), &content);
        header.push_str(",v1=");
        header.push_str(&hex::encode(tag.as_ref()));
    }
    header
}

/// Signs `body` per the [Standard Webhooks](https://www.standardwebhooks.com/)
/// specification and returns the value of the `webhook-signature` header.
///
/// The value is `v1,<sig>[ v1,<sig>…]` (entries separated by one space) where
/// each `<sig>` is the padded standard base64 of HMAC-SHA256, keyed with the
/// decoded bytes of a secret, over `"<msg_id>.<timestamp>.<body>"`.
///
/// * `secrets`: one entry per secret, in iteration order (new first during a
///   rotation). An empty iterator yields an empty string, which never verifies.
/// * `msg_id`: the value sent as `webhook-id`, e.g. `msg_…`/`evt_…`; it is
///   signed, so it must be sent byte-for-byte.
/// * `timestamp`: Unix time in **seconds**, sent as `webhook-timestamp`;
///   non-negative.
/// * `body`: the exact bytes of the HTTP request body.
///
/// # Examples
///
/// The specification's published test vector:
///
/// ```
/// use vid_webhooks::{sign_standard, Secret};
///
/// let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let header = sign_standard(
///     [&secret],
///     "msg_p5jXN8AQM9LWM0D4loKWxJek",
///     1_614_265_330,
///     br#"{"test": 2432232314}"#,
/// );
/// assert_eq!(header, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
/// # Ok::<(), vid_webhooks::SecretError>(())
/// ```
#[must_use]
pub fn sign_standard<'a, I>(secrets: I, msg_id: &str, timestamp: i64, body: &[u8]) -> String
where
    I: IntoIterator<Item = &'a Secret>,
{
    debug_assert!(timestamp >= 0, "webhook timestamps are non-negative");
    let content = standard_signed_content(msg_id, &timestamp.to_string(), body);
    let mut header = String::new();
    for secret in secrets {
        let tag = hmac::sign(secret.key(), &content);
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str("v1,");
        header.push_str(&STANDARD.encode(tag.as_ref()));
    }
    header
}

/// Returns every header a delivery in `scheme` needs, as lowercase
/// `(name, value)` pairs ready to add to the outgoing request.
///
/// * [`Scheme::WebhookSignature`]: `webhook-id` and `webhook-signature`
///   (see [`sign_webhook_signature`]).
/// * [`Scheme::StandardWebhooks`]: `webhook-id`, `webhook-timestamp` and
///   `webhook-signature` (see [`sign_standard`]).
///
/// Arguments are as for those functions; `msg_id` is the delivery id
/// (`evt_…`).
///
/// # Examples
///
/// ```
/// use vid_webhooks::{signature_headers, Scheme, Secret};
///
/// let secret = Secret::generate();
/// let headers = signature_headers(Scheme::StandardWebhooks, [&secret], "evt_1", 1_700_000_000, b"{}");
/// let names: Vec<&str> = headers.iter().map(|(name, _)| *name).collect();
/// assert_eq!(names, ["webhook-id", "webhook-timestamp", "webhook-signature"]);
/// ```
#[must_use]
pub fn signature_headers<'a, I>(scheme: Scheme, secrets: I, msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<(&'static str, String)>
where
    I: IntoIterator<Item = &'a Secret>,
{
    match scheme {
        Scheme::WebhookSignature => {
            vec![(names::WEBHOOK_ID, msg_id.to_owned()), (names::WEBHOOK_SIGNATURE, sign_webhook_signature(secrets, timestamp, body))]
        }
        Scheme::StandardWebhooks => vec![
            (names::WEBHOOK_ID, msg_id.to_owned()),
            (names::WEBHOOK_TIMESTAMP, timestamp.to_string()),
            (names::WEBHOOK_SIGNATURE, sign_standard(secrets, msg_id, timestamp, body)),
        ],
    }
}
