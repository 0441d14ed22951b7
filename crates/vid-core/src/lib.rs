//! Shared domain types of the video platform.
//!
//! This crate depends on nothing else of ours: the three services (`api`,
//! `transcoder`, `webhook-dispatcher`) and the client SDK all speak through the
//! types defined here, so a field renamed here is renamed everywhere at once.
//!
//! - [`ids`]: typed, prefixed identifiers (`op_…`, `vid_…`, `upl_…`, `evt_…`, `ep_…`).
//! - [`problem`]: RFC 9457 problem details with a stable `code`.
//! - [`operation`], [`video`], [`upload`], [`endpoint`], [`event`]: the public API resources.
//! - [`messages`]: what travels over RabbitMQ between the services.

pub mod endpoint;
pub mod event;
pub mod ids;
pub mod messages;
pub mod operation;
pub mod problem;
pub mod upload;
pub mod video;

pub use ids::*;
pub use problem::Problem;
