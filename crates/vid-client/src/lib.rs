//! Typed SDK for the video platform API.
//!
//! Every request and response type comes from `vid-core`, the crate the api
//! itself serialises with: there are no copied structs to drift apart.
//!
//! ```no_run
//! # async fn demo() -> Result<(), vid_client::ClientError> {
//! use vid_client::Client;
//! let client = Client::new("http://127.0.0.1:8080", "vidk_…");
//! let accepted = vid_client::upload::Uploader::new(&client).upload_file("movie.mp4".as_ref(), None).await?;
//! let op = client.wait_operation(&accepted.operation.id, std::time::Duration::from_secs(600), |_| {}).await?;
//! println!("{:?}", op.status);
//! # Ok(()) }
//! ```

//!
//! Modules: [`client`] the [`Client`] and its errors (one method per API
//! call); [`resources`] the webhook endpoint and delivery calls; [`signing`]
//! signing keys and playback tokens for signed playback IDs; [`upload`]
//! parallel, resumable uploads; [`sniff`] a file's media type from its first
//! bytes.

pub mod client;
pub mod resources;
pub mod signing;
pub mod sniff;
pub mod upload;

pub use client::{Accepted, Client, ClientError, EventFilter, HttpMethod, OperationEvent, OperationEvents, Page};
pub use resources::{DeliveryFilter, EndpointChanges};
pub use signing::{sign_claims, sign_playback_token, SignError};
