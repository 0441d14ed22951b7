//! Raw SQL that is prepared once per connection ([`cached_sql_query`]).
//!
//! diesel's `sql_query` marks itself unsafe to cache, so diesel-async
//! prepares it afresh at every call: a Parse/Describe round trip before the
//! Bind/Execute one, and PostgreSQL parses, analyses and plans the text
//! again each time. For a statement the dispatcher runs hundreds of times a
//! second (a claim, a fan-in, a batch of recorded successes: CTEs over
//! `unnest` of ten arrays), that is a Parse round trip and a planning per
//! call (issue 22; BENCHMARKS.md measured no throughput gain from caching
//! on loopback, where a round trip costs microseconds). A [`CachedQuery`] is the same text and the
//! same binds, kept in diesel-async's per-connection statement cache (keyed
//! by the SQL and its bind types): later calls send Bind/Execute only, and
//! after five runs PostgreSQL may switch the prepared statement to a generic
//! plan (`plan_cache_mode = auto`, PostgreSQL docs, "PREPARE").

use diesel::expression::AsExpression;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sql_types::{SqlType, Untyped};

/// A raw SQL statement with its binds, cached as a prepared statement on
/// each connection that runs it. Build it with [`cached_sql_query`] and
/// [`CachedQuery::bind`]; run it with diesel-async's `RunQueryDsl`
/// (`execute`, `load`, `get_result`), loading rows into `QueryableByName`
/// types as `sql_query` does.
///
/// Rules for the SQL text, checked when it is run (a mistake is a
/// [`diesel::result::Error::QueryBuilderError`]):
/// - placeholders are `$1`, `$2`, … in the order their binds are added, each
///   written exactly once (the k-th bind is written where `$k` stands);
///   text inside `'…'` and `E'…'` literals, `"…"` identifiers, `--` and
///   `/* … */` comments is skipped, so a `$2` there is not a placeholder
///   (and a bind count that then disagrees is refused);
/// - no dollar-quoted text (`$$…$$`, `$tag$…$tag$`) and no `$` followed by a
///   digit inside an identifier (`a$1`): both refused; an unterminated
///   literal, identifier or comment is refused;
/// - the text is `&'static str`: diesel-async's statement cache has no
///   eviction, so every distinct text stays prepared on every connection
///   that ran it for the connection's life (never build one with values);
/// - name the result columns (no `SELECT *`): PostgreSQL refuses to run a
///   cached statement whose result type changed since it was prepared
///   (SQLSTATE 0A000, "cached plan must not change result type"), which a
///   migration adding a column would otherwise cause on every open
///   connection. The same holds for a function's result type: a migration
///   that changes the columns a cached statement returns (e.g. of
///   `webhook_deliveries_claim`) makes every open connection fail that
///   statement until it is replaced, so such a change needs new function
///   names (or a rolling restart after the migration).
pub struct CachedQuery<'a> {
    sql: &'static str,
    binds: Vec<Box<dyn QueryFragment<Pg> + Send + 'a>>,
}

/// Starts a [`CachedQuery`] of `sql` (see its rules), with no binds yet.
pub fn cached_sql_query(sql: &'static str) -> CachedQuery<'static> {
    CachedQuery { sql, binds: Vec::new() }
}

impl<'a> CachedQuery<'a> {
    /// Adds the next bind (`$n` for the n-th), of SQL type `ST`, as
    /// `SqlQuery::bind` does.
    pub fn bind<ST, V>(self, value: V) -> CachedQuery<'a>
    where
        ST: SqlType + diesel::sql_types::SingleValue,
        V: AsExpression<ST>,
        V::Expression: QueryFragment<Pg> + Send + 'a,
    {
        let CachedQuery { sql, mut binds } = self;
        binds.push(Box::new(value.as_expression()));
        CachedQuery { sql, binds }
    }

    /// The text between placeholders: `pieces[0]`, `$1`, `pieces[1]`, `$2`,
    /// … (one more piece than binds). Errors as the type's rules say.
    fn pieces(&self) -> Result<Vec<&'static str>, String> {
        let sql = self.sql;
        let bytes = sql.as_bytes();
        let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80;
        // The end of the quoted run opened at `i` by `quote`, past its closing
        // quote (a doubled quote stays inside; `\` escapes in an E'' literal).
        let skip_quoted = |i: usize, quote: u8, backslash: bool| -> Result<usize, String> {
            let mut j = i + 1;
            while j < bytes.len() {
                match bytes[j] {
                    b'\\' if backslash => j += 2,
                    b if b == quote && bytes.get(j + 1) == Some(&quote) => j += 2,
                    b if b == quote => return Ok(j + 1),
                    _ => j += 1,
                }
            }
            Err(format!("unterminated {} opened at byte {i}", if quote == b'"' { "quoted identifier" } else { "string literal" }))
        };
        let (mut pieces, mut start, mut i) = (Vec::with_capacity(self.binds.len() + 1), 0, 0);
        while i < bytes.len() {
            let after_ident = i > 0 && ident(bytes[i - 1]);
            match bytes[i] {
                b'\'' => {
                    let e_string = after_ident && matches!(bytes[i - 1], b'E' | b'e') && !(i > 1 && ident(bytes[i - 2]));
                    i = skip_quoted(i, b'\'', e_string)?;
                }
                b'"' => i = skip_quoted(i, b'"', false)?,
                b'-' if bytes.get(i + 1) == Some(&b'-') => {
                    i = bytes[i..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n + 1);
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    let (open, mut depth, mut j) = (i, 0usize, i);
                    loop {
                        match (bytes.get(j), bytes.get(j + 1)) {
                            (Some(b'/'), Some(b'*')) => (depth, j) = (depth + 1, j + 2),
                            (Some(b'*'), Some(b'/')) => {
                                (depth, j) = (depth - 1, j + 2);
                                if depth == 0 {
                                    break;
                                }
                            }
                            (Some(_), _) => j += 1,
                            (None, _) => return Err(format!("unterminated comment opened at byte {open}")),
                        }
                    }
                    i = j;
                }
                b'$' if after_ident => i += 1, // part of an identifier such as `a$b`
                b'$' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                    let digits = bytes[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
                    if bytes.get(i + 1 + digits).is_some_and(|&b| ident(b) && !b.is_ascii_digit()) {
                        return Err(format!("`$` and digits at byte {i} run into an identifier"));
                    }
                    let n: usize = sql[i + 1..i + 1 + digits].parse().map_err(|e| format!("placeholder at byte {i}: {e}"))?;
                    if n != pieces.len() + 1 {
                        return Err(format!(
                            "placeholder ${n} at byte {i}: expected ${} (placeholders in bind order, each once)",
                            pieces.len() + 1
                        ));
                    }
                    pieces.push(&sql[start..i]);
                    i += 1 + digits;
                    start = i;
                }
                b'$' if bytes.get(i + 1).is_some_and(|&b| b == b'$' || b.is_ascii_alphabetic() || b == b'_') => {
                    let tag = bytes[i + 1..].iter().take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_').count();
                    if bytes.get(i + 1 + tag) == Some(&b'$') {
                        return Err(format!("dollar-quoted text at byte {i} is not supported"));
                    }
                    i += 1;
                }
                _ => i += 1,
            }
        }
        if pieces.len() != self.binds.len() {
            return Err(format!("{} placeholder(s) for {} bind(s)", pieces.len(), self.binds.len()));
        }
        pieces.push(&sql[start..]);
        Ok(pieces)
    }
}

impl QueryFragment<Pg> for CachedQuery<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let pieces = self.pieces().map_err(|e| diesel::result::Error::QueryBuilderError(format!("cached_sql_query: {e}").into()))?;
        let mut binds = self.binds.iter();
        for (i, piece) in pieces.iter().enumerate() {
            out.push_sql(piece);
            if i + 1 < pieces.len() {
                // Written as `$k`, k counting the binds pushed so far.
                binds.next().expect("one bind per placeholder").walk_ast(out.reborrow())?;
            }
        }
        Ok(())
    }
}

impl QueryId for CachedQuery<'_> {
    type QueryId = ();
    // Not static: diesel-async keys the cache by the SQL text and bind types.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for CachedQuery<'_> {
    type SqlType = Untyped;
}

#[cfg(test)]
mod tests {
    use diesel::sql_types::{BigInt, Text};

    use super::*;

    fn sql_of(q: &CachedQuery<'_>) -> QueryResult<String> {
        diesel::debug_query::<Pg, _>(q).to_string().split(" -- binds").next().map(str::to_owned).ok_or(diesel::result::Error::NotFound)
    }

    /// The builder's error for `q`, which must be refused.
    fn refused(q: CachedQuery<'_>) -> String {
        let mut builder = diesel::pg::PgQueryBuilder::default();
        q.to_sql(&mut builder, &Pg).expect_err("refused").to_string()
    }

    #[test]
    fn the_statement_is_the_text_with_its_binds_in_place() {
        let q = cached_sql_query("SELECT $1::bigint AS a, $2 AS b WHERE x = '$'").bind::<BigInt, _>(7i64).bind::<Text, _>("t");
        assert_eq!(sql_of(&q).unwrap(), "SELECT $1::bigint AS a, $2 AS b WHERE x = '$'");
        assert!(q.is_safe_to_cache_prepared(&Pg).unwrap(), "the point of the type");
        let q = cached_sql_query("SELECT 1");
        assert_eq!(sql_of(&q).unwrap(), "SELECT 1");
    }

    #[test]
    fn misplaced_or_missing_placeholders_are_refused() {
        let e = refused(cached_sql_query("SELECT $2, $1").bind::<BigInt, _>(1i64).bind::<BigInt, _>(2i64));
        assert!(e.contains("placeholder $2 at byte 7: expected $1"), "{e}");
        let e = refused(cached_sql_query("SELECT $1, $1").bind::<BigInt, _>(1i64));
        assert!(e.contains("placeholder $1 at byte 11: expected $2"), "{e}");
        let e = refused(cached_sql_query("SELECT $1").bind::<BigInt, _>(1i64).bind::<BigInt, _>(2i64));
        assert!(e.contains("1 placeholder(s) for 2 bind(s)"), "{e}");
        let e = refused(cached_sql_query("SELECT $1, $2").bind::<BigInt, _>(1i64));
        assert!(e.contains("2 placeholder(s) for 1 bind(s)"), "{e}");
    }

    /// `$n` in literals, quoted identifiers and comments is text, not a
    /// placeholder, so a bind for it is refused rather than silently ignored
    /// by PostgreSQL; dollar quotes, `$n` glued to an identifier and
    /// unterminated quotes or comments are refused.
    #[test]
    fn placeholders_are_found_outside_literals_and_comments_only() {
        let two = |sql: &'static str| cached_sql_query(sql).bind::<BigInt, _>(1i64).bind::<BigInt, _>(2i64);
        for sql in [
            "SELECT $1 AS a -- was $2",
            "SELECT '$2' AS lit, $1",
            "SELECT E'it\\'s $2', $1",
            "SELECT 'it''s $2', $1",
            "SELECT $1 AS \"col$2\"",
            "SELECT $1 /* $2 /* nested $2 */ still $2 */",
        ] {
            let e = refused(two(sql));
            assert!(e.contains("1 placeholder(s) for 2 bind(s)"), "{sql}: {e}");
        }
        let q = cached_sql_query("SELECT 'a''$1' AS t, $1 -- $1\n, \"x\"\"$2\" FROM t WHERE y = E'\\'$3'").bind::<BigInt, _>(1i64);
        assert!(sql_of(&q).is_ok(), "one placeholder outside the quotes and comments");
        for (sql, want) in [
            ("SELECT $$ $1 $$", "dollar-quoted text at byte 7"),
            ("SELECT $body$ x $body$", "dollar-quoted text at byte 7"),
            ("SELECT a$1", "placeholder(s)"),
            ("SELECT $1abc", "run into an identifier"),
            ("SELECT 'open", "unterminated string literal opened at byte 7"),
            ("SELECT \"open", "unterminated quoted identifier opened at byte 7"),
            ("SELECT /* open /* */", "unterminated comment opened at byte 7"),
        ] {
            let e = refused(cached_sql_query(sql).bind::<BigInt, _>(1i64));
            assert!(e.contains(want), "{sql}: {e}");
        }
    }
}
