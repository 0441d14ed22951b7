//! `vidctl verify`: checks a captured webhook's signature offline (Standard
//! Webhooks or `Webhook-Signature`, see `vid_webhooks::Verifier`).

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::exit::Exit;
use crate::output::Output;
use crate::view::{dash, unix_time};

/// Verifies `body_file` against the `header`s with any of `secrets`; exits 1
/// (after printing why and the error's code) when the signature is not valid.
pub(crate) fn verify(secrets: &[String], header: &[String], body_file: &Path, tolerance: u64, out: Output) -> anyhow::Result<()> {
    let secrets: Vec<vid_webhooks::Secret> = secrets
        .iter()
        .map(|s| vid_webhooks::Secret::parse(s.trim()).map_err(|e| anyhow::anyhow!("--secret is not a webhook secret: {e}")))
        .collect::<anyhow::Result<_>>()?;
    let headers: Vec<(String, String)> = header
        .iter()
        .map(|h| match h.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() && name.trim().chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                (name.trim().to_ascii_lowercase(), value.trim().to_owned())
            }
            _ => ("webhook-signature".to_owned(), h.trim().to_owned()),
        })
        .collect();
    let body = std::fs::read(body_file).with_context(|| format!("reading --body-file {}", body_file.display()))?;
    let verifier = vid_webhooks::Verifier::new().with_tolerance(Duration::from_secs(if tolerance == 0 { u64::MAX / 4 } else { tolerance }));
    match verifier.verify_now(secrets.iter(), &headers, &body) {
        Ok(v) => {
            out.show_with(
                || json!({ "valid": true, "scheme": v.scheme.as_str(), "timestamp": v.timestamp, "message_id": v.message_id, "secret_index": v.secret_index }),
                || {
                    println!(
                        "valid signature: {} format, signed {} ({}), id {}, secret #{}",
                        v.scheme.as_str(),
                        unix_time(v.timestamp),
                        v.timestamp,
                        dash(v.message_id.as_ref()),
                        v.secret_index + 1
                    )
                },
            );
            Ok(())
        }
        Err(e) => {
            // With --json the verdict is the result; for people it is the line below.
            out.show(&json!({ "valid": false, "code": e.code(), "detail": e.to_string() }), |_| {});
            eprintln!("invalid: {e}\n  code: {}", e.code());
            Err(Exit(1).into())
        }
    }
}
