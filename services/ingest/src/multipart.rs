//! Streams bytes into one storage object as an S3 multipart upload
//! (CreateMultipartUpload, UploadPart, CompleteMultipartUpload; on any
//! failure AbortMultipartUpload), holding at most two parts in memory: the
//! one being filled and the one being sent.

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::{Bytes, BytesMut};
use tokio::task::JoinHandle;

use crate::problems::IngestError;

/// S3's smallest part (all but the last), 5 MiB (S3 API, UploadPart).
pub const MIN_PART_BYTES: usize = 5 * 1024 * 1024;

/// One multipart upload in progress. Drop without [`finish`](Self::finish)
/// or [`abort`](Self::abort) leaves the upload to the bucket's lifecycle
/// rule; callers always end it with one of the two.
pub struct MultipartWriter {
    s3: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    upload_id: String,
    part_size: usize,
    buffer: BytesMut,
    next_part: i32,
    in_flight: Option<JoinHandle<Result<CompletedPart, IngestError>>>,
    done: Vec<CompletedPart>,
    written: u64,
}

fn storage(action: &str, e: impl std::fmt::Display) -> IngestError {
    IngestError::Storage(format!("{action}: {e}"))
}

impl MultipartWriter {
    /// Starts a multipart upload of `key` (S3 CreateMultipartUpload) with
    /// parts of `part_size` bytes (raised to [`MIN_PART_BYTES`]).
    pub async fn start(s3: aws_sdk_s3::Client, bucket: &str, key: &str, content_type: &str, part_size: usize) -> Result<Self, IngestError> {
        let out = s3
            .create_multipart_upload()
            .bucket(bucket)
            .key(key)
            .content_type(content_type)
            .send()
            .await
            .map_err(|e| storage("CreateMultipartUpload", aws_sdk_s3::error::DisplayErrorContext(e)))?;
        let upload_id = out.upload_id.ok_or_else(|| storage("CreateMultipartUpload", "no UploadId in the answer"))?;
        let part_size = part_size.max(MIN_PART_BYTES);
        Ok(Self {
            s3,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            upload_id,
            part_size,
            buffer: BytesMut::with_capacity(part_size),
            next_part: 1,
            in_flight: None,
            done: Vec::new(),
            written: 0,
        })
    }

    /// Bytes accepted so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Appends `chunk`; each full part is sent (S3 UploadPart) while the next
    /// one fills, waiting for the previous send first.
    pub async fn write(&mut self, mut chunk: Bytes) -> Result<(), IngestError> {
        self.written += chunk.len() as u64;
        while !chunk.is_empty() {
            let room = self.part_size - self.buffer.len();
            let take = room.min(chunk.len());
            self.buffer.extend_from_slice(&chunk.split_to(take));
            if self.buffer.len() == self.part_size {
                self.send_buffer().await?;
            }
        }
        Ok(())
    }

    async fn wait_in_flight(&mut self) -> Result<(), IngestError> {
        if let Some(handle) = self.in_flight.take() {
            let part = handle.await.map_err(|e| storage("UploadPart", e))??;
            self.done.push(part);
        }
        Ok(())
    }

    async fn send_buffer(&mut self) -> Result<(), IngestError> {
        self.wait_in_flight().await?;
        let body = std::mem::replace(&mut self.buffer, BytesMut::with_capacity(self.part_size)).freeze();
        let number = self.next_part;
        self.next_part += 1;
        let request = self
            .s3
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(number)
            .content_length(body.len() as i64)
            .body(ByteStream::from(body));
        self.in_flight = Some(tokio::spawn(async move {
            let out = request.send().await.map_err(|e| storage("UploadPart", aws_sdk_s3::error::DisplayErrorContext(e)))?;
            Ok(CompletedPart::builder().part_number(number).set_e_tag(out.e_tag).build())
        }));
        Ok(())
    }

    /// Sends the last part and assembles the object (S3
    /// CompleteMultipartUpload); returns its size. On error the upload is aborted.
    pub async fn finish(mut self) -> Result<u64, IngestError> {
        let result = async {
            if !self.buffer.is_empty() || self.next_part == 1 {
                self.send_buffer().await?;
            }
            self.wait_in_flight().await?;
            let parts = CompletedMultipartUpload::builder().set_parts(Some(self.done.clone())).build();
            self.s3
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .upload_id(&self.upload_id)
                .multipart_upload(parts)
                .send()
                .await
                .map_err(|e| storage("CompleteMultipartUpload", aws_sdk_s3::error::DisplayErrorContext(e)))?;
            Ok(self.written)
        }
        .await;
        if result.is_err() {
            self.abort_inner().await;
        }
        result
    }

    /// Drops the upload and its parts (S3 AbortMultipartUpload), best effort.
    pub async fn abort(mut self) {
        self.abort_inner().await;
    }

    async fn abort_inner(&mut self) {
        if let Some(handle) = self.in_flight.take() {
            let _ = handle.await;
        }
        let aborted = self.s3.abort_multipart_upload().bucket(&self.bucket).key(&self.key).upload_id(&self.upload_id).send().await;
        if let Err(e) = aborted {
            tracing::warn!(key = %self.key, error = %aws_sdk_s3::error::DisplayErrorContext(e), "could not abort a multipart upload; the bucket lifecycle rule will");
        }
    }
}
