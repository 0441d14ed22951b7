//! Shared domain types of the video platform.
//!
//! This crate depends on nothing else of ours: the three services (`api`,
//! `transcoder`, `webhook-dispatcher`) and the client SDK all speak through the
//! types defined here, so a field renamed here is renamed everywhere at once.
//!
//! - [`ids`]: typed, prefixed identifiers (`op_…`, `vid_…`, `upl_…`, `evt_…`, `ep_…`).
//! - [`problem`]: RFC 9457 problem details with a stable `code`.
//! - [`operation`], [`video`], [`upload`], [`endpoint`], [`delivery`], [`event`]: the public API resources.
//! - [`messages`]: what travels over RabbitMQ between the services.
//! - [`ingest`]: `POST /ingests` and the ingest worker's job and reports.
//! - [`page`]: the `{data, next_cursor}` envelope of every list endpoint.
//! - [`signing`]: signing keys and the claims of a signed playback token.
//! - [`state`]: string-valued state enums (`UploadStatus`, `OperationStatus`,
//!   `VideoStatus`, `Phase`, `ScanOutcome`, `EndpointStatus`, `DeliveryStatus`), one spelling for the wire and
//!   the database; an unknown stored value is an error, never a default.

#[macro_use]
pub mod state;

pub mod delivery;
pub mod endpoint;
pub mod event;
pub mod ids;
pub mod ingest;
pub mod messages;
pub mod operation;
pub mod page;
pub mod playback;
pub mod problem;
pub mod signing;
pub mod upload;
pub mod video;

pub use ids::*;
pub use page::Page;
pub use problem::Problem;
pub use state::UnknownState;
