//! Where the API is and which key to use: flags, environment, `.local/api-key`.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cli::Cli;

const DEFAULT_API_URL: &str = "http://127.0.0.1:8080";

/// `s` trimmed, or `None` when absent or blank.
pub(crate) fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The API base URL, normalised (lower-case scheme and host, no trailing `/`).
pub(crate) fn resolve_api_url(cli: &Cli) -> anyhow::Result<String> {
    let raw = non_empty(&cli.api_url).unwrap_or(DEFAULT_API_URL);
    match reqwest::Url::parse(raw) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(u.as_str().trim_end_matches('/').to_owned()),
        _ => anyhow::bail!("--api-url (or VIDCTL_API_URL) {raw} is not an http:// or https:// URL; e.g. http://{raw}"),
    }
}

/// `.local/api-key` in the current directory or the nearest parent that has one.
fn find_key_file() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors().map(|d| d.join(".local/api-key")).find(|p| p.is_file())
}

/// The API key: `--api-key` / `VIDCTL_API_KEY`, else the nearest `.local/api-key`.
pub(crate) fn resolve_api_key(cli: &Cli) -> anyhow::Result<String> {
    if let Some(k) = non_empty(&cli.api_key) {
        return Ok(k.to_owned());
    }
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
    let Some(path) = find_key_file() else {
        anyhow::bail!(
            "no API key: pass --api-key or set VIDCTL_API_KEY (no .local/api-key in {cwd} or any parent; `make up` writes one for the local stack)"
        );
    };
    let key = std::fs::read_to_string(&path).with_context(|| format!("reading the API key from {}", path.display()))?;
    let key = key.trim();
    anyhow::ensure!(!key.is_empty(), "no API key: {} is empty; pass --api-key or set VIDCTL_API_KEY", path.display());
    Ok(key.to_owned())
}
