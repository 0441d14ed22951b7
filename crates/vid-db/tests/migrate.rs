//! Migrations against a real PostgreSQL.

/// Several processes migrating one empty database at once (the migration
/// Job and every api replica at start-up) all succeed; exactly one applies
/// the migrations, the others find nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_all_succeed_and_apply_once() {
    let url = vid_testkit::empty_database().await;
    let results = futures::future::join_all((0..4).map(|_| vid_db::migrate(&url))).await;
    let mut applied: Vec<usize> = Vec::new();
    for r in results {
        applied.push(r.expect("every concurrent migrate succeeds").len());
    }
    applied.sort();
    let all = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(applied, vec![0, 0, 0, all], "one run applies all {all} migrations, the others none");
}
