//! What the shared store's reads and its committer share: errors as one
//! line, numbers as Postgres keeps them.

/// A database error as one line: the server's message (never the values of
/// the row at fault), or the client's with its cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(inner) = cause {
        text = format!("{text}: {inner}");
        cause = inner.source();
    }
    text
}

/// A number as Postgres's `bigint` (every id, time and count Airlock keeps
/// fits; larger saturates).
pub(crate) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
