//! Errors and exit statuses: 0 success; 1 an error (the API's problem is
//! printed); 2 the awaited operation ended `failed` or `cancelled`; 64 a usage
//! error (`EX_USAGE` of sysexits.h); 130 interrupted (Ctrl-C).

use serde_json::json;
use vid_client::ClientError;
use vid_core::operation::{Operation, OperationStatus};
use vid_core::Problem;

use crate::output::Output;

/// Exit status of usage errors (`EX_USAGE` of sysexits.h); 2 means the awaited operation failed.
pub(crate) const EXIT_USAGE: i32 = 64;

/// Ends the process with `code` after printing nothing more.
#[derive(Debug)]
pub(crate) struct Exit(pub(crate) i32);
impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}", self.0)
    }
}
impl std::error::Error for Exit {}

/// An API problem (RFC 9457) on stderr: title, detail, code and extensions.
pub(crate) fn print_problem(p: &Problem) {
    eprintln!("error: {}", p.title);
    if let Some(d) = &p.detail {
        eprintln!("  {d}");
    }
    eprintln!("  code: {} (HTTP {})", p.code, p.status);
    for (k, v) in &p.extensions {
        eprintln!("  {k}: {v}");
    }
}

/// Says what went wrong (stderr; and `{"error": …}` on stdout with `--json`)
/// and answers the exit status: the code of an [`Exit`], else 1.
pub(crate) fn report(e: &anyhow::Error, out: Output, api_url: &str) -> i32 {
    if let Some(Exit(code)) = e.downcast_ref::<Exit>() {
        return *code;
    }
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::Api(p)) => {
            print_problem(p);
            if p.status == 401 {
                eprintln!("  hint: check --api-key / VIDCTL_API_KEY");
            }
            out.error(json!(p));
        }
        Some(ClientError::Http(h)) if h.is_connect() && h.url().is_some_and(|u| u.as_str().starts_with(api_url)) => {
            // The innermost cause says why, e.g. "Connection refused (os error 111)".
            let mut cause: &dyn std::error::Error = h;
            while let Some(s) = cause.source() {
                cause = s;
            }
            let message = format!("cannot reach the API at {api_url}: {cause}");
            eprintln!("error: {message}");
            eprintln!("  set --api-url or VIDCTL_API_URL, or start the local stack (`make up`)");
            out.error(json!({ "title": "cannot reach the API", "detail": message }));
        }
        _ => {
            eprintln!("error: {e:#}");
            out.error(json!({ "title": "vidctl error", "detail": format!("{e:#}") }));
        }
    }
    1
}

/// Exit status of a terminal operation: 0 when it succeeded, else its problem and 2.
pub(crate) fn finish_operation(op: &Operation) -> anyhow::Result<()> {
    if op.status == OperationStatus::Succeeded {
        return Ok(());
    }
    match &op.error {
        Some(p) => {
            eprintln!("operation {} {}", op.id, op.status.as_str());
            print_problem(p);
        }
        None => eprintln!("error: operation {} ended {}", op.id, op.status.as_str()),
    }
    Err(Exit(2).into())
}
