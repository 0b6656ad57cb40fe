//! Durable sessions: the journal in a real SQLite file and in a real
//! Postgres database (one suite, both stores), through the library and the
//! `airlock` binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use airlock::agent::{Agent, RunError};
use airlock::context::{ContextRules, KeyPatterns};
use airlock::journal::{CallStatus, Folded, INTERRUPTED_MESSAGE, Item};
use airlock::llm::{Message, ScriptModel};
use airlock::sandbox::CancelToken;
use airlock::session::export::{ImportError, SessionExport};
use airlock::session::{Session, SessionOptions, SessionStore, StoreError};
use serde_json::{Value, json};

use crate::support::stores::{Backend, TestStore};
use crate::support::{airlock_with_env, guest, host, hostile_host, root, tool_messages};

mod calls;
mod deferred;
mod export;
mod fork;
mod leases;
mod replay;
mod retention;
mod secrets;
mod store;

fn options(user: Option<&str>, id: &str) -> SessionOptions {
    SessionOptions {
        user_id: user.map(str::to_owned),
        session_id: Some(id.to_owned()),
        ..SessionOptions::default()
    }
}

/// A session of `store` opened with `options` and the default context
/// rules.
async fn open(store: &Arc<dyn SessionStore>, options: SessionOptions) -> Session {
    Session::open(Arc::clone(store), options, &ContextRules::default())
        .await
        .unwrap()
}

/// Opens `options`' session and closes it, stored: a new session is
/// stored by its first commit (here, its deps).
async fn stored(store: &Arc<dyn SessionStore>, options: SessionOptions) {
    let deps = options.deps.clone().unwrap_or_default();
    let mut session = open(store, options).await;
    session
        .set_deps(deps, &ContextRules::default())
        .await
        .unwrap();
    session.close().await.unwrap();
}

/// A script model from `turns` (written to a file in `dir`).
fn script(dir: &Path, name: &str, turns: Value) -> Arc<ScriptModel> {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    Arc::new(ScriptModel::load(path).unwrap())
}

fn vowels() -> Arc<ScriptModel> {
    Arc::new(ScriptModel::load(root().join("guest-examples/scripts/vowels.json")).unwrap())
}

fn export_of(text: &str) -> Result<SessionExport, ImportError> {
    SessionExport::parse(text, &ContextRules::default())
}

/// Inserts the session `export` holds into `store`.
async fn import_into(
    store: &Arc<dyn SessionStore>,
    export: &SessionExport,
) -> Result<(), StoreError> {
    store
        .insert(
            &export.header(),
            Box::new(export.journal.clone()),
            export.updated_at_ms,
        )
        .await
}

/// The ids of the anonymous bucket's sessions in `store`, sorted.
async fn session_ids(store: &Arc<dyn SessionStore>) -> Vec<String> {
    let mut ids: Vec<String> = store
        .list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Records for an insert that give `pages` and then fail.
struct FailingAfter(Vec<Vec<airlock::journal::Record>>);

impl airlock::session::RecordPages for FailingAfter {
    fn next_page(&mut self) -> Result<Option<Vec<airlock::journal::Record>>, StoreError> {
        if self.0.is_empty() {
            return Err(StoreError::Backend {
                location: "the test's records".into(),
                message: "the disk went away".into(),
            });
        }
        Ok(Some(self.0.remove(0)))
    }
}

/// A call's records, as JSON text, with what differs between any two runs
/// (item ids and numbers, run ids, times, durations) blanked: the rest
/// must match byte for byte.
fn call_records(records: &[airlock::journal::Record]) -> Vec<String> {
    records
        .iter()
        .filter_map(|record| match record.entry.event() {
            Some(event)
                if matches!(
                    event.item,
                    Item::FunctionCall { .. }
                        | Item::FunctionCallOutput { .. }
                        | Item::ContextUpdate { .. }
                ) =>
            {
                let mut value = serde_json::to_value(event).unwrap();
                for volatile in ["id", "run_id", "at_ms", "duration_us", "iteration"] {
                    if let Some(field) = value.get_mut(volatile) {
                        *field = Value::Null;
                    }
                }
                Some(value.to_string())
            }
            _ => None,
        })
        .collect()
}

/// Secrets given in deps: never in a store's files or the CLI's output.
const DEPS_MARKERS: [&str; 3] = ["MARK-api-key", "MARK-hidden", "MARK-nested-password"];

/// Secrets a tool's ops put in deps. The model wrote them in the call's
/// arguments (that is how the probe tool gets them), so the conversation
/// holds them; no deps snapshot, op or deps output may.
const OP_MARKERS: [&str; 2] = ["MARK-op-token", "MARK-op-nested"];

/// Asserts that no deps in `records` (snapshots and ops) holds a marker.
fn assert_no_op_marker_in_deps(records: &[airlock::journal::Record]) {
    for record in records {
        let text = match &record.entry {
            airlock::journal::Entry::Deps { deps } => Value::Object(deps.clone()).to_string(),
            entry
                if entry
                    .event()
                    .is_some_and(|e| matches!(e.item, Item::ContextUpdate { .. })) =>
            {
                serde_json::to_string(&entry).unwrap()
            }
            _ => continue,
        };
        for marker in OP_MARKERS.iter().chain(&DEPS_MARKERS) {
            assert!(
                !text.contains(marker),
                "{marker} reached record {}",
                record.seq
            );
        }
    }
}

fn assert_no_marker(bytes: &[u8], what: &str) {
    let text = String::from_utf8_lossy(bytes);
    for marker in DEPS_MARKERS {
        assert!(!text.contains(marker), "{marker} reached {what}");
    }
}

fn assert_no_op_marker(bytes: &[u8], what: &str) {
    let text = String::from_utf8_lossy(bytes);
    for marker in OP_MARKERS {
        assert!(!text.contains(marker), "{marker} reached {what}");
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `airlock sessions ARGS --store STORE`.
fn sessions(store: &str, args: &[&str]) -> Output {
    let mut all: Vec<&str> = vec!["sessions"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", store]);
    airlock_with_env(&all, &[])
}

/// Empties the SQLite store's write-ahead log, so that its growth from
/// here is the next command's.
fn truncate_wal(file: &str) {
    let conn = rusqlite::Connection::open(file).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

/// Runs `airlock ARGS`, its output dropped, and SIGKILLs it once
/// `reached(its pid)` says so (unless it ended first); then reaps it.
fn run_killed(args: &[&str], reached: &dyn Fn(u32) -> bool) {
    let mut child = crate::support::airlock_command(args, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    while child.try_wait().unwrap().is_none() && !reached(pid) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let _ = child.kill();
    child.wait().unwrap();
}

/// `airlock run` on the vowels script and the example tools, on session
/// `id` in `store` (a file or a URL).
fn run_vowels(store: &str, id: &str, extra: &[&str]) -> Output {
    let script = root().join("guest-examples/scripts/vowels.json");
    let config = root().join("guest-examples/airlock.toml");
    let mut args = vec![
        "run",
        "Count the vowels of 'elephant'.",
        "--script",
        path(&script),
        "--config",
        path(&config),
        "--store",
        store,
        "--session",
        id,
        "--json",
    ];
    args.extend_from_slice(extra);
    airlock_with_env(&args, &[])
}

/// Keyed increments of `x` (ids `k<n>` for each `n` of `keys`) on the
/// anonymous session `id`, snapshotted every `every` records, then closed.
async fn keyed_increments(
    store: &Arc<dyn SessionStore>,
    id: &str,
    keys: std::ops::Range<usize>,
    every: u64,
) {
    keyed_increments_of(store, None, id, keys, every).await;
}

/// One keyed increment of counter `name` with call id `id`.
async fn keyed_increment(
    session: &mut Session,
    id: &str,
    name: &str,
) -> Result<airlock::CallOutcome, airlock::agent::SessionCallError> {
    let call = airlock::ToolCall {
        id: id.into(),
        ..airlock::ToolCall::new("increment", json!({ "name": name }).to_string())
    };
    session
        .call_once(host().await, &call, &CancelToken::new(), None)
        .await
}

/// [`keyed_increments`] on `user`'s session `id`.
async fn keyed_increments_of(
    store: &Arc<dyn SessionStore>,
    user: Option<&str>,
    id: &str,
    keys: std::ops::Range<usize>,
    every: u64,
) {
    let mut session = Session::open(
        Arc::clone(store),
        SessionOptions {
            snapshot_every: every,
            ..options(user, id)
        },
        &ContextRules::default(),
    )
    .await
    .unwrap();
    for k in keys {
        let call = airlock::ToolCall {
            id: format!("k{k}"),
            ..airlock::ToolCall::new("increment", r#"{"name":"x"}"#)
        };
        session
            .call_once(host().await, &call, &CancelToken::new(), None)
            .await
            .unwrap();
    }
    session.close().await.unwrap();
}

/// Asserts that `items` are numbered `item_1`, `item_2`, ... in order.
fn assert_numbered_in_order(items: &[airlock::journal::Event]) {
    let ids: Vec<&str> = items.iter().map(|e| e.id.as_str()).collect();
    let expected: Vec<String> = (1..=ids.len()).map(|n| format!("item_{n}")).collect();
    assert_eq!(ids, expected);
}

/// What each schema before this one looked like, as the Airlock of its
/// day wrote it, rebuilt from the current tables with the same rows (less
/// the keyed calls' marks, which that Airlock did not write): the SQL that
/// turns a store into one of `version`.
fn downgrade_to(backend: Backend, version: u32) -> &'static str {
    match (backend, version) {
        // Schema 1: sessions and records keyed by owner and id, no call
        // index, no snapshots.
        (Backend::Sqlite, 1) => {
            "CREATE TABLE sessions_v1 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL, metadata TEXT NOT NULL, head INTEGER NOT NULL,
                lease_holder TEXT, lease_token INTEGER NOT NULL, lease_expires_ms INTEGER NOT NULL,
                PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO sessions_v1 SELECT owner, session_id, created_at_ms, updated_at_ms,
                metadata, head, lease_holder, lease_token, lease_expires_ms FROM sessions;
             CREATE TABLE records_v1 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                at_ms INTEGER NOT NULL, entry TEXT NOT NULL,
                PRIMARY KEY (owner, session_id, seq)) WITHOUT ROWID;
             INSERT INTO records_v1 SELECT s.owner, s.session_id, r.seq, r.at_ms, r.entry
                FROM records r JOIN sessions s USING (sid);
             DROP TABLE records; DROP TABLE snapshots; DROP TABLE blobs; DROP TABLE sessions;
             ALTER TABLE sessions_v1 RENAME TO sessions; ALTER TABLE records_v1 RENAME TO records;
             UPDATE records SET entry = replace(entry, ',\"keyed\":true', '');
             PRAGMA user_version = 1;"
        }
        // Schema 2: schema 1 with the call id (indexed), the ephemeral
        // flag and snapshots, all keyed by owner and id.
        (Backend::Sqlite, 2) => {
            "CREATE TABLE sessions_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL, metadata TEXT NOT NULL, head INTEGER NOT NULL,
                lease_holder TEXT, lease_token INTEGER NOT NULL, lease_expires_ms INTEGER NOT NULL,
                ephemeral INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO sessions_v2 SELECT owner, session_id, created_at_ms, updated_at_ms,
                metadata, head, lease_holder, lease_token, lease_expires_ms, ephemeral FROM sessions;
             CREATE TABLE records_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                at_ms INTEGER NOT NULL, entry TEXT NOT NULL, call_id TEXT,
                PRIMARY KEY (owner, session_id, seq)) WITHOUT ROWID;
             INSERT INTO records_v2 SELECT s.owner, s.session_id, r.seq, r.at_ms, r.entry, r.call_id
                FROM records r JOIN sessions s USING (sid);
             CREATE TABLE snapshots_v2 (
                owner TEXT NOT NULL, session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                body TEXT NOT NULL, PRIMARY KEY (owner, session_id)) WITHOUT ROWID;
             INSERT INTO snapshots_v2 SELECT s.owner, s.session_id, n.seq, n.body
                FROM snapshots n JOIN sessions s USING (sid);
             DROP TABLE records; DROP TABLE snapshots; DROP TABLE blobs; DROP TABLE sessions;
             ALTER TABLE sessions_v2 RENAME TO sessions; ALTER TABLE records_v2 RENAME TO records;
             ALTER TABLE snapshots_v2 RENAME TO snapshots;
             UPDATE records SET entry = replace(entry, ',\"keyed\":true', '');
             CREATE INDEX records_by_call ON records (owner, session_id, call_id);
             PRAGMA user_version = 2;"
        }
        // Schema 3 (SQLite) and 2 (Postgres): the tables of today but
        // blobs, the version before format-2 records (which that Airlock
        // would refuse to read; here they are what the test wrote).
        (Backend::Sqlite, 3) => "DROP TABLE blobs; PRAGMA user_version = 3;",
        (Backend::Postgres, 2) => {
            "DROP TABLE airlock_blobs; UPDATE airlock_schema SET version = 2;"
        }
        (Backend::Postgres, 1) => {
            "ALTER TABLE airlock_records DROP COLUMN call_id; DROP TABLE airlock_snapshots;
             DROP TABLE airlock_blobs;
             UPDATE airlock_records SET entry = replace(entry, ',\"keyed\":true', '');
             ALTER TABLE airlock_sessions DROP COLUMN ephemeral;
             UPDATE airlock_schema SET version = 1;"
        }
        _ => unreachable!("no schema {version} on {backend:?}"),
    }
}

/// Another connection to the SQLite file `db`, holding its write lock
/// (`BEGIN IMMEDIATE`) until it commits.
fn write_locked(db: &Path) -> rusqlite::Connection {
    let other = rusqlite::Connection::open(db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
}

/// The real store, counting the commits made through it.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn SessionStore>,
    appends: std::sync::atomic::AtomicUsize,
    /// Those that need not wait for the disk.
    deferred: std::sync::atomic::AtomicUsize,
}

impl Counting {
    fn new(inner: Arc<dyn SessionStore>) -> Self {
        Self {
            inner,
            appends: Default::default(),
            deferred: Default::default(),
        }
    }

    fn appends(&self) -> usize {
        self.appends.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn deferred(&self) -> usize {
        self.deferred.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl SessionStore for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn lease<'a>(
        &'a self,
        request: airlock::session::LeaseRequest<'a>,
    ) -> airlock::session::Reply<'a, airlock::session::Leased> {
        self.inner.lease(request)
    }
    fn append<'a>(
        &'a self,
        append: airlock::session::Append<'a>,
    ) -> airlock::session::Reply<'a, ()> {
        self.appends
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if append.flush == airlock::journal::Flush::Deferred {
            self.deferred
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.append(append)
    }
    fn call_records<'a>(
        &'a self,
        call: airlock::session::CallKey<'a>,
    ) -> airlock::session::Reply<'a, Vec<airlock::journal::Record>> {
        self.inner.call_records(call)
    }
    fn renew<'a>(
        &'a self,
        lease: &'a airlock::session::Lease,
        now_ms: u64,
    ) -> airlock::session::Reply<'a, ()> {
        self.inner.renew(lease, now_ms)
    }
    fn release<'a>(
        &'a self,
        lease: &'a airlock::session::Lease,
    ) -> airlock::session::Reply<'a, ()> {
        self.inner.release(lease)
    }
    fn read<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
    ) -> airlock::session::Reply<'a, airlock::session::StoredSession> {
        self.inner.read(owner, session_id)
    }
    fn read_page<'a>(
        &'a self,
        page: airlock::session::Page<'a>,
    ) -> airlock::session::Reply<'a, airlock::session::StoredSession> {
        self.inner.read_page(page)
    }
    fn list<'a>(
        &'a self,
        owner: Option<&'a str>,
    ) -> airlock::session::Reply<'a, Vec<airlock::session::SessionSummary>> {
        self.inner.list(owner)
    }
    fn owners(&self) -> airlock::session::Reply<'_, Vec<Option<String>>> {
        self.inner.owners()
    }
    fn insert<'a>(
        &'a self,
        header: &'a airlock::session::SessionHeader,
        records: Box<dyn airlock::session::RecordPages>,
        updated_at_ms: u64,
    ) -> airlock::session::Reply<'a, ()> {
        self.inner.insert(header, records, updated_at_ms)
    }
    fn remove<'a>(
        &'a self,
        owner: Option<&'a str>,
        session_id: &'a str,
        now_ms: u64,
    ) -> airlock::session::Reply<'a, ()> {
        self.inner.remove(owner, session_id, now_ms)
    }
    fn prune<'a>(
        &'a self,
        request: airlock::session::PruneRequest<'a>,
    ) -> airlock::session::Reply<'a, Vec<airlock::session::Pruned>> {
        self.inner.prune(request)
    }
    fn fork<'a>(&'a self, fork: airlock::session::Fork<'a>) -> airlock::session::Reply<'a, u64> {
        self.inner.fork(fork)
    }
}

/// Creates session `id` (its first record: `deps`) leased to `holder`; the
/// lease.
async fn create_leased(
    store: &Arc<dyn SessionStore>,
    id: &str,
    holder: &airlock::session::Holder,
    deps: Value,
) -> airlock::session::Lease {
    use airlock::journal::{Entry, Record};
    let now = airlock::journal::now_ms();
    let header = airlock::session::SessionHeader {
        session_id: id.into(),
        user_id: None,
        created_at_ms: now,
        metadata: BTreeMap::new(),
        ephemeral: false,
    };
    let first = [Record {
        seq: 1,
        at_ms: now,
        entry: Entry::Deps {
            deps: deps.as_object().cloned().unwrap_or_default(),
        },
    }];
    store
        .lease(airlock::session::LeaseRequest {
            user_id: None,
            session_id: id,
            holder,
            ttl: std::time::Duration::from_secs(600),
            now_ms: now,
            create: Some((&header, &first)),
        })
        .await
        .unwrap()
        .lease
}

/// Appends `count` user messages of `size` bytes each to session `id`
/// (created), `per_commit` a commit; the store's records.
async fn fill(store: &Arc<dyn SessionStore>, id: &str, count: u64, size: usize, per_commit: u64) {
    use airlock::journal::{Entry, Record};
    let now = airlock::journal::now_ms();
    let holder = airlock::session::Holder::new();
    let lease = create_leased(store, id, &holder, json!({"counters": {"n": 1}})).await;
    let text = "x".repeat(size);
    let mut seq = 1;
    while seq <= count {
        let batch: Vec<Record> = (seq + 1..=(seq + per_commit).min(count + 1))
            .map(|s| Record {
                seq: s,
                at_ms: now,
                entry: Entry::Message {
                    message: Message::User {
                        content: format!("{s}:{text}"),
                    },
                },
            })
            .collect();
        seq += batch.len() as u64;
        store
            .append(airlock::session::Append {
                lease: &lease,
                records: &batch,
                snapshot: None,
                now_ms: now,
                flush: airlock::journal::Flush::Now,
            })
            .await
            .unwrap();
    }
    store.release(&lease).await.unwrap();
}

/// SQLite session `id`: made through the store (its deps, then a short
/// message), then `count - 1` messages of `size` bytes as records 3, 4,
/// ..., `count + 1`, written behind the store's back in one transaction (a
/// debug build is slow to serialize hundreds of megabytes).
async fn filled_behind(db: &TestStore, id: &str, count: u64, size: usize) {
    let store = db.open().await;
    fill(&store, id, 1, 1, 1).await;
    drop(store);
    let entry = serde_json::to_string(&airlock::journal::Entry::Message {
        message: Message::User {
            content: "x".repeat(size),
        },
    })
    .unwrap();
    let mut conn = rusqlite::Connection::open(&db.spec).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO records (sid, seq, at_ms, entry)
                 SELECT sid, ?1, 0, ?2 FROM sessions WHERE owner = '' AND session_id = ?3",
            )
            .unwrap();
        for seq in 3..=count + 1 {
            insert.execute(rusqlite::params![seq, entry, id]).unwrap();
        }
    }
    tx.execute(
        "UPDATE sessions SET head = ?1 WHERE owner = '' AND session_id = ?2",
        rusqlite::params![count + 1, id],
    )
    .unwrap();
    tx.commit().unwrap();
}
