//! The S3 client (aws-sdk-s3; rusoto is deprecated), configured for
//! self-hosted S3-compatible stores such as Garage or MinIO: a custom endpoint,
//! path-style addressing, and checksums only `WhenRequired` (the newer default
//! CRC32 trailers are not understood by every store).

use std::time::Duration;

use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation};
use secrecy::ExposeSecret;

use crate::settings::S3Settings;

/// A client for API calls from inside the cluster (`settings.endpoint`).
pub fn client(settings: &S3Settings) -> aws_sdk_s3::Client {
    build(settings, &settings.endpoint)
}

/// A client whose presigned URLs name the endpoint clients can reach
/// (`settings.public_endpoint`, or `endpoint` when unset). It signs only; no
/// request leaves through it.
pub fn presigning_client(settings: &S3Settings) -> aws_sdk_s3::Client {
    build(settings, settings.public_endpoint.as_deref().unwrap_or(&settings.endpoint))
}

/// Opening a TCP connection to the store may take this long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// From a request's start (body sent included) to the first byte of the
/// answer: a store that accepts connections but never answers fails the call
/// instead of hanging it. Generous, since an `UploadPart` sends up to a part
/// (tens of MiB) before the store answers; a download's body may take longer.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(300);

fn build(settings: &S3Settings, endpoint: &str) -> aws_sdk_s3::Client {
    let credentials =
        Credentials::new(settings.access_key_id.clone(), settings.secret_access_key.expose_secret().to_owned(), None, None, "vid-settings");
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(credentials)
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .timeout_config(TimeoutConfig::builder().connect_timeout(CONNECT_TIMEOUT).read_timeout(FIRST_BYTE_TIMEOUT).build())
        .build();
    aws_sdk_s3::Client::from_conf(config)
}
