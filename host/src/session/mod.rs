//! Sessions (DESIGN §6): a durable journal per conversation.
//!
//! A [`Session`] is a conversation the host owns: its deps, messages, item
//! log and usage, kept in a [`SessionStore`] as an append-only journal
//! ([`crate::journal`]), leased to one run at a time. The agent loop
//! ([`crate::Agent::run_session`]) and the session's own direct calls
//! ([`Session::call`]) record through the journal's one recorder:
//!
//! - the prompt, and each model reply with the calls it asks for (their
//!   intents), as one commit each;
//! - a direct call's intent before the call runs (a direct call of a tool
//!   that cannot have effects outside the sandbox, and is not keyed, skips
//!   this commit: its intent goes with its output);
//! - a call's output item and its ops together, in one commit, after it
//!   ends (the output of a call the model asked for is its tool message).
//!
//! So there is never a committed output without its ops or the reverse; a
//! process killed mid-call leaves an intent without an output, and the
//! next [`Session::open`] answers it with
//! [`INTERRUPTED_MESSAGE`](crate::journal::INTERRUPTED_MESSAGE) (once).
//!
//! Invariants:
//!
//! - One run at a time per session: [`Session::open`] takes a lease that
//!   another opener cannot take until it is released, expires, or its
//!   holder is seen to be dead ([`Holder`]). A holder whose lease was
//!   taken over can never commit again (fencing).
//! - Users are a hard partition: every store call names its owner, and a
//!   session of one owner does not exist for another; the anonymous bucket
//!   (`None`) is an owner of its own.
//! - Hidden and secret-looking keys ([`secrets`]) are never written: not in
//!   a deps snapshot, not in an op, not in an export. Which keys are hidden
//!   is read from the caller's rules (the host's loaded policy) at every
//!   write, so a reloaded policy applies from the next write on. The live
//!   deps of a run keep them; a resumed session does not have them.

mod batch;
pub mod export;
mod fork;
mod holder;
pub mod import;
mod postgres;
mod rows;
mod sqlite;
mod store;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

/// What a store operation fails with (the journal's [`StoreError`]).
pub use crate::journal::StoreError;
pub use batch::MAX_BATCH;
pub use fork::{ForkError, ForkPoint};
pub use holder::Holder;
pub use postgres::{DEFAULT_POOL_SIZE, PostgresStore, is_postgres_url};
pub use sqlite::{BUSY_TIMEOUT, SqliteStore};
pub use store::{
    Append, CallKey, Durability, Fork, Lease, LeaseRequest, Leased, Listing, Owner, Page,
    PruneRequest, Pruned, RecordPages, Reply, SessionHeader, SessionStore, SessionSummary,
    StoredSession, StoredSnapshot, TaskMail,
};

use crate::context::{ContextRules, RunContext};
use crate::journal::{
    Conversation, Entry, Event, Flush, Folded, Record, Snapshot, Transcript, now_ms, patch_entries,
    secrets,
};
use crate::kind::ErrorKind;
use writer::Writer;

/// How long a lease lasts after its last commit or renewal, unless the
/// opener says otherwise. A live holder renews it every third of this.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// How many records a session's journal grows between snapshots unless
/// the opener says otherwise ([`SessionOptions::snapshot_every`]). A
/// resume folds at most this many records after the snapshot (about 3 µs
/// each); each snapshot costs one encode of the deps and messages into the
/// commit that crosses it. Chosen by the sweep in docs/benchmarks.md §14
/// (16 to 256): at 32 a request on a 100,000-record session costs least
/// beside one on a new session, and snapshots cost a session holding
/// 64 KiB of deps about a tenth more per call; a session with much larger
/// deps and few reads may raise it.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 32;

/// Most items of its log a session holds in memory before it lets go of
/// the closed calls among them (a live session then holds what one
/// resumed from a snapshot does: the calls still open and the items
/// since). A session held open for a long time (an MCP server's, an
/// embedder's) so keeps bounded memory, however many calls it makes (a
/// keyed retry is always found in the store, by the records' indexed call
/// id). Letting go costs one pass over the held items each time they
/// reach this many.
pub const MAX_HELD_ITEMS: usize = 64;

/// Longest session id, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 128;

/// Longest user id, in bytes.
pub const MAX_USER_ID_BYTES: usize = 256;

/// The store's file name inside the data directory.
pub const STORE_FILE: &str = "sessions.db";

/// Where sessions live by default: `$AIRLOCK_DATA_DIR/sessions.db`, else
/// the user's data directory (`~/.local/share/airlock/sessions.db` on
/// Linux). `None` when neither is known.
pub fn default_store_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("AIRLOCK_DATA_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join(STORE_FILE));
    }
    Some(dirs::data_dir()?.join("airlock").join(STORE_FILE))
}

/// The SQLite file a store's name (`--store`) names: the name itself, or
/// what follows `sqlite:`, the way [`SessionStore::location`] names a
/// SQLite store (so a location a message showed can be given back), or
/// `sqlite://` (`sqlite:///abs/sessions.db`, sqlx's form).
pub fn sqlite_file(store: &str) -> &Path {
    let file = match store.strip_prefix("sqlite:") {
        Some(rest) => rest.strip_prefix("//").unwrap_or(rest),
        None => store,
    };
    Path::new(file)
}

/// Prunes `owner`'s sessions (every owner's when `None`) that `retention`
/// no longer keeps, counting age against `older_than` (the policy's `ttl`
/// when `None`; nothing is pruned when both are missing). What it removed.
pub async fn prune(
    store: &dyn SessionStore,
    retention: &crate::retention::Retention,
    owner: Option<Owner<'_>>,
    older_than: Option<Duration>,
) -> Result<Vec<Pruned>, StoreError> {
    prune_as(store, retention, owner, older_than, false).await
}

/// What [`prune`] would remove now, decided by the store as a prune
/// decides it; nothing is removed.
pub async fn would_prune(
    store: &dyn SessionStore,
    retention: &crate::retention::Retention,
    owner: Option<Owner<'_>>,
    older_than: Option<Duration>,
) -> Result<Vec<Pruned>, StoreError> {
    prune_as(store, retention, owner, older_than, true).await
}

async fn prune_as(
    store: &dyn SessionStore,
    retention: &crate::retention::Retention,
    owner: Option<Owner<'_>>,
    older_than: Option<Duration>,
    dry_run: bool,
) -> Result<Vec<Pruned>, StoreError> {
    let Some(older_than) = older_than.or(retention.ttl) else {
        return Ok(Vec::new());
    };
    let now = now_ms();
    let (updated_before_ms, ephemeral_updated_before_ms) = retention.cutoffs(older_than, now);
    store
        .prune(PruneRequest {
            owner,
            updated_before_ms,
            ephemeral_updated_before_ms,
            now_ms: now,
            dry_run,
        })
        .await
}

/// A session id or user id that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid {what}: {problem}")]
pub struct InvalidId {
    /// `session id` or `user id`.
    pub what: &'static str,
    /// What is wrong (never the id itself, which may be anything).
    pub problem: String,
}

/// Session `id` (anonymous, empty) of `store`, made and leased: for the
/// crate's unit tests.
#[cfg(test)]
pub(crate) async fn leased_for_test(store: &dyn SessionStore, id: &str) -> Lease {
    let header = SessionHeader {
        session_id: id.into(),
        user_id: None,
        created_at_ms: 1,
        metadata: BTreeMap::new(),
        ephemeral: false,
    };
    let holder = Holder::new();
    let request = LeaseRequest {
        user_id: None,
        session_id: id,
        holder: &holder,
        ttl: Duration::from_secs(30),
        now_ms: 1,
        create: Some((&header, &[])),
    };
    store.lease(request).await.unwrap().lease
}

/// Checks a session id: 1 to [`MAX_SESSION_ID_BYTES`] bytes of ASCII
/// letters, digits and `_ - . : @`.
pub fn check_session_id(id: &str) -> Result<(), InvalidId> {
    let fail = |problem: String| InvalidId {
        what: "session id",
        problem,
    };
    if id.is_empty() || id.len() > MAX_SESSION_ID_BYTES {
        return Err(fail(format!(
            "it must be 1 to {MAX_SESSION_ID_BYTES} bytes long"
        )));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-.:@".contains(&b))
    {
        return Err(fail(
            "only ASCII letters, digits and _ - . : @ are allowed".into(),
        ));
    }
    Ok(())
}

/// Checks a user id: 1 to [`MAX_USER_ID_BYTES`] bytes, no control
/// characters.
pub fn check_user_id(id: &str) -> Result<(), InvalidId> {
    let fail = |problem: &str| InvalidId {
        what: "user id",
        problem: problem.to_owned(),
    };
    if id.is_empty() || id.len() > MAX_USER_ID_BYTES {
        return Err(fail("it must be 1 to 256 bytes long"));
    }
    if id.chars().any(char::is_control) {
        return Err(fail("it must not contain control characters"));
    }
    Ok(())
}

/// What [`Session::open`] failed on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// A session or user id that cannot be used.
    #[error(transparent)]
    InvalidId(#[from] InvalidId),
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SessionError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SessionError::InvalidId(_) => ErrorKind::InvalidId,
            SessionError::Store(e) => e.kind(),
        }
    }
}

/// How to open a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// The owner; `None` is the anonymous bucket.
    pub user_id: Option<String>,
    /// The session to continue or create; `None` creates one with a fresh
    /// id.
    pub session_id: Option<String>,
    /// A new session's starting deps. For an existing session, these keys
    /// are laid over the stored deps (and that change is committed).
    pub deps: Option<Map<String, Value>>,
    /// A new session's metadata (an existing session keeps its own).
    pub metadata: BTreeMap<String, String>,
    /// How long the lease lasts without a commit or renewal.
    pub lease_ttl: Duration,
    /// Write a snapshot with the commit that crosses each multiple of this
    /// many records (0: never). See [`DEFAULT_SNAPSHOT_EVERY`].
    pub snapshot_every: u64,
    /// A new session is made for one run and not named: it is pruned
    /// sooner ([`SessionHeader::ephemeral`]). An existing one keeps its
    /// own.
    pub ephemeral: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            user_id: None,
            session_id: None,
            deps: None,
            metadata: BTreeMap::new(),
            lease_ttl: DEFAULT_LEASE_TTL,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            ephemeral: false,
        }
    }
}

/// A leased, durable conversation: the context, the transcript, and the
/// journal that keeps them.
///
/// Open one with [`Session::open`], run prompts on it with
/// [`crate::Agent::run_session`] or call tools on it with
/// [`Session::call`], and [`Session::close`] it to let the next run in at
/// once (dropping it does the same in the background).
#[derive(Debug)]
pub struct Session {
    /// The live context. Its deps keep hidden and secret-looking keys; the
    /// store does not.
    ctx: RunContext,
    transcript: Transcript,
    writer: Writer,
    created: bool,
    location: String,
}

impl<'s> From<&'s mut Session> for Conversation<'s> {
    /// The session as a conversation to record into: committed to its
    /// journal while its lease holds. Every call and run records through
    /// this, so it is where the session first lets go of its closed calls
    /// once it holds [`MAX_HELD_ITEMS`] items.
    fn from(session: &'s mut Session) -> Self {
        session.hold_bounded();
        Conversation {
            ctx: &mut session.ctx,
            transcript: &mut session.transcript,
            sink: Some(&mut session.writer),
        }
    }
}

/// A session's live context: `deps`, and the id, user and metadata its
/// header names.
fn context_of(deps: Map<String, Value>, header: &SessionHeader) -> RunContext {
    let mut ctx = RunContext::new(deps).with_session_id(&header.session_id);
    if let Some(user) = &header.user_id {
        ctx = ctx.with_user_id(user);
    }
    for (key, value) in &header.metadata {
        ctx = ctx.with_metadata(key, value);
    }
    ctx
}

impl Session {
    /// Leases the session `options.session_id` (created when it does not
    /// exist, or when no id is given) and loads it: deps are the fold of
    /// its ops, and the messages are the real history. Calls the model
    /// asked for that were never answered get
    /// [`INTERRUPTED_MESSAGE`](crate::journal::INTERRUPTED_MESSAGE),
    /// committed before this returns. Deps it writes (a new session's, or
    /// `options.deps` laid over an existing one's) leave out the keys
    /// `rules` hide and secret-looking ones.
    ///
    /// A new session (no id given, or one that names no session) is not
    /// stored until its first commit, which creates it with that commit's
    /// records in one transaction and takes its lease: an opener that
    /// commits nothing (a run that fails before its prompt is journaled,
    /// an MCP connection that never calls a tool) leaves nothing behind.
    /// Of two openers of the same new id, the second to commit writes
    /// nothing and fails: [`StoreError::InUse`] while the first holds the
    /// session, [`StoreError::AlreadyExists`] after (never does it append
    /// to a session it did not load).
    ///
    /// Fails with [`StoreError::InUse`] while another run holds the
    /// session, and changes nothing then.
    ///
    /// Cost: one lease (a transaction) that reads the newest snapshot and
    /// the records after it (at most [`SessionOptions::snapshot_every`]),
    /// and their fold. A snapshot that cannot be read (damaged, or written
    /// by a newer Airlock) is logged and the whole journal is read and
    /// folded instead. A session resumed with `snapshot_every` records or
    /// more after its snapshot, or without one (imported, or written with
    /// snapshots off), gets one with its next commit, so only one resume
    /// folds them all.
    pub async fn open(
        store: Arc<dyn SessionStore>,
        options: SessionOptions,
        rules: &ContextRules,
    ) -> Result<Session, SessionError> {
        if let Some(user) = &options.user_id {
            check_user_id(user)?;
        }
        let (session_id, named) = match &options.session_id {
            Some(id) => {
                check_session_id(id)?;
                (id.clone(), true)
            }
            None => (crate::context::new_id("sess"), false),
        };
        let holder = Holder::new();
        let now = now_ms();
        let header = SessionHeader {
            session_id: session_id.clone(),
            user_id: options.user_id.clone(),
            created_at_ms: now,
            metadata: options.metadata.clone(),
            ephemeral: options.ephemeral,
        };
        let first = Record {
            seq: 1,
            at_ms: now,
            entry: Entry::Deps {
                deps: secrets::scrub_deps(options.deps.as_ref().unwrap_or(&Map::new()), rules),
            },
        };
        // A fresh id names no session; a given one may.
        let leased = if named {
            let request = LeaseRequest {
                user_id: options.user_id.as_deref(),
                session_id: &session_id,
                holder: &holder,
                ttl: options.lease_ttl,
                now_ms: now,
                create: None,
            };
            match store.lease(request).await {
                Ok(leased) => Some(leased),
                Err(StoreError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            }
        } else {
            None
        };
        let location = store.location();
        let Some(leased) = leased else {
            // New: created by its first commit.
            let birth = writer::Birth {
                header,
                first,
                holder,
                ttl: options.lease_ttl,
            };
            let ctx = context_of(options.deps.unwrap_or_default(), &birth.header);
            let writer = Writer::unborn(store, birth, options.snapshot_every);
            return Ok(Session {
                ctx,
                transcript: Transcript::default(),
                writer,
                created: true,
                location,
            });
        };
        let stored = leased.session;
        let corrupt = |e: crate::journal::FoldError| StoreError::Corrupt {
            session_id: session_id.clone(),
            problem: e.to_string(),
        };
        // A snapshot naming a blob the store lacks cannot be used (then
        // the whole journal is read).
        let snapshot = stored.snapshot.map(|s| {
            let seq = s.seq;
            let decoded = Snapshot::decode(seq, &s.body).and_then(|mut snapshot| {
                rows::snapshot_join(&mut snapshot, &s.blobs)
                    .map(|()| snapshot)
                    .map_err(|digest| crate::journal::SnapshotError {
                        seq,
                        problem: format!("it names blob sha256:{digest}, which the store lacks"),
                    })
            });
            (seq, decoded)
        });
        // Where the journal ends (`records`' last, or `after` if none), and
        // how many records were folded after the snapshot (or without one).
        let journal_end = |records: &[Record], after: u64| {
            let head = records.last().map_or(after, |r| r.seq);
            (head, records.len() as u64)
        };
        let (folded, end) = match snapshot {
            None => (
                Folded::fold(&stored.records).map_err(corrupt)?,
                journal_end(&stored.records, 0),
            ),
            Some((seq, Ok(snapshot))) => (
                Folded::resume(snapshot, &stored.records).map_err(corrupt)?,
                journal_end(&stored.records, seq),
            ),
            Some((_, Err(e))) => {
                tracing::warn!(
                    session = %session_id,
                    error = %e,
                    "cannot use the session's snapshot; folding its whole journal instead"
                );
                let all = store.read(options.user_id.as_deref(), &session_id).await?;
                (
                    Folded::fold(&all.records).map_err(corrupt)?,
                    journal_end(&all.records, 0),
                )
            }
        };
        let writer = Writer::new(
            store,
            leased.lease,
            end,
            folded.clone(),
            options.snapshot_every,
        );

        let mut ctx = context_of(folded.deps, &stored.header);
        ctx.usage = folded.usage;
        ctx.iteration = folded.iteration;
        let mut session = Session {
            ctx,
            transcript: folded.transcript,
            writer,
            created: false,
            location,
        };
        if let Some(overlay) = options.deps {
            session.ctx.deps_mut().extend(overlay);
            let deps = secrets::scrub_deps(session.ctx.deps(), rules);
            session.commit(vec![Entry::Deps { deps }]).await?;
        }
        session.patch_unanswered().await?;
        Ok(session)
    }

    /// Answers every call the model asked for that has no answer with
    /// [`INTERRUPTED_MESSAGE`](crate::journal::INTERRUPTED_MESSAGE), and
    /// commits that. Does nothing when every call is answered, so calling
    /// it again adds nothing.
    pub async fn patch_unanswered(&mut self) -> Result<(), StoreError> {
        let entries = patch_entries(&self.transcript, self.ctx.run_id(), now_ms());
        for event in entries.iter().filter_map(Entry::event) {
            self.transcript.push_event(event.clone());
        }
        self.commit(entries).await
    }

    /// Lets go of the closed calls among the held items once there are
    /// [`MAX_HELD_ITEMS`] of them. Called before each call or run records
    /// anything, when every held item was committed (or its commit failed,
    /// and the store is the truth).
    fn hold_bounded(&mut self) {
        if self.transcript.items.len() >= MAX_HELD_ITEMS {
            self.transcript.compact();
        }
    }

    async fn commit(&mut self, entries: Vec<Entry>) -> Result<(), StoreError> {
        self.writer.commit(&self.ctx, entries, Flush::Now).await
    }

    /// Replaces deps between runs (the embedder's own change, like
    /// [`RunContext::deps_mut`]) and commits the new deps, less the keys
    /// `rules` hide and secret-looking ones.
    pub async fn set_deps(
        &mut self,
        deps: Map<String, Value>,
        rules: &ContextRules,
    ) -> Result<(), StoreError> {
        *self.ctx.deps_mut() = deps;
        let deps = secrets::scrub_deps(self.ctx.deps(), rules);
        self.commit(vec![Entry::Deps { deps }]).await
    }

    /// The items this session committed for keyed calls with `call_id`
    /// (one indexed read of the store): what an at-most-once call checks
    /// before it runs.
    pub(crate) async fn keyed_call_items(&self, call_id: &str) -> Result<Vec<Event>, StoreError> {
        let records = self.writer.call_records(call_id).await?;
        Ok(records
            .into_iter()
            .filter_map(|r| r.entry.into_event())
            .collect())
    }

    /// The live context (deps with everything the run has, ids, usage).
    pub fn context(&self) -> &RunContext {
        &self.ctx
    }

    /// The conversation so far, and the item log as far as it is held:
    /// every item until the session has held [`MAX_HELD_ITEMS`] at the
    /// start of a call or run; after that, and for a session resumed from a
    /// snapshot, the calls still open and the items since the closed ones
    /// were let go (`items_folded` counts those). The store holds them all
    /// ([`SessionStore::read`]).
    pub fn transcript(&self) -> &Transcript {
        &self.transcript
    }

    /// The store it is kept in.
    pub fn store(&self) -> Arc<dyn SessionStore> {
        Arc::clone(self.writer.store())
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        self.ctx.session_id()
    }

    /// Whether it is new: it did not exist when opened, and its first
    /// commit creates it.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Where it is stored ([`SessionStore::location`]).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The deps as they may be stored or shown: the keys `rules` hide and
    /// secret-looking ones removed.
    pub fn stored_deps(&self, rules: &ContextRules) -> Map<String, Value> {
        secrets::scrub_deps(self.ctx.deps(), rules)
    }

    /// Releases the lease, so the session can be opened again at once.
    pub async fn close(mut self) -> Result<(), StoreError> {
        self.release().await
    }

    /// [`Session::close`] for a session shared behind a lock: releases the
    /// lease; any later commit fails with [`StoreError::LeaseLost`].
    pub async fn release(&mut self) -> Result<(), StoreError> {
        self.writer.release().await
    }
}
