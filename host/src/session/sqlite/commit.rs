//! Group commit for the embedded store: appends from concurrent sessions
//! of one process share one transaction, so one fsync ([`super::batch`]).
//!
//! One committer thread per store takes the appends waiting for it, up to
//! [`MAX_BATCH`], and writes them in one `BEGIN IMMEDIATE` transaction. An
//! append whose fencing check fails (its lease was lost) writes nothing
//! (the check is its first statement) and fails alone; an append that
//! fails half-way rolls the transaction back, fails alone, and the others
//! are written again without it. Every member is answered only after the
//! transaction committed (with `synchronous = FULL`, after the fsync), and
//! a failed commit fails every member with its error. A lone append waits
//! for nothing: the batch is whatever queued while the previous one was on
//! disk.
//!
//! A batch whose every member may reach the disk later
//! ([`Flush::Deferred`](crate::journal::Flush), under
//! [`Durability::ByEffect`]) commits with `synchronous = NORMAL`: the WAL
//! is written but not flushed, so it survives a crash of the process, and
//! the next batch that waits (`FULL`) flushes it with its own frames. The
//! connection is back at `FULL` before anything else writes on it.
//!
//! With many sessions the committer's thread is what bounds calls a
//! second (docs/benchmarks.md §15), so it does only the writing: a second
//! thread answers each durable batch while the next one is written, and a
//! session's row is found by its integer key once the committer has seen
//! it. A lone append with no other waiting is answered by the committer
//! itself, one thread fewer to wake on its way back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::sql::{Failure, failure, insert_records, lock};
use crate::journal::StoreError;
use crate::session::batch::{Inbox, Job, KillPoint, MAX_BATCH, Stage, fill, waits};
use crate::session::rows::{expiry, owner_key_of};
use crate::session::store::Durability;

/// The committer of one store's appends.
#[derive(Debug)]
pub(crate) struct Committer {
    /// Shared by every appender (a `Sender` is `Sync`: no lock).
    pub inbox: Inbox<Sender<Job>>,
    max_batch: Arc<AtomicUsize>,
}

impl Committer {
    /// Starts the committer thread of the store at `location`; it ends
    /// when the committer is dropped.
    pub(super) fn start(
        connection: Arc<Mutex<Connection>>,
        location: String,
        durability: Durability,
    ) -> Self {
        let (jobs, queue) = std::sync::mpsc::channel();
        let name = location.clone();
        let max_batch = Arc::new(AtomicUsize::new(MAX_BATCH));
        let limit = Arc::clone(&max_batch);
        let spawned = std::thread::Builder::new()
            .name("airlock-sqlite-commit".into())
            .spawn(move || {
                let answers = Answerer::start();
                serve(&connection, &name, &queue, &limit, &answers, durability);
            });
        if let Err(e) = spawned {
            // Every append then fails, naming why.
            tracing::error!(error = %e, "cannot start the session store's committer");
        }
        Self {
            inbox: Inbox::new(jobs, location),
            max_batch,
        }
    }

    /// Takes at most `max_batch` appends (at least one) into a
    /// transaction from the next batch on.
    pub(super) fn set_max_batch(&self, max_batch: usize) {
        self.max_batch.store(max_batch.max(1), Ordering::Relaxed);
    }
}

/// A committed batch: each member and its result.
type Answered = Vec<(Job, Result<(), StoreError>)>;

/// Answers committed batches on a thread of its own, so that the
/// committer writes the next batch meanwhile: waking a batch's hundreds of
/// appenders (each a task of the async runtime, woken from outside it)
/// costs about a third as much as writing them. Dropping the batch (its
/// encoded records) happens there too. Without that thread (it could not
/// be started) the committer answers itself.
struct Answerer(Option<Sender<Answered>>);

impl Answerer {
    fn start() -> Self {
        let (answers, batches) = std::sync::mpsc::channel::<Answered>();
        let spawned = std::thread::Builder::new()
            .name("airlock-sqlite-answer".into())
            .spawn(move || batches.into_iter().for_each(answer_all));
        match spawned {
            Ok(_) => Self(Some(answers)),
            Err(e) => {
                tracing::warn!(error = %e, "the session store's committer answers its batches itself");
                Self(None)
            }
        }
    }

    /// Answers `batch`'s members, in order; they already are durable.
    fn answer(&self, batch: Answered) {
        let batch = match &self.0 {
            Some(answers) => match answers.send(batch) {
                Ok(()) => return,
                Err(returned) => returned.0,
            },
            None => batch,
        };
        answer_all(batch);
    }
}

/// Tells each member of a durable batch its result.
fn answer_all(batch: Answered) {
    for (job, result) in batch {
        job.answer(result);
    }
}

/// The committer thread: a batch of what is waiting, committed, answered;
/// until every sender is gone.
fn serve(
    connection: &Mutex<Connection>,
    location: &str,
    queue: &Receiver<Job>,
    max_batch: &AtomicUsize,
    answers: &Answerer,
    durability: Durability,
) {
    let mut kill = KillPoint::from_env();
    let mut sids = Sids::default();
    let mut next = None;
    while let Some(first) = next.take().or_else(|| queue.recv().ok()) {
        let mut batch = vec![first];
        fill(&mut batch, max_batch.load(Ordering::Relaxed), || {
            queue.try_recv().ok()
        });
        let aimed = KillPoint::aims_at(&mut kill, batch.len());
        // Under `never` the connection never waits: nothing to switch.
        let lax = durability != Durability::Never && !waits(&batch);
        let results = {
            let mut conn = lock(connection);
            // Not waiting for the disk is this batch's alone: the pragma
            // is set back before the lock is let go.
            let lax = lax && set_synchronous(&conn, false);
            let results = commit(
                &mut conn,
                &mut sids,
                &batch,
                aimed == Some(Stage::BeforeCommit),
            );
            if lax && !set_synchronous(&conn, true) {
                // Left lax, the store's other writes would not wait:
                // fail this batch's members rather than claim they do.
                tracing::error!("the session store cannot wait for the disk again; stopping");
                return;
            }
            results
        };
        if aimed == Some(Stage::AfterCommit) {
            KillPoint::die();
        }
        let answered: Answered = batch
            .into_iter()
            .zip(results)
            .map(|(job, result)| {
                let result = result.map_err(|f| match f {
                    Failure::Store(e) => e,
                    Failure::Backend(e) => failure(location, e),
                });
                (job, result)
            })
            .collect();
        // A lone append with nothing else waiting to be written is
        // answered here and now: handing it to the answerer would only add
        // a thread to wake before its appender. A bigger batch is still
        // handed over (waking its appenders is what the committer must not
        // wait for).
        next = queue.try_recv().ok();
        if next.is_none() && answered.len() == 1 {
            answer_all(answered);
        } else {
            answers.answer(answered);
        }
    }
}

/// The value of `PRAGMA synchronous` for a commit that waits for the
/// disk (`FULL`) or only for the OS (`NORMAL`).
pub(super) fn synchronous(wait: bool) -> &'static str {
    if wait { "FULL" } else { "NORMAL" }
}

/// Sets whether the connection's commits wait for the disk; whether it
/// could (between transactions it always can, but a failure is said).
fn set_synchronous(conn: &Connection, wait: bool) -> bool {
    match conn.pragma_update(None, "synchronous", synchronous(wait)) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, wait, "cannot set how commits wait for the disk");
            false
        }
    }
}

/// Commits `batch` in one transaction: each job's result.
///
/// A job refused by fencing writes nothing (its first statement is the
/// check) and fails alone. Any other failure of a job may leave it half
/// written: the transaction is rolled back, that job fails alone, and the
/// others are written again without it. A failed commit fails every job it
/// held.
///
/// `die_before_commit`: a kill test's [`KillPoint`], reached once every
/// job is written to the transaction.
fn commit(
    conn: &mut Connection,
    sids: &mut Sids,
    batch: &[Job],
    die_before_commit: bool,
) -> Vec<Result<(), Failure>> {
    let mut results: Vec<Option<Result<(), Failure>>> = batch.iter().map(|_| None).collect();
    'attempt: loop {
        let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => return finish(results, &e),
        };
        let mut written = Vec::with_capacity(batch.len());
        for (i, job) in batch.iter().enumerate() {
            if results[i].is_some() {
                continue;
            }
            match append(&tx, sids, job) {
                Ok(()) => written.push(i),
                Err(refused @ Failure::Store(StoreError::LeaseLost { .. })) => {
                    results[i] = Some(Err(refused));
                }
                Err(failed) => {
                    // Rolled back on drop; the others go again without it.
                    results[i] = Some(Err(failed));
                    continue 'attempt;
                }
            }
        }
        if die_before_commit {
            KillPoint::die();
        }
        if let Err(e) = tx.commit() {
            return finish(results, &e);
        }
        for i in written {
            results[i] = Some(Ok(()));
        }
        return results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect();
    }
}

/// Each job's result: its own, or `e` for those that have none.
fn finish(
    results: Vec<Option<Result<(), Failure>>>,
    e: &rusqlite::Error,
) -> Vec<Result<(), Failure>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(Failure::Backend(clone_error(e)))))
        .collect()
}

fn clone_error(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::InvalidParameterName(other.to_string()),
    }
}

/// The row ids (`sid`) of the sessions this committer has appended to,
/// by owner and session id: a session's row is then found by its integer
/// key, not by a walk of the `(owner, session_id)` index comparing text,
/// which was a tenth of a batch's work. A session removed and made again
/// has a new `sid` (they are never reused), so a stale entry finds no row
/// and the append looks the session up by name again.
#[derive(Default)]
struct Sids {
    /// Owner → session id → `sid`.
    by_owner: HashMap<String, HashMap<String, i64>>,
    len: usize,
}

impl Sids {
    /// The most sessions remembered; past it, the map starts afresh.
    const MOST: usize = 1 << 16;

    fn get(&self, owner: &str, session_id: &str) -> Option<i64> {
        self.by_owner.get(owner)?.get(session_id).copied()
    }

    fn remember(&mut self, owner: String, session_id: &str, sid: i64) {
        if self.len >= Self::MOST {
            *self = Self::default();
        }
        let sessions = self.by_owner.entry(owner).or_default();
        if sessions.insert(session_id.to_owned(), sid).is_none() {
            self.len += 1;
        }
    }
}

/// One append: the session's head moves and its records (and snapshot)
/// go in only while the lease's token is the session's and the head is
/// where this holder left it.
fn append(conn: &Connection, sids: &mut Sids, job: &Job) -> Result<(), Failure> {
    let (Some(first), Some(last)) = (job.rows.first(), job.rows.last()) else {
        return Ok(());
    };
    let lease = &job.lease;
    let owner = owner_key_of(lease.user_id.as_deref());
    let holder = lease.holder.as_str();
    let expires = expiry(job.now_ms, lease.ttl);
    let known = sids.get(owner, &lease.session_id);
    // By `sid` when known, else (or when that row is gone) by name. Both
    // statements take the same nine parameters; each uses its own.
    const BY_SID: &str = "UPDATE sessions SET head = ?7, updated_at_ms = ?8, lease_expires_ms = ?9
        WHERE sid = ?1 AND lease_token = ?4 AND lease_holder = ?5 AND head = ?6 RETURNING sid";
    const BY_NAME: &str = "UPDATE sessions SET head = ?7, updated_at_ms = ?8, lease_expires_ms = ?9
        WHERE owner = ?2 AND session_id = ?3 AND lease_token = ?4 AND lease_holder = ?5
          AND head = ?6 RETURNING sid";
    let mut sid: Option<i64> = None;
    for sql in known.map(|_| BY_SID).into_iter().chain([BY_NAME]) {
        sid = conn
            .prepare_cached(sql)?
            .query_row(
                params![
                    known,
                    owner,
                    lease.session_id,
                    lease.token,
                    holder,
                    first.seq - 1,
                    last.seq,
                    job.now_ms,
                    expires
                ],
                |row| row.get(0),
            )
            .optional()?;
        if sid.is_some() {
            break;
        }
    }
    let Some(sid) = sid else {
        return Err(job.lease_lost().into());
    };
    if known != Some(sid) {
        sids.remember(owner.to_owned(), &lease.session_id, sid);
    }
    insert_records(conn, sid, &job.rows)?;
    if let Some(snapshot) = &job.snapshot {
        conn.prepare_cached(
            "INSERT OR REPLACE INTO snapshots (sid, seq, body) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![sid, snapshot.seq, snapshot.body])?;
    }
    Ok(())
}
