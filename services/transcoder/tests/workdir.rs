//! Job directories and the start-up sweep (`vid_transcoder::workdir`), on a
//! temporary directory: what a dead process left is removed; what a live job
//! holds, here or in another process (util-linux `flock`), and whatever is
//! not a job directory are kept.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use vid_core::OperationId;
use vid_transcoder::workdir::{is_job_name, sweep, JobDir, Swept};

fn names(v: &[&OperationId]) -> Vec<String> {
    let mut v: Vec<String> = v.iter().map(|o| o.to_string()).collect();
    v.sort();
    v
}

fn entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn a_job_dir_is_locked_while_held_and_gone_once_dropped() {
    let root = tempfile::tempdir().unwrap();
    let op = OperationId::generate();
    let dir = JobDir::create(root.path(), &op).unwrap();
    assert_eq!(dir.path(), root.path().join(op.as_str()));
    std::fs::write(dir.path().join("source"), b"bytes").unwrap();
    assert_eq!(entries(root.path()), vec![op.to_string(), format!("{op}.lock")]);

    // A sweep (another worker starting on the same work dir) leaves it alone.
    let s = sweep(root.path()).unwrap();
    assert_eq!(s, Swept { in_use: vec![op.to_string()], ..Default::default() });
    assert!(dir.path().join("source").exists());

    drop(dir);
    assert_eq!(entries(root.path()), Vec::<String>::new(), "directory and lock file removed");
}

#[test]
fn a_second_holder_of_an_operation_gets_its_own_directory() {
    let root = tempfile::tempdir().unwrap();
    let op = OperationId::generate();
    let first = JobDir::create(root.path(), &op).unwrap();
    std::fs::write(first.path().join("source"), b"first").unwrap();
    let second = JobDir::create(root.path(), &op).unwrap();
    assert_eq!(second.path(), root.path().join(format!("{op}-2")));
    assert_eq!(std::fs::read(first.path().join("source")).unwrap(), b"first", "the first holder's files are untouched");
    drop(first);
    assert!(second.path().exists());
    let third = JobDir::create(root.path(), &op).unwrap();
    assert_eq!(third.path(), root.path().join(op.as_str()), "the freed name is used again");
    drop((second, third));
    assert_eq!(entries(root.path()), Vec::<String>::new());
}

#[test]
fn a_leftover_under_the_same_name_is_replaced() {
    let root = tempfile::tempdir().unwrap();
    let op = OperationId::generate();
    std::fs::create_dir_all(root.path().join(op.as_str()).join("out")).unwrap();
    std::fs::write(root.path().join(op.as_str()).join("source"), b"old").unwrap();
    let dir = JobDir::create(root.path(), &op).unwrap();
    assert_eq!(dir.path(), root.path().join(op.as_str()));
    assert_eq!(entries(dir.path()), Vec::<String>::new(), "a fresh, empty directory");
}

#[test]
fn the_sweep_removes_what_dead_processes_left_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let r = root.path();
    let [legacy, crashed, lock_only, foreign_lock, link, held_here] = std::array::from_fn(|_| OperationId::generate());

    // Left by dead processes: a directory without a lock file (a version
    // before the locks), one with its unlocked lock file, a lone lock file,
    // and a symlink (removed, its target kept).
    std::fs::create_dir_all(r.join(legacy.as_str()).join("out")).unwrap();
    std::fs::write(r.join(legacy.as_str()).join("source"), b"x").unwrap();
    std::fs::create_dir(r.join(crashed.as_str())).unwrap();
    std::fs::write(r.join(crashed.as_str()).join("source"), b"x").unwrap();
    std::fs::write(r.join(format!("{crashed}.lock")), b"").unwrap();
    std::fs::write(r.join(format!("{lock_only}.lock")), b"").unwrap();
    std::fs::write(outside.path().join("precious"), b"keep").unwrap();
    std::os::unix::fs::symlink(outside.path(), r.join(link.as_str())).unwrap();

    // Held: by a job of this process, and by another process (`flock -o`:
    // only `flock` itself holds the lock, not the command it runs).
    let job = JobDir::create(r, &held_here).unwrap();
    std::fs::create_dir(r.join(foreign_lock.as_str())).unwrap();
    std::fs::write(r.join(foreign_lock.as_str()).join("source"), b"in progress").unwrap();
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(r.join(format!("{foreign_lock}.lock")))
        .args(["sh", "-c", "echo locked; exec sleep 60"])
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("util-linux flock runs");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");

    // Not job directories: never touched.
    let upper = format!("OP_{}", &legacy.as_str()[3..].to_ascii_uppercase());
    let foreign = ["notes", "keep.txt", "op_bogus", "op_", upper.as_str()]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("{legacy}-1"), format!("{legacy}-02"), format!("{legacy}-9"), format!("{legacy}.tmp")])
        .collect::<Vec<_>>();
    for (i, f) in foreign.iter().enumerate() {
        if i % 2 == 0 {
            std::fs::create_dir(r.join(f)).unwrap();
            std::fs::write(r.join(f).join("file"), b"mine").unwrap();
        } else {
            std::fs::write(r.join(f), b"mine").unwrap();
        }
    }

    let s = sweep(r).unwrap();
    assert_eq!(s.removed, names(&[&legacy, &crashed, &lock_only, &link]));
    assert_eq!(s.in_use, names(&[&foreign_lock, &held_here]));
    assert!(s.failed.is_empty(), "{s:?}");
    assert_eq!(std::fs::read(outside.path().join("precious")).unwrap(), b"keep", "a symlink's target is not followed");
    let mut expected: Vec<String> = foreign.clone();
    expected.extend([foreign_lock.to_string(), format!("{foreign_lock}.lock"), held_here.to_string(), format!("{held_here}.lock")]);
    expected.sort();
    assert_eq!(entries(r), expected);
    assert_eq!(std::fs::read(r.join(foreign_lock.as_str()).join("source")).unwrap(), b"in progress");

    // The other process dies: its lock goes with it, and the next sweep takes the directory.
    // SAFETY: kill(2) of the process group we created for `flock`.
    assert_eq!(unsafe { libc::kill(-(holder.id() as libc::pid_t), libc::SIGKILL) }, 0);
    holder.wait().unwrap();
    let s = sweep(r).unwrap();
    assert_eq!(s, Swept { removed: vec![foreign_lock.to_string()], in_use: vec![held_here.to_string()], failed: vec![] });
    drop(job);
    let mut expected = foreign.clone();
    expected.sort();
    assert_eq!(entries(r), expected);
}

#[test]
fn a_missing_work_dir_sweeps_to_nothing() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(sweep(&root.path().join("absent")).unwrap(), Swept::default());
}

#[test]
fn job_names() {
    let op = OperationId::generate();
    assert!(is_job_name(op.as_str()));
    assert!(is_job_name(&format!("{op}-2")));
    assert!(is_job_name(&format!("{op}-8")));
    for bad in [
        format!("{op}-1"),
        format!("{op}-9"),
        format!("{op}-02"),
        format!("{op}-+2"),
        format!("{op}.lock"),
        op.as_str().to_ascii_uppercase(),
        format!("{op}x"),
        "op_".into(),
        "..".into(),
        "vid_01jd8x4m3v0k2q6s7t9w1y5zab".into(),
    ] {
        assert!(!is_job_name(&bad), "{bad}");
    }
}
