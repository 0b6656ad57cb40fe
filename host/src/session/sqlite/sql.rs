//! What the embedded store's reads and its committer share: the
//! connection's lock, what its errors mean, and how records are inserted.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::Connection;

use crate::journal::StoreError;
use crate::session::rows::{self, Row};

/// How long a write waits for another process's transaction.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type Failure = rows::Failure<rusqlite::Error>;

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Failure::Backend(e)
    }
}

pub(crate) fn lock(connection: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
    // A panic while holding the lock leaves no transaction open (it rolls
    // back on drop), so the connection is still good.
    connection
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The store at `location` is not one this Airlock can use, because
/// `problem` (carried through rusqlite's error type to [`failure`]).
pub(crate) fn not_a_store(problem: String) -> rusqlite::Error {
    rusqlite::Error::InvalidParameterName(format!("{NOT_A_STORE}{problem}"))
}

const NOT_A_STORE: &str = "\0not a store: ";

/// What a database error means for the store at `location`: a file that is
/// not a database, damaged, another program's or newer is
/// [`StoreError::NotAStore`] (the operator gave the wrong file, or it must
/// be restored); anything else is [`StoreError::Backend`].
pub(crate) fn failure(location: &str, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseCorrupt, NotADatabase};
    let not_a_store = |problem: String| StoreError::NotAStore {
        location: location.to_owned(),
        problem,
    };
    let backend = |message: String| StoreError::Backend {
        location: location.to_owned(),
        message,
    };
    match e {
        rusqlite::Error::InvalidParameterName(message) => match message.strip_prefix(NOT_A_STORE) {
            Some(problem) => not_a_store(problem.to_owned()),
            None => backend(message),
        },
        rusqlite::Error::SqliteFailure(code, _) if code.code == NotADatabase => {
            not_a_store("the file is not a SQLite database".into())
        }
        rusqlite::Error::SqliteFailure(code, _) if code.code == DatabaseCorrupt => {
            not_a_store("the database is damaged (restore it from a backup)".into())
        }
        // Every wait for a lock is bounded by BUSY_TIMEOUT, so a lock
        // that is still held has been held that long.
        rusqlite::Error::SqliteFailure(code, _) if code.code == DatabaseBusy => backend(format!(
            "database is locked: another connection held its write lock for more than {} s",
            BUSY_TIMEOUT.as_secs()
        )),
        other => backend(other.to_string()),
    }
}

/// Appends `rows` to the journal of the session `sid` (after the
/// records of every append committed before: the table's last pages), up
/// to [`ROWS_A_STATEMENT`] rows a statement (a call's records are one),
/// and the blobs they name that the session does not hold yet.
pub(crate) fn insert_records(tx: &Connection, sid: i64, rows: &[Row]) -> rusqlite::Result<()> {
    for chunk in rows.chunks(ROWS_A_STATEMENT) {
        let mut insert = tx.prepare_cached(insert_statement(chunk.len()))?;
        let mut at = 1;
        for row in chunk {
            insert.raw_bind_parameter(at, sid)?;
            insert.raw_bind_parameter(at + 1, row.seq)?;
            insert.raw_bind_parameter(at + 2, row.at_ms)?;
            insert.raw_bind_parameter(at + 3, &row.entry)?;
            insert.raw_bind_parameter(at + 4, &row.call_id)?;
            at += 5;
        }
        insert.raw_execute()?;
    }
    // A blob the session already holds is not written again.
    for blob in rows::distinct_blobs(rows) {
        tx.prepare_cached("INSERT OR IGNORE INTO blobs (sid, digest, data) VALUES (?1, ?2, ?3)")?
            .execute(rusqlite::params![sid, blob.digest, blob.data])?;
    }
    Ok(())
}

/// The most records one `INSERT` writes.
const ROWS_A_STATEMENT: usize = 8;

/// `INSERT INTO records` of `rows` rows (five parameters each), 1 to
/// [`ROWS_A_STATEMENT`]: written once, as the committer's thread looks its
/// statement up by this text on every append.
fn insert_statement(rows: usize) -> &'static str {
    static STATEMENTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        (1..=ROWS_A_STATEMENT)
            .map(|rows| {
                let values = vec!["(?, ?, ?, ?, ?)"; rows].join(", ");
                format!("INSERT INTO records (sid, seq, at_ms, entry, call_id) VALUES {values}")
            })
            .collect()
    });
    &STATEMENTS[rows.clamp(1, ROWS_A_STATEMENT) - 1]
}
