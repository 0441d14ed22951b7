//! Test support for tests that talk to the real local stack (PostgreSQL,
//! RabbitMQ, Garage) started by `scripts/stack.sh infra-up`.
//!
//! Isolation without mocks: every test gets its own database
//! ([`fresh_database`]) and its own RabbitMQ name prefix ([`unique_prefix`]),
//! and builds its settings with [`settings`] — which never mutates the process
//! environment, so tests can run in parallel threads.

pub mod frames;
pub mod iso;
pub mod stream;

use std::collections::HashMap;
use std::path::PathBuf;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::de::DeserializeOwned;

/// The repository root (where `config/` and `.local/` live).
pub fn repo_root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("config/default.toml").exists() {
        assert!(dir.pop(), "no config/default.toml above {}", env!("CARGO_MANIFEST_DIR"));
    }
    dir
}

/// The `VID__…` values written by `scripts/stack.sh infra-up` to `.local/stack.env`.
///
/// Panics with instructions when the file is missing (the stack is not up).
pub fn stack_env() -> HashMap<String, String> {
    let path = repo_root().join(".local/stack.env");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing: run `make up` (or `scripts/stack.sh infra-up`) first", path.display()));
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').trim_matches('"').to_owned()))
        .collect()
}

/// A name prefix no other test uses, e.g. `t01jd…` (for RabbitMQ names, databases).
pub fn unique_prefix() -> String {
    format!("t{}", ulid::Ulid::new().to_string().to_ascii_lowercase())
}

/// The server URL (no database) of the local PostgreSQL.
pub fn postgres_server_url() -> String {
    let url = stack_env().get("VID__DATABASE__URL").cloned().unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/vid".into());
    url.rsplit_once('/').map(|(base, _)| base.to_owned()).unwrap_or(url)
}

/// Creates an empty database with every migration applied; returns its URL.
/// Databases are named `vidtest_<ulid>`; `scripts/stack.sh` drops old ones.
pub async fn fresh_database() -> String {
    let url = empty_database().await;
    vid_db::migrate(&url).await.expect("migrate test database");
    url
}

/// Creates an empty database with no migration applied; returns its URL
/// (named like [`fresh_database`]'s).
pub async fn empty_database() -> String {
    let server = postgres_server_url();
    let name = format!("vidtest_{}", ulid::Ulid::new().to_string().to_ascii_lowercase());
    let mut admin = AsyncPgConnection::establish(&format!("{server}/postgres")).await.expect("connect to PostgreSQL");
    diesel::sql_query(format!("CREATE DATABASE {name}")).execute(&mut admin).await.expect("create test database");
    format!("{server}/{name}")
}

/// Settings of type `T` as a service would load them with `VID_PROFILE=test`,
/// plus the stack's `.local/stack.env` values, plus `overrides`
/// (`("database.url", "…")`, dotted keys; list settings, see
/// `vid_infra::settings::LIST_KEYS`, comma-separated). Touches no environment variable.
pub fn settings<T: DeserializeOwned>(overrides: &[(&str, &str)]) -> T {
    let dir = repo_root().join("config");
    let mut builder = config::Config::builder()
        .add_source(config::File::from(dir.join("default.toml")))
        .add_source(config::File::from(dir.join("test.toml")));
    for (k, v) in stack_env() {
        if let Some(key) = k.strip_prefix("VID__") {
            builder = builder.set_override(key.to_ascii_lowercase().replace("__", "."), v).expect("override");
        }
    }
    for (k, v) in overrides {
        builder = if vid_infra::settings::LIST_KEYS.contains(k) {
            // Comma-separated, as in the environment (`"443,80"`).
            let items: Vec<String> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
            builder.set_override(*k, items)
        } else {
            builder.set_override(*k, *v)
        }
        .expect("override");
    }
    builder.build().expect("settings build").try_deserialize().expect("settings deserialize")
}
