//! `/uploads`: direct-to-storage multipart uploads (design §1; S3 multipart upload API).
//!
//! An upload's `status` (column `uploads.status`) moves
//! `created` → `completing` → `completed`, or ends `aborted` (`DELETE`) or
//! `expired` (not completed by `expires_at`). `completing` falls back to
//! `created` when storage refuses to assemble the parts.
//!
//! PostgreSQL decides every race; storage follows:
//!
//! - **Per-tenant cap.** `POST /uploads` locks the tenant's row
//!   (`SELECT … FOR NO KEY UPDATE`, which does not block foreign-key checks)
//!   in the transaction that counts the tenant's uploads in flight and inserts
//!   the new one, so parallel creates are serialised per tenant and the cap
//!   holds exactly.
//! - **complete vs DELETE.** Each moves the row with a guarded `UPDATE … WHERE
//!   status IN (…)`. Whichever commits first wins; the loser answers `409`
//!   (`upload_completed` to the DELETE, `upload_aborted` to the complete) and
//!   cleans up after itself: a complete that assembled the object and then
//!   lost deletes it (S3 DeleteObject), so an aborted upload never leaves data.
//!   DELETE changes the row first and then aborts in storage.
//! - **Expiry.** `expires_at` is enforced by the handlers at request time;

pub mod complete;
pub mod create;
pub mod parts;
pub mod shared;

use actix_web::web;

pub use shared::{is_valid_filename, source_key, MAX_COMPLETE_BODY_BYTES, TOO_MANY_UPLOADS_RETRY_AFTER_SECONDS};

/// Routes of this module.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/uploads").route(web::post().to(create::create_upload)))
        .service(web::resource("/uploads/{id}").route(web::get().to(parts::get_upload)).route(web::delete().to(parts::abort_upload)))
        .service(web::resource("/uploads/{id}/parts:sign").route(web::post().to(parts::sign_parts)))
        .service(web::resource("/uploads/{id}/complete").route(web::post().to(complete::complete_upload)));
}
