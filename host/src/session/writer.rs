//! The write side of a leased session: numbers records and commits them
//! while the lease holds, and keeps the lease alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::store::{Lease, SessionStore};
use crate::BoxFuture;
use crate::context::{RunContext, Usage};
use crate::journal::{Entry, Record, Sink, StoreError, now_ms};

/// A leased session's journal, as a [`Sink`]: each commit is one append
/// of the next records, accepted by the store only while the lease is the
/// session's (fencing). A heartbeat renews the lease every third of its
/// ttl until the writer is released or dropped.
#[derive(Debug)]
pub(crate) struct Writer {
    store: Arc<dyn SessionStore>,
    lease: Lease,
    /// The number of the last record committed.
    head: u64,
    /// The usage and iteration last committed.
    committed: (Usage, u32),
    /// Set when the lease is known lost (a commit or a renewal said so) or
    /// given up.
    lost: Arc<AtomicBool>,
    heartbeat: tokio::task::JoinHandle<()>,
    released: bool,
}

impl Writer {
    /// Writes after record `head` of the session `lease` holds, whose
    /// usage and iteration so far are `committed`.
    pub(crate) fn new(
        store: Arc<dyn SessionStore>,
        lease: Lease,
        head: u64,
        committed: (Usage, u32),
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let heartbeat = spawn_heartbeat(Arc::clone(&store), lease.clone(), Arc::clone(&lost));
        Self {
            store,
            lease,
            head,
            committed,
            lost,
            heartbeat,
            released: false,
        }
    }

    /// Commits `entries`, plus the context's usage when it changed since
    /// the last commit, as one transaction. Nothing is committed after the
    /// lease is lost.
    pub(crate) async fn commit(
        &mut self,
        ctx: &RunContext,
        mut entries: Vec<Entry>,
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
            .map(|(entry, seq)| Record {
                seq,
                at_ms: now,
                entry,
            })
            .collect();
        match self.store.append(&self.lease, &records, now).await {
            Ok(()) => {
                self.head += records.len() as u64;
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

    fn lost_error(&self) -> StoreError {
        StoreError::LeaseLost {
            session_id: self.lease.session_id.clone(),
        }
    }

    /// Gives the lease up now; any later commit fails with
    /// [`StoreError::LeaseLost`].
    pub(crate) async fn release(&mut self) -> Result<(), StoreError> {
        self.lost.store(true, Ordering::SeqCst);
        self.heartbeat.abort();
        self.released = true;
        self.store.release(&self.lease).await
    }
}

impl Sink for Writer {
    fn commit<'a>(
        &'a mut self,
        ctx: &'a RunContext,
        entries: Vec<Entry>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Writer::commit(self, ctx, entries))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if self.released {
            return;
        }
        // Not closed: give the lease up in the background if a runtime is
        // there to do it; otherwise it expires.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let store = Arc::clone(&self.store);
            let lease = self.lease.clone();
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
