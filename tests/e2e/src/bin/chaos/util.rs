//! Small helpers of the run: waiting for a URL, free ports, times as
//! `+mm:ss.s`, and SQL through psql (the test kit's way; no driver needed
//! for a few queries).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};

/// Polls `url` until it answers 200; false after `timeout`.
pub(crate) async fn wait_200(url: &str, timeout: Duration) -> bool {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("a reqwest client builds");
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match http.get(url).send().await {
            Ok(r) if r.status().as_u16() == 200 => return true,
            Ok(r) => last = format!("HTTP {}", r.status()),
            Err(e) => last = format!("{e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    note(&format!("{url} did not answer 200 within {timeout:?}; last: {last}"));
    false
}

pub(crate) fn note(msg: &str) {
    eprintln!("chaos: {msg}");
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) fn fmt_t(d: Duration) -> String {
    let s = d.as_secs_f64();
    format!("+{:02}:{:04.1}", (s / 60.0).floor() as u64, s % 60.0)
}

pub(crate) async fn sql(url: &str, query: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let out = tokio::process::Command::new("psql")
        .args(["-X", "-q", "-A", "-t", "-F", "\u{1f}", "-v", "ON_ERROR_STOP=1", url, "-c", query])
        .output()
        .await
        .context("running psql")?;
    if !out.status.success() {
        bail!("psql {query:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\u{1f}').map(str::to_owned).collect())
        .collect())
}

pub(crate) async fn sql_count(url: &str, query: &str) -> anyhow::Result<i64> {
    let rows = sql(url, query).await?;
    rows.first().and_then(|r| r.first()).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("no count from {query:?}"))
}

/// Attempts to `endpoint` that got no HTTP answer (refused, reset, timed
/// out): `webhook_attempts` rows without a `response_status`.
pub(crate) async fn unanswered_attempts(url: &str, endpoint: &str) -> anyhow::Result<i64> {
    sql_count(url, &format!("SELECT count(*) FROM webhook_attempts WHERE endpoint_id = '{endpoint}' AND response_status IS NULL")).await
}
