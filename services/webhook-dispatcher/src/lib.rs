//! The webhook dispatcher: delivers every committed event to the tenant's
//! endpoints, signed, at least once, through two days of outage, without
//! ever reaching our own network and without one broken endpoint delaying
//! anyone else.
//!
//! # Flow
//!
//! ```text
//! api outbox ──▶ P.events ──▶ P.webhook.events ──▶ fanin ──▶ webhook_deliveries (pending)
//!                                                               │ scheduler: claim (lease)
//!                                                               ▼
//!                                 attempt: SSRF check → connect → signed POST
//!                                                               │ one transaction
//!                                                               ▼
//!                                 webhook_attempts + delivery status + endpoint health
//! ```
//!
//! - [`fanin`]: RabbitMQ message → the event (read from `events`, the truth)
//!   → one delivery row per matching endpoint (`vid_deliveries::fanin::MATCH`), acked after commit.
//! - [`scheduler`]: claims due deliveries (leases, per-endpoint concurrency bound) and runs attempts.
//! - [`attempt`]: the HTTP request (hyper 1, rustls), SSRF re-check, error classes.
//! - [`retry`]: schedule, jitter, `Retry-After` (pure).
//! - [`app`]: [`Dispatcher`]: settings checked, tasks started, shutdown in order.
//! - `vid_deliveries` (shared crate): every SQL statement of a delivery
//!   transition and the delivery state machine; the api's `:retry` and
//!   `:enable` use it too. The dispatcher speaks no SQL of its own except the
//!   LISTEN in [`listen`].
//! - [`reconcile`]: at start-up and every `reconcile_interval_seconds`,
//!   events in PostgreSQL older than `reconcile_grace_seconds` that lack a
//!   delivery for a matching endpoint get it (a message lost by RabbitMQ).
//! - [`listen`]: LISTEN for deliveries that became due elsewhere (wakes the scheduler).
//! - [`health`]: `/healthz`, `/readyz`, `/metrics`.
//!
//! # Metrics (`GET /metrics` on the health server)
//!
//! - `webhook_delivery_attempts_total{outcome}`: every attempt; `outcome` is
//!   `succeeded`, `http_4xx`/`http_5xx`/…, `redirect`, or the error class
//!   (`timeout`, `connect`, `dns`, `tls`, `blocked_address`, `http`).
//! - `webhook_delivery_attempt_duration_seconds`: histogram of attempt durations.
//! - `webhook_retry_backlog`: deliveries `pending` with a future next attempt
//!   (refreshed every `retry_backlog_interval_ms`).
//! - `webhook_endpoints_disabled_total{reason}`: `gone`, `failed_deliveries`, `failing_too_long`.
//! - `amqp_messages_consumed_total{queue,outcome}`: fan-in messages, `ack|requeue|reject`.
//! - `webhook_deliveries_leased_total{by}`: deliveries leased for an attempt,
//!   `by` `fanin` (the fan-in's insert leased them: no claim) or `claim`.
//!   The fan-in leases only for an endpoint with nothing older due; leasing
//!   ahead of the bound (`lease_ahead`) it leases a burst that outruns the
//!   receivers too, where otherwise nearly every delivery waits for a claim
//!   (BENCHMARKS.md, 2026-12-06 third and eighth sessions).
//! - `webhook_deliveries_given_back_total{reason}`: leases given back
//!   unsent from the endpoint's gate (`scheduler::Gates`), due again at
//!   once for any replica: `endpoint_failed` (an attempt to the endpoint
//!   answered 429/503 or 410, or failed with no retry left, and was not yet
//!   recorded, or was recorded after the lease was taken),
//!   `endpoint_changed` (a lease older than a
//!   second found its endpoint paused, deleted or with a new URL, format
//!   or secret when read again) or `lease_short` (too little of the lease
//!   left for a whole attempt).
//! - `webhook_claims_total{result}`: claim statements that returned,
//!   `leased` or `empty` (nothing claimable within the bounds; the loop's
//!   wake-ups are not told why, so some are); a failed one is logged, not
//!   counted. Leases are counted when taken: one given back unsent at
//!   shutdown counts too.
//! - `events_reconciled_total`, `webhook_deliveries_reconciled_total`:
//!   events (and their delivery rows) the reconciliation created because the
//!   message path had not; 0 on a healthy system, so any increase is a lost message.
//! - `events_reconcile_last_success_timestamp_seconds` (Unix time of the last
//!   completed pass) and `events_reconcile_mark_lag_seconds` (now minus the
//!   high-water mark; grace + at most one interval when healthy).
//!
//! # Ownership
//!
//! The dispatcher writes `webhook_deliveries`, `webhook_attempts` and the
//! health columns of `webhook_endpoints` (`status`, `disabled_reason`,
//! `disabled_at`, `consecutive_failures`, `failing_since`,
//! `last_success_at`, `throttled_until`). It reads the api's configuration
//! columns (URL, filter, format, sealed secrets). It writes `events` in one
//! place only: the `webhook_endpoint.disabled` event (`vid_deliveries::disable`).
//! Column by column: see `vid_deliveries`.
//!
//! # Signing
//!
//! Every attempt is signed afresh (`t` = attempt time) with
//! [`vid_webhooks::signature_headers`]: the endpoint's current secret and,
//! while `previous_secret_expires_at` is in the future, its previous one
//! (two `v1` entries, new first). The id (`Webhook-Id`/`webhook-id`) is the
//! event id on every retry. Formats: `webhook-signature` (default;
//! `Webhook-Signature: t=…,v1=…`) and `standard-webhooks`
//! (<https://www.standardwebhooks.com/>).
//!
//! # Retry schedule
//!
//! After failed attempt `n` the delivery waits `retry_schedule_seconds[n-1]`
//! ±20 % jitter, or what `Retry-After` asks within `[step, max(step, 1 h)]`
//! (RFC 9110 §10.2.3; see [`retry`]). Production (`config/default.toml`):
//!
//! | after attempt | wait | first attempt + waits (nominal) |
//! |---:|---:|---:|
//! | 1 | 5 s | 5 s |
//! | 2 | 30 s | 35 s |
//! | 3 | 2 min | 2 min 35 s |
//! | 4 | 10 min | 12 min 35 s |
//! | 5 | 30 min | 42 min 35 s |
//! | 6 | 1 h | 1 h 43 min |
//! | 7 | 2 h | 3 h 43 min |
//! | 8 | 4 h | 7 h 43 min |
//! | 9 | 8 h | 15 h 43 min |
//! | 10 | 8 h | 23 h 43 min |
//! | 11 | 8 h | 31 h 43 min |
//!
//! 12 attempts; after the 12th fails the delivery is `failed`. With jitter
//! the last attempt lands between 0.8× and 1.2× the nominal total (25.4 h –
//! 38.1 h; at most 42.2 h with maximal `Retry-After`s, [`retry::horizon`]),
//! inside the required 24–48 h window (checked by the test
//! `retry_window_of_the_production_schedule`).
//!
//! `429` and `503` also slow the whole endpoint down (AIMD, like TCP's
//! congestion control):
//! - no attempt to it starts until that retry is due (`throttled_until`):
//!   the claim skips it meanwhile;
//! - the first 429/503 of a throttle halves its concurrency
//!   (`concurrency_limit`, at least 1; NULL means `per_endpoint_concurrency`),
//!   and every recorded success raises it by one until it is back at
//!   `per_endpoint_concurrency`. So when the throttle ends, a rate-limited
//!   endpoint gets at most half its former burst, not the full one.
//!
//! # Disabling
//!
//! An enabled endpoint is disabled when (defaults, `[dispatcher]` settings):
//! - it answers `410 Gone` (at once);
//! - `disable_after_failed_deliveries` (5) deliveries in a row ended `failed`
//!   with every retry used; or
//! - every attempt has failed for `disable_after_failing_seconds` (24 h)
//!   since the first failure after its last success.
//!
//! Disabling sets `status = disabled`, `disabled_reason`, `disabled_at`;
//! pending deliveries become `paused` (kept); new events are stored `paused`;
//! a `webhook_endpoint.disabled` event goes to the tenant's other enabled
//! endpoints. `POST /webhook-endpoints/{id}:enable` (api) resumes them all.
//!
//! # Shutdown
//!
//! On SIGTERM (or SIGINT): the fan-in stops consuming (messages received but
//! not yet fanned in go back to the queue when its channel closes; a batch
//! being inserted is committed and acked first), the scheduler stops
//! claiming, in-flight attempts get `shutdown_grace_seconds` (20 s) to
//! finish and are recorded, then the rest are aborted and their leases
//! released in one statement so any replica claims them at once; exit 0.
//! Within the grace period nothing is sent twice because of the shutdown;
//! an attempt aborted after its request went out is sent again later (at
//! least once). A crash loses nothing either: unacked messages are
//! redelivered and leases expire after `lease_ms`.
//!
//! # Throughput
//!
//! Per delivery the hot path costs a share of: one fan-in transaction per
//! batch of messages (which leases them, ahead of the bound where it may),
//! one claim transaction per batch of deliveries the fan-in could not lease,
//! a pooled keep-alive HTTP request, and one recording statement per batch
//! of successes. See `scripts/bench-dispatch.sh` and
//! the README for measured figures.

pub mod app;
pub mod attempt;
pub mod fanin;
pub mod health;
pub mod listen;
pub mod reconcile;
pub mod retry;
pub mod scheduler;
pub mod settings;

pub use crate::app::{run, Dispatcher};
pub use crate::attempt::ConnectObserver;
pub use crate::settings::Settings;
