//! Sealing secrets at rest with AES-256-GCM (`ring::aead`).
//!
//! Webhook signing secrets must be readable by the dispatcher (it signs with
//! them), so they cannot be hashed; they are sealed under a 32-byte master key
//! from the settings (`webhooks.secret_key`, hex) instead. A sealed value is
//! `nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)`; the endpoint id is bound
//! as associated data, so a sealed secret copied to another row does not open.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Why sealing or opening failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The master key is not 64 hex characters (32 bytes).
    #[error("the sealing key must be 32 bytes written as 64 hex characters")]
    BadKey,
    /// The sealed value was tampered with, truncated, bound to another id, or sealed under another key.
    #[error("the sealed secret does not open under this key and id")]
    Open,
    /// The system RNG failed.
    #[error("the system random number generator failed")]
    Rng,
}

/// The master key that seals and opens secrets.
pub struct SealingKey(LessSafeKey);

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealingKey(<redacted>)")
    }
}

impl SealingKey {
    /// Parses a 32-byte key written as 64 hex characters.
    pub fn from_hex(hex_key: &str) -> Result<Self, SealError> {
        let bytes = decode_hex(hex_key.trim()).ok_or(SealError::BadKey)?;
        if bytes.len() != 32 {
            return Err(SealError::BadKey);
        }
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| SealError::BadKey)?;
        Ok(Self(LessSafeKey::new(key)))
    }

    /// Seals `plaintext`, binding it to `context` (the owning row's id).
    pub fn seal(&self, context: &str, plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| SealError::Rng)?;
        let mut buf = plaintext.to_vec();
        self.0
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(context.as_bytes()), &mut buf)
            .map_err(|_| SealError::Rng)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(out)
    }

    /// Opens a value produced by [`SealingKey::seal`] with the same `context`.
    pub fn open(&self, context: &str, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(SealError::Open);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
        let mut buf = body.to_vec();
        let plain = self.0.open_in_place(nonce, Aad::from(context.as_bytes()), &mut buf).map_err(|_| SealError::Open)?;
        Ok(plain.to_vec())
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn seals_and_opens_bound_to_context() {
        let key = SealingKey::from_hex(KEY).unwrap();
        let sealed = key.seal("ep_a", b"whsec_secret").unwrap();
        assert_ne!(&sealed[12..], b"whsec_secret".as_slice());
        assert_eq!(key.open("ep_a", &sealed).unwrap(), b"whsec_secret");
        assert!(matches!(key.open("ep_b", &sealed), Err(SealError::Open)));
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(matches!(key.open("ep_a", &tampered), Err(SealError::Open)));
        let other = SealingKey::from_hex(&KEY.replace("1f", "ff")).unwrap();
        assert!(matches!(other.open("ep_a", &sealed), Err(SealError::Open)));
    }

    #[test]
    fn refuses_bad_keys() {
        assert!(matches!(SealingKey::from_hex("abcd"), Err(SealError::BadKey)));
        assert!(matches!(SealingKey::from_hex(&"zz".repeat(32)), Err(SealError::BadKey)));
        assert_eq!(format!("{:?}", SealingKey::from_hex(KEY).unwrap()), "SealingKey(<redacted>)");
    }
}
