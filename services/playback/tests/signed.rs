//! Signed playback (issue 20) against the real PostgreSQL and Garage, with
//! the real CMAF stream of `common`: keys made and deleted through the api's
//! own code (`vid_api::routes::signing_keys::generate_key_pair`,
//! `vid_api::store::signing_keys`), tokens signed with the SDK, by hand
//! (the bad ones) and by PyJWT (an implementation nobody here wrote).
//! Each bad token is a `403` with its code and `Cache-Control: no-store`;
//! a valid one plays by following only the URIs inside the manifests; a
//! deleted key fails on the next request.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use common::*;
use reqwest::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE};
use vid_core::playback::Audience;
use vid_core::signing::PlaybackClaims;
use vid_core::{PlaybackId, SigningKeyId, TenantId};

/// A signing key of a tenant, made and stored as `POST /signing-keys` does.
struct Key {
    id: SigningKeyId,
    private_pem: String,
    public_pem: String,
}

async fn conn(db: &str) -> vid_api::store::Conn {
    <vid_api::store::Conn as diesel_async::AsyncConnection>::establish(db).await.unwrap()
}

async fn make_key(db: &str, tenant: &str) -> Key {
    let (private_pem, public_pem) = vid_api::routes::signing_keys::generate_key_pair().unwrap();
    let id = SigningKeyId::generate();
    let tenant: TenantId = tenant.parse().unwrap();
    vid_api::store::signing_keys::insert(&mut conn(db).await, &tenant, &id, &public_pem).await.unwrap();
    Key { id, private_pem, public_pem }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn claims(sub: &PlaybackId, aud: &str, exp: u64) -> PlaybackClaims {
    PlaybackClaims { sub: sub.to_string(), aud: aud.into(), exp, nbf: None }
}

fn sign(key: &Key, c: &PlaybackClaims) -> String {
    vid_client::sign_claims(&key.private_pem, &key.id, c).unwrap()
}

/// A JWS of any header and payload JSON, signed RS256 with `key`.
fn sign_raw(key: &Key, header: serde_json::Value, payload: serde_json::Value) -> String {
    let mut h: jsonwebtoken::Header = serde_json::from_value(header).unwrap();
    h.kid = h.kid.or_else(|| Some(key.id.to_string()));
    jsonwebtoken::encode(&h, &payload, &jsonwebtoken::EncodingKey::from_rsa_pem(key.private_pem.as_bytes()).unwrap()).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn header(res: &reqwest::Response, name: impl reqwest::header::AsHeaderName) -> &str {
    res.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Asserts a 403 problem with `code`, `no-store`, and nothing of the tenant or keys in it.
async fn assert_refused(res: reqwest::Response, code: &str, what: &str, secrets: &[&str]) {
    assert_eq!(res.status(), 403, "{what}");
    assert_eq!(header(&res, CACHE_CONTROL), "no-store", "{what}");
    assert_eq!(header(&res, CONTENT_TYPE), "application/problem+json", "{what}");
    let body = res.text().await.unwrap();
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["code"], code, "{what}: {body}");
    for s in secrets {
        assert!(!body.contains(s), "{what}: the problem shows {s:?}: {body}");
    }
}

#[tokio::test]
async fn every_bad_token_is_a_403_with_its_code_and_no_store() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let key = make_key(&w.db, &w.tenant).await;
    let other_tenant = TenantId::generate().to_string();
    {
        use diesel_async::RunQueryDsl;
        diesel::sql_query(format!("INSERT INTO tenants (id, name) VALUES ('{other_tenant}', 'other')"))
            .execute(&mut conn(&w.db).await)
            .await
            .unwrap();
    }
    let stranger = make_key(&w.db, &other_tenant).await;
    let master = pb.at(&format!("/play/{}.m3u8", w.signed));
    let with = |t: &str| format!("{master}?token={t}");
    let client = http();
    let get = |url: String| client.get(url).send();
    let secrets = [w.tenant.as_str(), other_tenant.as_str(), key.id.as_str(), stranger.id.as_str()];

    let valid = sign(&key, &claims(&w.signed, "v", now() + 300));
    let res = get(with(&valid)).await.unwrap();
    assert_eq!(res.status(), 200, "the valid token");
    let cc = header(&res, CACHE_CONTROL).to_owned();
    assert!(cc.starts_with("private, max-age="), "{cc}");
    // Within the leeway (30 s) an expired token still plays; past it, not.
    assert_eq!(get(with(&sign(&key, &claims(&w.signed, "v", now() - 10)))).await.unwrap().status(), 200, "inside the leeway");

    assert_refused(get(master.clone()).await.unwrap(), "playback_token_required", "no token", &secrets).await;

    let payload = serde_json::to_vec(&claims(&w.signed, "v", now() + 300)).unwrap();
    let none = format!("{}.{}.", b64(format!(r#"{{"alg":"none","typ":"JWT","kid":"{}"}}"#, key.id).as_bytes()), b64(&payload));
    let hs256 = {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = Some(key.id.to_string());
        let secret = jsonwebtoken::EncodingKey::from_secret(key.public_pem.as_bytes()).unwrap();
        jsonwebtoken::encode(&h, &claims(&w.signed, "v", now() + 300), &secret).unwrap()
    };
    let parts: Vec<&str> = valid.split('.').collect();
    let tampered_payload =
        format!("{}.{}.{}", parts[0], b64(&serde_json::to_vec(&claims(&w.signed, "v", now() + 86_400)).unwrap()), parts[2]);
    let mut sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    sig[10] ^= 0x01;
    let tampered_signature = format!("{}.{}.{}", parts[0], parts[1], b64(&sig));
    let unknown = Key { id: SigningKeyId::generate(), private_pem: key.private_pem.clone(), public_pem: String::new() };
    // Correctly signed, with an `exp` (and `nbf`) that is present but no NumericDate.
    let raw = |exp: serde_json::Value, nbf: Option<serde_json::Value>| {
        let mut c = serde_json::json!({"sub": w.signed.as_str(), "aud": "v", "exp": exp});
        if let Some(nbf) = nbf {
            c["nbf"] = nbf;
        }
        sign_raw(&key, serde_json::json!({"alg": "RS256", "typ": "JWT"}), c)
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("alg none", none, "token_algorithm_not_allowed"),
        ("HS256 with the public key as the secret", hs256, "token_algorithm_not_allowed"),
        ("another playback ID", sign(&key, &claims(&w.public, "v", now() + 300)), "token_wrong_subject"),
        ("another tenant's key", sign(&stranger, &claims(&w.signed, "v", now() + 300)), "token_unknown_key"),
        ("an unknown key", sign(&unknown, &claims(&w.signed, "v", now() + 300)), "token_unknown_key"),
        ("aud t on the stream", sign(&key, &claims(&w.signed, "t", now() + 300)), "token_wrong_audience"),
        ("expired", sign(&key, &claims(&w.signed, "v", now() - 120)), "token_expired"),
        (
            "not yet valid",
            sign(&key, &PlaybackClaims { nbf: Some(now() + 600), ..claims(&w.signed, "v", now() + 900) }),
            "token_not_yet_valid",
        ),
        (
            "missing exp",
            sign_raw(&key, serde_json::json!({"alg": "RS256", "typ": "JWT"}), serde_json::json!({"sub": w.signed.as_str(), "aud": "v"})),
            "token_missing_claim",
        ),
        ("a tampered payload", tampered_payload, "token_bad_signature"),
        ("exp -1", raw(serde_json::json!(-1), None), "token_malformed"),
        ("exp 1e308", raw(serde_json::json!(1e308), None), "token_malformed"),
        ("exp 2^64 + 5", raw(serde_json::json!(18446744073709551621.0), None), "token_malformed"),
        ("exp a string", raw(serde_json::json!("4102444800"), None), "token_malformed"),
        ("nbf 1e308", raw(serde_json::json!(now() + 300), Some(serde_json::json!(1e308))), "token_malformed"),
        ("a tampered signature", tampered_signature, "token_bad_signature"),
        ("malformed", "not-a-jwt".into(), "token_malformed"),
        ("malformed parts", format!("{}.e30.", b64(b"[]")), "token_malformed"),
        ("empty", String::new(), "token_malformed"),
    ];
    for (what, token, code) in &cases {
        assert_refused(get(with(token)).await.unwrap(), code, what, &secrets).await;
    }
    // The same refusals on a segment URL: every URL of a signed ID checks.
    let segment = pb.at(&format!("/play/{}/360p/seg-00001.m4s", w.signed));
    assert_refused(get(format!("{segment}?token={}", cases[5].1)).await.unwrap(), "token_wrong_audience", "segment, aud t", &secrets).await;
    assert_refused(get(segment.clone()).await.unwrap(), "playback_token_required", "segment, no token", &secrets).await;

    // A token in the wrong place: a header, or a second `token` parameter.
    let res = client.get(&master).header(AUTHORIZATION, format!("Bearer {valid}")).send().await.unwrap();
    assert_refused(res, "token_misplaced", "Authorization header", &secrets).await;
    let res = client.get(with(&valid)).header(AUTHORIZATION, format!("Bearer {valid}")).send().await.unwrap();
    assert_refused(res, "token_misplaced", "query and header", &secrets).await;
    assert_refused(get(format!("{}&token={valid}", with(&valid))).await.unwrap(), "token_misplaced", "second token parameter", &secrets)
        .await;
    // Outside the grammar, before any lookup: another parameter, a token in the path.
    for url in [format!("{}&x=1", with(&valid)), format!("{master}?jwt={valid}"), pb.at(&format!("/play/{}/{valid}/index.m3u8", w.signed))]
    {
        let res = get(url.clone()).await.unwrap();
        assert_eq!((res.status().as_u16(), header(&res, CACHE_CONTROL)), (404, "no-store"), "{url}");
    }
    // A public ID takes no query at all, a valid-looking token included.
    let public = pb.at(&format!("/play/{}.m3u8", w.public));
    assert_eq!(get(format!("{public}?token={valid}")).await.unwrap().status(), 404);
    assert_eq!(get(public).await.unwrap().status(), 200);
}

/// The URIs of an HLS playlist: URI lines and `URI="…"` attributes.
fn uris(playlist: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in playlist.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix('#') {
            if let Some(i) = rest.find("URI=\"") {
                let v = &rest[i + 5..];
                out.push(v[..v.find('"').unwrap()].to_owned());
            }
        } else {
            out.push(line.to_owned());
        }
    }
    out
}

#[tokio::test]
async fn one_token_url_plays_the_stream_and_a_deleted_key_fails_at_once() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let key = make_key(&w.db, &w.tenant).await;
    let token = vid_client::sign_playback_token(&key.private_pem, &key.id, &w.signed, Audience::Video, Duration::from_secs(120)).unwrap();
    let exp = now() + 120;
    let client = http();
    let master_url = url::Url::parse(&pb.at(&format!("/play/{}.m3u8?token={token}", w.signed))).unwrap();

    let res = client.get(master_url.as_str()).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let max_age = |res: &reqwest::Response| -> u64 {
        let cc = header(res, CACHE_CONTROL);
        assert!(cc.starts_with("private, max-age="), "a signed answer is never public: {cc}");
        cc["private, max-age=".len()..].parse().unwrap()
    };
    assert!(max_age(&res) <= 10, "the configured 10 s, no more");
    let master = res.text().await.unwrap();
    let listed = uris(&master);
    assert_eq!(listed.len(), RUNGS.len() + 1, "{master}");
    for u in &listed {
        assert!(u.ends_with(&format!("?token={token}")), "the same token on every URI: {u}");
    }

    // Follow only what the manifests say: a media playlist, its init and first segment.
    let media_url = master_url.join(listed.iter().find(|u| u.contains("/360p/")).unwrap()).unwrap();
    let res = client.get(media_url.as_str()).send().await.unwrap();
    assert_eq!(res.status(), 200, "{media_url}");
    max_age(&res);
    let media = res.text().await.unwrap();
    let inside = uris(&media);
    assert_eq!(inside.len(), 1 + stream_files().iter().filter(|(f, _)| f.starts_with("360p/seg-")).count(), "{media}");
    for (u, file) in inside.iter().take(2).zip(["init.mp4", "seg-00001.m4s"]) {
        assert_eq!(u, &format!("{file}?token={token}"));
        let res = client.get(media_url.join(u).unwrap().as_str()).send().await.unwrap();
        assert_eq!(res.status(), 200, "{u}");
        let age = max_age(&res);
        assert!(age <= exp.saturating_sub(now()) + 1 && age > 0, "no later than the token's exp: {age}");
        assert_eq!(res.bytes().await.unwrap(), stream_bytes(&format!("360p/{file}")));
    }
    // The unrewritten object is what the manifest cache holds: a second token gets its own URIs.
    let other = vid_client::sign_playback_token(&key.private_pem, &key.id, &w.signed, Audience::Video, Duration::from_secs(60)).unwrap();
    let again = client.get(pb.at(&format!("/play/{}.m3u8?token={other}", w.signed))).send().await.unwrap().text().await.unwrap();
    assert!(uris(&again).iter().all(|u| u.ends_with(&format!("?token={other}")) && !u.contains(&token)), "{again}");
    // The MPD carries it on its templates too.
    let mpd = client.get(pb.at(&format!("/play/{}.mpd?token={token}", w.signed))).send().await.unwrap().text().await.unwrap();
    assert_eq!(mpd.matches(&format!("?token={token}\"")).count(), 2 * (RUNGS.len() + 1), "{mpd}");

    // Deleting the key (as DELETE /signing-keys/{id} does) fails the next request.
    let tenant: TenantId = w.tenant.parse().unwrap();
    assert!(vid_api::store::signing_keys::delete(&mut conn(&w.db).await, &tenant, &key.id).await.unwrap());
    let res = client.get(master_url.as_str()).send().await.unwrap();
    assert_refused(res, "token_unknown_key", "after the key was deleted", &[w.tenant.as_str()]).await;
    let res = client.get(media_url.join(&inside[1]).unwrap().as_str()).send().await.unwrap();
    assert_refused(res, "token_unknown_key", "a segment after the key was deleted", &[w.tenant.as_str()]).await;
}

#[tokio::test]
async fn a_token_minted_by_pyjwt_is_accepted() {
    let w = seed().await;
    let pb = Playback::start(&w.db, &[]).await;
    let key = make_key(&w.db, &w.tenant).await;
    let file = std::env::temp_dir().join(format!("vid-signing-key-{}.pem", key.id));
    std::fs::write(&file, &key.private_pem).unwrap();
    // The README's five lines.
    let script = "import sys, time, jwt\n\
        key = open(sys.argv[1]).read()\n\
        claims = {'sub': sys.argv[3], 'aud': sys.argv[4], 'exp': int(time.time()) + 3600}\n\
        print(jwt.encode(claims, key, algorithm='RS256', headers={'kid': sys.argv[2]}))\n";
    let mint = |aud: &str| {
        let out = std::process::Command::new(python())
            .args(["-c", script])
            .arg(&file)
            .arg(key.id.as_str())
            .arg(w.signed.as_str())
            .arg(aud)
            .output()
            .expect("python runs");
        assert!(out.status.success(), "PyJWT: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let token = mint("v");
    std::fs::remove_file(&file).unwrap();
    let res = http().get(pb.at(&format!("/play/{}.m3u8?token={token}", w.signed))).send().await.unwrap();
    assert_eq!(res.status(), 200, "{}", res.text().await.unwrap());
    let res = http().get(pb.at(&format!("/play/{}/audio/seg-00001.m4s?token={token}", w.signed))).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.bytes().await.unwrap(), stream_bytes("audio/seg-00001.m4s"));
}
