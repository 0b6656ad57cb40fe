//! The shared store for many hosts: PostgreSQL, through a pool of
//! `tokio-postgres` connections (`deadpool-postgres`).
//!
//! The same two tables as the embedded store, prefixed so they can live
//! in a database the operator already has: `airlock_sessions` (a row per
//! session: header, last record number, lease) and `airlock_records` (the
//! journal). What makes several hosts safe is Postgres's, not ours:
//!
//! - taking a lease locks the session's row (`SELECT … FOR UPDATE`), so of
//!   two hosts leasing one session at once one waits and then sees the
//!   other's lease;
//! - an append moves the session's head and inserts the records only if
//!   the session still has the lease's fencing token and the head the
//!   appender expects, in the statement that checks it; a host that lost
//!   its lease (it expired, another host took the session) inserts
//!   nothing, whatever its timing. The appends of one host's concurrent
//!   sessions share that statement and its transaction
//!   ([`commit`]);
//! - the schema is created and migrated under a transaction-scoped
//!   advisory lock, so hosts starting together migrate once.
//!
//! Lease expiry uses Airlock's clock (the `now_ms` each request carries),
//! like every store: hosts' clocks must agree to well within the lease's
//! ttl (NTP does). A skewed clock can only make a lease end early (its
//! holder then fails with [`StoreError::LeaseLost`], saving nothing more);
//! the fencing token keeps the journal whole either way.
//!
//! Cost: a lone append is one round trip and one transaction (an fsync of
//! the server's WAL), and appends that arrive while others are being
//! committed share the next; taking a lease is five round trips and reads
//! the snapshot and the tail. Connections are opened as needed, up to the
//! pool's size.
//!
//! A lease reads the session's newest snapshot and the records after it;
//! an append that writes a snapshot writes it in the same statement.
//!
//! TLS as libpq's URL parameters ask (`sslmode=require|verify-ca|
//! verify-full`, `sslrootcert=FILE`), through rustls (`tls`); without
//! `sslmode` the connection is plain TCP or a Unix socket.

mod commit;
mod sql;
mod tls;

use std::time::Duration;

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;
use tokio_postgres::{Config, IsolationLevel, NoTls};

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
use commit::Committer;
use sql::{big, describe};

/// The schema this version writes (`airlock_schema.version`): 3 holds
/// journals of record format 2 (`journal::RECORD_FORMAT`: items only)
/// beside format-1 records written before, which stay as they are. The
/// tables are version 2's: 3 is there so that an older Airlock refuses the
/// store instead of misreading its new records. 4 adds `airlock_blobs`
/// ([`SCHEMA_V4`]).
const SCHEMA_VERSION: i32 = 4;

/// The advisory lock key under which the schema is migrated (any constant
/// no other program uses: "airlock" in ASCII).
const MIGRATION_LOCK: i64 = 0x0061_6972_6c6f_636b;

/// How many connections a store opens at most, unless told otherwise.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for a free connection of the pool.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// The schema, version 1. Columns as in the embedded store; entries are
/// `text`, kept byte for byte (key order is part of deps).
const SCHEMA_V1: &str = "
CREATE TABLE airlock_sessions (
    owner text NOT NULL,
    session_id text NOT NULL,
    created_at_ms bigint NOT NULL,
    updated_at_ms bigint NOT NULL,
    metadata text NOT NULL,
    head bigint NOT NULL,
    lease_holder text,
    lease_token bigint NOT NULL,
    lease_expires_ms bigint NOT NULL,
    PRIMARY KEY (owner, session_id)
);
CREATE INDEX airlock_sessions_by_update ON airlock_sessions (owner, updated_at_ms DESC);
CREATE TABLE airlock_records (
    owner text NOT NULL,
    session_id text NOT NULL,
    seq bigint NOT NULL,
    at_ms bigint NOT NULL,
    entry text NOT NULL,
    PRIMARY KEY (owner, session_id, seq),
    FOREIGN KEY (owner, session_id) REFERENCES airlock_sessions ON DELETE CASCADE
);
";

/// Version 2: a keyed call's records indexed by its id (a keyed retry's
/// lookup; the records already written, every call's), each session's
/// newest snapshot, and whether a session is ephemeral.
const SCHEMA_V2: &str = "
ALTER TABLE airlock_sessions ADD COLUMN ephemeral boolean NOT NULL DEFAULT false;
ALTER TABLE airlock_records ADD COLUMN call_id text;
CREATE INDEX airlock_records_by_call ON airlock_records (owner, session_id, call_id)
    WHERE call_id IS NOT NULL;
CREATE TABLE airlock_snapshots (
    owner text NOT NULL,
    session_id text NOT NULL,
    seq bigint NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (owner, session_id),
    FOREIGN KEY (owner, session_id) REFERENCES airlock_sessions ON DELETE CASCADE
);
";

/// Version 4: what a call showed (images, sounds, binary resources), kept
/// once per session, its records naming it by digest.
const SCHEMA_V4: &str = "
CREATE TABLE airlock_blobs (
    owner text NOT NULL,
    session_id text NOT NULL,
    digest text NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (owner, session_id, digest),
    FOREIGN KEY (owner, session_id) REFERENCES airlock_sessions ON DELETE CASCADE
);
";

/// [`TaskMail`], beside the versioned tables: made where it is missing by
/// any version that uses it, and needing no newer schema, since an older
/// Airlock that does not read it loses nothing (its tasks are seen whole
/// only by the host that runs them, as before).
const TASK_MAIL: &str = "
CREATE TABLE IF NOT EXISTS airlock_task_mail (
    owner text NOT NULL,
    session_id text NOT NULL,
    call_id text NOT NULL,
    waiting text,
    answers text,
    cancelled boolean NOT NULL,
    status text,
    PRIMARY KEY (owner, session_id, call_id),
    FOREIGN KEY (owner, session_id) REFERENCES airlock_sessions ON DELETE CASCADE
);
";

/// Sessions in a PostgreSQL database, shared by every host that uses it.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    location: String,
    /// Appends, batched ([`commit`]).
    committer: std::sync::Arc<Committer>,
    /// Which of them wait for the server's WAL flush.
    durability: Durability,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("location", &self.location)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// Whether `text` names a Postgres store (`postgres://…` or
/// `postgresql://…`) rather than a SQLite file.
pub fn is_postgres_url(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db`,
    /// or libpq's `key=value` form) with a pool of [`DEFAULT_POOL_SIZE`]
    /// connections, and creates or migrates the schema. Errors never show
    /// the password.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, DEFAULT_POOL_SIZE).await
    }

    /// [`PostgresStore::connect`] with at most `pool_size` connections.
    pub async fn connect_with(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let invalid = |message: String| StoreError::NotAStore {
            location: "postgres".into(),
            problem: format!("invalid Postgres URL: {message}"),
        };
        let (url, tls) = tls::split_url(url).map_err(invalid)?;
        let mut config: Config = url.parse().map_err(|e| invalid(describe(&e)))?;
        let tls_config = tls.client_config().map_err(invalid)?;
        if tls.encrypted() {
            // Never plain text once TLS is asked for.
            config.ssl_mode(SslMode::Require);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("airlock");
        }
        let location = describe_config(&config);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match tls_config {
            Some(tls_config) => Manager::from_config(
                config,
                tokio_postgres_rustls::MakeRustlsConnect::new(tls_config),
                manager_config,
            ),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Backend {
                location: location.clone(),
                message: e.to_string(),
            })?;
        let committer = std::sync::Arc::new(commit::start(pool.clone(), location.clone()));
        let store = Self {
            pool,
            location,
            committer,
            durability: Durability::ByEffect,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The store whose appends wait for the server's WAL flush as
    /// `durability` says ([`Durability::ByEffect`] unless set): a batch
    /// that need not wait commits with `synchronous_commit = off` for its
    /// transaction alone (the server's other transactions keep their
    /// setting). [`Durability::EveryCall`] leaves every commit to the
    /// server's own `synchronous_commit`.
    #[must_use]
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    fn fail(&self, message: String) -> StoreError {
        StoreError::Backend {
            location: self.location.clone(),
            message,
        }
    }

    /// `span` of a session, in one read-only snapshot (the header and the
    /// journal agree).
    async fn read_span(
        &self,
        owner: Owner<'_>,
        session_id: &str,
        span: Span,
    ) -> Result<StoredSession, StoreError> {
        self.run(async move {
            let owner = owner_key(owner);
            let mut client = self.client().await?;
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let session = read_session(&tx, &owner, session_id, span).await?;
            tx.commit().await?;
            Ok(session)
        })
        .await
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            self.fail(match e {
                deadpool_postgres::PoolError::Backend(e) => describe(&e),
                other => other.to_string(),
            })
        })
    }

    /// Creates the schema, or checks it is one this version reads. Hosts
    /// starting together take turns on the advisory lock.
    async fn migrate(&self) -> Result<(), StoreError> {
        let db = |e: tokio_postgres::Error| self.fail(describe(&e));
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS airlock_schema (version integer NOT NULL)")
            .await
            .map_err(db)?;
        let version: Option<i32> = tx
            .query_one("SELECT max(version) FROM airlock_schema", &[])
            .await
            .map_err(db)?
            .get(0);
        let version = version.unwrap_or(0);
        if version > SCHEMA_VERSION {
            return Err(self.fail(format!(
                "written by a newer Airlock (schema {version}; this one reads {SCHEMA_VERSION})"
            )));
        }
        if version < 1 {
            tx.batch_execute(SCHEMA_V1).await.map_err(db)?;
        }
        if version < 2 {
            tx.batch_execute(SCHEMA_V2).await.map_err(db)?;
            // Records written by version 1: their call ids.
            let rows = tx
                .query(
                    "SELECT owner, session_id, seq, entry FROM airlock_records",
                    &[],
                )
                .await
                .map_err(db)?;
            for row in rows {
                let entry: &str = row.get(3);
                if let Some(call_id) = rows::call_id_of(entry) {
                    let (owner, session_id, seq): (&str, &str, i64) =
                        (row.get(0), row.get(1), row.get(2));
                    tx.execute(
                        "UPDATE airlock_records SET call_id = $4
                         WHERE owner = $1 AND session_id = $2 AND seq = $3",
                        &[&owner, &session_id, &seq, &call_id],
                    )
                    .await
                    .map_err(db)?;
                }
            }
        }
        if version < 4 {
            tx.batch_execute(SCHEMA_V4).await.map_err(db)?;
        }
        tx.batch_execute(TASK_MAIL).await.map_err(db)?;
        if version < SCHEMA_VERSION {
            tx.execute("DELETE FROM airlock_schema", &[])
                .await
                .map_err(db)?;
            tx.execute(
                "INSERT INTO airlock_schema (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)
    }

    /// Runs `work` and turns a database error into [`StoreError::Backend`].
    async fn run<T>(
        &self,
        work: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, StoreError> {
        match work.await {
            Ok(value) => Ok(value),
            Err(Failure::Store(e)) => Err(e),
            Err(Failure::Backend(e)) => Err(self.fail(describe(&e))),
        }
    }
}

/// The store's address for messages: no password.
fn describe_config(config: &Config) -> String {
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().unwrap_or(user);
    let at = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    format!("postgres://{at}{host}:{port}/{db}")
}

type Failure = rows::Failure<tokio_postgres::Error>;

/// The owner's sessions, most recently updated first, at most `most` of
/// them (all without it).
async fn summaries(
    client: &tokio_postgres::Client,
    owner: &str,
    most: Option<u64>,
) -> Result<Vec<SessionSummary>, tokio_postgres::Error> {
    let now = crate::journal::now_ms();
    // Postgres reads a null limit as none.
    let limit = most.map(|most| i64::try_from(most).unwrap_or(i64::MAX));
    let rows = client
        .query(
            "SELECT session_id, created_at_ms, updated_at_ms, head, lease_holder,
                    lease_token, lease_expires_ms, ephemeral
             FROM airlock_sessions WHERE owner = $1
             ORDER BY updated_at_ms DESC, session_id LIMIT $2",
            &[&owner, &limit],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let lease = LeaseRow {
                holder: row.get(4),
                token: num(row.get(5)),
                expires_ms: num(row.get(6)),
            };
            SessionSummary {
                session_id: row.get(0),
                created_at_ms: num(row.get(1)),
                updated_at_ms: num(row.get(2)),
                records: num(row.get(3)),
                leased_until_ms: lease.blocking_until(now),
                ephemeral: row.get(7),
            }
        })
        .collect())
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Backend(e)
    }
}

/// A `bigint` back (a negative one, which Airlock never writes, as 0).
fn num(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Inserts a session's row and journal unless the owner already has one
/// with its id; whether it did. `lease` is (holder, token, expiry) when the
/// session is created leased.
async fn insert_session(
    tx: &impl GenericClient,
    new: &NewSession,
    updated_at_ms: u64,
    lease: Option<(&str, u64, u64)>,
) -> Result<bool, tokio_postgres::Error> {
    let (holder, token, expires) = match lease {
        Some((holder, token, expires)) => (Some(holder), token, expires),
        None => (None, 0, 0),
    };
    let inserted = tx
        .execute(
            "INSERT INTO airlock_sessions (owner, session_id, created_at_ms, updated_at_ms,
               metadata, head, lease_holder, lease_token, lease_expires_ms, ephemeral)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (owner, session_id) DO NOTHING",
            &[
                &new.owner,
                &new.session_id,
                &big(new.created_at_ms),
                &big(updated_at_ms),
                &new.metadata,
                &big(new.head()),
                &holder,
                &big(token),
                &big(expires),
                &new.ephemeral,
            ],
        )
        .await?;
    if inserted != 1 {
        return Ok(false);
    }
    insert_records(tx, &new.owner, &new.session_id, &new.rows).await?;
    Ok(true)
}

/// The columns of `rows`, as the arrays `INSERT … SELECT … FROM unnest`
/// takes: one statement for any number of records.
fn columns(rows: &[Row]) -> Columns<'_> {
    (
        rows.iter().map(|r| big(r.seq)).collect(),
        rows.iter().map(|r| big(r.at_ms)).collect(),
        rows.iter().map(|r| r.entry.as_str()).collect(),
        rows.iter().map(|r| r.call_id.as_deref()).collect(),
    )
}

type Columns<'r> = (Vec<i64>, Vec<i64>, Vec<&'r str>, Vec<Option<&'r str>>);

async fn insert_records(
    tx: &impl GenericClient,
    owner: &str,
    session_id: &str,
    rows: &[Row],
) -> Result<(), tokio_postgres::Error> {
    let (seqs, times, entries, calls) = columns(rows);
    tx.execute(
        "INSERT INTO airlock_records (owner, session_id, seq, at_ms, entry, call_id)
         SELECT $1, $2, r.seq, r.at_ms, r.entry, r.call_id
         FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::text[])
           AS r(seq, at_ms, entry, call_id)",
        &[&owner, &session_id, &seqs, &times, &entries, &calls],
    )
    .await?;
    let (digests, data): (Vec<&str>, Vec<&str>) = rows::distinct_blobs(rows)
        .into_iter()
        .map(|blob| (blob.digest.as_str(), blob.data.as_str()))
        .unzip();
    if !digests.is_empty() {
        // A blob the session already holds is not written again.
        tx.execute(
            "INSERT INTO airlock_blobs (owner, session_id, digest, data)
             SELECT $1, $2, b.digest, b.data FROM unnest($3::text[], $4::text[]) AS b(digest, data)
             ON CONFLICT DO NOTHING",
            &[&owner, &session_id, &digests, &data],
        )
        .await?;
    }
    Ok(())
}

/// The blobs of session `session_id` of `owner` that `rows` and
/// `snapshot` name.
async fn read_blobs(
    tx: &impl GenericClient,
    owner: &str,
    session_id: &str,
    rows: &[Row],
    snapshot: Option<&StoredSnapshot>,
) -> Result<std::collections::HashMap<String, String>, tokio_postgres::Error> {
    let mut wanted = rows::wanted_blobs(rows);
    if let Some(snapshot) = snapshot {
        rows::marks_in(&snapshot.body, &mut wanted);
    }
    if wanted.is_empty() {
        return Ok(std::collections::HashMap::new());
    }
    let statement = tx
        .prepare_cached(
            "SELECT digest, data FROM airlock_blobs
             WHERE owner = $1 AND session_id = $2 AND digest = ANY($3)",
        )
        .await?;
    Ok(tx
        .query(&statement, &[&owner, &session_id, &wanted])
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// The session's lease, its row locked until the transaction ends.
/// The parameters of a row of `airlock_task_mail`, in its columns' order.
fn mail_row<'a>(
    owner: &'a String,
    session_id: &'a &'a str,
    call_id: &'a &'a str,
    mail: &'a TaskMail,
) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 7] {
    [
        owner,
        session_id,
        call_id,
        &mail.waiting,
        &mail.answers,
        &mail.cancelled,
        &mail.status,
    ]
}

/// The mail of call `call_id` of a session ([`TaskMail`]), if any; read
/// with `lock` (`FOR UPDATE`, or nothing).
async fn read_mail(
    client: &impl GenericClient,
    owner: &str,
    session_id: &str,
    call_id: &str,
    lock: &str,
) -> Result<Option<TaskMail>, tokio_postgres::Error> {
    let query = format!(
        "SELECT waiting, answers, cancelled, status FROM airlock_task_mail
         WHERE owner = $1 AND session_id = $2 AND call_id = $3 {lock}"
    );
    let row = client
        .query_opt(&query, &[&owner, &session_id, &call_id])
        .await?;
    Ok(row.map(|row| TaskMail {
        waiting: row.get(0),
        answers: row.get(1),
        cancelled: row.get(2),
        status: row.get(3),
    }))
}

async fn lock_lease(
    tx: &impl GenericClient,
    owner: &str,
    session_id: &str,
) -> Result<Option<LeaseRow>, tokio_postgres::Error> {
    let statement = tx
        .prepare_cached(
            "SELECT lease_holder, lease_token, lease_expires_ms FROM airlock_sessions
             WHERE owner = $1 AND session_id = $2 FOR UPDATE",
        )
        .await?;
    let row = tx.query_opt(&statement, &[&owner, &session_id]).await?;
    Ok(row.map(|row| LeaseRow {
        holder: row.get(0),
        token: num(row.get(1)),
        expires_ms: num(row.get(2)),
    }))
}

/// Reads a session's header and the records `span` names, on `tx` (a
/// transaction, or the pool's connection for a read on its own).
async fn read_session(
    tx: &impl GenericClient,
    owner: &str,
    session_id: &str,
    span: Span,
) -> Result<StoredSession, Failure> {
    let statement = tx
        .prepare_cached(
            "SELECT created_at_ms, updated_at_ms, metadata, ephemeral FROM airlock_sessions
             WHERE owner = $1 AND session_id = $2",
        )
        .await?;
    let header = tx.query_opt(&statement, &[&owner, &session_id]).await?;
    let Some(header) = header else {
        return Err(StoreError::NotFound {
            session_id: session_id.to_owned(),
        }
        .into());
    };
    let header = HeaderRow {
        created_at_ms: num(header.get(0)),
        updated_at_ms: num(header.get(1)),
        metadata: header.get(2),
        ephemeral: header.get(3),
    };
    let snapshot = if span.snapshot() {
        let statement = tx
            .prepare_cached(
                "SELECT seq, body FROM airlock_snapshots WHERE owner = $1 AND session_id = $2",
            )
            .await?;
        tx.query_opt(&statement, &[&owner, &session_id])
            .await?
            .map(|row| StoredSnapshot {
                seq: num(row.get(0)),
                body: row.get(1),
                blobs: Default::default(),
            })
    } else {
        None
    };
    let (after, limit) = span.bounds(snapshot.as_ref().map_or(0, |s| s.seq));
    let statement = tx
        .prepare_cached(
            "SELECT seq, at_ms, entry, call_id FROM airlock_records
             WHERE owner = $1 AND session_id = $2 AND seq > $3 ORDER BY seq LIMIT $4",
        )
        .await?;
    let rows: Vec<Row> = tx
        .query(&statement, &[&owner, &session_id, &after, &limit])
        .await?
        .into_iter()
        .map(row_of)
        .collect();
    let mut snapshot = snapshot;
    let blobs = read_blobs(tx, owner, session_id, &rows, snapshot.as_ref()).await?;
    if let Some(snapshot) = &mut snapshot {
        rows::snapshot_blobs(snapshot, &blobs);
    }
    Ok(decode_session(
        owner, session_id, header, snapshot, rows, &blobs,
    )?)
}

fn row_of(row: tokio_postgres::Row) -> Row {
    Row {
        seq: num(row.get(0)),
        at_ms: num(row.get(1)),
        entry: row.get(2),
        call_id: row.get(3),
        blobs: Vec::new(),
    }
}

/// How many times a lease retries after losing a race to create the same
/// new session (the second attempt finds it; more covers a remove between).
const CREATE_ATTEMPTS: usize = 3;

impl PostgresStore {
    /// Moves `lease`'s expiry to `expires`, or gives the lease up
    /// (`None`), while the session still carries its token: whether it
    /// did.
    async fn update_lease(&self, lease: &Lease, expires: Option<u64>) -> Result<bool, Failure> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "UPDATE airlock_sessions
                 SET lease_holder = CASE WHEN $5::bigint IS NULL THEN NULL ELSE lease_holder END,
                     lease_expires_ms = COALESCE($5::bigint, 0)
                 WHERE owner = $1 AND session_id = $2 AND lease_token = $3 AND lease_holder = $4",
            )
            .await?;
        let changed = client
            .execute(
                &statement,
                &[
                    &owner_key_of(lease.user_id.as_deref()),
                    &lease.session_id,
                    &big(lease.token),
                    &lease.holder.as_str(),
                    &expires.map(big),
                ],
            )
            .await?;
        Ok(changed == 1)
    }
}

impl SessionStore for PostgresStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    fn lease<'a>(&'a self, request: LeaseRequest<'a>) -> Reply<'a, Leased> {
        Box::pin(self.run(async move {
            let owner = owner_key(request.user_id);
            let session_id = request.session_id;
            let now = request.now_ms;
            let expires = expiry(now, request.ttl);
            let holder = request.holder.as_str();
            let create = request
                .create
                .map(|(header, records)| NewSession::of(header, records))
                .transpose()?;
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let mut attempts = 0;
            let (token, created) = loop {
                attempts += 1;
                if let Some(row) = lock_lease(&tx, &owner, session_id).await? {
                    row.check_free(session_id, now)?;
                    let token = row.token + 1;
                    let statement = tx
                        .prepare_cached(
                            "UPDATE airlock_sessions
                             SET lease_holder = $3, lease_token = $4, lease_expires_ms = $5
                             WHERE owner = $1 AND session_id = $2",
                        )
                        .await?;
                    tx.execute(
                        &statement,
                        &[
                            &owner,
                            &session_id,
                            &holder,
                            &big(token),
                            &big(expires),
                        ],
                    )
                    .await?;
                    if row.holder.is_some() {
                        // Taken from a holder that never released it: the
                        // mail its tasks left is stale ([`TaskMail`]).
                        tx.execute(
                            "DELETE FROM airlock_task_mail WHERE owner = $1 AND session_id = $2",
                            &[&owner, &session_id],
                        )
                        .await?;
                    }
                    break (token, false);
                }
                let Some(new) = &create else {
                    return Err(StoreError::NotFound {
                        session_id: session_id.to_owned(),
                    }
                    .into());
                };
                if insert_session(&tx, new, now, Some((holder, 1, expires))).await? {
                    break (1, true);
                }
                // Another host created it between our look and our insert
                // (the insert waited for its commit): look again.
                if attempts == CREATE_ATTEMPTS {
                    return Err(self
                        .fail(format!(
                            "session {session_id} kept appearing and disappearing while being created"
                        ))
                        .into());
                }
            };
            let session = read_session(&tx, &owner, session_id, Span::FromSnapshot).await?;
            tx.commit().await?;
            Ok(Leased {
                lease: Lease {
                    user_id: owner_of(owner),
                    session_id: session_id.to_owned(),
                    holder: request.holder.clone(),
                    token,
                    ttl: request.ttl,
                },
                created,
                session,
            })
        }))
    }

    fn append<'a>(&'a self, append: Append<'a>) -> Reply<'a, ()> {
        Box::pin(self.committer.append(append, self.durability))
    }

    fn renew<'a>(&'a self, lease: &'a Lease, now_ms: u64) -> Reply<'a, ()> {
        Box::pin(self.run(async move {
            let expires = expiry(now_ms, lease.ttl);
            if self.update_lease(lease, Some(expires)).await? {
                Ok(())
            } else {
                Err(lease.lost().into())
            }
        }))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> Reply<'a, ()> {
        Box::pin(self.run(async move {
            self.update_lease(lease, None).await?;
            Ok(())
        }))
    }

    fn read_page<'a>(&'a self, page: Page<'a>) -> Reply<'a, StoredSession> {
        Box::pin(self.read_span(page.owner, page.session_id, Span::page(&page)))
    }

    fn owners(&self) -> Reply<'_, Vec<Option<String>>> {
        Box::pin(self.run(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT DISTINCT owner FROM airlock_sessions ORDER BY owner",
                    &[],
                )
                .await?;
            Ok(rows.into_iter().map(|row| owner_of(row.get(0))).collect())
        }))
    }

    fn list<'a>(&'a self, owner: Owner<'a>) -> Reply<'a, Vec<SessionSummary>> {
        Box::pin(self.run(async move {
            let client = self.client().await?;
            Ok(summaries(&client, &owner_key(owner), None).await?)
        }))
    }

    fn list_recent<'a>(&'a self, owner: Owner<'a>, most: u64) -> Reply<'a, Listing> {
        Box::pin(self.run(async move {
            let owner = owner_key(owner);
            let client = self.client().await?;
            let sessions = summaries(&client, &owner, Some(most)).await?;
            let total = if (sessions.len() as u64) < most {
                sessions.len() as u64
            } else {
                let count = "SELECT count(*) FROM airlock_sessions WHERE owner = $1";
                num(client.query_one(count, &[&owner]).await?.get(0))
            };
            Ok(Listing { sessions, total })
        }))
    }

    fn insert<'a>(
        &'a self,
        header: &'a SessionHeader,
        mut records: Box<dyn RecordPages>,
        updated_at_ms: u64,
    ) -> Reply<'a, ()> {
        Box::pin(self.run(async move {
            let new = NewSession::of(header, &[])?;
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            if !insert_session(&tx, &new, updated_at_ms, None).await? {
                return Err(StoreError::AlreadyExists {
                    session_id: new.session_id,
                }
                .into());
            }
            let mut head = 0;
            loop {
                // A page may be read from a file: off the runtime's threads.
                let (back, page) = tokio::task::spawn_blocking(move || {
                    let page = records.next_page();
                    (records, page)
                })
                .await
                .map_err(|e| self.fail(format!("reading the records failed: {e}")))?;
                records = back;
                let Some(page) = page? else { break };
                head = page.last().map_or(head, |r| r.seq);
                insert_records(&tx, &new.owner, &new.session_id, &encode(&page)?).await?;
            }
            tx.execute(
                "UPDATE airlock_sessions SET head = $3 WHERE owner = $1 AND session_id = $2",
                &[&new.owner, &new.session_id, &big(head)],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        }))
    }

    fn call_records<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Vec<Record>> {
        let (owner, session_id, call_id) = (owner_key(call.owner), call.session_id, call.call_id);
        Box::pin(self.run(async move {
            let client = self.client().await?;
            let statement = client
                .prepare_cached(
                    "SELECT seq, at_ms, entry, call_id FROM airlock_records
                     WHERE owner = $1 AND session_id = $2 AND call_id = $3 AND call_id IS NOT NULL
                     ORDER BY seq",
                )
                .await?;
            let rows: Vec<Row> = client
                .query(&statement, &[&owner, &session_id, &call_id])
                .await?
                .into_iter()
                .map(row_of)
                .collect();
            let blobs = read_blobs(&client, &owner, session_id, &rows, None).await?;
            Ok(rows::decode_records(session_id, rows, &blobs)?)
        }))
    }

    fn task_mail<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Option<TaskMail>> {
        let (owner, session_id, call_id) = (owner_key(call.owner), call.session_id, call.call_id);
        Box::pin(self.run(async move {
            let client = self.client().await?;
            Ok(read_mail(&client, &owner, session_id, call_id, "").await?)
        }))
    }

    fn swap_task_mail<'a>(
        &'a self,
        call: CallKey<'a>,
        expected: Option<&'a TaskMail>,
        new: Option<&'a TaskMail>,
    ) -> Reply<'a, bool> {
        let (owner, session_id, call_id) = (owner_key(call.owner), call.session_id, call.call_id);
        Box::pin(self.run(async move {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // The mail's row, locked until the swap commits; where there
            // is none, an insert racing this one's finds the key taken.
            let now = read_mail(&tx, &owner, session_id, call_id, "FOR UPDATE").await?;
            if now.as_ref() != expected {
                return Ok(false);
            }
            let changed = match (now, new) {
                (None, None) => 1,
                (Some(_), None) => {
                    tx.execute(
                        "DELETE FROM airlock_task_mail
                         WHERE owner = $1 AND session_id = $2 AND call_id = $3",
                        &[&owner, &session_id, &call_id],
                    )
                    .await?
                }
                (Some(_), Some(mail)) => {
                    tx.execute(
                        "UPDATE airlock_task_mail
                         SET waiting = $4, answers = $5, cancelled = $6, status = $7
                         WHERE owner = $1 AND session_id = $2 AND call_id = $3",
                        &mail_row(&owner, &session_id, &call_id, mail),
                    )
                    .await?
                }
                (None, Some(mail)) => {
                    tx.execute(
                        "INSERT INTO airlock_task_mail
                             (owner, session_id, call_id, waiting, answers, cancelled, status)
                         SELECT owner, session_id, $3, $4, $5, $6, $7 FROM airlock_sessions
                         WHERE owner = $1 AND session_id = $2
                         ON CONFLICT DO NOTHING",
                        &mail_row(&owner, &session_id, &call_id, mail),
                    )
                    .await?
                }
            };
            tx.commit().await?;
            Ok(changed == 1)
        }))
    }

    fn prune<'a>(&'a self, request: PruneRequest<'a>) -> Reply<'a, Vec<Pruned>> {
        let owner = request.owner.map(owner_key);
        Box::pin(self.run(async move {
            let client = self.client().await?;
            // One statement: the journals and snapshots go with their rows
            // (ON DELETE CASCADE); a lease taken meanwhile locks the row
            // first, and the row no longer matches.
            const DOOMED: &str = "WHERE ($1::text IS NULL OR owner = $1)
                       AND (updated_at_ms < $2 OR (ephemeral AND updated_at_ms < $3))
                       AND (lease_holder IS NULL OR lease_expires_ms <= $4)";
            let statement = if request.dry_run {
                format!("SELECT owner, session_id FROM airlock_sessions {DOOMED}")
            } else {
                format!("DELETE FROM airlock_sessions {DOOMED} RETURNING owner, session_id")
            };
            let rows = client
                .query(
                    &statement,
                    &[
                        &owner,
                        &big(request.updated_before_ms),
                        &big(request.ephemeral_updated_before_ms),
                        &big(request.now_ms),
                    ],
                )
                .await?;
            Ok(rows
                .into_iter()
                .map(|row| Pruned {
                    user_id: owner_of(row.get(0)),
                    session_id: row.get(1),
                })
                .collect())
        }))
    }

    fn fork<'a>(&'a self, fork: Fork<'a>) -> Reply<'a, u64> {
        Box::pin(self.run(async move {
            let owner = owner_key(fork.owner);
            let (from, to) = (fork.from, fork.to);
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // The row is locked against a remove for the transaction.
            let parent = tx
                .query_opt(
                    "SELECT metadata, head FROM airlock_sessions
                     WHERE owner = $1 AND session_id = $2 FOR SHARE",
                    &[&owner, &from],
                )
                .await?;
            let Some(parent) = parent else {
                return Err(StoreError::NotFound {
                    session_id: from.to_owned(),
                }
                .into());
            };
            let (metadata, head): (String, i64) = (parent.get(0), parent.get(1));
            let held = big(fork.at).min(head);
            let made = tx
                .execute(
                    "INSERT INTO airlock_sessions (owner, session_id, created_at_ms, updated_at_ms,
                         metadata, head, lease_holder, lease_token, lease_expires_ms, ephemeral)
                     VALUES ($1, $2, $3, $3, $4, $5, NULL, 0, 0, false)
                     ON CONFLICT DO NOTHING",
                    &[&owner, &to, &big(fork.now_ms), &metadata, &held],
                )
                .await?;
            if made == 0 {
                return Err(StoreError::AlreadyExists {
                    session_id: to.to_owned(),
                }
                .into());
            }
            for copy in [
                "INSERT INTO airlock_records (owner, session_id, seq, at_ms, entry, call_id)
                 SELECT owner, $3, seq, at_ms, entry, call_id FROM airlock_records
                 WHERE owner = $1 AND session_id = $2 AND seq <= $4",
                "INSERT INTO airlock_snapshots (owner, session_id, seq, body)
                 SELECT owner, $3, seq, body FROM airlock_snapshots
                 WHERE owner = $1 AND session_id = $2 AND seq <= $4",
            ] {
                tx.execute(copy, &[&owner, &from, &to, &held]).await?;
            }
            // Only the blobs the fork's records and snapshot name: none
            // that only later records show.
            let mut wanted = Vec::new();
            for named in [
                "SELECT entry FROM airlock_records
                 WHERE owner = $1 AND session_id = $2 AND strpos(entry, $3) > 0",
                "SELECT body FROM airlock_snapshots
                 WHERE owner = $1 AND session_id = $2 AND strpos(body, $3) > 0",
            ] {
                for row in tx.query(named, &[&owner, &to, &rows::QUOTED_MARK]).await? {
                    rows::marks_in(row.get(0), &mut wanted);
                }
            }
            tx.execute(
                "INSERT INTO airlock_blobs (owner, session_id, digest, data)
                 SELECT owner, $3, digest, data FROM airlock_blobs
                 WHERE owner = $1 AND session_id = $2 AND digest = ANY($4)",
                &[&owner, &from, &to, &wanted],
            )
            .await?;
            tx.commit().await?;
            Ok(num(held))
        }))
    }

    fn remove<'a>(&'a self, owner: Owner<'a>, session_id: &'a str, now_ms: u64) -> Reply<'a, ()> {
        Box::pin(self.run(async move {
            let owner = owner_key(owner);
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let Some(row) = lock_lease(&tx, &owner, session_id).await? else {
                return Err(StoreError::NotFound {
                    session_id: session_id.to_owned(),
                }
                .into());
            };
            row.check_free(session_id, now_ms)?;
            // The journal goes with the row (ON DELETE CASCADE).
            tx.execute(
                "DELETE FROM airlock_sessions WHERE owner = $1 AND session_id = $2",
                &[&owner, &session_id],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        }))
    }
}
