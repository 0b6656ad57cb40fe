//! What the stores' committers share: an append waiting for its batch,
//! how many a batch takes, and the points inside a batch's commit where a
//! durability test stops the process.
//!
//! A committer takes the appends that queued while the previous batch was
//! being committed (at least one, at most its limit) and commits them in
//! one transaction, so concurrent sessions share one fsync; a lone append
//! waits for nothing. Every member is answered only after its batch is
//! durable, a fenced member fails alone, and a failed commit fails every
//! member it held (the `commit` module of each store).

use super::rows::{Blob, Row, encode};
use super::store::Durability;
use super::store::{Append, Lease, StoredSnapshot};
use crate::journal::{Flush, StoreError};

/// The most appends one transaction takes, unless the store is told
/// otherwise ([`SqliteStore::with_max_batch`](super::SqliteStore::with_max_batch)).
pub const MAX_BATCH: usize = 256;

/// Adds to `batch` the appends `waiting` has queued, up to `limit`
/// members in all: what queued while the previous batch was committed.
/// Never waits; a lone append makes a batch of one.
pub(super) fn fill(batch: &mut Vec<Job>, limit: usize, mut waiting: impl FnMut() -> Option<Job>) {
    while batch.len() < limit {
        match waiting() {
            Some(job) => batch.push(job),
            None => break,
        }
    }
}

/// One append, waiting for its batch.
#[derive(Debug)]
pub(super) struct Job {
    pub lease: Lease,
    pub rows: Vec<Row>,
    pub snapshot: Option<StoredSnapshot>,
    pub now_ms: u64,
    /// How soon its records must reach the disk.
    pub flush: Flush,
    pub reply: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
}

/// Whether a batch's commit waits for the disk: when any of its jobs asks
/// for [`Flush::Now`] (the store's [`Durability`] is already in each
/// job's flush: [`Inbox::append`]).
pub(super) fn waits(batch: &[Job]) -> bool {
    batch.iter().any(|job| job.flush == Flush::Now)
}

/// How soon an append asking for `asked` reaches the disk in a store of
/// `durability`: always at once, as asked, or never of its own.
fn flush_under(durability: Durability, asked: Flush) -> Flush {
    match durability {
        Durability::EveryCall => Flush::Now,
        Durability::ByEffect => asked,
        Durability::Never => Flush::Deferred,
    }
}

impl Job {
    /// A job, and where its answer arrives.
    fn new(
        append: &Append<'_>,
        rows: Vec<Row>,
        durability: Durability,
    ) -> (Self, tokio::sync::oneshot::Receiver<Result<(), StoreError>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Self {
            lease: append.lease.clone(),
            rows,
            snapshot: append.snapshot.cloned(),
            now_ms: append.now_ms,
            flush: flush_under(durability, append.flush),
            reply,
        };
        (job, answer)
    }

    /// Answers the appender (who may have gone: its task was cancelled).
    pub(super) fn answer(self, result: Result<(), StoreError>) {
        let _ = self.reply.send(result);
    }

    /// What a job refused by fencing fails with.
    pub(super) fn lease_lost(&self) -> StoreError {
        self.lease.lost()
    }
}

/// The appenders' side of a committer: the channel its jobs queue on,
/// and the store its errors name.
#[derive(Debug)]
pub(super) struct Inbox<Q> {
    jobs: Q,
    location: String,
}

/// A channel a committer takes [`Job`]s from.
pub(super) trait JobQueue {
    /// Queues `job`; false if the committer is gone.
    fn push(&self, job: Job) -> bool;
}

impl JobQueue for std::sync::mpsc::Sender<Job> {
    fn push(&self, job: Job) -> bool {
        self.send(job).is_ok()
    }
}

impl JobQueue for tokio::sync::mpsc::UnboundedSender<Job> {
    fn push(&self, job: Job) -> bool {
        self.send(job).is_ok()
    }
}

impl<Q: JobQueue> Inbox<Q> {
    /// The inbox of the committer that reads `jobs`, for the store at
    /// `location`.
    pub(super) fn new(jobs: Q, location: String) -> Self {
        Self { jobs, location }
    }

    /// Queues `append` for the next batch: `Ok` once it is committed, and
    /// on disk as `durability` and its flush say (at once when it has no
    /// record).
    pub(super) async fn append(
        &self,
        append: Append<'_>,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let mut rows = encode(append.records)?;
        // What the snapshot names is kept with the records (a blob the
        // session holds already is not written again).
        if let (Some(snapshot), Some(last)) = (append.snapshot, rows.last_mut()) {
            last.blobs
                .extend(snapshot.blobs.iter().map(|(digest, data)| Blob {
                    digest: digest.clone(),
                    data: data.clone(),
                }));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let (job, answer) = Job::new(&append, rows, durability);
        if !self.jobs.push(job) {
            return Err(stopped(&self.location));
        }
        answer.await.map_err(|_| stopped(&self.location))?
    }
}

/// What an appender is told when the committer is gone.
fn stopped(location: &str) -> StoreError {
    StoreError::Backend {
        location: location.to_owned(),
        message: "the store's committer stopped".into(),
    }
}

/// The environment variable that sets a [`KillPoint`]: read only by a
/// build with the `test-hooks` feature (the tests'); a build without it
/// (every shipped one) holds neither the name nor the code that reads it.
#[cfg(feature = "test-hooks")]
const KILL_POINT_VAR: &str = "AIRLOCK_TEST_KILL_AT_COMMIT";

/// Where in a batch's commit a durability test stops the process with
/// SIGKILL.
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Every append of the batch written into its transaction, nothing
    /// durable yet.
    BeforeCommit,
    /// The transaction durable (on SQLite with `synchronous = FULL`,
    /// after the fsync; on Postgres, once the server said it committed),
    /// no appender answered yet.
    AfterCommit,
}

/// For kill tests only, in a build with the `test-hooks` feature:
/// `AIRLOCK_TEST_KILL_AT_COMMIT=before:N` (or `after:N`) makes the process
/// SIGKILL itself at the N-th batch that holds two or more appends, before
/// its commit (or after it, before any appender hears). Read once, when
/// the store opens; anything else in the variable is ignored. Without the
/// feature there is never a kill point.
#[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
#[derive(Debug)]
pub(super) struct KillPoint {
    stage: Stage,
    batch: usize,
    seen: usize,
}

impl KillPoint {
    #[cfg(not(feature = "test-hooks"))]
    pub(super) fn from_env() -> Option<Self> {
        None
    }

    #[cfg(feature = "test-hooks")]
    pub(super) fn from_env() -> Option<Self> {
        let value = std::env::var(KILL_POINT_VAR).ok()?;
        let (stage, batch) = value.split_once(':')?;
        let stage = match stage {
            "before" => Stage::BeforeCommit,
            "after" => Stage::AfterCommit,
            _ => return None,
        };
        Some(Self {
            stage,
            batch: batch.parse().ok()?,
            seen: 0,
        })
    }

    /// Counts a batch of `appends`; where to die in it, when it is the one.
    pub(super) fn aims_at(point: &mut Option<Self>, appends: usize) -> Option<Stage> {
        let point = point.as_mut()?;
        if appends < 2 {
            return None;
        }
        point.seen += 1;
        (point.seen == point.batch).then_some(point.stage)
    }

    /// SIGKILLs this process.
    pub(super) fn die() -> ! {
        let me = rustix::process::getpid();
        let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should it not be delivered, stop anyway.
        std::process::abort();
    }
}
