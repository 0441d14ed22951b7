//! The resume state of an upload: a small JSON file per file being uploaded
//! (under the user's cache directory) and its exclusive lock.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vid_core::UploadId;

/// What is remembered between runs of the same upload.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadStateFile {
    /// The API the upload was created on.
    pub api_url: String,
    /// The upload.
    pub upload_id: UploadId,
    /// File size when the upload was created.
    pub size_bytes: u64,
}

/// `<cache dir>/vidctl/uploads`, e.g. `~/.cache/vidctl/uploads`.
pub fn default_state_dir() -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("vidctl/uploads"))
}

/// The exclusive lock on a state file: `<state file>.lock`, removed when
/// dropped unless the state file is still there (the upload can be resumed).
pub(super) struct StateLock {
    _file: std::fs::File,
    path: PathBuf,
    state: PathBuf,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        if !self.state.exists() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Takes the lock of the state file `path` without waiting, creating its directory.
pub(super) fn lock_state(path: &Path) -> Result<StateLock, std::fs::TryLockError> {
    let lock_path = path.with_extension("lock");
    let open = || -> std::io::Result<std::fs::File> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path)
    };
    let file = open().map_err(std::fs::TryLockError::Error)?;
    file.try_lock()?;
    Ok(StateLock { _file: file, path: lock_path, state: path.to_owned() })
}

pub(super) fn read_state(path: &Path) -> Option<UploadStateFile> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

pub(super) fn write_state(path: &Path, state: &UploadStateFile) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(state).expect("serialises"))?;
    std::fs::rename(tmp, path)
}
