//! The readiness check every HTTP service answers on `/readyz`: its
//! database and its media bucket each answered within
//! [`CHECK_TIMEOUT`]. A dependency that accepts connections but never
//! answers makes the service unready, not stuck.
//!
//! RabbitMQ is deliberately not part of it where a service keeps serving
//! without the broker (the api writes to its transactional outbox).

use std::future::Future;

use serde::Serialize;

/// How long each check may take before it counts as failed.
pub const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The `/readyz` body: `{"database": bool, "storage": bool}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Readiness {
    /// PostgreSQL answered `SELECT 1`.
    pub database: bool,
    /// The media bucket answered `HeadBucket` (S3 API `HeadBucket`).
    pub storage: bool,
}

impl Readiness {
    /// Both answered: `/readyz` is `200`, else `503` with the same body.
    pub fn is_ready(&self) -> bool {
        self.database && self.storage
    }
}

/// Runs the database check (e.g. `vid_db::ping(&pool)`) and the bucket check
/// ([`bucket_answers`]) concurrently, each bounded by [`CHECK_TIMEOUT`].
pub async fn check(database: impl Future<Output = bool>, storage: impl Future<Output = bool>) -> Readiness {
    let (database, storage) = futures::join!(bounded(database), bounded(storage));
    Readiness { database, storage }
}

async fn bounded(check: impl Future<Output = bool>) -> bool {
    tokio::time::timeout(CHECK_TIMEOUT, check).await.unwrap_or(false)
}

/// Whether `bucket` answers `HeadBucket` (S3 API action HeadBucket).
pub async fn bucket_answers(s3: &aws_sdk_s3::Client, bucket: &str) -> bool {
    s3.head_bucket().bucket(bucket).send().await.is_ok()
}
