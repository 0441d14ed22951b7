//! [`MediaError`]: why media work failed. A leaf: every media module uses it.

use vid_core::Problem;

/// Why the media work failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MediaError {
    /// The source is bad: fail the job with this problem, do not retry.
    #[error("{0}")]
    Permanent(Problem),
    /// Our side failed (encoder/muxer/file system): worth a retry on another attempt.
    #[error("internal media error: {0}")]
    Internal(String),
}

impl From<Problem> for MediaError {
    fn from(p: Problem) -> Self {
        Self::Permanent(p)
    }
}
