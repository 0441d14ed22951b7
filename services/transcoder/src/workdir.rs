//! Job directories under `transcoder.work_dir`, and the start-up sweep that
//! removes the ones a killed process left behind.
//!
//! A job works in `<work_dir>/<operation id>/` (the downloaded source, the
//! child's spec, the outputs). Beside it, `<work_dir>/<operation id>.lock`
//! is held with an exclusive `flock(2)` for the job's whole lifetime: the
//! lock is what says "a live process uses this directory". When the job ends
//! ([`JobDir`] is dropped, also on panic or abort) the directory is removed,
//! then the lock file, then the lock is released. When the process dies
//! (SIGKILL, OOM kill) the directory and the lock file stay, but the kernel
//! releases the lock with the process.
//!
//! [`sweep`], run when a worker starts, removes every job directory (and lock
//! file) whose lock it can take, and leaves the others alone. Several
//! transcoders may share one work dir (local development, the e2e tests), so
//! a sibling's in-progress job, whose lock that sibling holds, is never
//! touched; nor is a job starting meanwhile (its creator takes the lock
//! before it creates the directory). Only names shaped like a job's are
//! considered (`op_<ulid>`, optionally `-<n>`, optionally `.lock`), so a
//! misconfigured `work_dir` (say `/tmp`) loses nothing else.
//!
//! Taking a lock on a path that its previous holder is unlinking could lock
//! a file nobody will see again; after every `flock` the file's inode is
//! therefore compared with the one the path names now, and the attempt is
//! repeated on a mismatch. Lock files are opened with `O_NOFOLLOW` and
//! `O_CLOEXEC` (std's default), so the `work` child never inherits a lock.
//!
//! Why locks rather than age: a job has no fixed maximum duration (it scales
//! with the source, see `child::Limits`), and a rule "older than N hours"
//! would keep a crashed job's source on disk for those N hours. An `flock`
//! dies with its process, whatever killed it.
//!
//! Two deliveries of the same operation (a duplicate job; see
//! `crate::worker`) can run at once in one work dir: the second finds
//! `<operation id>.lock` held and uses `<operation id>-2/` (up to
//! [`MAX_HOLDERS`]), so neither removes the other's files.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use vid_core::OperationId;

/// How many jobs of one operation may hold directories in one work dir at
/// once: `<operation id>/`, then `<operation id>-2/` … `<operation id>-8/`.
pub const MAX_HOLDERS: u32 = 8;

/// Suffix of the lock file beside each job directory.
pub const LOCK_SUFFIX: &str = ".lock";

/// A job's private directory, `<work_dir>/<name>/`, held (locked) until dropped.
/// Dropping removes the directory and its lock file, then releases the lock.
#[derive(Debug)]
pub struct JobDir {
    path: PathBuf,
    lock_path: PathBuf,
    /// Holds the `flock`; closed (released) after `Drop::drop` ran.
    _lock: File,
}

impl JobDir {
    /// Creates and locks the directory of a job for `operation` under `root`
    /// (which must exist): `<root>/<operation id>/`, or `<root>/<operation
    /// id>-<n>/` when other live jobs of the same operation hold the lower
    /// names. A leftover of a killed predecessor under the chosen name is
    /// removed first. Errors: I/O errors of the lock file or the directory;
    /// `WouldBlock` when all [`MAX_HOLDERS`] names are held.
    pub fn create(root: &Path, operation: &OperationId) -> io::Result<Self> {
        for n in 1..=MAX_HOLDERS {
            let name = if n == 1 { operation.to_string() } else { format!("{operation}-{n}") };
            let lock_path = root.join(format!("{name}{LOCK_SUFFIX}"));
            let Some(lock) = claim(&lock_path)? else { continue };
            // From here on, dropping `dir` undoes everything (also on the errors below).
            let dir = JobDir { path: root.join(&name), lock_path, _lock: lock };
            remove_entry(&dir.path)?;
            std::fs::create_dir(&dir.path)?;
            return Ok(dir);
        }
        Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!("{MAX_HOLDERS} jobs of {operation} already hold directories in {}", root.display()),
        ))
    }

    /// The directory, e.g. `/tmp/vid-transcoder/op_01jd…/`.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for JobDir {
    fn drop(&mut self) {
        if let Err(e) = remove_entry(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the work dir");
        }
        // Unlinked while still locked: whoever opens the name from now on gets a new file.
        if let Err(e) = std::fs::remove_file(&self.lock_path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %self.lock_path.display(), error = %e, "could not remove the work dir's lock file");
            }
        }
    }
}

/// What [`sweep`] found, by name (`op_…` or `op_…-<n>`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Left by dead processes: removed (directory and lock file).
    pub removed: Vec<String>,
    /// Held by live jobs (here or in another process sharing the work dir): kept.
    pub in_use: Vec<String>,
    /// Could not be checked or removed (the error is logged): kept.
    pub failed: Vec<String>,
}

/// Removes the job directories and lock files under `root` that no live job
/// holds (see the module docs); other entries are never touched. A missing
/// `root` is empty. Errors: only listing `root` fails the sweep; a name that
/// cannot be handled is logged and reported in [`Swept::failed`].
pub fn sweep(root: &Path) -> io::Result<Swept> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Swept::default()),
        Err(e) => return Err(e),
    };
    let mut names = BTreeSet::new();
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(s) = file_name.to_str() else { continue };
        let name = s.strip_suffix(LOCK_SUFFIX).unwrap_or(s);
        if is_job_name(name) {
            names.insert(name.to_owned());
        }
    }
    let mut swept = Swept::default();
    for name in names {
        let lock_path = root.join(format!("{name}{LOCK_SUFFIX}"));
        let outcome = claim(&lock_path).and_then(|lock| match lock {
            Some(lock) => {
                let dir = JobDir { path: root.join(&name), lock_path, _lock: lock };
                let removed = remove_entry(&dir.path);
                drop(dir);
                removed.map(|()| true)
            }
            None => Ok(false),
        });
        match outcome {
            Ok(true) => swept.removed.push(name),
            Ok(false) => swept.in_use.push(name),
            Err(e) => {
                tracing::warn!(name, root = %root.display(), error = %e, "could not sweep a leftover job directory");
                swept.failed.push(name);
            }
        }
    }
    Ok(swept)
}

/// `op_<26-character lower-case ULID>`, optionally followed by `-<n>` with
/// `2 ≤ n ≤ MAX_HOLDERS`: the names [`JobDir::create`] uses.
pub fn is_job_name(name: &str) -> bool {
    let base = match name.rsplit_once('-') {
        // `-<n>` in canonical form only (no sign, no leading zero).
        Some((base, n)) => match n.parse::<u32>() {
            Ok(k) if (2..=MAX_HOLDERS).contains(&k) && k.to_string() == n => base,
            _ => return false,
        },
        None => name,
    };
    base.parse::<OperationId>().is_ok_and(|op| op.as_str() == base)
}

/// Takes the exclusive lock of `lock_path`, creating the file if needed.
/// `Ok(None)`: a live holder has it (or the name kept changing hands).
fn claim(lock_path: &Path) -> io::Result<Option<File>> {
    for _ in 0..8 {
        let file = OpenOptions::new().read(true).write(true).create(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(lock_path)?;
        if !try_lock(&file)? {
            return Ok(None);
        }
        // The previous holder may have unlinked the path between our open and our lock:
        // the lock counts only if the path still names the file we locked.
        let ours = file.metadata()?;
        match std::fs::symlink_metadata(lock_path) {
            Ok(now) if now.dev() == ours.dev() && now.ino() == ours.ino() => return Ok(Some(file)),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// `flock(LOCK_EX | LOCK_NB)`: `true` if taken, `false` if another open file description holds it.
fn try_lock(file: &File) -> io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns for the duration of the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// Removes `path` whatever it is (a directory tree, a file, a symlink —
/// never its target); a missing path is fine.
fn remove_entry(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
