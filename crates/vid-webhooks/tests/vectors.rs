//! Signature vectors for both formats.
//!
//! The expected signatures below were NOT produced by this crate:
//! * the Standard Webhooks vector is the one published with the specification
//!   and its reference libraries;
//! * the others were computed once with OpenSSL from the decoded key
//!   (hex `31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0`, i.e.
//!   `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`):
//!
//! ```text
//! printf '%s' "$t.$body"       | openssl dgst -sha256 -mac HMAC -macopt hexkey:$key
//! printf '%s' "$id.$t.$body"   | openssl dgst -sha256 -mac HMAC -macopt hexkey:$key -binary | base64
//! ```

use std::time::Duration;

use vid_webhooks::{sign_standard, sign_webhook_signature, Scheme, Secret, Verified, Verifier, VerifyError};

const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SPEC_TS: i64 = 1_614_265_330;
const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
const SPEC_SIG: &str = "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

const TS: i64 = 1_700_000_000;
const ID: &str = "evt_01";
const ASCII_BODY: &str = r#"{"event":"video.ready","id":"vid_01"}"#;
/// openssl: HMAC(key, "1700000000." + ASCII_BODY), hex.
const ASCII_HEX: &str = "d6ef319d9233ec7702a85b20de501782b438d3bda9cc0fbe91b9b7242665a94b";
/// `{"event":"video.ready","id":"vid_01","title":"Crème brûlée 🎬"}` (NFC).
const UNICODE_BODY: &str = "{\"event\":\"video.ready\",\"id\":\"vid_01\",\"title\":\"Cr\u{e8}me br\u{fb}l\u{e9}e \u{1f3ac}\"}";
/// openssl: HMAC(key, "1700000000." + UNICODE_BODY), hex.
const UNICODE_HEX: &str = "93a6e008a98dd7079744bc44bf87d6a8a48b5db51bda226cda04054bacae99d4";
/// openssl: HMAC(key, "evt_01.1700000000." + UNICODE_BODY), base64.
const UNICODE_B64: &str = "rgJ4d/IuVYo4/e1ys9Ghd9K89qlOb8ZS+UlshTGGAEI=";

fn spec_secret() -> Secret {
    Secret::parse(SPEC_SECRET).unwrap()
}

/// A second, unrelated secret (the "old" one in rotation cases).
fn other_secret() -> Secret {
    Secret::from_bytes(&[0x42; 32]).unwrap()
}

fn other_hex(ts: i64, body: &str) -> String {
    let header = sign_webhook_signature([&other_secret()], ts, body.as_bytes());
    header.split_once(",v1=").unwrap().1.to_owned()
}

fn other_b64(id: &str, ts: i64, body: &str) -> String {
    sign_standard([&other_secret()], id, ts, body.as_bytes()).strip_prefix("v1,").unwrap().to_owned()
}

fn ours(signature: String) -> Vec<(&'static str, String)> {
    vec![("Webhook-Id", ID.to_owned()), ("Webhook-Signature", signature)]
}

fn standard(id: &str, ts: &str, signature: String) -> Vec<(&'static str, String)> {
    vec![("webhook-id", id.to_owned()), ("webhook-timestamp", ts.to_owned()), ("webhook-signature", signature)]
}

struct Case {
    name: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    now: i64,
    /// `Ok((scheme, timestamp))` or `Err(code)`.
    expect: Result<(Scheme, i64), &'static str>,
}

fn case(
    name: &'static str,
    headers: Vec<(&'static str, String)>,
    body: impl Into<Vec<u8>>,
    now: i64,
    expect: Result<(Scheme, i64), &'static str>,
) -> Case {
    Case { name, headers, body: body.into(), now, expect }
}

#[test]
fn signature_vectors() {
    use Scheme::{StandardWebhooks as Std, WebhookSignature as Ours};

    let ms = TS * 1000;
    let ms_header = sign_webhook_signature([&spec_secret()], ms, ASCII_BODY.as_bytes());
    let ms_std = sign_standard([&spec_secret()], ID, ms, UNICODE_BODY.as_bytes());
    let changed_byte = ASCII_BODY.replace("vid_01", "vid_02");
    let unaccented = UNICODE_BODY.replace('\u{e8}', "e");
    let spec_ts = SPEC_TS.to_string();
    let ts = TS.to_string();

    #[rustfmt::skip]
    let cases = vec![
        // ---- webhook-signature (ours) ----
        case("ours: valid", ours(format!("t={TS},v1={ASCII_HEX}")), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: one body byte changed", ours(format!("t={TS},v1={ASCII_HEX}")), changed_byte.as_str(), TS, Err("no_matching_signature")),
        case("ours: trailing newline not signed", ours(format!("t={TS},v1={ASCII_HEX}")), format!("{ASCII_BODY}\n"), TS, Err("no_matching_signature")),
        case("ours: non-ASCII body", ours(format!("t={TS},v1={UNICODE_HEX}")), UNICODE_BODY, TS, Ok((Ours, TS))),
        case("ours: non-ASCII body, accent dropped", ours(format!("t={TS},v1={UNICODE_HEX}")), unaccented.as_str(), TS, Err("no_matching_signature")),
        case("ours: signed timestamp altered", ours(format!("t={},v1={ASCII_HEX}", TS + 1)), ASCII_BODY, TS, Err("no_matching_signature")),
        case("ours: several v1, good first", ours(format!("t={TS},v1={ASCII_HEX},v1={}", other_hex(TS, ASCII_BODY))), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: several v1, good last", ours(format!("t={TS},v1={},v1=zz,v1={ASCII_HEX}", other_hex(TS, ASCII_BODY))), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: several v1, none good", ours(format!("t={TS},v1={},v1={}", other_hex(TS, ASCII_BODY), &ASCII_HEX[..62])), ASCII_BODY, TS, Err("no_matching_signature")),
        case("ours: space after commas", ours(format!("t={TS}, v1={}, v1={ASCII_HEX}", other_hex(TS, ASCII_BODY))), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: timestamp not first", ours(format!("v1={ASCII_HEX},t={TS}")), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: unknown scheme ignored even if it matches", ours(format!("t={TS},v0={ASCII_HEX}")), ASCII_BODY, TS, Err("no_matching_signature")),
        case("ours: unknown scheme beside a good v1", ours(format!("t={TS},v0=abc,v2=xyz,v1={ASCII_HEX}")), ASCII_BODY, TS, Ok((Ours, TS))),
        case("ours: at the edge of the window", ours(format!("t={TS},v1={ASCII_HEX}")), ASCII_BODY, TS + 300, Ok((Ours, TS))),
        case("ours: stale", ours(format!("t={TS},v1={ASCII_HEX}")), ASCII_BODY, TS + 301, Err("timestamp_too_old")),
        case("ours: future", ours(format!("t={TS},v1={ASCII_HEX}")), ASCII_BODY, TS - 301, Err("timestamp_too_new")),
        case("ours: milliseconds", ours(ms_header.clone()), ASCII_BODY, TS, Err("timestamp_in_milliseconds")),
        case("ours: milliseconds but forged", ours(format!("t={ms},v1={}", "00".repeat(32))), ASCII_BODY, TS, Err("no_matching_signature")),
        case("ours: missing timestamp", ours(format!("v1={ASCII_HEX}")), ASCII_BODY, TS, Err("timestamp_missing")),
        case("ours: non-numeric timestamp", ours(format!("t=17e8,v1={ASCII_HEX}")), ASCII_BODY, TS, Err("header_malformed")),
        case("ours: garbage entry", ours(format!("t={TS},v1={ASCII_HEX},junk")), ASCII_BODY, TS, Err("header_malformed")),
        case("ours: signature header missing", vec![("Webhook-Id", ID.to_owned())], ASCII_BODY, TS, Err("header_missing")),
        case("ours: header names in any case", vec![("WEBHOOK-SIGNATURE", format!("t={TS},v1={ASCII_HEX}"))], ASCII_BODY, TS, Ok((Ours, TS))),
        // ---- Standard Webhooks ----
        case("std: published spec vector", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: one body byte changed", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), r#"{"test": 2432232315}"#, SPEC_TS, Err("no_matching_signature")),
        case("std: trailing newline not signed", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), format!("{SPEC_BODY}\n"), SPEC_TS, Err("no_matching_signature")),
        case("std: re-serialised JSON", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), r#"{"test":2432232314}"#, SPEC_TS, Err("no_matching_signature")),
        case("std: message id is signed", standard("msg_other", &spec_ts, format!("v1,{SPEC_SIG}")), SPEC_BODY, SPEC_TS, Err("no_matching_signature")),
        case("std: non-ASCII body", standard(ID, &ts, format!("v1,{UNICODE_B64}")), UNICODE_BODY, TS, Ok((Std, TS))),
        case("std: non-ASCII body, accent dropped", standard(ID, &ts, format!("v1,{UNICODE_B64}")), unaccented.as_str(), TS, Err("no_matching_signature")),
        case("std: several v1, good first", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG} v1,{}", other_b64(SPEC_ID, SPEC_TS, SPEC_BODY))), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: several v1, good last", standard(SPEC_ID, &spec_ts, format!("v1,{} v1,{SPEC_SIG}", other_b64(SPEC_ID, SPEC_TS, SPEC_BODY))), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: space after the comma", standard(SPEC_ID, &spec_ts, format!("v1, {SPEC_SIG}")), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: comma-and-space separated entries", standard(SPEC_ID, &spec_ts, format!("v1,{}, v1,{SPEC_SIG}", other_b64(SPEC_ID, SPEC_TS, SPEC_BODY))), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: unpadded base64", standard(SPEC_ID, &spec_ts, format!("v1,{}", SPEC_SIG.trim_end_matches('='))), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: unknown version ignored even if it matches", standard(SPEC_ID, &spec_ts, format!("v1a,{SPEC_SIG}")), SPEC_BODY, SPEC_TS, Err("no_matching_signature")),
        case("std: unknown version beside a good v1", standard(SPEC_ID, &spec_ts, format!("v1a,AAAA v2,xyz v1,{SPEC_SIG}")), SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
        case("std: stale", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), SPEC_BODY, SPEC_TS + 301, Err("timestamp_too_old")),
        case("std: future", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG}")), SPEC_BODY, SPEC_TS - 301, Err("timestamp_too_new")),
        case("std: milliseconds", standard(ID, &ms.to_string(), ms_std), UNICODE_BODY, TS, Err("timestamp_in_milliseconds")),
        case("std: missing timestamp", vec![("webhook-id", SPEC_ID.to_owned()), ("webhook-signature", format!("v1,{SPEC_SIG}"))], SPEC_BODY, SPEC_TS, Err("timestamp_missing")),
        case("std: missing id", vec![("webhook-timestamp", spec_ts.clone()), ("webhook-signature", format!("v1,{SPEC_SIG}"))], SPEC_BODY, SPEC_TS, Err("header_missing")),
        case("std: dangling entry", standard(SPEC_ID, &spec_ts, format!("v1,{SPEC_SIG} v1")), SPEC_BODY, SPEC_TS, Err("header_malformed")),
        case("std: mixed-case header names", vec![("Webhook-Id", SPEC_ID.to_owned()), ("WEBHOOK-TIMESTAMP", spec_ts.clone()), ("Webhook-Signature", format!("v1,{SPEC_SIG}"))], SPEC_BODY, SPEC_TS, Ok((Std, SPEC_TS))),
    ];

    let secret = spec_secret();
    let mut failures = Vec::new();
    for c in &cases {
        let got = Verifier::new().verify([&secret], &c.headers, &c.body, c.now).map(|v| (v.scheme, v.timestamp)).map_err(|e| e.code());
        if got != c.expect {
            failures.push(format!("{}: expected {:?}, got {:?}", c.name, c.expect, got));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn signing_reproduces_the_independent_vectors() {
    let secret = spec_secret();
    assert_eq!(sign_standard([&secret], SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes()), format!("v1,{SPEC_SIG}"));
    assert_eq!(sign_standard([&secret], ID, TS, UNICODE_BODY.as_bytes()), format!("v1,{UNICODE_B64}"));
    assert_eq!(sign_webhook_signature([&secret], TS, ASCII_BODY.as_bytes()), format!("t={TS},v1={ASCII_HEX}"));
    assert_eq!(sign_webhook_signature([&secret], TS, UNICODE_BODY.as_bytes()), format!("t={TS},v1={UNICODE_HEX}"));
    // Rotation: new first, then old; Standard Webhooks separates with a space.
    let both = sign_standard([&secret, &other_secret()], SPEC_ID, SPEC_TS, SPEC_BODY.as_bytes());
    assert_eq!(both, format!("v1,{SPEC_SIG} v1,{}", other_b64(SPEC_ID, SPEC_TS, SPEC_BODY)));
    let both = sign_webhook_signature([&secret, &other_secret()], TS, ASCII_BODY.as_bytes());
    assert_eq!(both, format!("t={TS},v1={ASCII_HEX},v1={}", other_hex(TS, ASCII_BODY)));
}

#[test]
fn rotation_reports_which_secret_matched() {
    let new = spec_secret();
    let old = other_secret();
    let unrelated = Secret::generate();
    let header = sign_webhook_signature([&new, &old], TS, ASCII_BODY.as_bytes());
    let headers = [("webhook-signature", header.as_str())];
    let check =
        |secrets: &[&Secret]| Verifier::new().verify(secrets.iter().copied(), &headers, ASCII_BODY.as_bytes(), TS).map(|v| v.secret_index);
    assert_eq!(check(&[&unrelated, &old]), Ok(1));
    assert_eq!(check(&[&new]), Ok(0));
    assert_eq!(check(&[&unrelated]), Err(VerifyError::NoMatchingSignature { signatures: 2, secrets: 1 }));
    assert_eq!(check(&[]), Err(VerifyError::NoSecrets));
}

#[test]
fn verified_carries_id_and_timestamp() {
    let headers = standard(SPEC_ID, &SPEC_TS.to_string(), format!("v1,{SPEC_SIG}"));
    let verified: Verified = vid_webhooks::verify([&spec_secret()], &headers, SPEC_BODY.as_bytes(), SPEC_TS + 5).unwrap();
    assert_eq!(verified.scheme, Scheme::StandardWebhooks);
    assert_eq!(verified.timestamp, SPEC_TS);
    assert_eq!(verified.message_id.as_deref(), Some(SPEC_ID));
    assert_eq!(verified.secret_index, 0);

    // Ours without Webhook-Id: verified, no id.
    let headers = [("Webhook-Signature", format!("t={TS},v1={ASCII_HEX}"))];
    let verified = vid_webhooks::verify([&spec_secret()], &headers, ASCII_BODY.as_bytes(), TS).unwrap();
    assert_eq!(verified.message_id, None);
}

#[test]
fn forced_scheme_and_tolerance() {
    let secret = spec_secret();
    let ours_headers = ours(format!("t={TS},v1={ASCII_HEX}"));
    let forced_std = Verifier::new().with_scheme(Scheme::StandardWebhooks);
    // Our header read as Standard Webhooks: no webhook-timestamp header.
    assert_eq!(forced_std.verify([&secret], &ours_headers, ASCII_BODY.as_bytes(), TS).unwrap_err(), VerifyError::TimestampMissing);
    let std_headers = standard(SPEC_ID, &SPEC_TS.to_string(), format!("v1,{SPEC_SIG}"));
    let forced_ours = Verifier::new().with_scheme(Scheme::WebhookSignature);
    assert_eq!(forced_ours.verify([&secret], &std_headers, SPEC_BODY.as_bytes(), SPEC_TS).unwrap_err().code(), "header_malformed");
    assert!(forced_std.verify([&secret], &std_headers, SPEC_BODY.as_bytes(), SPEC_TS).is_ok());

    let strict = Verifier::new().with_tolerance(Duration::from_secs(10));
    assert!(strict.verify([&secret], &ours_headers, ASCII_BODY.as_bytes(), TS + 10).is_ok());
    assert_eq!(
        strict.verify([&secret], &ours_headers, ASCII_BODY.as_bytes(), TS + 11).unwrap_err(),
        VerifyError::TimestampTooOld { timestamp: TS, now: TS + 11, tolerance_secs: 10 }
    );
}

#[test]
fn non_utf8_header_is_malformed() {
    struct Raw;
    impl vid_webhooks::Headers for Raw {
        fn header(&self, name: &str) -> Option<&[u8]> {
            (name == "webhook-signature").then_some(&b"t=1,v1=\xff"[..])
        }
    }
    let err = vid_webhooks::verify([&spec_secret()], &Raw, b"", 1).unwrap_err();
    assert_eq!(err.code(), "header_malformed");
}

#[test]
fn error_codes_are_stable() {
    let all = [
        (VerifyError::HeaderMissing { header: "webhook-signature" }, "header_missing"),
        (VerifyError::HeaderMalformed { header: "webhook-signature", reason: "x" }, "header_malformed"),
        (VerifyError::TimestampMissing, "timestamp_missing"),
        (VerifyError::TimestampTooOld { timestamp: 0, now: 301, tolerance_secs: 300 }, "timestamp_too_old"),
        (VerifyError::TimestampTooNew { timestamp: 301, now: 0, tolerance_secs: 300 }, "timestamp_too_new"),
        (VerifyError::TimestampInMilliseconds { timestamp: 1_700_000_000_000 }, "timestamp_in_milliseconds"),
        (VerifyError::NoMatchingSignature { signatures: 1, secrets: 1 }, "no_matching_signature"),
        (VerifyError::NoSecrets, "no_secrets"),
    ];
    for (err, code) in all {
        assert_eq!(err.code(), code);
        assert!(!err.to_string().is_empty());
    }
}

#[cfg(feature = "http")]
#[test]
fn verifies_from_http_header_map() {
    let mut map = http::HeaderMap::new();
    map.insert("Webhook-Id", http::HeaderValue::from_static(SPEC_ID));
    map.insert("Webhook-Timestamp", http::HeaderValue::from_static("1614265330"));
    map.insert("Webhook-Signature", http::HeaderValue::from_static("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="));
    let verified = vid_webhooks::verify([&spec_secret()], &map, SPEC_BODY.as_bytes(), SPEC_TS).unwrap();
    assert_eq!(verified.message_id.as_deref(), Some(SPEC_ID));
}
