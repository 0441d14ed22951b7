//! The api's persistence layer: one module per group of tables; the only
//! api code that speaks SQL.
//!
//! - [`endpoints`]: `webhook_endpoints` (configuration, secrets, deletion) and the delivery health read.
//! - [`deliveries`]: the delivery log (`webhook_deliveries`, `webhook_attempts`) and `:retry`/`:enable`,
//!   which go through the shared state machine `vid_deliveries`.

pub mod deliveries;
pub mod endpoints;
