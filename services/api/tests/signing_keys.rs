//! Issue 20, the api half of signed playback: `/signing-keys` create, list,
//! get, delete against the real PostgreSQL; the private key is answered
//! once, is a working RSA 2048 key, and is not stored (the table holds the
//! public half only); another tenant's key is 404.

mod common;

use common::{problem_code, TestApi};
use diesel::prelude::*;
use vid_core::playback::Audience;
use vid_core::signing::PlaybackClaims;
use vid_core::{PlaybackId, SigningKeyId};
use vid_db::RunQueryDsl;

/// Every row of `signing_keys`, all columns as text: (id, tenant_id, public_key).
async fn rows(api: &TestApi) -> Vec<(String, String, String)> {
    use vid_db::schema::signing_keys;
    let mut conn = api.state.db.get().await.unwrap();
    signing_keys::table
        .order(signing_keys::id.asc())
        .select((signing_keys::id, signing_keys::tenant_id, signing_keys::public_key))
        .load(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_key_is_shown_once_stored_public_only_listed_and_deleted() {
    let api = TestApi::start(&[]).await;
    let client = api.client();
    let tenant = api.tenant_id().await;

    let resp = client.http().post(format!("{}/signing-keys", api.url)).bearer_auth(&api.key).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers().get("cache-control").and_then(|v| v.to_str().ok()), Some("no-store"), "the private key is not cached");
    let location = resp.headers().get("location").unwrap().to_str().unwrap().to_owned();
    let first: vid_core::signing::CreatedSigningKey = resp.json().await.unwrap();
    assert_eq!(location, format!("/signing-keys/{}", first.id));
    assert!(first.private_key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{}", first.private_key);
    let second = client.create_signing_key().await.unwrap();
    assert_ne!(first.private_key, second.private_key);

    // The private key works: a token signed with it verifies with the stored public half.
    let stored = rows(&api).await;
    assert_eq!(stored.len(), 2);
    let pb = PlaybackId::generate();
    let token =
        vid_client::sign_playback_token(&first.private_key, &first.id, &pb, Audience::Video, std::time::Duration::from_secs(60)).unwrap();
    let (_, _, public) = stored.iter().find(|r| r.0 == first.id.as_str()).unwrap();
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(public.as_bytes()).unwrap();
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_audience(&["v"]);
    let claims = jsonwebtoken::decode::<PlaybackClaims>(&token, &key, &v).unwrap().claims;
    assert_eq!(claims.sub, pb.as_str());
    // …and the other key's public half does not verify it.
    let (_, _, other_public) = stored.iter().find(|r| r.0 == second.id.as_str()).unwrap();
    let other = jsonwebtoken::DecodingKey::from_rsa_pem(other_public.as_bytes()).unwrap();
    assert!(jsonwebtoken::decode::<PlaybackClaims>(&token, &other, &v).is_err());

    // RSA 2048: the SPKI of a 2048-bit modulus is 294 bytes.
    let der = pem::parse(public).unwrap();
    assert_eq!(der.tag(), "PUBLIC KEY");
    assert_eq!(der.contents().len(), 294);

    // Nothing private is stored: every column of every row, and no text of the private key.
    let private_body: String = first.private_key.lines().filter(|l| !l.starts_with("-----")).collect();
    for (id, t, public) in &stored {
        assert_eq!(t, tenant.as_str());
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----\n") && !public.contains("PRIVATE"), "{id}: {public}");
        assert!(!public.contains(&private_body[..64]), "{id} holds private key text");
    }

    // List: newest first, without key material; pages by cursor.
    let listed = client.list_signing_keys(None).await.unwrap();
    assert_eq!(listed.data.iter().map(|k| k.id.clone()).collect::<Vec<_>>(), vec![second.id.clone(), first.id.clone()]);
    let raw: serde_json::Value =
        client.http().get(format!("{}/signing-keys?limit=1", api.url)).bearer_auth(&api.key).send().await.unwrap().json().await.unwrap();
    assert_eq!(raw["data"].as_array().unwrap().len(), 1);
    assert_eq!(raw["data"][0].as_object().unwrap().keys().collect::<Vec<_>>(), ["created_at", "id"]);
    assert_eq!(raw["next_cursor"], second.id.as_str());
    let page2 = client.list_signing_keys(Some(second.id.as_str())).await.unwrap();
    assert_eq!(page2.data.iter().map(|k| &k.id).collect::<Vec<_>>(), vec![&first.id]);
    let bad = client.http().get(format!("{}/signing-keys?cursor=pb_x", api.url)).bearer_auth(&api.key).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(client.get_signing_key(&first.id).await.unwrap().created_at, first.created_at);

    // Delete: 204, the row is gone at once; again is 404.
    client.delete_signing_key(&first.id).await.unwrap();
    assert_eq!(rows(&api).await.iter().map(|r| r.0.clone()).collect::<Vec<_>>(), vec![second.id.to_string()]);
    assert_eq!(problem_code(&client.delete_signing_key(&first.id).await.unwrap_err()), "not_found");
    assert_eq!(problem_code(&client.get_signing_key(&first.id).await.unwrap_err()), "not_found");
    assert_eq!(client.list_signing_keys(None).await.unwrap().data.len(), 1);
}

#[tokio::test]
async fn another_tenants_key_is_404_and_untouched() {
    let api = TestApi::start(&[]).await;
    let mine = api.client().create_signing_key().await.unwrap();
    let stranger = api.other_tenant().await;
    assert!(stranger.list_signing_keys(None).await.unwrap().data.is_empty());
    assert_eq!(problem_code(&stranger.get_signing_key(&mine.id).await.unwrap_err()), "not_found");
    assert_eq!(problem_code(&stranger.delete_signing_key(&mine.id).await.unwrap_err()), "not_found");
    assert_eq!(rows(&api).await.len(), 1, "the stranger's delete left it");
    let theirs = stranger.create_signing_key().await.unwrap();
    assert_eq!(api.client().list_signing_keys(None).await.unwrap().data.iter().map(|k| &k.id).collect::<Vec<_>>(), vec![&mine.id]);
    assert_eq!(problem_code(&api.client().delete_signing_key(&theirs.id).await.unwrap_err()), "not_found");
    // A malformed or other kind of id is 404 too.
    let status =
        api.client().http().delete(format!("{}/signing-keys/sk_nope", api.url)).bearer_auth(&api.key).send().await.unwrap().status();
    assert_eq!(status, 404);
    assert_eq!(problem_code(&api.client().delete_signing_key(&SigningKeyId::generate()).await.unwrap_err()), "not_found");
}
