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

/// The SQL statements of a migration's `up.sql`, comments dropped, upper-cased.
fn statements(sql: &str) -> Vec<String> {
    let code: String = sql.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    code.split(';').map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ").to_uppercase()).filter(|s| !s.is_empty()).collect()
}

/// Migrations written before this rule existed (their indexes were built
/// with a plain `CREATE INDEX`, which blocks writes to the table meanwhile).
const BEFORE_THE_RULE: &str = "2026-11-30-000050";

/// A migration lint (the rule of tools like strong_migrations and squawk):
/// an index added to a table that already exists is built `CONCURRENTLY`, so
/// the table keeps taking writes during the build (PostgreSQL, CREATE INDEX,
/// "Building Indexes Concurrently"). That statement cannot run in a
/// transaction or beside other statements, so such a migration holds that
/// one statement and its `metadata.toml` says `run_in_transaction = false`.
#[test]
fn indexes_on_existing_tables_are_built_concurrently() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !path.is_dir() || name.as_str() < BEFORE_THE_RULE {
            continue;
        }
        let up = statements(&std::fs::read_to_string(path.join("up.sql")).unwrap());
        let created: Vec<String> = up
            .iter()
            .filter_map(|s| s.strip_prefix("CREATE TABLE "))
            .map(|rest| rest.trim_start_matches("IF NOT EXISTS ").split([' ', '(']).next().unwrap().to_owned())
            .collect();
        for stmt in up.iter().filter(|s| s.starts_with("CREATE INDEX") || s.starts_with("CREATE UNIQUE INDEX")) {
            let table = stmt.split(" ON ").nth(1).and_then(|t| t.split([' ', '(']).next()).expect("CREATE INDEX … ON table");
            if created.iter().any(|c| c == table) {
                continue;
            }
            checked += 1;
            assert!(stmt.contains(" INDEX CONCURRENTLY "), "{name}: an index on the existing table {table} is built CONCURRENTLY: {stmt}");
            assert_eq!(up.len(), 1, "{name}: CREATE INDEX CONCURRENTLY is the migration's only statement");
            let meta = std::fs::read_to_string(path.join("metadata.toml")).unwrap_or_default();
            assert!(
                meta.lines().any(|l| l.split_whitespace().collect::<String>() == "run_in_transaction=false"),
                "{name}: metadata.toml says run_in_transaction = false"
            );
        }
    }
    assert!(checked >= 2, "the lint saw the index migrations it should ({checked})");
}
