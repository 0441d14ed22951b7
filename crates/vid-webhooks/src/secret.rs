//! The [`Secret`] newtype: a `whsec_…` signing secret.

use std::fmt;
use std::str::FromStr;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The text every secret starts with (Standard Webhooks convention).
pub const SECRET_PREFIX: &str = "whsec_";

/// The smallest accepted key, in decoded bytes (192 bits).
pub const MIN_SECRET_BYTES: usize = 24;

/// The size of a key made by [`Secret::generate`], in bytes (256 bits).
pub const GENERATED_SECRET_BYTES: usize = 32;

/// Standard base64 alphabet; the trailing `=` padding may be present or not.
pub(crate) const BASE64_LENIENT: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

/// Why a text could not be used as a [`Secret`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The text does not start with `whsec_`.
    #[error("webhook secret must start with `whsec_`")]
    MissingPrefix,
    /// The text after `whsec_` is not standard base64.
    #[error("webhook secret is not valid base64 after the `whsec_` prefix")]
    InvalidBase64,
    /// The key is shorter than [`MIN_SECRET_BYTES`].
    #[error("webhook secret decodes to {len} bytes; at least {min} are required", min = MIN_SECRET_BYTES)]
    TooShort {
        /// Decoded length of the rejected key, in bytes.
        len: usize,
    },
    /// The operating system's random number generator failed
    /// (only from [`Secret::try_generate`]).
    #[error("the system random number generator failed")]
    Rng,
}

impl SecretError {
    /// A stable, machine-readable identifier for the error, safe to log and
    /// to match on: `secret_missing_prefix`, `secret_invalid_base64`,
    /// `secret_too_short` or `secret_rng_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            SecretError::MissingPrefix => "secret_missing_prefix",
            SecretError::InvalidBase64 => "secret_invalid_base64",
            SecretError::TooShort { .. } => "secret_too_short",
            SecretError::Rng => "secret_rng_failed",
        }
    }
}

/// A webhook signing secret: `whsec_` followed by the standard base64 of at
/// least [`MIN_SECRET_BYTES`] random bytes.
///
/// The HMAC-SHA256 key is the **decoded** bytes, not the `whsec_…` text, as in
/// the [Standard Webhooks](https://www.standardwebhooks.com/) specification;
/// both signature formats of this crate use the same key.
///
/// * [`Display`](fmt::Display) and [`as_str`](Secret::as_str) give the full
///   `whsec_…` text, which is what the customer is shown (once) and pastes
///   into their receiver.
/// * [`Debug`](fmt::Debug) never shows the value, so a `Secret` inside a
///   logged struct does not leak.
///
/// # Examples
///
/// ```
/// use vid_webhooks::Secret;
///
/// let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// assert_eq!(secret.to_string(), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
/// assert_eq!(format!("{secret:?}"), "Secret(\"whsec_[redacted]\")");
///
/// let fresh = Secret::generate();
/// assert!(fresh.as_str().starts_with("whsec_"));
/// # Ok::<(), vid_webhooks::SecretError>(())
/// ```
#[derive(Clone)]
pub struct Secret {
    text: String,
    key: hmac::Key,
}

impl Secret {
    /// Creates a new secret from [`GENERATED_SECRET_BYTES`] (32) bytes of
    /// [`ring::rand::SystemRandom`].
    ///
    /// # Panics
    ///
    /// If the operating system's random number generator fails, which does not
    /// happen on supported platforms. Use [`Secret::try_generate`] to get an
    /// error instead.
    #[must_use]
    pub fn generate() -> Secret {
        Secret::try_generate().expect("system random number generator failed")
    }

    /// Like [`Secret::generate`], but returns [`SecretError::Rng`] instead of
    /// panicking if the random number generator fails.
    ///
    /// # Errors
    ///
    /// [`SecretError::Rng`] when `SystemRandom::fill` fails.
    pub fn try_generate() -> Result<Secret, SecretError> {
        let mut bytes = [0u8; GENERATED_SECRET_BYTES];
        SystemRandom::new().fill(&mut bytes).map_err(|_| SecretError::Rng)?;
        Secret::from_bytes(&bytes)
    }

    /// Parses the `whsec_<base64>` text of a secret.
    ///
    /// Surrounding whitespace (e.g. a newline from an environment file) is
    /// ignored. The base64 must use the standard alphabet (`+`, `/`); the `=`
    /// padding may be omitted.
    ///
    /// # Errors
    ///
    /// * [`SecretError::MissingPrefix`] when the text does not start with `whsec_`;
    /// * [`SecretError::InvalidBase64`] when the rest is not standard base64;
    /// * [`SecretError::TooShort`] when it decodes to fewer than
    ///   [`MIN_SECRET_BYTES`] bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use vid_webhooks::{Secret, SecretError};
    ///
    /// assert!(Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
    /// assert_eq!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(), SecretError::MissingPrefix);
    /// assert_eq!(Secret::parse("whsec_c2hvcnQ=").unwrap_err(), SecretError::TooShort { len: 5 });
    /// ```
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let text = text.trim();
        let encoded = text.strip_prefix(SECRET_PREFIX).ok_or(SecretError::MissingPrefix)?;
        let bytes = BASE64_LENIENT.decode(encoded).map_err(|_| SecretError::InvalidBase64)?;
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { len: bytes.len() });
        }
        Ok(Secret { text: text.to_owned(), key: hmac::Key::new(hmac::HMAC_SHA256, &bytes) })
    }

    /// Wraps raw key bytes (for example read from a key store); the text form
    /// is `whsec_` + padded standard base64 of `bytes`.
    ///
    /// # Errors
    ///
    /// [`SecretError::TooShort`] when `bytes` is shorter than [`MIN_SECRET_BYTES`].
    ///
    /// # Examples
    ///
    /// ```
    /// use vid_webhooks::Secret;
    ///
    /// let secret = Secret::from_bytes(&[0u8; 24])?;
    /// assert_eq!(secret.as_str(), "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    /// # Ok::<(), vid_webhooks::SecretError>(())
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Secret, SecretError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { len: bytes.len() });
        }
        Ok(Secret { text: format!("{SECRET_PREFIX}{}", STANDARD.encode(bytes)), key: hmac::Key::new(hmac::HMAC_SHA256, bytes) })
    }

    /// The full `whsec_…` text. Treat it like a password.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The HMAC-SHA256 key made from the decoded bytes.
    pub(crate) fn key(&self) -> &hmac::Key {
        &self.key
    }
}

impl fmt::Display for Secret {
    /// Writes the full `whsec_…` text (the secret itself).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Secret {
    /// Writes `Secret("whsec_[redacted]")`, never the value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Secret").field(&format_args!("\"{SECRET_PREFIX}[redacted]\"")).finish()
    }
}

impl FromStr for Secret {
    type Err = SecretError;

    /// Same as [`Secret::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Secret::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_are_32_bytes_distinct_and_reparse() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_ne!(a.as_str(), b.as_str());
        let encoded = a.as_str().strip_prefix(SECRET_PREFIX).unwrap();
        assert_eq!(STANDARD.decode(encoded).unwrap().len(), 32);
        assert_eq!(Secret::parse(a.as_str()).unwrap().as_str(), a.as_str());
    }

    #[test]
    fn parse_rejections() {
        assert_eq!(Secret::parse("").unwrap_err(), SecretError::MissingPrefix);
        assert_eq!(Secret::parse("WHSEC_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(), SecretError::MissingPrefix);
        assert_eq!(Secret::parse("whsec_not base64!").unwrap_err(), SecretError::InvalidBase64);
        // URL-safe alphabet is not the standard one.
        assert_eq!(Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa-_").unwrap_err(), SecretError::InvalidBase64);
        // 23 bytes
        let short = format!("whsec_{}", STANDARD.encode([7u8; 23]));
        assert_eq!(Secret::parse(&short).unwrap_err(), SecretError::TooShort { len: 23 });
        assert_eq!(SecretError::TooShort { len: 1 }.code(), "secret_too_short");
    }

    #[test]
    fn parse_accepts_unpadded_and_surrounding_whitespace() {
        let padded = format!("whsec_{}", STANDARD.encode([9u8; 32]));
        assert!(padded.ends_with('='));
        let unpadded = padded.trim_end_matches('=');
        let a = Secret::parse(&padded).unwrap();
        let b = Secret::parse(unpadded).unwrap();
        let c = Secret::parse(&format!("  {padded}\n")).unwrap();
        assert_eq!(c.as_str(), padded);
        let tag_a = hmac::sign(a.key(), b"x");
        assert!(hmac::verify(b.key(), b"x", tag_a.as_ref()).is_ok());
    }

    #[test]
    fn debug_redacts_and_display_shows() {
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let dbg = format!("{s:?} {:#?}", Some(&s));
        assert!(!dbg.contains("MfKQ9r8"), "{dbg}");
        assert!(dbg.contains("redacted"));
        assert_eq!(format!("{s}"), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    }
}
