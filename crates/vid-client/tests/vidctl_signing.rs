//! Issue 20, item 3 ("tools for the customer's server"): the built `vidctl`
//! binary (`CARGO_BIN_EXE_vidctl`, a subprocess) against the real api
//! (in-process, a fresh database and RabbitMQ prefix on the local stack):
//! `signing-keys create --out` writes the private key (mode 0600), `list`
//! shows the key, `playback sign` prints an RS256 token that verifies with
//! the public half the api stored (read from PostgreSQL with `psql`, checked
//! with the `jsonwebtoken` crate, not with vidctl's own code path: `kid`,
//! `sub`, `aud`, `exp` as issue 20 specifies), and `delete` removes the key
//! (gone from the list and the table; a second delete is `not_found`).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use vid_core::signing::PlaybackClaims;
use vid_core::PlaybackId;

/// The real api on a fresh database; returns (base URL, an API key, database URL).
async fn start_api() -> (String, String, String) {
    let db = vid_testkit::fresh_database().await;
    let prefix = vid_testkit::unique_prefix();
    let settings: vid_api::Settings =
        vid_testkit::settings(&[("database.url", db.as_str()), ("amqp.prefix", prefix.as_str()), ("api.listen", "127.0.0.1:0")]);
    let app = vid_api::Application::build(settings).expect("api builds");
    let url = format!("http://127.0.0.1:{}", app.port());
    let state = app.state().clone();
    tokio::spawn(app.run());
    let (_, key) = vid_api::auth::create_tenant(&state.db, "test").await.unwrap();
    (url, key, db)
}

/// What one `vidctl` run printed, and how it ended.
struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `vidctl args…` against `api` (flags from the environment, as a
/// customer's server would set them), in `dir` (no `.local/api-key` above it
/// is read: the key comes from `VIDCTL_API_KEY`). Async, so the in-process
/// api keeps serving on this test's runtime meanwhile.
async fn vidctl(api: &(String, String, String), dir: &Path, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vidctl"))
        .args(args)
        .current_dir(dir)
        .env("VIDCTL_API_URL", &api.0)
        .env("VIDCTL_API_KEY", &api.1)
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .env("XDG_CACHE_HOME", dir)
        .output()
        .await
        .expect("vidctl runs");
    Run { status: out.status, stdout: String::from_utf8(out.stdout).unwrap(), stderr: String::from_utf8(out.stderr).unwrap() }
}

/// Like [`vidctl`], which must succeed; its stdout as JSON (`--json` runs).
async fn vidctl_json(api: &(String, String, String), dir: &Path, args: &[&str]) -> serde_json::Value {
    let run = vidctl(api, dir, args).await;
    assert!(run.status.success(), "vidctl {args:?} exited {:?}\n--- stdout\n{}--- stderr\n{}", run.status, run.stdout, run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("vidctl {args:?} printed no JSON ({e}): {}", run.stdout))
}

/// The `public_key` column of signing key `id` (none if no such row).
fn stored_public_key(db: &str, id: &str) -> Option<String> {
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "not an id: {id}");
    let out = std::process::Command::new("psql")
        .args([db, "-Atc", &format!("SELECT public_key FROM signing_keys WHERE id = '{id}'")])
        .output()
        .expect("psql runs");
    assert!(out.status.success(), "psql failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.trim();
    (!text.is_empty()).then(|| format!("{text}\n"))
}

/// A fresh directory under the system's temp dir.
fn scratch_dir() -> PathBuf {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let dir = std::env::temp_dir().join(format!("vidctl-signing-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// Decodes and verifies `token` with the PEM public key `public` for audience `aud` (RS256 only).
fn verify(token: &str, public: &str, aud: &str) -> Result<jsonwebtoken::TokenData<PlaybackClaims>, jsonwebtoken::errors::Error> {
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(public.as_bytes()).expect("a PEM public key");
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_audience(&[aud]);
    v.set_required_spec_claims(&["exp", "sub", "aud"]);
    v.leeway = 0;
    jsonwebtoken::decode::<PlaybackClaims>(token, &key, &v)
}

#[tokio::test]
async fn vidctl_creates_lists_signs_with_and_deletes_a_signing_key() {
    let api = start_api().await;
    let dir = scratch_dir();
    let key_file = dir.join("signing-key.pem");
    let key_path = key_file.to_str().unwrap();

    // create --out: the id on stdout, the private key in a new owner-only file.
    let created = vidctl_json(&api, &dir, &["--json", "signing-keys", "create", "--out", key_path]).await;
    let id = created["id"].as_str().expect("an id").to_owned();
    assert!(id.starts_with("sk_"), "{created}");
    assert_eq!(created["private_key_file"], key_path);
    assert!(created.get("private_key").is_none(), "with --out the key is not printed: {created}");
    let pem = std::fs::read_to_string(&key_file).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // --out never overwrites: a second create to the same file fails and leaves it as it was.
    let again = vidctl(&api, &dir, &["signing-keys", "create", "--out", key_path]).await;
    assert!(!again.status.success(), "{}", again.stdout);
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), pem);
    let public = stored_public_key(&api.2, &id).expect("the api stored the public half");

    // list: the key, without key material.
    let listed = vidctl_json(&api, &dir, &["--json", "signing-keys", "list", "--all"]).await;
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|k| k["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&id.as_str()), "{listed}");
    assert!(!listed.to_string().contains("PRIVATE KEY") && !listed.to_string().contains("PUBLIC KEY"), "{listed}");
    let table = vidctl(&api, &dir, &["signing-keys", "list"]).await;
    assert!(table.status.success() && table.stdout.contains(&id), "{}{}", table.stdout, table.stderr);

    // playback sign (offline): a thumbnail token for 15 minutes.
    let pb = PlaybackId::generate();
    let before = now_secs();
    let signed = vidctl_json(
        &api,
        &dir,
        &[
            "--json",
            "playback",
            "sign",
            "--key-file",
            key_path,
            "--key-id",
            &id,
            "--playback-id",
            pb.as_str(),
            "--audience",
            "t",
            "--expires-in",
            "15m",
        ],
    )
    .await;
    let after = now_secs();
    let token = signed["token"].as_str().expect("a token").to_owned();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!((header.alg, header.kid.as_deref()), (jsonwebtoken::Algorithm::RS256, Some(id.as_str())));
    let claims = verify(&token, &public, "t").expect("the token verifies with the stored public key").claims;
    assert_eq!((claims.sub.as_str(), claims.aud.as_str(), claims.nbf), (pb.as_str(), "t", None));
    assert!((before + 900..=after + 900).contains(&claims.exp), "exp {} is 15 minutes after signing ({before}..{after})", claims.exp);
    // The audience is bound: a stream (`v`) check refuses it.
    let wrong = verify(&token, &public, "v").expect_err("a `t` token is not a `v` token");
    assert_eq!(*wrong.kind(), jsonwebtoken::errors::ErrorKind::InvalidAudience);

    // Text output and the defaults (audience v, 1 hour): the token alone on one line.
    let plain = vidctl(&api, &dir, &["playback", "sign", "--key-file", key_path, "--key-id", &id, "--playback-id", pb.as_str()]).await;
    assert!(plain.status.success(), "{}", plain.stderr);
    let line = plain.stdout.strip_suffix('\n').expect("one line");
    assert!(!line.contains('\n') && line.split('.').count() == 3, "{:?}", plain.stdout);
    let claims = verify(line, &public, "v").expect("the default token verifies for the stream").claims;
    assert_eq!(claims.sub, pb.as_str());
    assert!(claims.exp.abs_diff(now_secs() + 3600) <= 5, "exp {} is an hour away", claims.exp);

    // A file that is not a private key: an error, no token.
    std::fs::write(dir.join("not-a-key.pem"), "hello").unwrap();
    let bad = vidctl(&api, &dir, &["playback", "sign", "--key-file", "not-a-key.pem", "--key-id", &id, "--playback-id", pb.as_str()]).await;
    assert!(!bad.status.success() && bad.stdout.is_empty(), "{}{}", bad.stdout, bad.stderr);

    // delete: gone from the api and from the table; a second delete is not_found.
    let deleted = vidctl_json(&api, &dir, &["--json", "signing-keys", "delete", &id]).await;
    assert_eq!(deleted["deleted"], id.as_str());
    let listed = vidctl_json(&api, &dir, &["--json", "signing-keys", "list", "--all"]).await;
    assert!(listed["data"].as_array().unwrap().iter().all(|k| k["id"] != id.as_str()), "{listed}");
    assert_eq!(stored_public_key(&api.2, &id), None, "the row is deleted");
    let twice = vidctl(&api, &dir, &["--json", "signing-keys", "delete", &id]).await;
    assert_eq!(twice.status.code(), Some(1), "{}{}", twice.stdout, twice.stderr);
    let error: serde_json::Value = serde_json::from_str(&twice.stdout).unwrap();
    assert_eq!(error["error"]["code"], "not_found", "{error}");

    let _ = std::fs::remove_dir_all(&dir);
}
