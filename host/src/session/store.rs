//! The [`SessionStore`] trait: what a backend must do for sessions, and
//! nothing of how.
//!
//! Every id, sequence number and timestamp comes from Airlock; a store only
//! keeps them. A store is partitioned by user: every method takes the
//! owner, and a session of one owner does not exist for another (the
//! anonymous bucket, `None`, is an owner of its own).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Holder;
pub use crate::journal::Durability;
use crate::journal::{Flush, Record, StoreError};
use futures::future::BoxFuture;

/// What every [`SessionStore`] method returns: a boxed future of its
/// result.
pub type Reply<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Who a session belongs to: a user id, or `None` for the anonymous bucket.
pub type Owner<'a> = Option<&'a str>;

/// What a session is, apart from its journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHeader {
    /// The session's id, unique within its owner's sessions.
    pub session_id: String,
    /// The owner (`None`: the anonymous bucket).
    pub user_id: Option<String>,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Opaque string pairs, fixed at creation.
    pub metadata: BTreeMap<String, String>,
    /// Made for one run and not named (`airlock run` without
    /// `--session`): pruned sooner ([`PruneRequest`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

/// A session as read from a store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSession {
    /// Its header.
    pub header: SessionHeader,
    /// When the last record was committed (the creation time if none).
    pub updated_at_ms: u64,
    /// The newest snapshot, when one was read: then `records` holds only
    /// the records after it. [`SessionStore::read`] never reads one.
    pub snapshot: Option<StoredSnapshot>,
    /// The records, in order: every one, or those after `snapshot`.
    pub records: Vec<Record>,
}

/// A snapshot as stored: the fold of records 1..=`seq`
/// ([`crate::journal::Snapshot`], encoded). A store keeps a session's
/// newest only, and never reads into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSnapshot {
    /// The last record it folds.
    pub seq: u64,
    /// Its encoding, what calls showed named by digest (as records name
    /// it).
    pub body: String,
    /// What calls showed that the body names, digest to base64: given
    /// with an append (a store keeps those it lacks, once per session, as
    /// it keeps records'), and filled in by a read with those the store
    /// has.
    pub blobs: std::collections::BTreeMap<String, String>,
}

/// A session's records for [`SessionStore::insert`], a page at a time.
/// Taking a page may block (a file is read): stores take them off the
/// async runtime's threads.
pub trait RecordPages: Send {
    /// The next records, in order, never an empty page; `None` after the
    /// last.
    fn next_page(&mut self) -> Result<Option<Vec<Record>>, StoreError>;
}

/// Records in memory: all of them, as one page.
impl RecordPages for Vec<Record> {
    fn next_page(&mut self) -> Result<Option<Vec<Record>>, StoreError> {
        Ok((!self.is_empty()).then(|| std::mem::take(self)))
    }
}

/// One line of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionSummary {
    /// The session's id.
    pub session_id: String,
    /// When it was created (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When its last record was committed.
    pub updated_at_ms: u64,
    /// How many records its journal holds.
    pub records: u64,
    /// Until when a run holds it, if one does (it may have died: a lease
    /// whose holder is gone is taken over before then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leased_until_ms: Option<u64>,
    /// Whether it was made for one run ([`SessionHeader::ephemeral`]).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

/// What [`SessionStore::list_recent`] gives: an owner's most recently
/// updated sessions, first first, and how many it has in all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// The sessions shown.
    pub sessions: Vec<SessionSummary>,
    /// How many sessions the owner has (at least `sessions.len()`).
    pub total: u64,
}

/// Which sessions [`SessionStore::prune`] removes: those of `owner` (every
/// owner when `None`) last updated before `updated_before_ms`, or, for an
/// ephemeral one, before `ephemeral_updated_before_ms`; never one whose
/// lease has not expired at `now_ms` (even if its holder looks dead: a
/// prune does not race a resume).
#[derive(Debug, Clone, Copy)]
pub struct PruneRequest<'a> {
    /// Whose sessions (`None`: everyone's, as a store-wide ttl).
    pub owner: Option<Owner<'a>>,
    /// Remove sessions last updated before this (ms since the epoch).
    pub updated_before_ms: u64,
    /// Remove ephemeral sessions last updated before this.
    pub ephemeral_updated_before_ms: u64,
    /// The time now, for leases.
    pub now_ms: u64,
    /// Only say which sessions it would remove; remove none.
    pub dry_run: bool,
}

/// A session a prune removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// Its owner.
    pub user_id: Option<String>,
    /// Its id.
    pub session_id: String,
}

/// The right to append to one session, held by one run at a time.
///
/// A lease is taken with a fencing token one higher than the session's
/// last; a store accepts an append only while the session's token is still
/// the lease's, so a holder that lost its lease (it expired and another run
/// took the session) can never commit again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The owner.
    pub user_id: Option<String>,
    /// The session.
    pub session_id: String,
    /// Who holds it.
    pub holder: Holder,
    /// The fencing token.
    pub token: u64,
    /// How long the lease lasts after each commit or renewal.
    pub ttl: Duration,
}

impl Lease {
    /// What a holder fenced off (its token no longer the session's) is
    /// told.
    pub fn lost(&self) -> StoreError {
        StoreError::LeaseLost {
            session_id: self.session_id.clone(),
        }
    }
}

/// One append ([`SessionStore::append`]): `records` (numbered on from the
/// session's last) under `lease`, with the session's new snapshot when
/// given (it folds up to the last of `records`), at `now_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Append<'a> {
    /// The lease the records are written under.
    pub lease: &'a Lease,
    /// The records.
    pub records: &'a [Record],
    /// The snapshot that replaces the session's, if any.
    pub snapshot: Option<&'a StoredSnapshot>,
    /// Now, in milliseconds since the Unix epoch.
    pub now_ms: u64,
    /// How soon the records must reach the disk (the store's
    /// [`Durability`] may wait anyway).
    pub flush: Flush,
}

/// Which records of which session a read returns
/// ([`SessionStore::read_page`]).
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    /// The owner.
    pub owner: Owner<'a>,
    /// The session.
    pub session_id: &'a str,
    /// The records after this one (0: from the first).
    pub after: u64,
    /// At most this many.
    pub limit: u64,
}

/// A session made from the start of another's journal
/// ([`SessionStore::fork`]).
#[derive(Debug, Clone, Copy)]
pub struct Fork<'a> {
    /// The owner of both.
    pub owner: Owner<'a>,
    /// The session forked.
    pub from: &'a str,
    /// Its last record the fork holds.
    pub at: u64,
    /// The new session.
    pub to: &'a str,
    /// The time now (the fork's creation).
    pub now_ms: u64,
}

/// A keyed call of a session ([`SessionStore::call_records`]).
#[derive(Debug, Clone, Copy)]
pub struct CallKey<'a> {
    /// The owner.
    pub owner: Owner<'a>,
    /// The session.
    pub session_id: &'a str,
    /// The call's key (its id).
    pub call_id: &'a str,
}

/// What hosts sharing a store tell each other about a task (an MCP call
/// that outlives its request) whose call runs on one of them: the host
/// that runs it posts the questions it waits on and its latest progress
/// report; any host leaves it answers, or asks it to stop. The store keeps the fields as they are
/// given and reads nothing into them; they are about one call, and go
/// with its session, or with the lease they were posted under when
/// another holder takes the session from a holder that never released it
/// ([`SessionStore::lease`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskMail {
    /// The questions the call waits on, as its host wrote them; `None`
    /// while it waits on none.
    pub waiting: Option<String>,
    /// Answers left for its host, not yet taken.
    pub answers: Option<String>,
    /// Whether a host asked the task to stop.
    pub cancelled: bool,
    /// The call's latest progress report, as its host last posted it (at
    /// most once a poll): the task's status message on other hosts.
    pub status: Option<String>,
}

/// A request to lease a session, creating it if it does not exist.
#[derive(Debug, Clone)]
pub struct LeaseRequest<'a> {
    /// The owner.
    pub user_id: Option<&'a str>,
    /// The session.
    pub session_id: &'a str,
    /// Who asks.
    pub holder: &'a Holder,
    /// The lease's length.
    pub ttl: Duration,
    /// The time now (ms since the Unix epoch), Airlock's clock.
    pub now_ms: u64,
    /// The header and first records of the session if it does not exist
    /// yet; `None` to lease only an existing session.
    pub create: Option<(&'a SessionHeader, &'a [Record])>,
}

/// A leased session.
#[derive(Debug, Clone)]
pub struct Leased {
    /// The lease to append with.
    pub lease: Lease,
    /// Whether this request created the session.
    pub created: bool,
    /// The session as it was when the lease was taken.
    pub session: StoredSession,
}

/// Where sessions are kept. Implementations: [`super::SqliteStore`]
/// (embedded, the default) and [`super::PostgresStore`] (shared by many
/// hosts).
///
/// Every method is atomic: it does all it says or nothing. Methods that
/// take an owner never see sessions of another owner.
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    /// Where the store is, for messages (`sqlite:/path/sessions.db`).
    fn location(&self) -> String;

    /// Leases a session (creating it with `request.create` if it does not
    /// exist and that is given) and reads it: its newest snapshot and the
    /// records after it (every record when it has none). Fails with
    /// [`StoreError::InUse`] while another holder's lease is current: it
    /// has not expired and [`super::Holder::is_gone`] does not say its
    /// holder is gone. A lease taken from a holder that never released it
    /// removes the session's [`TaskMail`] (its tasks ran under that lease,
    /// and no longer run).
    fn lease<'a>(&'a self, request: LeaseRequest<'a>) -> Reply<'a, Leased>;

    /// Appends [`Append::records`] and, in the same transaction, replaces
    /// the session's snapshot with [`Append::snapshot`] when given;
    /// extends the lease to `now_ms` + its ttl. Fails with
    /// [`StoreError::LeaseLost`], writing nothing, when the session's
    /// fencing token is no longer the lease's.
    fn append<'a>(&'a self, append: Append<'a>) -> Reply<'a, ()>;

    /// The records of the keyed call `call.call_id` ([`Record`]s whose
    /// [`Entry::call_key`](crate::journal::Entry::call_key) it is), in
    /// order; empty if none. Indexed: its cost does not grow with the
    /// session's length. Only keyed calls' records need an index entry, so
    /// that other calls' commits pay for none. Records stored before keyed
    /// calls were told apart are all indexed by their call's id, and
    /// returned as well; every read gives an indexed record back marked
    /// keyed, so that an export says what a key finds.
    fn call_records<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Vec<Record>>;

    /// The mail of task `call` ([`TaskMail`]); `None` when there is none
    /// (no host that runs it keeps mail, or it has ended). One indexed
    /// read. A store that keeps no mail (the default) has none: its tasks
    /// are seen whole only by the host that runs them.
    fn task_mail<'a>(&'a self, call: CallKey<'a>) -> Reply<'a, Option<TaskMail>> {
        let _ = call;
        Box::pin(async { Ok(None) })
    }

    /// Replaces the mail of task `call` with `new` (`None` removes it) if
    /// it is `expected` now (`None`: there is none), in one transaction;
    /// whether it was. Mail is kept only for a session that exists (and
    /// goes with it); for any other, `false` (but for `None` to `None`,
    /// which changes nothing anywhere). Hosts change mail by reading
    /// it and swapping what they read for what they make of it, again
    /// when another host changed it meanwhile.
    fn swap_task_mail<'a>(
        &'a self,
        call: CallKey<'a>,
        expected: Option<&'a TaskMail>,
        new: Option<&'a TaskMail>,
    ) -> Reply<'a, bool> {
        let _ = (call, expected, new);
        Box::pin(async { Ok(false) })
    }

    /// Extends the lease to `now_ms` + its ttl; [`StoreError::LeaseLost`]
    /// if it was lost.
    fn renew<'a>(&'a self, lease: &'a Lease, now_ms: u64) -> Reply<'a, ()>;

    /// Gives the lease up, so the session can be leased at once. Releasing
    /// a lost lease does nothing.
    fn release<'a>(&'a self, lease: &'a Lease) -> Reply<'a, ()>;

    /// Reads a session without leasing it: every record.
    fn read<'a>(&'a self, owner: Owner<'a>, session_id: &'a str) -> Reply<'a, StoredSession> {
        self.read_page(Page {
            owner,
            session_id,
            after: 0,
            limit: u64::MAX,
        })
    }

    /// The session's header and at most `page.limit` of its records after
    /// record `page.after`, in order: a journal too long to read whole,
    /// read a page at a time (an export, a replay). Fewer than
    /// `page.limit` only when the journal held no more when it was read:
    /// a replay reads no further.
    fn read_page<'a>(&'a self, page: Page<'a>) -> Reply<'a, StoredSession>;

    /// The owner's sessions, most recently updated first.
    fn list<'a>(&'a self, owner: Owner<'a>) -> Reply<'a, Vec<SessionSummary>>;

    /// The owner's `most` most recently updated sessions, in that order,
    /// and how many it has in all: a listing of an owner with many
    /// sessions that holds only what it shows.
    ///
    /// The stores Airlock has read at most `most` rows, and count the
    /// owner's sessions (an index scan) only when there may be more; this
    /// default lists them all and keeps the first `most`.
    fn list_recent<'a>(&'a self, owner: Owner<'a>, most: u64) -> Reply<'a, Listing> {
        Box::pin(async move {
            let mut sessions = self.list(owner).await?;
            let total = sessions.len() as u64;
            sessions.truncate(usize::try_from(most).unwrap_or(usize::MAX));
            Ok(Listing { sessions, total })
        })
    }

    /// Every owner that has a session (`None`: the anonymous bucket), in
    /// order: what an operator's command over all users goes through.
    fn owners(&self) -> Reply<'_, Vec<Option<String>>>;

    /// Creates a whole session at once (an import) in one transaction,
    /// its records taken a page at a time from `records` (which must
    /// number them 1, 2, 3, ...): a session of any length is inserted in
    /// the memory of a page. [`StoreError::AlreadyExists`] if the owner
    /// has one with that id; on any error nothing was inserted.
    fn insert<'a>(
        &'a self,
        header: &'a SessionHeader,
        records: Box<dyn RecordPages>,
        updated_at_ms: u64,
    ) -> Reply<'a, ()>;

    /// Removes, in one transaction, the sessions `request` names (their
    /// journals and snapshots too); what it removed.
    fn prune<'a>(&'a self, request: PruneRequest<'a>) -> Reply<'a, Vec<Pruned>>;

    /// Removes a session and its journal. [`StoreError::InUse`] while a
    /// current lease is held on it.
    fn remove<'a>(&'a self, owner: Owner<'a>, session_id: &'a str, now_ms: u64) -> Reply<'a, ()>;

    /// Makes session `fork.to` of the owner, not leased, whose journal is
    /// records 1 to `fork.at` of session `fork.from` (its metadata, the
    /// blobs those records name, and its snapshot when that folds no
    /// further), in one
    /// transaction inside the store: nothing passes through the caller,
    /// and on any error nothing was made. Returns how many records the
    /// fork holds (fewer than `at` when `from` has fewer).
    /// [`StoreError::NotFound`] when `from` does not exist,
    /// [`StoreError::AlreadyExists`] when `to` does. `from` may be in use:
    /// its records up to `at` never change.
    fn fork<'a>(&'a self, fork: Fork<'a>) -> Reply<'a, u64>;
}
