//! Domain rules: what may happen to a resource, in one place per resource.
//!
//! Invariants: domain code never imports `routes` or actix-web (it is
//! called by handlers, consumers and the janitor alike); it reaches the
//! database only through [`crate::store`].

pub mod operation;
pub mod upload;
