//! Group commit for the shared store: the appends of one host's
//! concurrent sessions share one statement, one transaction and one WAL
//! flush on the server ([`super::batch`]).
//!
//! One committer task per store takes the appends waiting for it, up to
//! [`MAX_BATCH`], and writes them with one statement on one pooled
//! connection, with at most [`IN_FLIGHT`] batches under way at once: the sessions' heads move and their records and snapshots
//! go in, each member only while its session still has the member's lease
//! token and the head it expects (fencing); the statement returns which
//! members moved, and the others fail with [`StoreError::LeaseLost`]
//! having written nothing. A lone append is that statement on its own (one
//! round trip, one transaction); a batch of several runs it inside
//! `BEGIN … COMMIT`, so a durability test can stop the process between the
//! write and the commit. When the statement fails (no member's rows are
//! written then), each member is written again alone and gets its own
//! result; when the commit fails, every member fails with its error.
//! Members are answered only after the server committed.
//!
//! Several hosts' committers take the same row locks in whatever order
//! their batches hold them; only a stale holder's append can touch a
//! session another host holds, and a deadlock between two such batches is
//! broken by the server (one statement fails, and its members are retried
//! alone).

use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::{Semaphore, mpsc};

use super::sql::{big, describe};
use crate::journal::StoreError;
use crate::session::batch::{Inbox, Job, KillPoint, MAX_BATCH, Stage, fill, waits};
use crate::session::rows::{self, expiry, owner_key_of};

/// Every member of a batch at once: its session's head moves where its
/// lease still holds, then the records and snapshots of the members that
/// moved go in. Returns the members (`n`) that moved. With `$21` true the
/// transaction commits without waiting for the server's WAL flush
/// (`synchronous_commit = off` for it alone): a batch that need not wait.
const APPEND: &str = "
WITH job AS (
    SELECT * FROM unnest($1::int[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                         $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[])
      AS j(n, owner, session_id, token, holder, head, last, now_ms, expires)
), moved AS (
    UPDATE airlock_sessions s
    SET head = j.last, updated_at_ms = j.now_ms, lease_expires_ms = j.expires
    FROM job j
    WHERE s.owner = j.owner AND s.session_id = j.session_id AND s.lease_token = j.token
      AND s.lease_holder = j.holder AND s.head = j.head
    RETURNING j.n, s.owner, s.session_id
), snapshot AS (
    INSERT INTO airlock_snapshots (owner, session_id, seq, body)
    SELECT m.owner, m.session_id, n.seq, n.body
    FROM unnest($10::int[], $11::bigint[], $12::text[]) AS n(n, seq, body)
    JOIN moved m ON m.n = n.n
    ON CONFLICT (owner, session_id) DO UPDATE SET seq = EXCLUDED.seq, body = EXCLUDED.body
), record AS (
    INSERT INTO airlock_records (owner, session_id, seq, at_ms, entry, call_id)
    SELECT m.owner, m.session_id, r.seq, r.at_ms, r.entry, r.call_id
    FROM unnest($13::int[], $14::bigint[], $15::bigint[], $16::text[], $17::text[])
      AS r(n, seq, at_ms, entry, call_id)
    JOIN moved m ON m.n = r.n
), blob AS (
    INSERT INTO airlock_blobs (owner, session_id, digest, data)
    SELECT m.owner, m.session_id, b.digest, b.data
    FROM unnest($18::int[], $19::text[], $20::text[]) AS b(n, digest, data)
    JOIN moved m ON m.n = b.n
    ON CONFLICT DO NOTHING
)
SELECT n FROM moved
CROSS JOIN (SELECT CASE WHEN $21::bool
                        THEN set_config('synchronous_commit', 'off', true) END) AS lax";

/// The committer of one store's appends: its inbox.
pub(super) type Committer = Inbox<mpsc::UnboundedSender<Job>>;

/// Starts the committer task of the store whose connections `pool`
/// gives; it ends when the committer is dropped. Needs a Tokio runtime.
pub(super) fn start(pool: Pool, location: String) -> Committer {
    let (jobs, queue) = mpsc::unbounded_channel();
    tokio::spawn(serve(pool, location.clone(), queue));
    Inbox::new(jobs, location)
}

/// How many batches are being committed at once: while the server writes
/// one, the next is formed and sent (docs/benchmarks.md §15: 256 sessions
/// commit about 1.4× as many calls a second as with one at a time, and 3
/// gain nothing more on 2 cores).
const IN_FLIGHT: usize = 2;

/// The committer task: batches of what is waiting, each committed and its
/// members answered on a task of its own, at most [`IN_FLIGHT`] at once;
/// until every sender is gone.
async fn serve(pool: Pool, location: String, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut kill = KillPoint::from_env();
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let location: Arc<str> = location.into();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // While both slots are busy, more appends queue: take them too.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        fill(&mut batch, MAX_BATCH, || queue.try_recv().ok());
        let aimed = KillPoint::aims_at(&mut kill, batch.len());
        let jobs = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
        // A batch that waits keeps the server's own setting, untouched.
        let wait = waits(&jobs);
        let (pool, location) = (pool.clone(), Arc::clone(&location));
        tokio::spawn(async move {
            let results = commit(&pool, &jobs, !wait, aimed == Some(Stage::BeforeCommit)).await;
            if aimed == Some(Stage::AfterCommit) {
                KillPoint::die();
            }
            for (job, result) in jobs.into_iter().zip(results) {
                job.answer(result.map_err(|e| e.into_store_error(&location)));
            }
            drop(slot);
        });
    }
}

/// Why a member was not committed.
enum Refusal {
    /// The store's own verdict (fencing).
    Store(StoreError),
    /// The server's or the pool's, as one line.
    Backend(String),
}

impl Refusal {
    fn into_store_error(self, location: &str) -> StoreError {
        match self {
            Refusal::Store(e) => e,
            Refusal::Backend(message) => StoreError::Backend {
                location: location.to_owned(),
                message,
            },
        }
    }
}

/// Commits `batch`: each member's result.
/// `lax`: the transaction need not wait for the server's WAL flush.
async fn commit(
    pool: &Pool,
    batch: &[Job],
    lax: bool,
    die_before_commit: bool,
) -> Vec<Result<(), Refusal>> {
    let fail_all = |message: String| {
        batch
            .iter()
            .map(|_| Err(Refusal::Backend(message.clone())))
            .collect()
    };
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(deadpool_postgres::PoolError::Backend(e)) => return fail_all(describe(&e)),
        Err(e) => return fail_all(e.to_string()),
    };
    let all: Vec<&Job> = batch.iter().collect();
    if let [job] = all.as_slice() {
        return vec![append_alone(&client, job, lax).await];
    }
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return fail_all(describe(&e)),
    };
    let Ok(moved) = append(&tx, &all, lax).await else {
        // Nothing of the batch is written; each member alone says which
        // one failed and why.
        drop(tx);
        let mut results = Vec::with_capacity(batch.len());
        for job in batch {
            results.push(append_alone(&client, job, lax).await);
        }
        return results;
    };
    if die_before_commit {
        KillPoint::die();
    }
    if let Err(e) = tx.commit().await {
        return fail_all(describe(&e));
    }
    batch
        .iter()
        .enumerate()
        .map(|(i, job)| {
            if moved.contains(&i) {
                Ok(())
            } else {
                Err(Refusal::Store(job.lease_lost()))
            }
        })
        .collect()
}

/// One member in a transaction of its own (one statement).
async fn append_alone(client: &impl GenericClient, job: &Job, lax: bool) -> Result<(), Refusal> {
    match append(client, &[job], lax).await {
        Ok(moved) if moved.is_empty() => Err(Refusal::Store(job.lease_lost())),
        Ok(_) => Ok(()),
        Err(e) => Err(Refusal::Backend(describe(&e))),
    }
}

/// Runs [`APPEND`] for `jobs`: the indexes of those that moved.
async fn append(
    client: &impl GenericClient,
    jobs: &[&Job],
    lax: bool,
) -> Result<Vec<usize>, tokio_postgres::Error> {
    let columns = Columns::of(jobs);
    let statement = client.prepare_cached(APPEND).await?;
    let moved = client
        .query(
            &statement,
            &[
                &columns.n,
                &columns.owner,
                &columns.session_id,
                &columns.token,
                &columns.holder,
                &columns.head,
                &columns.last,
                &columns.now_ms,
                &columns.expires,
                &columns.snapshot_n,
                &columns.snapshot_seq,
                &columns.snapshot_body,
                &columns.record_n,
                &columns.record_seq,
                &columns.record_at_ms,
                &columns.record_entry,
                &columns.record_call_id,
                &columns.blob_n,
                &columns.blob_digest,
                &columns.blob_data,
                &lax,
            ],
        )
        .await?;
    Ok(moved
        .iter()
        .filter_map(|row| usize::try_from(row.get::<_, i32>(0)).ok())
        .collect())
}

/// A batch as the arrays [`APPEND`] unnests: a row per member, per
/// snapshot and per record, each naming its member by `n`.
#[derive(Default)]
struct Columns<'j> {
    n: Vec<i32>,
    owner: Vec<&'j str>,
    session_id: Vec<&'j str>,
    token: Vec<i64>,
    holder: Vec<&'j str>,
    head: Vec<i64>,
    last: Vec<i64>,
    now_ms: Vec<i64>,
    expires: Vec<i64>,
    snapshot_n: Vec<i32>,
    snapshot_seq: Vec<i64>,
    snapshot_body: Vec<&'j str>,
    record_n: Vec<i32>,
    record_seq: Vec<i64>,
    record_at_ms: Vec<i64>,
    record_entry: Vec<&'j str>,
    record_call_id: Vec<Option<&'j str>>,
    blob_n: Vec<i32>,
    blob_digest: Vec<&'j str>,
    blob_data: Vec<&'j str>,
}

impl<'j> Columns<'j> {
    fn of(jobs: &[&'j Job]) -> Self {
        let mut c = Columns::default();
        for (n, job) in jobs.iter().enumerate() {
            let (Some(first), Some(last)) = (job.rows.first(), job.rows.last()) else {
                continue;
            };
            // At most MAX_BATCH members.
            let n = i32::try_from(n).unwrap_or(i32::MAX);
            let lease = &job.lease;
            c.n.push(n);
            c.owner.push(owner_key_of(lease.user_id.as_deref()));
            c.session_id.push(&lease.session_id);
            c.token.push(big(lease.token));
            c.holder.push(lease.holder.as_str());
            c.head.push(big(first.seq.saturating_sub(1)));
            c.last.push(big(last.seq));
            c.now_ms.push(big(job.now_ms));
            c.expires.push(big(expiry(job.now_ms, lease.ttl)));
            if let Some(snapshot) = &job.snapshot {
                c.snapshot_n.push(n);
                c.snapshot_seq.push(big(snapshot.seq));
                c.snapshot_body.push(&snapshot.body);
            }
            for row in &job.rows {
                c.record_n.push(n);
                c.record_seq.push(big(row.seq));
                c.record_at_ms.push(big(row.at_ms));
                c.record_entry.push(&row.entry);
                c.record_call_id.push(row.call_id.as_deref());
            }
            // Each blob once per member.
            for blob in rows::distinct_blobs(&job.rows) {
                c.blob_n.push(n);
                c.blob_digest.push(&blob.digest);
                c.blob_data.push(&blob.data);
            }
        }
        c
    }
}
