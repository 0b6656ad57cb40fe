//! The write side of a leased session: numbers records and commits them
//! while the lease holds, snapshots the journal's fold every so many
//! records, and keeps the lease alive. A new session is created by its
//! first commit (with its first record), not by opening it: an opener
//! that commits nothing leaves nothing behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Holder;
use super::store::{
    Append, CallKey, Lease, LeaseRequest, SessionHeader, SessionStore, StoredSnapshot,
};
use crate::context::{RunContext, Usage};
use crate::journal::{Entry, Flush, Folded, Record, Sink, Snapshot, StoreError, now_ms};
use futures::future::BoxFuture;

/// A session not created yet: what its first commit creates it with.
#[derive(Debug)]
pub(crate) struct Birth {
    pub header: SessionHeader,
    /// Record 1 (the starting deps).
    pub first: Record,
    pub holder: Holder,
    pub ttl: Duration,
}

/// Whether the session exists yet, and its lease once it does.
#[derive(Debug)]
enum Holding {
    /// Not created yet: what its first commit creates it with.
    Unborn(Box<Birth>),
    /// Created and leased: the lease, and the task that renews it.
    Leased {
        lease: Lease,
        heartbeat: tokio::task::JoinHandle<()>,
    },
}

impl Holding {
    /// The session's id.
    fn session_id(&self) -> &str {
        match self {
            Holding::Unborn(birth) => &birth.header.session_id,
            Holding::Leased { lease, .. } => &lease.session_id,
        }
    }
}

/// A leased session's journal, as a [`Sink`]: each commit is one append
/// of the next records, accepted by the store only while the lease is the
/// session's (fencing). A heartbeat renews the lease every third of its
/// ttl until the writer is released or dropped.
#[derive(Debug)]
pub(crate) struct Writer {
    store: Arc<dyn SessionStore>,
    holding: Holding,
    /// The number of the last record committed.
    head: u64,
    /// The usage and iteration last committed.
    committed: (Usage, u32),
    /// The fold of what is committed (no hidden key: records have none),
    /// held since the last snapshot; `None` once it could not be kept
    /// (no more snapshots are written then, and resuming folds from the
    /// last one).
    state: Option<Folded>,
    /// A snapshot is written with the commit that crosses each multiple of
    /// this many records (0: never).
    snapshot_every: u64,
    /// How many records after the newest stored snapshot the session held
    /// when it was resumed, until a snapshot is written. At least
    /// `snapshot_every` (an imported session, one whose snapshot could not
    /// be read, one written with snapshots off) and the next commit writes
    /// one, whatever multiple it crosses: only one resume folds them all.
    behind: u64,
    /// Set when the lease is known lost (a commit or a renewal said so) or
    /// given up.
    lost: Arc<AtomicBool>,
    released: bool,
}

impl Writer {
    /// Writes after record `head` of the session `lease` holds, whose
    /// stored fold up to `head` is `state`, folded from `behind` records
    /// after its newest snapshot (or from all of them, without one).
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        lease: Lease,
        (head, behind): (u64, u64),
        state: Folded,
        snapshot_every: u64,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let heartbeat = spawn_heartbeat(Arc::clone(&store), lease.clone(), Arc::clone(&lost));
        let mut writer = Self::with(store, Holding::Leased { lease, heartbeat }, state);
        writer.head = head;
        writer.behind = behind;
        writer.snapshot_every = snapshot_every;
        writer.lost = lost;
        writer
    }

    /// Writes a session that does not exist yet: its first commit creates
    /// it (with `birth.first` and the commit's records, in one transaction)
    /// and takes its lease. When another opener created it meanwhile,
    /// fails with [`StoreError::InUse`] (theirs is leased) or
    /// [`StoreError::AlreadyExists`], writing nothing.
    pub(crate) fn unborn(store: Arc<dyn SessionStore>, birth: Birth, snapshot_every: u64) -> Self {
        let state = Folded::fold(std::slice::from_ref(&birth.first)).unwrap_or_default();
        let head = birth.first.seq;
        let mut writer = Self::with(store, Holding::Unborn(Box::new(birth)), state);
        writer.head = head;
        writer.snapshot_every = snapshot_every;
        writer
    }

    fn with(store: Arc<dyn SessionStore>, holding: Holding, mut state: Folded) -> Self {
        let committed = (state.usage, state.iteration);
        state.transcript.compact();
        Self {
            store,
            holding,
            head: 0,
            committed,
            state: Some(state),
            snapshot_every: 0,
            behind: 0,
            lost: Arc::new(AtomicBool::new(false)),
            released: false,
        }
    }

    /// Commits `entries`, plus the context's usage when it changed since
    /// the last commit, as one transaction, on disk as `flush` says (a
    /// session's first commit, which creates it, is always on disk).
    /// Nothing is committed after the lease is lost.
    pub(crate) async fn commit(
        &mut self,
        ctx: &RunContext,
        mut entries: Vec<Entry>,
        flush: Flush,
    ) -> Result<(), StoreError> {
        let usage = (ctx.usage, ctx.iteration);
        if usage != self.committed {
            entries.push(Entry::Usage {
                usage: usage.0,
                iteration: usage.1,
            });
        }
        if entries.is_empty() {
            return Ok(());
        }
        if self.lost.load(Ordering::SeqCst) {
            return Err(self.lost_error());
        }
        let now = now_ms();
        let records: Vec<Record> = entries
            .into_iter()
            .zip(self.head + 1..)
            .map(|(entry, seq)| Record::committed(seq, now, entry))
            .collect();
        let last = self.head + records.len() as u64;
        if matches!(self.holding, Holding::Unborn(_)) {
            self.create(records, now).await?;
            self.committed = usage;
            return Ok(());
        }
        let snapshot = self.snapshot_at(last, &records);
        let stored = snapshot.as_ref().map(|(stored, _)| stored);
        let Holding::Leased { lease, .. } = &self.holding else {
            return Err(self.lost_error());
        };
        let append = Append {
            lease,
            records: &records,
            snapshot: stored,
            now_ms: now,
            flush,
        };
        match self.store.append(append).await {
            Ok(()) => {
                if snapshot.is_some() {
                    self.behind = 0;
                }
                self.fold_committed(records, snapshot.map(|(_, state)| state));
                self.head = last;
                self.committed = usage;
                Ok(())
            }
            Err(e) => {
                if matches!(e, StoreError::LeaseLost { .. }) {
                    self.lost.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    /// Creates the session with `first` and `records` (one transaction),
    /// taking its lease; from then on the writer appends.
    async fn create(&mut self, records: Vec<Record>, now: u64) -> Result<(), StoreError> {
        let Holding::Unborn(birth) = &self.holding else {
            return Err(self.lost_error());
        };
        let mut all = Vec::with_capacity(records.len() + 1);
        all.push(birth.first.clone());
        all.extend(records);
        let leased = self
            .store
            .lease(LeaseRequest {
                user_id: birth.header.user_id.as_deref(),
                session_id: &birth.header.session_id,
                holder: &birth.holder,
                ttl: birth.ttl,
                now_ms: now,
                create: Some((&birth.header, &all)),
            })
            .await?;
        if !leased.created {
            // Another opener made it after this one looked: it is theirs.
            let _ = self.store.release(&leased.lease).await;
            return Err(StoreError::AlreadyExists {
                session_id: birth.header.session_id.clone(),
            });
        }
        let last = all.last().map_or(self.head, |r| r.seq);
        let records = all.split_off(1);
        let heartbeat = spawn_heartbeat(
            Arc::clone(&self.store),
            leased.lease.clone(),
            Arc::clone(&self.lost),
        );
        self.holding = Holding::Leased {
            lease: leased.lease,
            heartbeat,
        };
        self.fold_committed(records, None);
        self.head = last;
        Ok(())
    }

    /// The snapshot to write with `records` (ending at record `last`), and
    /// the state it leaves, when they cross a multiple of
    /// `snapshot_every`, or the session was resumed that far behind its
    /// snapshot. Costs a copy of the state (deps and messages) once per
    /// `snapshot_every` records.
    fn snapshot_at(&mut self, last: u64, records: &[Record]) -> Option<(StoredSnapshot, Folded)> {
        let every = self.snapshot_every;
        if every == 0 || (self.head / every == last / every && self.behind < every) {
            return None;
        }
        let mut next = self.state.clone()?;
        if let Err(e) = next.fold_from(self.head + 1, records) {
            self.give_up_state(&e.to_string());
            return None;
        }
        let mut snapshot = Snapshot::of(&next, last);
        let (body, blobs) = super::rows::snapshot_apart(&mut snapshot);
        let stored = StoredSnapshot {
            seq: last,
            body,
            blobs,
        };
        Some((stored, Folded::from_snapshot(snapshot)))
    }

    /// Brings the held state up to the records just committed (or to the
    /// snapshot committed with them), its item log compacted to the calls
    /// still open: the records are moved in, not copied.
    fn fold_committed(&mut self, records: Vec<Record>, snapshotted: Option<Folded>) {
        if let Some(state) = snapshotted {
            self.state = Some(state);
            return;
        }
        let first = self.head + 1;
        let Some(state) = &mut self.state else {
            return;
        };
        match state.fold_owned(first, records) {
            Ok(()) => state.transcript.compact(),
            Err(e) => self.give_up_state(&e.to_string()),
        }
    }

    fn give_up_state(&mut self, problem: &str) {
        tracing::warn!(
            session = %self.holding.session_id(),
            problem,
            "the journal's fold cannot be kept; no more snapshots of this session from this run"
        );
        self.state = None;
    }

    /// The store it writes to.
    pub(crate) fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// The committed records about the tool call `call_id`.
    pub(crate) async fn call_records(&self, call_id: &str) -> Result<Vec<Record>, StoreError> {
        let Holding::Leased { lease, .. } = &self.holding else {
            return Ok(Vec::new());
        };
        self.store
            .call_records(CallKey {
                owner: lease.user_id.as_deref(),
                session_id: &lease.session_id,
                call_id,
            })
            .await
    }

    fn lost_error(&self) -> StoreError {
        StoreError::LeaseLost {
            session_id: self.holding.session_id().to_owned(),
        }
    }

    /// Gives the lease up now; any later commit fails with
    /// [`StoreError::LeaseLost`].
    pub(crate) async fn release(&mut self) -> Result<(), StoreError> {
        self.lost.store(true, Ordering::SeqCst);
        self.released = true;
        match &self.holding {
            Holding::Leased { lease, heartbeat } => {
                heartbeat.abort();
                self.store.release(lease).await
            }
            Holding::Unborn(_) => Ok(()),
        }
    }
}

impl Sink for Writer {
    fn commit<'a>(
        &'a mut self,
        ctx: &'a RunContext,
        entries: Vec<Entry>,
        flush: Flush,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Writer::commit(self, ctx, entries, flush))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let Holding::Leased { lease, heartbeat } = &self.holding else {
            return;
        };
        heartbeat.abort();
        if self.released {
            return;
        }
        // Not closed: give the lease up in the background if a runtime is
        // there to do it; otherwise it expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            let lease = lease.clone();
            runtime.spawn(async move {
                if let Err(e) = store.release(&lease).await {
                    tracing::warn!(error = %e, "cannot release a session lease");
                }
            });
        }
    }
}

/// Renews the lease every third of its ttl until aborted or lost.
fn spawn_heartbeat(
    store: Arc<dyn SessionStore>,
    lease: Lease,
    lost: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = (lease.ttl / 3).max(Duration::from_millis(10));
        loop {
            tokio::time::sleep(every).await;
            match store.renew(&lease, now_ms()).await {
                Ok(()) => {}
                Err(StoreError::LeaseLost { .. }) => {
                    lost.store(true, Ordering::SeqCst);
                    tracing::warn!(session = %lease.session_id, "lost the session's lease");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot renew a session lease"),
            }
        }
    })
}
