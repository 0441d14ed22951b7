//! The HTTP client: [`Client`] with one method per API call, its error type,
//! pages, and the operation event stream. The webhook endpoint and delivery
//! calls are in [`crate::resources`].

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;
use vid_core::endpoint::{CreateEndpoint, CreatedEndpoint, EndpointSummary};
use vid_core::event::Event;
use vid_core::operation::{Operation, WaitOperation, WaitResponse};
use vid_core::playback::{CreatePlaybackId, PlaybackIdView, PlaybackPolicy};
use vid_core::upload::{CompleteUpload, CreateUpload, CreatedUpload, SignParts, SignedParts, UploadState};
use vid_core::video::Video;
use vid_core::{EndpointId, EventId, OperationId, PlaybackId, Problem, UploadId, VideoId};

/// Everything that can go wrong talking to the API or to storage.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with a problem-details error.
    #[error("{} ({}): {}", .0.title, .0.code, .0.detail.as_deref().unwrap_or(""))]
    Api(Problem),
    /// The API answered something that is not what the contract says.
    #[error("unexpected answer from the API: HTTP {status}: {body}")]
    Unexpected {
        /// HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// Network or protocol failure. Storage errors carry no URL (presigned
    /// URLs hold a signature).
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    /// Storage refused a part after every retry.
    #[error("storage refused part {part_number}: HTTP {status}: {body}")]
    Storage {
        /// The part.
        part_number: u32,
        /// HTTP status from storage.
        status: u16,
        /// What storage said: its S3 error code with a hint (never the
        /// bucket or key), or the start of a body that is not an S3 error.
        body: String,
    },
    /// The file to upload cannot be opened or read, or is not a regular file.
    #[error("{}: {error}", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        error: std::io::Error,
    },
    /// Reading the file failed, or the upload stopped where it was asked to
    /// ([`Uploader::stop_after_parts`](crate::upload::Uploader::stop_after_parts)).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Another process holds the lock on this file's upload state: it is
    /// uploading the same file now.
    #[error("another vidctl is uploading this file ({})", upload_id.as_ref().map_or_else(|| "its upload is being created".to_owned(), |id| format!("upload {id}")))]
    Busy {
        /// The upload the other process works on, once it has created it.
        upload_id: Option<UploadId>,
    },
    /// The file's unfinished upload was started with another content type
    /// than the one asked for now.
    #[error(
        "this file's unfinished upload {upload_id} was started as {started}, not {requested}: resume it with the same content type \
         (or none), or abort it (`vidctl uploads abort {upload_id}`) to start afresh"
    )]
    ContentTypeMismatch {
        /// The unfinished upload.
        upload_id: UploadId,
        /// Its content type.
        started: String,
        /// The content type asked for now.
        requested: String,
    },
    /// Waiting ran out of time.
    #[error("timed out waiting for operation {0}")]
    Timeout(OperationId),
}

impl ClientError {
    /// True for failures worth retrying as they are: the connection failed
    /// or was cut, or the server answered `502`, `503` or `504`.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Http(e) => e.is_connect() || e.is_request() || e.is_body() || e.is_timeout(),
            ClientError::Api(p) => matches!(p.status, 502..=504),
            ClientError::Unexpected { status, .. } => matches!(status, 502..=504),
            _ => false,
        }
    }
}

/// Pause before `wait_operation` calls again after a transient failure.
const WAIT_RETRY_PAUSE: Duration = Duration::from_millis(500);

impl ClientError {
    /// The problem details, when the API sent some.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Api(p) => Some(p),
            _ => None,
        }
    }
}

/// Result of calls that answer `202 Accepted`: the operation and its `Location`.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The operation as returned in the body.
    pub operation: Operation,
    /// The `Location` header, e.g. `/operations/op_…`.
    pub location: String,
}

/// A page of a list endpoint: `{data, next_cursor}`, the wire type itself.
pub use vid_core::Page;

/// Filters of `GET /events` ([`Client::list_events`]); `Default` is no filter.
///
/// Filters combine (AND) and stay in force while paging: pass the same filter
/// again with `cursor` set to the previous page's `next_cursor`.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventFilter<'a> {
    /// Only events of this type, e.g. `video.ready`; an unknown type is the
    /// api's `400 invalid_event_type`.
    pub type_: Option<&'a str>,
    /// Only events recorded strictly after this instant (an exclusive bound
    /// on the database's clock, to the microsecond). Sent as RFC 3339 in UTC.
    pub created_after: Option<DateTime<Utc>>,
    /// Only events recorded strictly before this instant (exclusive). Sent as
    /// RFC 3339 in UTC.
    pub created_before: Option<DateTime<Utc>>,
    /// Page size, 1–100 (server default 20; larger values are clamped).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page: events older than that one.
    pub cursor: Option<&'a str>,
}

/// An instant as a query value: RFC 3339 in UTC with a `Z` (no `+` to
/// encode), with as many fractional digits as it needs (none, 3, 6 or 9).
fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A client for one API base URL and key. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Client {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8080`) authenticating with `api_key`.
    pub fn new(base_url: &str, api_key: &str) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .user_agent(concat!("vidctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a default reqwest client always builds");
        Self { http, base: base_url.trim_end_matches('/').to_owned(), key: api_key.to_owned() }
    }

    /// The HTTP client, shared with storage uploads.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The API base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub(crate) async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        headers: &[(&str, &str)],
    ) -> Result<(T, Option<String>), ClientError> {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.key);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<Problem>(&bytes) {
                Ok(p) => ClientError::Api(p),
                Err(_) => ClientError::Unexpected {
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into(),
                },
            });
        }
        let body = if status == StatusCode::NO_CONTENT || bytes.is_empty() { b"null".as_slice() } else { &bytes };
        let value = serde_json::from_slice(body).map_err(|e| ClientError::Unexpected {
            status: status.as_u16(),
            body: format!("{e}: {}", String::from_utf8_lossy(&bytes[..bytes.len().min(512)])),
        })?;
        Ok((value, location))
    }

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        Ok(self.call::<(), T>(Method::GET, path, None, &[]).await?.0)
    }

    /// `POST /uploads`. `idempotency_key` makes a retried call replay the first answer.
    pub async fn create_upload(&self, req: &CreateUpload, idempotency_key: Option<&str>) -> Result<CreatedUpload, ClientError> {
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| vec![("Idempotency-Key", k)]).unwrap_or_default();
        Ok(self.call(Method::POST, "/uploads", Some(req), &headers).await?.0)
    }

    /// `GET /uploads/{id}`: status and the parts storage holds.
    pub async fn get_upload(&self, id: &UploadId) -> Result<UploadState, ClientError> {
        self.get(&format!("/uploads/{id}")).await
    }

    /// `POST /uploads/{id}/parts:sign`: fresh URLs for the named parts.
    pub async fn sign_parts(&self, id: &UploadId, part_numbers: &[u32]) -> Result<SignedParts, ClientError> {
        let body = SignParts { part_numbers: part_numbers.to_vec() };
        Ok(self.call(Method::POST, &format!("/uploads/{id}/parts:sign"), Some(&body), &[]).await?.0)
    }

    /// `POST /uploads/{id}/complete` → `202` with the transcode operation.
    pub async fn complete_upload(&self, id: &UploadId, body: Option<&CompleteUpload>) -> Result<Accepted, ClientError> {
        let (operation, location) = match body {
            Some(b) => self.call(Method::POST, &format!("/uploads/{id}/complete"), Some(b), &[]).await?,
            None => self.call::<(), Operation>(Method::POST, &format!("/uploads/{id}/complete"), None, &[]).await?,
        };
        Ok(Accepted { location: location.unwrap_or_else(|| format!("/operations/{}", operation.id)), operation })
    }

    /// `DELETE /uploads/{id}`: abort.
    pub async fn abort_upload(&self, id: &UploadId) -> Result<(), ClientError> {
        self.call::<(), serde_json::Value>(Method::DELETE, &format!("/uploads/{id}"), None, &[]).await?;
        Ok(())
    }

    /// `GET /operations/{id}`.
    pub async fn get_operation(&self, id: &OperationId) -> Result<Operation, ClientError> {
        self.get(&format!("/operations/{id}")).await
    }

    /// `GET /operations?status=&cursor=`.
    pub async fn list_operations(&self, status: Option<&str>, cursor: Option<&str>) -> Result<Page<Operation>, ClientError> {
        self.get(&format!("/operations?{}", query(&[("status", status), ("cursor", cursor)]))).await
    }

    /// `POST /operations/{id}:cancel`.
    pub async fn cancel_operation(&self, id: &OperationId) -> Result<Operation, ClientError> {
        Ok(self.call::<(), Operation>(Method::POST, &format!("/operations/{id}:cancel"), None, &[]).await?.0)
    }

    /// `POST /operations/{id}:wait`: answers when the operation changes
    /// (relative to `revision`, or to its state when the call arrives), when it
    /// is terminal, or after `timeout_seconds` (server default 30, at most 60).
    pub async fn wait_operation_once(
        &self,
        id: &OperationId,
        timeout_seconds: Option<u64>,
        revision: Option<i64>,
    ) -> Result<WaitResponse, ClientError> {
        let timeout_seconds = timeout_seconds.map(|s| u32::try_from(s).unwrap_or(u32::MAX));
        let body = WaitOperation { timeout_seconds, revision };
        Ok(self.call(Method::POST, &format!("/operations/{id}:wait"), Some(&body), &[]).await?.0)
    }

    /// Follows an operation until it is terminal, calling `on_change` with
    /// its current state first and then on every change; gives up after
    /// `timeout`. Uses long-polling (`:wait`), so changes arrive as they
    /// happen without polling at a fixed interval. A lost connection or a
    /// `502`/`503`/`504` (an api replica stopping during a rollout, a load
    /// balancer between replicas) is retried after a short pause, within
    /// `timeout`; other errors end the wait.
    pub async fn wait_operation(
        &self,
        id: &OperationId,
        timeout: Duration,
        mut on_change: impl FnMut(&Operation),
    ) -> Result<Operation, ClientError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // Revision -1: the first call answers at once with the current state.
        let mut revision = -1;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let seconds = if revision < 0 { 0 } else { left.as_secs_f64().ceil() as u64 };
            let answer = match self.wait_operation_once(id, Some(seconds.min(WAIT_CALL_SECONDS)), Some(revision)).await {
                Ok(a) => a,
                Err(e) if e.is_transient() && tokio::time::Instant::now() + WAIT_RETRY_PAUSE < deadline => {
                    tokio::time::sleep(WAIT_RETRY_PAUSE).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if answer.revision != revision {
                on_change(&answer.operation);
                revision = answer.revision;
            }
            if answer.operation.status.is_terminal() {
                return Ok(answer.operation);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClientError::Timeout(id.clone()));
            }
        }
    }

    /// `GET /operations/{id}/events`: the operation's Server-Sent Events.
    /// `last_event_id` resumes after an event already seen (its `id`).
    /// Answers `Ok(None)` when the server says there is nothing more to see
    /// (`204`: the operation ended at that event).
    pub async fn operation_events(&self, id: &OperationId, last_event_id: Option<i64>) -> Result<Option<OperationEvents>, ClientError> {
        let mut req = self
            .http
            .get(format!("{}/operations/{id}/events", self.base))
            .bearer_auth(&self.key)
            .header("Accept", "text/event-stream")
            // The client-wide timeout covers whole responses; a stream lasts as long as the operation.
            .timeout(Duration::from_secs(7 * 24 * 3600));
        if let Some(last) = last_event_id {
            req = req.header("Last-Event-ID", last.to_string());
        }
        let resp = req.send().await?;
        let status = resp.status();
        if status == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        if !status.is_success() {
            let bytes = resp.bytes().await?;
            return Err(match serde_json::from_slice::<Problem>(&bytes) {
                Ok(p) => ClientError::Api(p),
                Err(_) => ClientError::Unexpected {
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into(),
                },
            });
        }
        Ok(Some(OperationEvents { resp, buf: Vec::new() }))
    }

    /// `GET /videos/{id}` (with download URLs).
    pub async fn get_video(&self, id: &VideoId) -> Result<Video, ClientError> {
        self.get(&format!("/videos/{id}")).await
    }

    /// `GET /videos`.
    pub async fn list_videos(&self, cursor: Option<&str>) -> Result<Page<Video>, ClientError> {
        self.get(&format!("/videos?{}", query(&[("cursor", cursor)]))).await
    }

    /// `POST /videos/{id}/playback-ids` → `201`: a new playback ID of `policy`
    /// for `video`, with its stable `hls_url` and `dash_url` (they serve once
    /// the video is ready).
    ///
    /// Errors: [`ClientError::Api`] with `not_found` (no such video of this
    /// tenant). A `signed` ID plays with a token ([`crate::sign_playback_token`]).
    pub async fn create_playback_id(&self, video: &VideoId, policy: PlaybackPolicy) -> Result<PlaybackIdView, ClientError> {
        let body = CreatePlaybackId { policy };
        Ok(self.call(Method::POST, &format!("/videos/{video}/playback-ids"), Some(&body), &[]).await?.0)
    }

    /// `DELETE /videos/{id}/playback-ids/{playback_id}` → `204`: its URLs stop working.
    ///
    /// Errors: [`ClientError::Api`] with `not_found` for an unknown id, or one
    /// of another video or tenant.
    pub async fn delete_playback_id(&self, video: &VideoId, playback_id: &PlaybackId) -> Result<(), ClientError> {
        self.call::<(), serde_json::Value>(Method::DELETE, &format!("/videos/{video}/playback-ids/{playback_id}"), None, &[]).await?;
        Ok(())
    }

    /// `POST /webhook-endpoints` (the secret is in the answer, shown once).
    pub async fn create_endpoint(&self, req: &CreateEndpoint) -> Result<CreatedEndpoint, ClientError> {
        Ok(self.call(Method::POST, "/webhook-endpoints", Some(req), &[]).await?.0)
    }

    /// `GET /webhook-endpoints`: every endpoint, newest first, each with its delivery health.
    pub async fn list_endpoints(&self) -> Result<Page<EndpointSummary>, ClientError> {
        self.get("/webhook-endpoints").await
    }

    /// `GET /webhook-endpoints/{id}`: the endpoint with its delivery health.
    pub async fn get_endpoint(&self, id: &EndpointId) -> Result<EndpointSummary, ClientError> {
        self.get(&format!("/webhook-endpoints/{id}")).await
    }

    /// `DELETE /webhook-endpoints/{id}`.
    pub async fn delete_endpoint(&self, id: &EndpointId) -> Result<(), ClientError> {
        self.call::<(), serde_json::Value>(Method::DELETE, &format!("/webhook-endpoints/{id}"), None, &[]).await?;
        Ok(())
    }

    /// `GET /events?type=&created_after=&created_before=&limit=&cursor=`:
    /// the tenant's events, newest first, each exactly as its webhooks
    /// carried it. Only the filters that are set are sent.
    ///
    /// Errors: [`ClientError::Api`] with `invalid_event_type` for an unknown
    /// type, `invalid_cursor` for a cursor that is not an event id.
    pub async fn list_events(&self, filter: &EventFilter<'_>) -> Result<Page<Event>, ClientError> {
        let after = filter.created_after.as_ref().map(rfc3339);
        let before = filter.created_before.as_ref().map(rfc3339);
        let limit = filter.limit.map(|l| l.to_string());
        let q = query(&[
            ("type", filter.type_),
            ("created_after", after.as_deref()),
            ("created_before", before.as_deref()),
            ("limit", limit.as_deref()),
            ("cursor", filter.cursor),
        ]);
        self.get(&format!("/events?{q}")).await
    }

    /// `GET /events/{id}`.
    pub async fn get_event(&self, id: &EventId) -> Result<Event, ClientError> {
        self.get(&format!("/events/{id}")).await
    }

    /// A raw JSON call, for resources this SDK has no typed method for yet.
    pub async fn raw(&self, method: Method, path: &str, body: Option<&serde_json::Value>) -> Result<serde_json::Value, ClientError> {
        Ok(self.call(method, path, body, &[]).await?.0)
    }
}

/// Longest `:wait` call the SDK makes (the server caps at 60 s).
const WAIT_CALL_SECONDS: u64 = 30;

/// One event of an operation's event stream.
#[derive(Debug, Clone)]
pub struct OperationEvent {
    /// The event's `id:` (the operation's revision); pass it to resume.
    pub id: Option<i64>,
    /// The operation at that revision.
    pub operation: Operation,
}

/// An open `GET /operations/{id}/events` stream.
#[derive(Debug)]
pub struct OperationEvents {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl OperationEvents {
    /// The next event; `Ok(None)` when the stream ended (after the terminal
    /// event, or when the server closed it). Comments and `retry:` are skipped.
    pub async fn next(&mut self) -> Result<Option<OperationEvent>, ClientError> {
        loop {
            while let Some(end) = find_block_end(&self.buf) {
                let block: Vec<u8> = self.buf.drain(..end.1).collect();
                let parsed = parse_block(&block[..end.0]).map_err(|body| ClientError::Unexpected { status: 200, body })?;
                if let Some(event) = parsed {
                    return Ok(Some(event));
                }
            }
            match self.resp.chunk().await? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}

/// The end of the first event block: (end of its content, end including the blank line).
fn find_block_end(buf: &[u8]) -> Option<(usize, usize)> {
    (0..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\n\n") {
            Some((i, i + 2))
        } else if buf[i..].starts_with(b"\r\n\r\n") {
            Some((i, i + 4))
        } else {
            None
        }
    })
}

/// One event block; `Err` with the offending data when it is not an operation.
fn parse_block(block: &[u8]) -> Result<Option<OperationEvent>, String> {
    let text = String::from_utf8_lossy(block);
    let mut id = None;
    let mut data = String::new();
    for line in text.lines() {
        let (field, value) = line.split_once(':').map(|(f, v)| (f, v.strip_prefix(' ').unwrap_or(v))).unwrap_or((line, ""));
        match field {
            "id" => id = value.trim().parse().ok(),
            "data" => {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            _ => {}
        }
    }
    if data.is_empty() {
        return Ok(None);
    }
    let operation = serde_json::from_str(&data).map_err(|e| format!("{e}: {data}"))?;
    Ok(Some(OperationEvent { id, operation }))
}

/// A query string (`application/x-www-form-urlencoded`) of the pairs that have a value.
pub(crate) fn query(pairs: &[(&str, Option<&str>)]) -> String {
    let mut url = reqwest::Url::parse("http://query.invalid/").expect("a valid URL");
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in pairs {
            if let Some(v) = v {
                q.append_pair(k, v);
            }
        }
    }
    url.query().unwrap_or_default().to_owned()
}

pub use reqwest::Method as HttpMethod;

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    #[test]
    fn event_time_filters_are_sent_as_rfc3339_in_utc() {
        let t = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        assert_eq!(rfc3339(&t), "2026-01-02T03:04:05Z");
        let t = t + chrono::Duration::microseconds(250_001);
        assert_eq!(rfc3339(&t), "2026-01-02T03:04:05.250001Z");
        let after = rfc3339(&t);
        assert_eq!(
            query(&[("type", Some("video.ready")), ("created_after", Some(&after)), ("cursor", None)]),
            format!("type=video.ready&created_after={}", after.replace(':', "%3A"))
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query(&[("type", Some("video.ready#x"))]), "type=video.ready%23x");
        assert_eq!(query(&[("a", Some("x&y=z+1 %/?"))]), "a=x%26y%3Dz%2B1+%25%2F%3F");
        assert_eq!(query(&[("a", None), ("b", None)]), "");
    }

    #[test]
    fn error_chains_do_not_repeat_the_cause() {
        let e = anyhow::Error::from(ClientError::Io(std::io::Error::from(std::io::ErrorKind::PermissionDenied)));
        let text = format!("{e:#}");
        assert_eq!(text.matches("ermission denied").count(), 1, "{text}");
        let e = ClientError::File { path: "/x/movie.mp4".into(), error: std::io::Error::from(std::io::ErrorKind::PermissionDenied) };
        let text = format!("{:#}", anyhow::Error::from(e));
        assert!(text.starts_with("/x/movie.mp4: "), "{text}");
        assert_eq!(text.matches("ermission denied").count(), 1, "{text}");
    }
}
