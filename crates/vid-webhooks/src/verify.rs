//! Verifying received deliveries (used by customers and our reference receiver).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use ring::hmac;

use crate::headers::{names, Headers};
use crate::scheme::Scheme;
use crate::secret::Secret;
use crate::secret::BASE64_LENIENT;
use crate::sign::{ours_signed_content, standard_signed_content};

/// Timestamps above this value (10^11) are reported as
/// [`VerifyError::TimestampInMilliseconds`]: as seconds they would be after
/// the year 5000, while as milliseconds they are any date after March 1973.
pub const MILLISECOND_THRESHOLD: i64 = 100_000_000_000;

/// The most `v1` signatures read from one header; a header carrying more is
/// [`VerifyError::HeaderMalformed`]. It bounds the HMAC work an unauthenticated
/// request can cause. Senders put one per active secret (two during a rotation).
pub const MAX_SIGNATURES: usize = 16;

/// Why a delivery was rejected.
///
/// Every variant has a stable [`code`](VerifyError::code) to log or return to
/// the sender; the `Display` text is for humans and may change.
///
/// Timestamp errors ([`TimestampTooOld`](VerifyError::TimestampTooOld),
/// [`TimestampTooNew`](VerifyError::TimestampTooNew),
/// [`TimestampInMilliseconds`](VerifyError::TimestampInMilliseconds)) are only
/// returned **after** a signature matched: they mean the delivery is authentic
/// but outside the replay window (a replay, a clock problem, or a sender bug).
/// Respond to every error with a 4xx status and do not process the event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A required header is absent: `webhook-signature` (both formats), or
    /// `webhook-id` (Standard Webhooks). Code `header_missing`.
    #[error("required header `{header}` is missing")]
    HeaderMissing {
        /// Lowercase name of the missing header.
        header: &'static str,
    },
    /// A header is present but cannot be parsed (not UTF-8, an entry without
    /// `=` or `,`, a non-numeric or duplicated timestamp, more than
    /// [`MAX_SIGNATURES`] signatures, …). Code `header_malformed`.
    #[error("header `{header}` is malformed: {reason}")]
    HeaderMalformed {
        /// Lowercase name of the offending header.
        header: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No timestamp: no `t=` entry in our `webhook-signature` header, or no
    /// `webhook-timestamp` header for Standard Webhooks. Code `timestamp_missing`.
    #[error("the delivery carries no timestamp (`t=` in webhook-signature, or webhook-timestamp)")]
    TimestampMissing,
    /// The signed timestamp is more than the tolerance before `now`.
    /// Code `timestamp_too_old`.
    #[error(
        "timestamp {timestamp} is {} s before now ({now}), beyond the {tolerance_secs} s tolerance",
        i128::from(*.now) - i128::from(*.timestamp)
    )]
    TimestampTooOld {
        /// The signed timestamp, Unix seconds.
        timestamp: i64,
        /// The receiver's current time used for the check, Unix seconds.
        now: i64,
        /// The tolerance in force, seconds.
        tolerance_secs: u64,
    },
    /// The signed timestamp is more than the tolerance after `now` (usually a
    /// clock out of sync). Code `timestamp_too_new`.
    #[error(
        "timestamp {timestamp} is {} s after now ({now}), beyond the {tolerance_secs} s tolerance",
        i128::from(*.timestamp) - i128::from(*.now)
    )]
    TimestampTooNew {
        /// The signed timestamp, Unix seconds.
        timestamp: i64,
        /// The receiver's current time used for the check, Unix seconds.
        now: i64,
        /// The tolerance in force, seconds.
        tolerance_secs: u64,
    },
    /// The signed timestamp exceeds [`MILLISECOND_THRESHOLD`]: the sender put
    /// milliseconds where Unix **seconds** are required.
    /// Code `timestamp_in_milliseconds`.
    #[error("timestamp {timestamp} looks like milliseconds since the epoch; webhook timestamps are Unix seconds")]
    TimestampInMilliseconds {
        /// The signed value as received.
        timestamp: i64,
    },
    /// None of the `v1` signatures matched any of the secrets: wrong secret,
    /// altered body (including re-serialised JSON or an added newline), or a
    /// forged request. Unknown schemes (`v0=`, `v1a,`…) are ignored and not
    /// counted. Code `no_matching_signature`.
    #[error("no signature matched ({signatures} v1 signature(s) checked against {secrets} secret(s))")]
    NoMatchingSignature {
        /// How many `v1` signatures the header carried.
        signatures: usize,
        /// How many secrets were tried.
        secrets: usize,
    },
    /// The caller passed no secrets; this is a receiver configuration error.
    /// Code `no_secrets`.
    #[error("no secrets were given to verify with")]
    NoSecrets,
}

impl VerifyError {
    /// A stable, machine-readable identifier for the error:
    ///
    /// | variant | code |
    /// |---|---|
    /// | [`HeaderMissing`](VerifyError::HeaderMissing) | `header_missing` |
    /// | [`HeaderMalformed`](VerifyError::HeaderMalformed) | `header_malformed` |
    /// | [`TimestampMissing`](VerifyError::TimestampMissing) | `timestamp_missing` |
    /// | [`TimestampTooOld`](VerifyError::TimestampTooOld) | `timestamp_too_old` |
    /// | [`TimestampTooNew`](VerifyError::TimestampTooNew) | `timestamp_too_new` |
    /// | [`TimestampInMilliseconds`](VerifyError::TimestampInMilliseconds) | `timestamp_in_milliseconds` |
    /// | [`NoMatchingSignature`](VerifyError::NoMatchingSignature) | `no_matching_signature` |
    /// | [`NoSecrets`](VerifyError::NoSecrets) | `no_secrets` |
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::HeaderMissing { .. } => "header_missing",
            VerifyError::HeaderMalformed { .. } => "header_malformed",
            VerifyError::TimestampMissing => "timestamp_missing",
            VerifyError::TimestampTooOld { .. } => "timestamp_too_old",
            VerifyError::TimestampTooNew { .. } => "timestamp_too_new",
            VerifyError::TimestampInMilliseconds { .. } => "timestamp_in_milliseconds",
            VerifyError::NoMatchingSignature { .. } => "no_matching_signature",
            VerifyError::NoSecrets => "no_secrets",
        }
    }
}

/// A successfully verified delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Verified {
    /// The format the delivery was signed in.
    pub scheme: Scheme,
    /// The signed timestamp, Unix seconds.
    pub timestamp: i64,
    /// The `webhook-id` header, if present (always present for Standard
    /// Webhooks). Use it to de-duplicate retries. In the
    /// [`WebhookSignature`](Scheme::WebhookSignature) format it is **not**
    /// covered by the signature.
    pub message_id: Option<String>,
    /// Index, in the `secrets` given to verify, of the secret that matched.
    /// Once no delivery matches an old secret any more, it can be dropped.
    pub secret_index: usize,
}

/// Verification options: timestamp tolerance and, optionally, a forced format.
///
/// [`Verifier::default()`] (same as [`Verifier::new()`]) allows
/// [`DEFAULT_TOLERANCE`](Verifier::DEFAULT_TOLERANCE) (300 s) of clock skew in
/// either direction and auto-detects the format:
///
/// * a `webhook-signature` header with a `t=` entry is our
///   [`WebhookSignature`](Scheme::WebhookSignature) format;
/// * otherwise, with a `webhook-timestamp` header, it is
///   [`StandardWebhooks`](Scheme::StandardWebhooks);
/// * otherwise the shape of `webhook-signature` decides (`v1=…` is ours,
///   `v1,…` is Standard Webhooks) and the result is
///   [`VerifyError::TimestampMissing`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use vid_webhooks::{Scheme, Verifier};
///
/// let verifier = Verifier::new()
///     .with_tolerance(Duration::from_secs(60))
///     .with_scheme(Scheme::StandardWebhooks);
/// assert_eq!(verifier.tolerance(), Duration::from_secs(60));
/// assert_eq!(Verifier::default().scheme(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verifier {
    tolerance: Duration,
    scheme: Option<Scheme>,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier::new()
    }
}

impl Verifier {
    /// The default accepted difference between the signed timestamp and the
    /// receiver's clock: 5 minutes, either direction.
    pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

    /// Default options: 300 s tolerance, format auto-detected.
    #[must_use]
    pub const fn new() -> Self {
        Verifier { tolerance: Self::DEFAULT_TOLERANCE, scheme: None }
    }

    /// Sets the accepted clock difference in either direction. Only whole
    /// seconds count (sub-second parts are dropped).
    #[must_use]
    pub const fn with_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// Accepts only `scheme` instead of auto-detecting the format.
    #[must_use]
    pub const fn with_scheme(mut self, scheme: Scheme) -> Self {
        self.scheme = Some(scheme);
        self
    }

    /// The accepted clock difference.
    #[must_use]
    pub const fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// The forced format, or `None` when auto-detecting.
    #[must_use]
    pub const fn scheme(&self) -> Option<Scheme> {
        self.scheme
    }

    /// Verifies a received delivery.
    ///
    /// * `secrets`: every secret currently valid for the endpoint (the new and
    ///   the old one during a rotation). The delivery is accepted when any `v1`
    ///   signature matches any secret.
    /// * `headers`: the request headers; see [`Headers`] for what is accepted.
    /// * `body`: the **raw** request body bytes exactly as received, before any
    ///   JSON parsing, decoding or trimming.
    /// * `now`: the receiver's current Unix time in **seconds**; pass it in for
    ///   deterministic tests, or use [`verify_now`](Verifier::verify_now).
    ///
    /// Each candidate signature is decoded and checked with
    /// [`ring::hmac::verify`] (constant-time). The timestamp window is checked
    /// only after a signature matched.
    ///
    /// # Errors
    ///
    /// A [`VerifyError`] saying why the delivery must be rejected.
    ///
    /// # Examples
    ///
    /// ```
    /// use vid_webhooks::{Scheme, Secret, Verifier, VerifyError};
    ///
    /// let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
    /// let body = br#"{"event":"video.ready","id":"vid_01"}"#;
    /// let headers = [
    ///     ("Webhook-Id", "evt_01"),
    ///     ("Webhook-Signature", "t=1700000000,v1=d6ef319d9233ec7702a85b20de501782b438d3bda9cc0fbe91b9b7242665a94b"),
    /// ];
    ///
    /// let verified = Verifier::new().verify([&secret], &headers, body, 1_700_000_100)?;
    /// assert_eq!(verified.scheme, Scheme::WebhookSignature);
    /// assert_eq!(verified.timestamp, 1_700_000_000);
    /// assert_eq!(verified.message_id.as_deref(), Some("evt_01"));
    ///
    /// // Ten minutes later the same delivery is a replay.
    /// let err = Verifier::new().verify([&secret], &headers, body, 1_700_000_600).unwrap_err();
    /// assert_eq!(err.code(), "timestamp_too_old");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify<'a, S, H>(&self, secrets: S, headers: &H, body: &[u8], now: i64) -> Result<Verified, VerifyError>
    where
        S: IntoIterator<Item = &'a Secret>,
        H: Headers + ?Sized,
    {
        let secrets: Vec<&Secret> = secrets.into_iter().collect();
        if secrets.is_empty() {
            return Err(VerifyError::NoSecrets);
        }

        let signature =
            header_text(headers, names::WEBHOOK_SIGNATURE)?.ok_or(VerifyError::HeaderMissing { header: names::WEBHOOK_SIGNATURE })?;
        let message_id = header_text(headers, names::WEBHOOK_ID)?;
        let scheme = match self.scheme {
            Some(scheme) => scheme,
            None => detect(signature, headers),
        };

        let (timestamp_text, candidates, content) = match scheme {
            Scheme::WebhookSignature => {
                let parsed = parse_ours(signature)?;
                let content = ours_signed_content(parsed.timestamp, body);
                (parsed.timestamp, parsed.candidates, content)
            }
            Scheme::StandardWebhooks => {
                let timestamp = header_text(headers, names::WEBHOOK_TIMESTAMP)?.ok_or(VerifyError::TimestampMissing)?;
                let id = message_id.ok_or(VerifyError::HeaderMissing { header: names::WEBHOOK_ID })?;
                let candidates = parse_standard(signature)?;
                let content = standard_signed_content(id, timestamp, body);
                (timestamp, candidates, content)
            }
        };
        let timestamp = parse_timestamp(timestamp_text, scheme)?;

        let secret_index = secrets
            .iter()
            .position(|secret| candidates.iter().flatten().any(|candidate| hmac::verify(secret.key(), &content, candidate).is_ok()))
            .ok_or(VerifyError::NoMatchingSignature { signatures: candidates.len(), secrets: secrets.len() })?;

        self.check_timestamp(timestamp, now)?;

        Ok(Verified { scheme, timestamp, message_id: message_id.map(str::to_owned), secret_index })
    }

    /// [`verify`](Verifier::verify) with `now` taken from the system clock.
    ///
    /// # Errors
    ///
    /// As for [`verify`](Verifier::verify).
    pub fn verify_now<'a, S, H>(&self, secrets: S, headers: &H, body: &[u8]) -> Result<Verified, VerifyError>
    where
        S: IntoIterator<Item = &'a Secret>,
        H: Headers + ?Sized,
    {
        self.verify(secrets, headers, body, unix_now())
    }

    fn check_timestamp(&self, timestamp: i64, now: i64) -> Result<(), VerifyError> {
        if timestamp > MILLISECOND_THRESHOLD {
            return Err(VerifyError::TimestampInMilliseconds { timestamp });
        }
        let tolerance_secs = self.tolerance.as_secs();
        let tolerance = i128::from(tolerance_secs);
        let age = i128::from(now) - i128::from(timestamp);
        if age > tolerance {
            Err(VerifyError::TimestampTooOld { timestamp, now, tolerance_secs })
        } else if -age > tolerance {
            Err(VerifyError::TimestampTooNew { timestamp, now, tolerance_secs })
        } else {
            Ok(())
        }
    }
}

/// Verifies a received delivery with the default [`Verifier`] (300 s
/// tolerance, format auto-detected). `now` is Unix seconds.
///
/// See [`Verifier::verify`] for the arguments and rules.
///
/// # Errors
///
/// A [`VerifyError`] saying why the delivery must be rejected.
///
/// # Examples
///
/// Verifying the Standard Webhooks specification's example delivery:
///
/// ```
/// use vid_webhooks::{verify, Scheme, Secret};
///
/// let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// let headers = [
///     ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
///     ("webhook-timestamp", "1614265330"),
///     ("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
/// ];
/// let verified = verify([&secret], &headers, br#"{"test": 2432232314}"#, 1_614_265_330)?;
/// assert_eq!(verified.scheme, Scheme::StandardWebhooks);
///
/// // One changed byte in the body:
/// let err = verify([&secret], &headers, br#"{"test": 2432232315}"#, 1_614_265_330).unwrap_err();
/// assert_eq!(err.code(), "no_matching_signature");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn verify<'a, S, H>(secrets: S, headers: &H, body: &[u8], now: i64) -> Result<Verified, VerifyError>
where
    S: IntoIterator<Item = &'a Secret>,
    H: Headers + ?Sized,
{
    Verifier::new().verify(secrets, headers, body, now)
}

/// [`verify`] using the system clock for `now`.
///
/// # Errors
///
/// As for [`verify`].
///
/// # Examples
///
/// ```
/// use std::time::{SystemTime, UNIX_EPOCH};
/// use vid_webhooks::{sign_webhook_signature, verify_now, Secret};
///
/// let secret = Secret::generate();
/// let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
/// let signature = sign_webhook_signature([&secret], now, b"{}");
/// verify_now([&secret], &[("Webhook-Signature", signature)], b"{}")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn verify_now<'a, S, H>(secrets: S, headers: &H, body: &[u8]) -> Result<Verified, VerifyError>
where
    S: IntoIterator<Item = &'a Secret>,
    H: Headers + ?Sized,
{
    Verifier::new().verify_now(secrets, headers, body)
}

fn unix_now() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// The header's value as trimmed text; `Ok(None)` when absent.
fn header_text<'h, H: Headers + ?Sized>(headers: &'h H, name: &'static str) -> Result<Option<&'h str>, VerifyError> {
    headers
        .header(name)
        .map(|bytes| {
            std::str::from_utf8(bytes)
                .map(|text| text.trim_matches([' ', '\t']))
                .map_err(|_| VerifyError::HeaderMalformed { header: name, reason: "value is not valid UTF-8" })
        })
        .transpose()
}

fn detect<H: Headers + ?Sized>(signature: &str, headers: &H) -> Scheme {
    let mut entries = signature.split(',').map(|entry| entry.trim_matches([' ', '\t']));
    if entries.clone().any(|entry| entry.starts_with("t=")) {
        Scheme::WebhookSignature
    } else if headers.header(names::WEBHOOK_TIMESTAMP).is_some() {
        Scheme::StandardWebhooks
    } else if entries.next().is_some_and(|first| first.contains('=')) {
        Scheme::WebhookSignature
    } else {
        Scheme::StandardWebhooks
    }
}

struct Ours<'h> {
    timestamp: &'h str,
    /// Decoded `v1` signatures; `None` for one that is not valid hex.
    candidates: Vec<Option<Vec<u8>>>,
}

fn malformed_signature(reason: &'static str) -> VerifyError {
    VerifyError::HeaderMalformed { header: names::WEBHOOK_SIGNATURE, reason }
}

/// Parses `t=<ts>,v1=<hex>[,v1=<hex>…]`, tolerating spaces around entries and
/// ignoring unknown keys.
fn parse_ours(value: &str) -> Result<Ours<'_>, VerifyError> {
    let mut timestamp = None;
    let mut candidates = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim_matches([' ', '\t']);
        let (key, val) = entry.split_once('=').ok_or_else(|| malformed_signature("an entry is not of the form `key=value`"))?;
        match key {
            "t" if timestamp.is_some() => {
                return Err(malformed_signature("`t=` appears more than once"));
            }
            "t" => timestamp = Some(val),
            "v1" => {
                if candidates.len() == MAX_SIGNATURES {
                    return Err(malformed_signature("too many `v1` signatures"));
                }
                candidates.push(hex::decode(val).ok());
            }
            _ => {} // other schemes (v0=, future versions): ignored
        }
    }
    Ok(Ours { timestamp: timestamp.ok_or(VerifyError::TimestampMissing)?, candidates })
}

/// Parses `v1,<b64>[ v1,<b64>…]`: `version,signature` pairs separated by
/// spaces (a comma or a space after the comma is tolerated). Unknown versions
/// are ignored.
fn parse_standard(value: &str) -> Result<Vec<Option<Vec<u8>>>, VerifyError> {
    let tokens: Vec<&str> = value.split(|c: char| c == ',' || c.is_ascii_whitespace()).filter(|token| !token.is_empty()).collect();
    if tokens.len() % 2 != 0 {
        return Err(malformed_signature("expected space-separated `version,signature` entries"));
    }
    let mut candidates = Vec::new();
    for pair in tokens.chunks_exact(2) {
        if pair[0] == "v1" {
            if candidates.len() == MAX_SIGNATURES {
                return Err(malformed_signature("too many `v1` signatures"));
            }
            candidates.push(BASE64_LENIENT.decode(pair[1]).ok());
        }
    }
    Ok(candidates)
}

/// Parses unsigned decimal Unix seconds.
fn parse_timestamp(text: &str, scheme: Scheme) -> Result<i64, VerifyError> {
    let header = match scheme {
        Scheme::WebhookSignature => names::WEBHOOK_SIGNATURE,
        Scheme::StandardWebhooks => names::WEBHOOK_TIMESTAMP,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::HeaderMalformed { header, reason: "timestamp is not an unsigned decimal integer" });
    }
    text.parse().map_err(|_| VerifyError::HeaderMalformed { header, reason: "timestamp is out of range" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ours_tolerates_spaces_and_ignores_unknown_schemes() {
        let parsed = parse_ours("t=12 , v0=zz,\tv1=00ff, v2=abc").unwrap();
        assert_eq!(parsed.timestamp, "12");
        assert_eq!(parsed.candidates, vec![Some(vec![0, 255])]);
    }

    #[test]
    fn parse_ours_rejects_garbage() {
        for bad in ["t=1,v1", "t=1,t=2,v1=00", "", "t=1,,v1=00"] {
            let err = parse_ours(bad).err().unwrap();
            assert_eq!(err.code(), "header_malformed", "{bad:?}");
        }
        assert_eq!(parse_ours("v1=00").err(), Some(VerifyError::TimestampMissing));
        let many = format!("t=1{}", ",v1=00".repeat(MAX_SIGNATURES + 1));
        assert_eq!(parse_ours(&many).err().unwrap().code(), "header_malformed");
    }

    #[test]
    fn parse_standard_pairs() {
        let got = parse_standard("v1,AAE= v1a,AAAA v2,x  v1, AAI=,v1,AAM").unwrap();
        assert_eq!(got, vec![Some(vec![0, 1]), Some(vec![0, 2]), Some(vec![0, 3])]);
        assert_eq!(parse_standard("v1,AAE= v1").err().unwrap().code(), "header_malformed");
        assert_eq!(parse_standard("v1,%%%").unwrap(), vec![None]);
    }

    #[test]
    fn timestamps_must_be_plain_digits() {
        for bad in ["", "-1", "+1", "1.5", "1e9", "99999999999999999999"] {
            assert_eq!(parse_timestamp(bad, Scheme::StandardWebhooks).err().unwrap().code(), "header_malformed", "{bad:?}");
        }
        assert_eq!(parse_timestamp("0017", Scheme::WebhookSignature), Ok(17));
    }

    #[test]
    fn window_edges_are_inclusive() {
        let v = Verifier::new().with_tolerance(Duration::from_secs(10));
        assert!(v.check_timestamp(100, 110).is_ok());
        assert!(v.check_timestamp(110, 100).is_ok());
        assert_eq!(v.check_timestamp(100, 111).unwrap_err().code(), "timestamp_too_old");
        assert_eq!(v.check_timestamp(111, 100).unwrap_err().code(), "timestamp_too_new");
        assert_eq!(
            v.check_timestamp(MILLISECOND_THRESHOLD + 1, MILLISECOND_THRESHOLD + 1).unwrap_err().code(),
            "timestamp_in_milliseconds"
        );
        // No overflow at the extremes.
        assert!(v.check_timestamp(0, i64::MIN).is_err());
        assert!(v.check_timestamp(0, i64::MAX).is_err());
    }

    #[test]
    fn error_messages_mention_the_skew() {
        let err = VerifyError::TimestampTooOld { timestamp: 100, now: 500, tolerance_secs: 300 };
        assert_eq!(err.to_string(), "timestamp 100 is 400 s before now (500), beyond the 300 s tolerance");
    }
}
