//! The api's persistence layer: every row type and every SQL statement of
//! the api. The delivery state machine's transitions (`:retry`, `:enable`)
//! are the shared crate `vid_deliveries`', called through [`deliveries`].
//!
//! Invariants:
//! - only `store/` names `vid_db::schema` (checked by `tests/layers.rs`);
//! - functions take a connection (`&mut Conn`), so the caller decides the
//!   transaction; none commits on its own except where its docs say so;
//! - states are typed ([`vid_core::upload::UploadStatus`], …): a stored value
//!   the code does not know is a deserialize error, which handlers answer as
//!   a logged `500 internal` and consumers retry, never a plausible default.
//!
//! One module per group of tables: [`uploads`], [`operations`] (with
//! `videos`), [`playback_ids`], [`signing_keys`] (public halves only), [`events`], [`outbox`], [`idempotency`], [`tenants`] (with
//! `api_keys`), [`endpoints`] (`webhook_endpoints`: configuration, secrets,
//! deletion, and the delivery health read), [`deliveries`] (the delivery log:
//! `webhook_deliveries`, `webhook_attempts`; `:retry` and `:enable`).

pub mod deliveries;
pub mod endpoints;
pub mod events;
pub mod idempotency;
pub mod ingests;
pub mod operations;
pub mod outbox;
pub mod playback_ids;
pub mod signing_keys;
pub mod tenants;
pub mod uploads;

/// The connection every query runs on (a pooled one derefs to it).
pub type Conn = diesel_async::AsyncPgConnection;
