//! Property: anything signed verifies, and any single-byte change does not.
//!
//! Uses a fixed-seed xorshift generator so a failure is reproducible; the
//! failing iteration's inputs are printed.

use vid_webhooks::{signature_headers, Scheme, Secret, Verifier};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn sign_then_verify_round_trips_for_random_bodies() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let pool: Vec<Secret> = (0..4).map(|_| Secret::generate()).collect();
    let outsider = Secret::generate();

    for iteration in 0..500 {
        let scheme = if rng.below(2) == 0 { Scheme::WebhookSignature } else { Scheme::StandardWebhooks };
        let len = match rng.below(4) {
            0 => 0,
            1 => rng.below(16) as usize,
            _ => rng.below(4096) as usize,
        };
        let body = rng.bytes(len);
        let timestamp = rng.below(10_000_000_000) as i64;
        let now = timestamp + rng.below(601) as i64 - 300;
        let msg_id = format!("evt_{:x}", rng.next());

        // Sign with 1..=3 secrets; verify holding one of them plus outsiders.
        let signers: Vec<&Secret> = (0..=rng.below(3)).map(|i| &pool[i as usize]).collect();
        let holder = signers[rng.below(signers.len() as u64) as usize];
        let held = [&outsider, holder];
        let headers = signature_headers(scheme, signers.iter().copied(), &msg_id, timestamp, &body);
        let ctx = format!("iteration {iteration}: {scheme}, body {body:?}, t={timestamp}, now={now}, headers {headers:?}");

        let verified = Verifier::new().verify(held, &headers, &body, now).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(verified.timestamp, timestamp, "{ctx}");
        assert_eq!(verified.secret_index, 1, "{ctx}");
        assert_eq!(verified.scheme, scheme, "{ctx}");
        assert_eq!(verified.message_id.as_deref(), Some(msg_id.as_str()), "{ctx}");

        // Flip one byte, or append one: must not verify.
        let mut tampered = body.clone();
        if tampered.is_empty() || rng.below(4) == 0 {
            tampered.push(rng.next() as u8);
        } else {
            let at = rng.below(tampered.len() as u64) as usize;
            tampered[at] ^= 1 + rng.below(255) as u8;
        }
        let err = Verifier::new().verify(held, &headers, &tampered, now).unwrap_err();
        assert_eq!(err.code(), "no_matching_signature", "{ctx}");

        // A secret that did not sign: must not verify.
        let err = Verifier::new().verify([&outsider], &headers, &body, now).unwrap_err();
        assert_eq!(err.code(), "no_matching_signature", "{ctx}");
    }
}
