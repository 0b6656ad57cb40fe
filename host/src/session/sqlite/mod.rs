//! The embedded store: one SQLite file (WAL mode), SQLite compiled in.
//!
//! Three tables: `sessions` (a row per session: its key `sid`, header,
//! last record number, lease), `records` (the journal) and `snapshots`
//! (each session's newest). Every write is one `BEGIN IMMEDIATE`
//! transaction, so any number of processes may share the file: a writer
//! waits for another (up to [`BUSY_TIMEOUT`]) instead of failing.
//!
//! Layout (schema 3): records are kept in the order they were appended
//! (`rid`, the table's rowid), so a batch of many sessions' appends fills
//! the table's last pages instead of one page per session; what finds a
//! session's records is the index `(sid, seq)` of small integer entries,
//! and `(sid, call_id)` for the records of a keyed call (only theirs: an
//! entry at a random place of an index for every call's records would
//! dirty pages of its own at every commit). A session is named by
//! its integer `sid` inside the file (never reused: `AUTOINCREMENT`), by
//! owner and id everywhere else.
//!
//! Cost: a commit is one transaction (an fsync of the WAL when it must
//! wait for the disk: [`Durability`]), shared by the appends of concurrent
//! sessions that wait for it ([`commit`]); a lease reads the newest
//! snapshot and the records after it (one index range, then a row each);
//! [`SessionStore::read`] reads the whole journal.

mod commit;
mod sql;

pub use sql::BUSY_TIMEOUT;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};

use super::rows::{
    self, HeaderRow, LeaseRow, NewSession, Row, Span, decode_session, encode, expiry, owner_key,
    owner_key_of, owner_of,
};
use super::store::{
    Append, CallKey, Durability, Fork, Lease, LeaseRequest, Leased, Listing, Owner, Page,
    PruneRequest, Pruned, RecordPages, Reply, SessionHeader, SessionStore, SessionSummary,
    StoredSession, StoredSnapshot, TaskMail,
};
use crate::journal::{Record, StoreError};
use commit::{Committer, synchronous};
use futures::future::BoxFuture;
use sql::{Failure, failure, insert_records, lock, not_a_store};

/// The schema this version writes (`PRAGMA user_version`): 2 added
/// `records.call_id` (indexed), `snapshots` and `sessions.ephemeral`; 3
/// keys sessions by an integer `sid` and keeps records in append order;
/// 4 holds journals of record format 2 (`journal::RECORD_FORMAT`: items
/// only), beside format-1 records written before, which stay as they are.
/// The tables are schema 3's: 4 is there so that an older Airlock refuses
/// the store instead of misreading its new records. 5 adds `blobs`: what
/// a call showed, kept once per session, its records naming it by digest
/// (an older Airlock would not find it).
const SCHEMA_VERSION: i64 = 5;

/// The tables and indexes of schema 5 (3's, and `blobs`), and
/// `task_mail` ([`TaskMail`]): made where it is missing by any version
/// that uses it, and needing no newer schema, since an older Airlock that
/// does not read it loses nothing (its tasks are seen whole only by the
/// host that runs them, as before).
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS sessions (
        sid INTEGER PRIMARY KEY AUTOINCREMENT,
        owner TEXT NOT NULL,
        session_id TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        metadata TEXT NOT NULL,
        head INTEGER NOT NULL,
        lease_holder TEXT,
        lease_token INTEGER NOT NULL,
        lease_expires_ms INTEGER NOT NULL,
        ephemeral INTEGER NOT NULL DEFAULT 0,
        UNIQUE (owner, session_id)
    );
    CREATE TABLE IF NOT EXISTS records (
        rid INTEGER PRIMARY KEY,
        sid INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        at_ms INTEGER NOT NULL,
        entry TEXT NOT NULL,
        call_id TEXT
    );
    CREATE UNIQUE INDEX IF NOT EXISTS records_by_seq ON records (sid, seq);
    CREATE INDEX IF NOT EXISTS records_by_call ON records (sid, call_id)
        WHERE call_id IS NOT NULL;
    CREATE TABLE IF NOT EXISTS snapshots (
        sid INTEGER PRIMARY KEY,
        seq INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS blobs (
        sid INTEGER NOT NULL,
        digest TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (sid, digest)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS task_mail (
        sid INTEGER NOT NULL,
        call_id TEXT NOT NULL,
        waiting TEXT,
        answers TEXT,
        cancelled INTEGER NOT NULL,
        status TEXT,
        PRIMARY KEY (sid, call_id)
    ) WITHOUT ROWID;";

/// The most page cache the store's connection keeps, in KiB.
const CACHE_KIB: i64 = 32 * 1024;

/// How many pages the write-ahead log grows to before its pages are copied
/// into the database file (4 KiB each: 16 MiB).
const WAL_CHECKPOINT_PAGES: i64 = 4096;

/// Sessions in one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    path: PathBuf,
    durability: Durability,
    connection: Arc<Mutex<Connection>>,
    /// Appends, batched ([`commit`]).
    committer: Arc<Committer>,
    /// Connections that only read journals, beside the one above.
    readers: Arc<Readers>,
}

/// Connections that read journals ([`SqliteStore::read_span`]) beside the
/// store's own, so that reads of several sessions at once (a replay of
/// many, several resumes) run at once instead of one after another on the
/// store's connection, and never wait for a batch being committed. In WAL
/// mode each sees what was committed when its read began. Opened as
/// needed; at most [`Readers::KEPT`] are kept between reads.
#[derive(Debug, Default)]
struct Readers {
    idle: Mutex<Vec<Connection>>,
}

impl Readers {
    /// How many idle readers are kept (a few pages of cache each).
    const KEPT: usize = 4;

    /// An idle reader, or a new one on `path`.
    fn take(&self, path: &Path) -> rusqlite::Result<Connection> {
        let idle = self.idle().pop();
        match idle {
            Some(conn) => Ok(conn),
            None => {
                let conn = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                conn.busy_timeout(BUSY_TIMEOUT)?;
                conn.set_db_config(
                    rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
                    true,
                )?;
                Ok(conn)
            }
        }
    }

    /// Gives `conn` back, unless enough are kept. (One whose read failed
    /// is dropped instead: its transaction rolls back.)
    fn give(&self, conn: Connection) {
        let mut idle = self.idle();
        if idle.len() < Self::KEPT {
            idle.push(conn);
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        // Nothing is left half-done under this lock.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SqliteStore {
    /// Opens (or creates, with its directory) the store at `path`, with
    /// [`Durability::ByEffect`]. A new file is readable by its owner only.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, Durability::ByEffect)
    }

    /// [`SqliteStore::open`] with the given durability.
    pub fn open_with(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let location = format!("sqlite:{}", path.display());
        let fail = |message: String| StoreError::Backend {
            location: location.clone(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir).map_err(|e| {
                let problem = format!("cannot create {}: {e}", dir.display());
                // A file where its directory, or one above it, should be is
                // the name's fault, not the store's.
                match e.kind() {
                    std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
                        StoreError::NotAStore {
                            location: location.clone(),
                            problem,
                        }
                    }
                    _ => fail(problem),
                }
            })?;
        }
        // A store is a regular file, or a link to one. Given a device, a
        // pipe or a directory, SQLite fails with "disk I/O error" after
        // writing its journal beside it (`/dev/zero-journal`).
        let found = std::fs::metadata(&path).ok();
        if let Some(kind) = found.as_ref().and_then(crate::fs::not_a_file) {
            return Err(StoreError::NotAStore {
                location: location.clone(),
                problem: format!("it is {kind}, not a file"),
            });
        }
        let existed = found.is_some();
        let connection = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| fail(e.to_string()))?;
        if !existed {
            restrict_to_owner(&path);
        }
        let connection = Arc::new(Mutex::new(connection));
        let store = Self {
            durability,
            committer: Arc::new(Committer::start(
                Arc::clone(&connection),
                location.clone(),
                durability,
            )),
            connection,
            path,
            readers: Arc::default(),
        };
        store.prepare().map_err(|e| failure(&location, e))?;
        Ok(store)
    }

    /// The store with at most `max_batch` appends (at least one) sharing
    /// a transaction and its fsync; [`MAX_BATCH`](super::MAX_BATCH) unless set. 1 commits
    /// every append alone (as Airlock did before group commit): lower
    /// latency for a lone writer costs nothing either way, since a batch
    /// is only what queued while the previous one was on disk.
    #[must_use]
    pub fn with_max_batch(self, max_batch: usize) -> Self {
        self.committer.set_max_batch(max_batch);
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What a commit survives.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    fn prepare(&self) -> rusqlite::Result<()> {
        let mut conn = lock(&self.connection);
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // A statement's plan does not depend on the values bound to it.
        // Otherwise SQLite compiles a cached statement again whenever a
        // value it might plan by is bound anew: every read of a page of
        // a journal (its session's `sid`, its `LIMIT`). Airlock's queries
        // have one plan whatever their values.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        // Before anything that writes (switching to WAL rewrites the
        // header): a file that is not ours is left as it was. One read
        // transaction, so that another process creating the store at the
        // same time is seen before or after, never half-way.
        {
            let read = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            check_ours(&read)?;
            read.commit()?;
        }
        // Switching a new file to WAL rewrites its header from inside a
        // read: SQLite does not wait for that write lock (two connections
        // each holding a read and waiting for the other would deadlock)
        // but fails at once, so processes creating the store together
        // take turns here.
        let mode: String =
            retry_busy(|| conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(rusqlite::Error::InvalidParameterName(format!(
                "cannot use WAL mode (got {mode})"
            )));
        }
        // Every write waits for the disk (`synchronous = FULL`) but the
        // committer's batches that need not ([`commit::serve`]), unless
        // none does.
        conn.pragma_update(
            None,
            "synchronous",
            synchronous(self.durability != Durability::Never),
        )?;
        // A batch of many sessions' appends dirties a few pages per
        // session; SQLite's default cache (2 MiB) spills them mid-batch
        // and reads its pages again. The cache grows only as pages are
        // used (docs/benchmarks.md §15).
        conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
        // Checkpoint (copy the log into the file) every 16 MiB of log, not
        // SQLite's 4 MiB: the pages every batch rewrites (the sessions'
        // rows, the indexes' last leaves) are then copied once for many
        // batches (docs/benchmarks.md §15: about a fifth more calls a
        // second with 256 sessions). The log file stays about this size.
        conn.pragma_update(None, "wal_autocheckpoint", WAL_CHECKPOINT_PAGES)?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version = check_ours(&tx)?;
        if version == 1 {
            migrate_v1(&tx)?;
        }
        if version == 1 || version == 2 {
            migrate_v2(&tx)?;
        }
        tx.execute_batch(SCHEMA)?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        tx.commit()
    }

    /// `span` of a session, in one read transaction (the header and the
    /// journal agree).
    fn read_span(
        &self,
        owner: Owner<'_>,
        session_id: &str,
        span: Span,
    ) -> BoxFuture<'static, Result<StoredSession, StoreError>> {
        let owner = owner_key(owner);
        let session_id = session_id.to_owned();
        let (readers, path) = (Arc::clone(&self.readers), self.path.clone());
        self.run_on(move || {
            let mut conn = readers.take(&path)?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let session = read_session(&tx, &owner, &session_id, span)?;
            tx.commit()?;
            readers.give(conn);
            Ok(session)
        })
    }

    /// Runs `work` on the connection on a blocking thread.
    fn run<T, F>(&self, work: F) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, Failure> + Send + 'static,
    {
        let connection = Arc::clone(&self.connection);
        self.run_on(move || work(&mut lock(&connection)))
    }

    /// Runs `work` on a blocking thread.
    fn run_on<T, F>(&self, work: F) -> BoxFuture<'static, Result<T, StoreError>>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, Failure> + Send + 'static,
    {
        let location = self.location();
        Box::pin(async move {
            let task = tokio::task::spawn_blocking(work);
            let failed = |message: String| StoreError::Backend {
                location: location.clone(),
                message,
            };
            match task.await {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(Failure::Store(e))) => Err(e),
                Ok(Err(Failure::Backend(e))) => Err(failure(&location, e)),
                Err(e) => Err(failed(format!("store task failed: {e}"))),
            }
        })
    }
}

/// `statement` again while it fails with `SQLITE_BUSY`, for
/// [`BUSY_TIMEOUT`] in all (the last try at its end): for what SQLite's
/// busy handler does not cover, where it fails at once rather than wait
/// for a lock its holder might be waiting to upgrade past. `statement`
/// must hold no lock when it fails (an autocommit statement: its read
/// ends with it). Between tries, 1 ms doubling to 64 ms.
fn retry_busy<T>(mut statement: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    const MOST: Duration = Duration::from_millis(64);
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match statement() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && Instant::now() < deadline =>
            {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(MOST);
            }
            done => return done,
        }
    }
}

/// The schema version of the database `conn` holds, refusing one that is
/// not an Airlock store (another program's tables, or no database at all)
/// or that a newer Airlock wrote.
fn check_ours(conn: &Connection) -> rusqlite::Result<i64> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(not_a_store(format!(
            "written by a newer Airlock (schema {version}; this one reads {SCHEMA_VERSION})"
        )));
    }
    if version == 0 {
        // Every store this Airlock or an earlier one made has a version; a
        // database without one that holds tables is another program's.
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        if !tables.is_empty() {
            return Err(not_a_store(format!(
                "a database of another program (its tables: {})",
                crate::text::truncate(&tables.join(", "), 200)
            )));
        }
    }
    Ok(version)
}

/// Schema 1 to 2: the call id column, filled from the entries already
/// there (the index and the snapshots table are created after).
fn migrate_v1(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE records ADD COLUMN call_id TEXT;
         ALTER TABLE sessions ADD COLUMN ephemeral INTEGER NOT NULL DEFAULT 0;",
    )?;
    let mut read = tx.prepare("SELECT owner, session_id, seq, entry FROM records")?;
    let mut update = tx.prepare(
        "UPDATE records SET call_id = ?4 WHERE owner = ?1 AND session_id = ?2 AND seq = ?3",
    )?;
    let mut rows = read.query([])?;
    while let Some(row) = rows.next()? {
        let entry: String = row.get(3)?;
        if let Some(call_id) = rows::call_id_of(&entry) {
            let (owner, session_id, seq): (String, String, i64) =
                (row.get(0)?, row.get(1)?, row.get(2)?);
            update.execute(params![owner, session_id, seq, call_id])?;
        }
    }
    Ok(())
}

/// Schema 2 to 3: the same rows in the new tables (sessions keyed by
/// `sid`, records in append order, each session's records in a row
/// after the other), then the old tables dropped. One pass over the
/// journal, in the migration's transaction.
fn migrate_v2(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS snapshots (owner TEXT, session_id TEXT, seq INTEGER, body TEXT);
         ALTER TABLE sessions RENAME TO sessions_v2;
         ALTER TABLE records RENAME TO records_v2;
         ALTER TABLE snapshots RENAME TO snapshots_v2;
         DROP INDEX IF EXISTS records_by_call;",
    )?;
    tx.execute_batch(SCHEMA)?;
    tx.execute_batch(
        "INSERT INTO sessions (owner, session_id, created_at_ms, updated_at_ms, metadata, head,
                               lease_holder, lease_token, lease_expires_ms, ephemeral)
             SELECT owner, session_id, created_at_ms, updated_at_ms, metadata, head,
                    lease_holder, lease_token, lease_expires_ms, ephemeral
             FROM sessions_v2 ORDER BY owner, session_id;
         INSERT INTO records (sid, seq, at_ms, entry, call_id)
             SELECT s.sid, r.seq, r.at_ms, r.entry, r.call_id
             FROM records_v2 r JOIN sessions s ON s.owner = r.owner AND s.session_id = r.session_id
             ORDER BY s.sid, r.seq;
         INSERT INTO snapshots (sid, seq, body)
             SELECT s.sid, n.seq, n.body
             FROM snapshots_v2 n JOIN sessions s ON s.owner = n.owner AND s.session_id = n.session_id;
         DROP TABLE snapshots_v2;
         DROP TABLE records_v2;
         DROP TABLE sessions_v2;",
    )
}

/// Inserts a session's row and journal; `lease` is (holder, token,
/// expiry) when the session is created leased. The session's key in this
/// file.
fn insert_session(
    new: &NewSession,
    tx: &rusqlite::Transaction<'_>,
    updated_at_ms: u64,
    lease: Option<(&str, u64, u64)>,
) -> rusqlite::Result<i64> {
    let (holder, token, expires) = match lease {
        Some((holder, token, expires)) => (Some(holder), token, expires),
        None => (None, 0, 0),
    };
    let sid = tx.query_row(
        "INSERT INTO sessions (owner, session_id, created_at_ms, updated_at_ms, metadata,
               head, lease_holder, lease_token, lease_expires_ms, ephemeral)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) RETURNING sid",
        params![
            new.owner,
            new.session_id,
            new.created_at_ms,
            updated_at_ms,
            new.metadata,
            new.head(),
            holder,
            token,
            expires,
            new.ephemeral
        ],
        |row| row.get(0),
    )?;
    insert_records(tx, sid, &new.rows)?;
    Ok(sid)
}

/// A session's key in this file and its lease columns.
fn lease_row(
    tx: &rusqlite::Transaction<'_>,
    owner: &str,
    session_id: &str,
) -> rusqlite::Result<Option<(i64, LeaseRow)>> {
    tx.prepare_cached(
        "SELECT sid, lease_holder, lease_token, lease_expires_ms FROM sessions
         WHERE owner = ?1 AND session_id = ?2",
    )?
    .query_row(params![owner, session_id], |row| {
        Ok((
            row.get(0)?,
            LeaseRow {
                holder: row.get(1)?,
                token: row.get(2)?,
                expires_ms: row.get(3)?,
            },
        ))
    })
    .optional()
}

/// The mail of call `call_id` of a session ([`TaskMail`]), if any.
fn read_mail(
    conn: &Connection,
    owner: &str,
    session_id: &str,
    call_id: &str,
) -> rusqlite::Result<Option<TaskMail>> {
    conn.prepare_cached(
        "SELECT m.waiting, m.answers, m.cancelled, m.status
         FROM sessions s JOIN task_mail m ON m.sid = s.sid
         WHERE s.owner = ?1 AND s.session_id = ?2 AND m.call_id = ?3",
    )?
    .query_row(params![owner, session_id, call_id], |row| {
        Ok(TaskMail {
            waiting: row.get(0)?,
            answers: row.get(1)?,
            cancelled: row.get(2)?,
            status: row.get(3)?,
        })
    })
    .optional()
}

/// Removes the session `sid`: its journal, snapshot, task mail and row.
fn delete_session(tx: &rusqlite::Transaction<'_>, sid: i64) -> rusqlite::Result<()> {
    for table in ["records", "snapshots", "blobs", "task_mail", "sessions"] {
        tx.prepare_cached(&format!("DELETE FROM {table} WHERE sid = ?1"))?
            .execute([sid])?;
    }
    Ok(())
}

/// A session's records after a number, at most so many.
const RECORDS_AFTER: &str = "SELECT seq, at_ms, entry, call_id FROM records
     WHERE sid = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";

/// Reads a session's header and the records `span` names, within
/// whatever transaction `conn` is in.
fn read_session(
    conn: &Connection,
    owner: &str,
    session_id: &str,
    span: Span,
) -> Result<StoredSession, Failure> {
    let header = conn
        .prepare_cached(
            "SELECT sid, created_at_ms, updated_at_ms, metadata, ephemeral FROM sessions
             WHERE owner = ?1 AND session_id = ?2",
        )?
        .query_row(params![owner, session_id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                HeaderRow {
                    created_at_ms: row.get(1)?,
                    updated_at_ms: row.get(2)?,
                    metadata: row.get(3)?,
                    ephemeral: row.get(4)?,
                },
            ))
        })
        .optional()?;
    let Some((sid, header)) = header else {
        return Err(StoreError::NotFound {
            session_id: session_id.to_owned(),
        }
        .into());
    };
    let snapshot = if span.snapshot() {
        conn.prepare_cached("SELECT seq, body FROM snapshots WHERE sid = ?1")?
            .query_row([sid], |row| {
                Ok(StoredSnapshot {
                    seq: row.get(0)?,
                    body: row.get(1)?,
                    blobs: Default::default(),
                })
            })
            .optional()?
    } else {
        None
    };
    let (after, limit) = span.bounds(snapshot.as_ref().map_or(0, |s| s.seq));
    let mut query = conn.prepare_cached(RECORDS_AFTER)?;
    let rows = query
        .query_map(params![sid, after, limit], row_of)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut snapshot = snapshot;
    let blobs = read_blobs(conn, sid, &rows, snapshot.as_ref())?;
    if let Some(snapshot) = &mut snapshot {
        rows::snapshot_blobs(snapshot, &blobs);
    }
    Ok(decode_session(
        owner, session_id, header, snapshot, rows, &blobs,
    )?)
}

/// The blobs of session `sid` that `rows` and `snapshot` name: one
/// indexed lookup each.
fn read_blobs(
    conn: &Connection,
    sid: i64,
    rows: &[Row],
    snapshot: Option<&StoredSnapshot>,
) -> rusqlite::Result<std::collections::HashMap<String, String>> {
    let mut blobs = std::collections::HashMap::new();
    let mut wanted = rows::wanted_blobs(rows);
    if let Some(snapshot) = snapshot {
        rows::marks_in(&snapshot.body, &mut wanted);
    }
    if wanted.is_empty() {
        return Ok(blobs);
    }
    let mut query = conn.prepare_cached("SELECT data FROM blobs WHERE sid = ?1 AND digest = ?2")?;
    for digest in wanted {
        if let Some(data) = query
            .query_row(params![sid, digest], |row| row.get(0))
            .optional()?
        {
            blobs.insert(digest, data);
        }
    }
    Ok(blobs)
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        seq: row.get(0)?,
        at_ms: row.get(1)?,
        entry: row.get(2)?,
        call_id: row.get(3)?,
        blobs: Vec::new(),
    })
}

/// The owner's sessions, most recently updated first, at most `most` of
/// them (all without it).
fn summaries(
    conn: &Connection,
    owner: &str,
    most: Option<u64>,
) -> rusqlite::Result<Vec<SessionSummary>> {
    let now = crate::journal::now_ms();
    // SQLite reads a negative limit as none.
    let limit = most.map_or(-1, |most| i64::try_from(most).unwrap_or(i64::MAX));
    let mut query = conn.prepare_cached(
        "SELECT session_id, created_at_ms, updated_at_ms, head, lease_holder, lease_token,
                lease_expires_ms, ephemeral
         FROM sessions WHERE owner = ?1 ORDER BY updated_at_ms DESC, session_id LIMIT ?2",
    )?;
    let rows = query.query_map(params![owner, limit], |row| {
        let lease = LeaseRow {
            holder: row.get(4)?,
            token: row.get(5)?,
            expires_ms: row.get(6)?,
        };
        Ok(SessionSummary {
            session_id: row.get(0)?,
            created_at_ms: row.get(1)?,
            updated_at_ms: row.get(2)?,
            records: row.get(3)?,
            leased_until_ms: lease.blocking_until(now),
            ephemeral: row.get(7)?,
        })
    })?;
    rows.collect()
}

/// Moves `lease`'s expiry to `expires`, or gives the lease up (`None`),
/// while the session still carries its token: whether it did.
fn update_lease(conn: &Connection, lease: &Lease, expires: Option<u64>) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE sessions
             SET lease_holder = CASE WHEN ?5 IS NULL THEN NULL ELSE lease_holder END,
                 lease_expires_ms = COALESCE(?5, 0)
             WHERE owner = ?1 AND session_id = ?2 AND lease_token = ?3 AND lease_holder = ?4",
        )?
        .execute(params![
            owner_key_of(lease.user_id.as_deref()),
            lease.session_id,
            lease.token,
            lease.holder.as_str(),
            expires
        ])?;
    Ok(changed == 1)
}

impl SessionStore for SqliteStore {
    fn location(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn lease<'a>(&'a self, request: LeaseRequest<'a>) -> Reply<'a, Leased> {
        let owner = owner_key(request.user_id);
        let session_id = request.session_id.to_owned();
        let holder = request.holder.clone();
        let ttl = request.ttl;
        let now = request.now_ms;
        let expires = expiry(now, ttl);
        let create = request
            .create
            .map(|(header, records)| NewSession::of(header, records));
        self.run(move |conn| {
            let create = create.transpose()?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (token, created) = match lease_row(&tx, &owner, &session_id)? {
                Some((sid, row)) => {
                    row.check_free(&session_id, now)?;
                    let token = row.token + 1;
                    tx.prepare_cached(
                        "UPDATE sessions SET lease_holder = ?2, lease_token = ?3, lease_expires_ms = ?4
                         WHERE sid = ?1",
                    )?
                    .execute(params![sid, holder.as_str(), token, expires])?;
                    if row.holder.is_some() {
                        // Taken from a holder that never released it: the
                        // mail its tasks left is stale ([`TaskMail`]).
                        tx.prepare_cached("DELETE FROM task_mail WHERE sid = ?1")?
                            .execute([sid])?;
                    }
                    (token, false)
                }
                None => {
                    let Some(new) = create else {
                        return Err(StoreError::NotFound { session_id }.into());
                    };
                    insert_session(&new, &tx, now, Some((holder.as_str(), 1, expires)))?;
                    (1, true)
                }
            };
            let session = read_session(&tx, &owner, &session_id, Span::FromSnapshot)?;
            tx.commit()?;
            Ok(Leased {
                lease: Lease {
                    user_id: owner_of(owner),
                    session_id,
                    holder,
                    token,
                    ttl,
                },
                created,
                session,
            })
        })
    }

    fn append<'a>(&'a self, append: Append<'a>) -> Reply<'a, ()> {
        Box::pin(self.committer.inbox.append(append, self.durability))
    }

    fn renew<'a>(&'a self, lease: &'a Lease, now_ms: u64) -> Reply<'a, ()> {
        let lease = lease.clone();
        self.run(move |conn| {
            let expires = expiry(now_ms, lease.ttl);
            if update_lease(conn, &lease, Some(expires))? {
                Ok(())
            } else {
                Err(lease.lost().into())
            }
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> Reply<'a, ()> {
        let lease = lease.clone();
        self.run(move |conn| {
            update_lease(conn, &lease, None)?;
            Ok(())
        })
    }

    fn read_page<'a>(&'a self, page: Page<'a>) -> Reply<'a, StoredSession> {
        self.read_span(page.owner, page.session_id, Span::page(&page))
    }

    fn owners(&self) -> Reply<'_, Vec<Option<String>>> {
        self.run(move |conn| {
            let mut query =
                conn.prepare_cached("SELECT DISTINCT owner FROM sessions ORDER BY owner")?;
            let rows = query.query_map([], |row| row.get::<_, String>(0))?;
            let keys = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(keys.into_iter().map(owner_of).collect())
        })
    }

    fn list<'a>(&'a self, owner: Owner<'a>) -> Reply<'a, Vec<SessionSummary>> {
        let owner = owner_key(owner);
        self.run(move |conn| Ok(summaries(conn, &owner, None)?))
    }

    fn list_recent<'a>(&'a self, owner: Owner<'a>, most: u64) -> Reply<'a, Listing> {
        let owner = owner_key(owner);
        self.run(move |conn| {
            let sessions = summaries(conn, &owner, Some(most))?;
            let total = if (sessions.len() as u64) < most {
                sessions.len() as u64
            } else {
                conn.prepare_cached("SELECT count(*) FROM sessions WHERE owner = ?1")?
                    .query_row(params![owner], |row| row.get(0))?
            };
            Ok(Listing { sessions, total })
        })
    }

    fn insert<'a>(
        &'a self,
        header: &'a SessionHeader,
        mut records: Box<dyn RecordPages>,
        updated_at_ms: u64,
    ) -> Reply<'a, ()> {
        let new = NewSession::of(header, &[]);
        // On the store's blocking thread, holding the file's write lock
        // until the last page is in: other writers wait (`BUSY_TIMEOUT`).
        self.run(move |conn| {
            let new = new?;
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if lease_row(&tx, &new.owner, &new.session_id)?.is_some() {
                return Err(StoreError::AlreadyExists {
                    session_id: new.session_id,
                }
                .into());
            }
            let sid = insert_session(&new, &tx, updated_at_ms, None)?;
            let mut head = 0;
            while let Some(page) = records.next_page()? {
                head = page.last().map_or(head, |r| r.seq);
                insert_records(&tx, sid, &encode(&page)?)?;
            }
            tx.prepare_cached("UPDATE sessions SET head = ?1 WHERE sid = ?2")?
                .execute(params![head, sid])?;
            tx.commit()?;
            Ok(())
        })
    }

    fn call_records<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Vec<Record>> {
        let owner = owner_key(call.owner);
        let (session_id, call_id) = (call.session_id.to_owned(), call.call_id.to_owned());
        self.run(move |conn| {
            let mut query = conn.prepare_cached(
                "SELECT r.seq, r.at_ms, r.entry, r.call_id
                 FROM sessions s JOIN records r INDEXED BY records_by_call ON r.sid = s.sid
                 WHERE s.owner = ?1 AND s.session_id = ?2 AND r.call_id = ?3 ORDER BY r.seq",
            )?;
            let rows = query
                .query_map(params![owner, session_id, call_id], row_of)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut blobs = std::collections::HashMap::new();
            if !rows::wanted_blobs(&rows).is_empty() {
                let sid: Option<i64> = conn
                    .prepare_cached(
                        "SELECT sid FROM sessions WHERE owner = ?1 AND session_id = ?2",
                    )?
                    .query_row(params![owner, session_id], |row| row.get(0))
                    .optional()?;
                if let Some(sid) = sid {
                    blobs = read_blobs(conn, sid, &rows, None)?;
                }
            }
            Ok(rows::decode_records(&session_id, rows, &blobs)?)
        })
    }

    fn task_mail<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Option<TaskMail>> {
        let owner = owner_key(call.owner);
        let (session_id, call_id) = (call.session_id.to_owned(), call.call_id.to_owned());
        self.run(move |conn| Ok(read_mail(conn, &owner, &session_id, &call_id)?))
    }

    fn swap_task_mail<'a>(
        &'a self,
        call: CallKey<'a>,
        expected: Option<&'a TaskMail>,
        new: Option<&'a TaskMail>,
    ) -> Reply<'a, bool> {
        let owner = owner_key(call.owner);
        let (session_id, call_id) = (call.session_id.to_owned(), call.call_id.to_owned());
        let (expected, new) = (expected.cloned(), new.cloned());
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            if read_mail(&tx, &owner, &session_id, &call_id)? != expected {
                return Ok(false);
            }
            let sid: Option<i64> = tx
                .prepare_cached("SELECT sid FROM sessions WHERE owner = ?1 AND session_id = ?2")?
                .query_row(params![owner, session_id], |row| row.get(0))
                .optional()?;
            let Some(sid) = sid else {
                // Only none was expected: nothing to remove, nowhere to
                // keep anything.
                return Ok(new.is_none());
            };
            match new {
                None => tx
                    .prepare_cached("DELETE FROM task_mail WHERE sid = ?1 AND call_id = ?2")?
                    .execute(params![sid, call_id])?,
                Some(mail) => tx
                    .prepare_cached(
                        "INSERT OR REPLACE INTO task_mail
                             (sid, call_id, waiting, answers, cancelled, status)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![
                        sid,
                        call_id,
                        mail.waiting,
                        mail.answers,
                        mail.cancelled,
                        mail.status
                    ])?,
            };
            tx.commit()?;
            Ok(true)
        })
    }

    fn prune<'a>(&'a self, request: PruneRequest<'a>) -> Reply<'a, Vec<Pruned>> {
        let owner = request.owner.map(owner_key);
        let (before, ephemeral_before, now, dry_run) = (
            request.updated_before_ms,
            request.ephemeral_updated_before_ms,
            request.now_ms,
            request.dry_run,
        );
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let doomed: Vec<(i64, String, String)> = tx
                .prepare_cached(
                    "SELECT sid, owner, session_id FROM sessions
                     WHERE (?1 IS NULL OR owner = ?1)
                       AND (updated_at_ms < ?2 OR (ephemeral AND updated_at_ms < ?3))
                       AND (lease_holder IS NULL OR lease_expires_ms <= ?4)",
                )?
                .query_map(params![owner, before, ephemeral_before, now], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })?
                .collect::<rusqlite::Result<_>>()?;
            if !dry_run {
                for (sid, ..) in &doomed {
                    delete_session(&tx, *sid)?;
                }
                tx.commit()?;
            }
            Ok(doomed
                .into_iter()
                .map(|(_, owner, session_id)| Pruned {
                    user_id: owner_of(owner),
                    session_id,
                })
                .collect())
        })
    }

    fn fork<'a>(&'a self, fork: Fork<'a>) -> Reply<'a, u64> {
        let owner = owner_key(fork.owner);
        let (from, to) = (fork.from.to_owned(), fork.to.to_owned());
        let (at, now_ms) = (fork.at, fork.now_ms);
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some((sid, _)) = lease_row(&tx, &owner, &from)? else {
                return Err(StoreError::NotFound { session_id: from }.into());
            };
            if lease_row(&tx, &owner, &to)?.is_some() {
                return Err(StoreError::AlreadyExists { session_id: to }.into());
            }
            let (metadata, head): (String, u64) = tx.query_row(
                "SELECT metadata, head FROM sessions WHERE sid = ?1",
                [sid],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )?;
            let held = at.min(head);
            let forked: i64 = tx.query_row(
                "INSERT INTO sessions (owner, session_id, created_at_ms, updated_at_ms, metadata,
                       head, lease_holder, lease_token, lease_expires_ms, ephemeral)
                 VALUES (?1, ?2, ?3, ?3, ?4, ?5, NULL, 0, 0, 0) RETURNING sid",
                params![owner, to, now_ms, metadata, held],
                |row| row.get(0),
            )?;
            tx.execute(
                "INSERT INTO records (sid, seq, at_ms, entry, call_id)
                 SELECT ?1, seq, at_ms, entry, call_id FROM records
                 WHERE sid = ?2 AND seq <= ?3 ORDER BY seq",
                params![forked, sid, held],
            )?;
            tx.execute(
                "INSERT INTO snapshots (sid, seq, body) SELECT ?1, seq, body FROM snapshots
                 WHERE sid = ?2 AND seq <= ?3",
                params![forked, sid, held],
            )?;
            // Only the blobs the fork's records and snapshot name: none
            // that only later records show.
            let mut wanted = Vec::new();
            for named in [
                "SELECT entry FROM records WHERE sid = ?1 AND instr(entry, ?2) > 0",
                "SELECT body FROM snapshots WHERE sid = ?1 AND instr(body, ?2) > 0",
            ] {
                let mut query = tx.prepare(named)?;
                let texts = query.query_map(params![forked, rows::QUOTED_MARK], |row| {
                    row.get::<_, String>(0)
                })?;
                for text in texts {
                    rows::marks_in(&text?, &mut wanted);
                }
            }
            {
                let mut copy = tx.prepare(
                    "INSERT INTO blobs (sid, digest, data) SELECT ?1, digest, data FROM blobs
                     WHERE sid = ?2 AND digest = ?3",
                )?;
                for digest in &wanted {
                    copy.execute(params![forked, sid, digest])?;
                }
            }
            tx.commit()?;
            Ok(held)
        })
    }

    fn remove<'a>(&'a self, owner: Owner<'a>, session_id: &'a str, now_ms: u64) -> Reply<'a, ()> {
        let owner = owner_key(owner);
        let session_id = session_id.to_owned();
        self.run(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some((sid, row)) = lease_row(&tx, &owner, &session_id)? else {
                return Err(StoreError::NotFound { session_id }.into());
            };
            row.check_free(&session_id, now_ms)?;
            delete_session(&tx, sid)?;
            tx.commit()?;
            Ok(())
        })
    }
}

/// Creates `dir` (and its parents) readable by its owner only, when it does
/// not exist.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Makes a new store file readable and writable by its owner only (SQLite
/// gives its `-wal` and `-shm` files the same mode).
fn restrict_to_owner(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        tracing::warn!(path = %path.display(), error = %e, "cannot restrict the store file to its owner");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Entry, Flush};

    /// The store's `PRAGMA synchronous`: 2 is `FULL`, 1 `NORMAL`.
    fn synchronous_now(store: &SqliteStore) -> i64 {
        lock(&store.connection)
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .unwrap()
    }

    /// Session `s` of `store`, leased; its lease.
    async fn leased(store: &SqliteStore) -> crate::session::Lease {
        crate::session::leased_for_test(store, "s").await
    }

    /// Appends record `seq` to the session `lease` holds, flushed so.
    async fn append(store: &SqliteStore, lease: &crate::session::Lease, seq: u64, flush: Flush) {
        let deps = Entry::Deps {
            deps: serde_json::Map::new(),
        };
        let records = [Record::committed(seq, 2, deps)];
        let append = Append {
            lease,
            records: &records,
            snapshot: None,
            now_ms: 2,
            flush,
        };
        store.append(append).await.unwrap();
    }

    /// A deferred batch commits without waiting for the disk and leaves
    /// the connection waiting again, for every write after it; under
    /// `never` nothing waits.
    #[tokio::test]
    async fn a_deferred_batch_leaves_the_connection_waiting_for_the_disk() {
        for (durability, after) in [(Durability::ByEffect, 2), (Durability::Never, 1)] {
            let dir = tempfile::tempdir().unwrap();
            let store = SqliteStore::open_with(dir.path().join("s.db"), durability).unwrap();
            assert_eq!(synchronous_now(&store), after);
            let lease = leased(&store).await;
            for (seq, flush) in [(1, Flush::Deferred), (2, Flush::Now), (3, Flush::Deferred)] {
                append(&store, &lease, seq, flush).await;
                assert_eq!(synchronous_now(&store), after, "after {flush:?}");
            }
            assert_eq!(store.read(None, "s").await.unwrap().records.len(), 3);
        }
    }

    /// Reading a session page by page, and whole, compiles its query
    /// once: a replay or an export reads thousands of pages.
    #[tokio::test]
    async fn pages_of_a_journal_are_read_without_compiling_the_query_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open_with(dir.path().join("s.db"), Durability::Never).unwrap();
        let lease = leased(&store).await;
        for seq in 1..=5 {
            append(&store, &lease, seq, Flush::Deferred).await;
        }
        let mut read = Vec::new();
        for (after, limit) in [(0, 2), (2, 2), (4, 2), (5, 2)] {
            let page = Page {
                owner: None,
                session_id: "s",
                after,
                limit,
            };
            let records = store.read_page(page).await.unwrap().records;
            read.extend(records.iter().map(|r| r.seq));
        }
        let whole = store.read(None, "s").await.unwrap().records.len();
        let conn = lock(&store.connection);
        let query = conn.prepare_cached(RECORDS_AFTER).unwrap();
        assert_eq!(query.get_status(rusqlite::StatementStatus::RePrepare), 0);
        assert_eq!(read, [1, 2, 3, 4, 5]);
        assert_eq!(whole, 5);
    }
}
