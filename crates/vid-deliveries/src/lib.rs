//! The webhook delivery state machine, in one place: every transition of
//! `webhook_deliveries`, every write of `webhook_attempts`, and every write of
//! the endpoint health columns of `webhook_endpoints`, each with its SQL.
//! The webhook-dispatcher makes every transition but two, which the api makes
//! on a customer's request (`:retry`, `:enable`); both call this crate, so
//! each transition has exactly one implementation.
//!
//! # Delivery states ([`DeliveryStatus`], `webhook_deliveries.status`)
//!
//! ```text
//!            fan-in (endpoint enabled)          2xx
//!   event ───────────────────────────▶ pending ─────▶ succeeded
//!     │                                 │  ▲   │            │
//!     │ fan-in (endpoint disabled)      │  │   │ retries    │ api :retry
//!     ▼                                 │  │   ▼ exhausted  ▼ (one more attempt)
//!   paused ◀────── endpoint disabled ───┘  │  failed ─────▶ pending
//!     └──────────── api `:enable` ─────────┘
//! ```
//!
//! | transition | function | caller |
//! |---|---|---|
//! | fan-in insert (`pending` due now, or `paused`; endpoints by [`fanin::MATCH`]) | [`fanin::fan_in`] | [`health::disable`]; [`reconcile::pass`] |
//! | fan-in insert, leasing what fits at once (claim at fan-in) | [`fanin::fan_in_leasing`] | dispatcher fan-in |
//! | claim: lease a due `pending` delivery | [`lease::claim`] | dispatcher scheduler |
//! | lease given back / expired / postponed | [`lease::release`], [`lease::release_expired`], [`lease::postpone`] | dispatcher scheduler |
//! | attempt outcome: `succeeded`, retry scheduled (`pending`), given up (`failed`), `paused` | [`outcome::record`], [`outcome::record_successes`] | dispatcher recorder |
//! | settled without an attempt (endpoint disabled → `paused`, deleted → `failed`) | [`outcome::settle_without_attempt`] | dispatcher scheduler |
//! | endpoint disabled: its `pending` deliveries → `paused` | [`health::disable`] | [`outcome::record`] |
//! | manual retry: → `pending`, due now, one attempt only | [`manual::retry`] | api `:retry` |
//! | endpoint re-enabled: `paused` → `pending`, due now | [`manual::enable`] | api `:enable` |
//!
//! A claimed delivery has `locked_until` set (a lease); the lease value is
//! also the claim token: only the claimer records the outcome, and a lease
//! that expired and was claimed again makes the old holder's writes void.
//!
//! # Who writes which column
//!
//! - `webhook_deliveries`: every column, only through this crate. The
//!   dispatcher writes all of them; the api writes `status`,
//!   `next_attempt_at`, `manual_retry`, `locked_until` and `updated_at`
//!   through [`manual::retry`] and [`manual::enable`].
//! - `webhook_attempts`: inserted by [`outcome`] only (the dispatcher); the api reads it.
//! - `webhook_endpoints` health columns (`status`, `disabled_reason`,
//!   `disabled_at`, `consecutive_failures`, `failing_since`,
//!   `last_success_at`, `throttled_until`, `concurrency_limit`): the
//!   dispatcher through [`outcome`] and [`health::disable`]; the api through
//!   [`manual::enable`] (it clears them). The api's configuration routes
//!   write the other columns, and `status = disabled` with
//!   `disabled_reason = deleted` on `DELETE` (with `deleted_at`).
//! - `events`: this crate writes one kind only, `webhook_endpoint.disabled`
//!   ([`health::disable`]), born in the same transaction as the disabling.
//!   Every fan-in reads the event from `events`: PostgreSQL is the truth,
//!   a RabbitMQ message only names the event.
//! - `webhook_reconcile_mark`: [`reconcile`] only (the dispatcher).
//!
//! Issue 22 tuned the hot path: the dispatcher's fan-in leases the new
//! deliveries in its insert when the endpoint has free slots and nothing
//! older due ([`fanin::fan_in_leasing`]); both leasing writes, the claim
//! and that insert, are one round trip each, a PL/pgSQL function called in
//! autocommit ([`lease::LEASING_FUNCTIONS`]). Every lease is taken under its
//! endpoint's transaction-scoped advisory lock
//! ([`lease::ENDPOINT_LOCK_CLASS`]), taken without waiting and held to the
//! end of the transaction: in autocommit, as the dispatcher calls them,
//! only while that one statement runs (inside a caller's transaction, until
//! it ends, and a failing call aborts it). A claim or fan-in skips an endpoint
//! another one is leasing at that moment, so the per-endpoint bound stays
//! exact across replicas and no leasing statement waits for another's
//! endpoint lock (a claim's `UPDATE` may wait on a row lock, for at most
//! its `lock_timeout` of 2 s, and a fan-in's insert on a concurrent insert
//! of the same delivery). The fan-in reads the
//! event from `events` and picks endpoints by the one rule [`fanin::MATCH`]
//! (issue 24), shared with the reconciliation ([`reconcile`]).

pub mod decision;
pub mod fanin;
pub mod health;
pub mod lease;
pub mod manual;
pub mod outcome;
pub mod read;
pub mod reconcile;

pub use vid_core::delivery::DeliveryStatus;
pub use vid_core::endpoint::EndpointStatus;

pub use crate::decision::{decide, AttemptRecord, Decision, HealthRules};
pub use crate::fanin::{fan_in, fan_in_leasing, Ahead, FannedIn, LeaseFresh};
pub use crate::health::disable;
pub use crate::lease::{claim, claim_answered, claim_for_send, postpone, release, release_expired, Claimed, ClaimedForSend};
pub use crate::outcome::{record, record_successes, settle_without_attempt, Recorded};
pub use crate::read::{load_endpoints, retry_backlog, DeliveryRecord, EndpointForSend};
