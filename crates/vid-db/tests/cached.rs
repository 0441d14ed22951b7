//! `cached_sql_query` against a real PostgreSQL: one prepared statement per
//! connection, run again without being prepared again.

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use vid_db::{cached_sql_query, AsyncConnection, RunQueryDsl};

#[derive(QueryableByName, Debug, PartialEq)]
struct Row {
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Text)]
    label: String,
}

#[derive(QueryableByName)]
struct Prepared {
    #[diesel(sql_type = BigInt)]
    count: i64,
    #[diesel(sql_type = BigInt)]
    runs: i64,
}

const SQL: &str = "SELECT $1::bigint + g AS n, $2::text AS label FROM generate_series(1, 2) g ORDER BY g";

/// The session's prepared statements whose text is `sql`, and how many times
/// they were planned (custom or generic) in all (`pg_prepared_statements`,
/// PostgreSQL ≥ 14).
async fn prepared(conn: &mut diesel_async::AsyncPgConnection, sql: &str) -> (i64, i64) {
    let p: Prepared = diesel::sql_query(
        "SELECT count(*) AS count, coalesce(sum(generic_plans + custom_plans), 0)::bigint AS runs \
         FROM pg_prepared_statements WHERE statement = $1",
    )
    .bind::<Text, _>(sql)
    .get_result(conn)
    .await
    .unwrap();
    (p.count, p.runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_query_is_prepared_once_per_connection_and_rerun() {
    let url = vid_testkit::empty_database().await;
    let mut conn = diesel_async::AsyncPgConnection::establish(&url).await.unwrap();
    for i in 0..7i64 {
        let label = format!("run {i}");
        let rows: Vec<Row> = cached_sql_query(SQL).bind::<BigInt, _>(i * 10).bind::<Text, _>(label.as_str()).load(&mut conn).await.unwrap();
        assert_eq!(rows, vec![Row { n: i * 10 + 1, label: label.clone() }, Row { n: i * 10 + 2, label }]);
    }
    assert_eq!(prepared(&mut conn, SQL).await, (1, 7), "one statement, executed seven times");

    // diesel's sql_query of the same text is prepared afresh (and closed) at every call.
    let other = SQL.replace("label", "label2");
    for _ in 0..3 {
        diesel::sql_query(other.as_str()).bind::<BigInt, _>(1i64).bind::<Text, _>("x").execute(&mut conn).await.unwrap();
    }
    let (count, _) = prepared(&mut conn, &other).await;
    assert!(count <= 1, "sql_query keeps no statement around (at most one not yet closed): {count}");

    // A wrongly numbered statement is refused before anything is sent.
    let e = cached_sql_query("SELECT $2::bigint").bind::<BigInt, _>(1i64).execute(&mut conn).await.unwrap_err();
    assert!(e.to_string().contains("expected $1"), "{e}");
}
