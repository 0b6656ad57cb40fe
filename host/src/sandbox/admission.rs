//! Admission to the instance pool: what each call takes from it, and how
//! much of it one tool may hold.
//!
//! The pooling allocator has fixed numbers of slots: component instances
//! (one per call), linear memories and tables. A component may declare many
//! memories and tables, so without admission a few concurrent calls of one
//! component could take every slot and every other tool would get `busy`.
//!
//! Rules:
//!
//! - a call is admitted only when the pool has room for everything its
//!   component declares (counted from the compiled component, or the
//!   tool's `max_instances` when it cannot be known statically), and holds
//!   that room until the call's store is gone;
//! - one tool may hold at most half of each kind of slot at once; a
//!   component whose single call needs more is refused at load;
//! - a call that finds no room waits its turn (first come, first served)
//!   for at most its timeout; at most [`QUEUE_PER_SLOT`] calls per admitted
//!   call of a tool wait, and past that (or past the wait) the call fails
//!   with `busy`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Calls that may wait per call a tool may have in flight.
pub const QUEUE_PER_SLOT: usize = 4;

/// What one call of a component takes from the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Linear memories.
    pub memories: u32,
    /// Tables.
    pub tables: u32,
}

/// Slots in use and calls waiting, host-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Calls admitted and not yet finished.
    pub calls: u32,
    /// Memories those calls hold.
    pub memories: u32,
    /// Tables those calls hold.
    pub tables: u32,
    /// Calls waiting for room.
    pub waiting: u32,
}

/// The host's pool, as admission sees it.
#[derive(Debug)]
pub(crate) struct Admission {
    calls: Arc<Semaphore>,
    memories: Arc<Semaphore>,
    tables: Arc<Semaphore>,
    total: (u32, u32, u32),
    waiting: AtomicUsize,
}

/// One tool's share of the pool.
#[derive(Debug)]
pub(crate) struct ToolGate {
    footprint: Footprint,
    share: Arc<Semaphore>,
    max_waiting: usize,
    waiting: AtomicUsize,
}

/// Room in the pool, held for one call.
#[derive(Debug)]
pub(crate) struct Admitted {
    _permits: [OwnedSemaphorePermit; 4],
}

/// One place in a count of waiting calls, given back when dropped (also
/// when the waiting call is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn join(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub(crate) fn new(calls: u32, memories: u32, tables: u32) -> Self {
        let semaphore = |n: u32| Arc::new(Semaphore::new(n as usize));
        Self {
            calls: semaphore(calls),
            memories: semaphore(memories),
            tables: semaphore(tables),
            total: (calls, memories, tables),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The gate of a tool whose calls take `footprint`: its share is as
    /// many concurrent calls as fit in half of each kind of slot. The error
    /// says which kind a single call needs too much of.
    pub(crate) fn gate(&self, footprint: Footprint) -> Result<ToolGate, String> {
        let (calls, memories, tables) = self.total;
        let fits = |need: u32, total: u32| (total / 2).checked_div(need).unwrap_or(u32::MAX);
        let share = (calls / 2)
            .min(fits(footprint.memories, memories))
            .min(fits(footprint.tables, tables));
        if share == 0 {
            return Err(format!(
                "one call needs {} memories and {} tables; one tool may hold at most half of the \
                 host's pool ({} memories, {} tables)",
                footprint.memories,
                footprint.tables,
                memories / 2,
                tables / 2
            ));
        }
        let share = share as usize;
        Ok(ToolGate {
            footprint,
            share: Arc::new(Semaphore::new(share)),
            max_waiting: share.saturating_mul(QUEUE_PER_SLOT),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Room for one call through `gate`, waiting at most `wait`. The error
    /// is why there is none (for [`crate::tools::CallError::Busy`]).
    pub(crate) async fn admit(&self, gate: &ToolGate, wait: Duration) -> Result<Admitted, String> {
        if let Some(admitted) = self.try_admit(gate) {
            return Ok(admitted);
        }
        let _in_line = Waiting::join(&gate.waiting);
        if gate.waiting.load(Ordering::SeqCst) > gate.max_waiting {
            return Err(format!(
                "{} calls of this tool are already waiting for room",
                gate.max_waiting
            ));
        }
        // Counted until this returns or the call is dropped (cancelled).
        let _waiting = Waiting::join(&self.waiting);
        let acquired = tokio::time::timeout(wait, self.acquire(gate)).await;
        match acquired {
            Ok(Some(admitted)) => Ok(admitted),
            Ok(None) => Err("the instance pool is closed".into()),
            Err(_) => Err(format!(
                "no room in the instance pool within {} ms",
                wait.as_millis()
            )),
        }
    }

    fn try_admit(&self, gate: &ToolGate) -> Option<Admitted> {
        let share = Arc::clone(&gate.share).try_acquire_owned().ok()?;
        let calls = Arc::clone(&self.calls).try_acquire_owned().ok()?;
        let memories = Arc::clone(&self.memories)
            .try_acquire_many_owned(gate.footprint.memories)
            .ok()?;
        let tables = Arc::clone(&self.tables)
            .try_acquire_many_owned(gate.footprint.tables)
            .ok()?;
        Some(Admitted {
            _permits: [share, calls, memories, tables],
        })
    }

    /// In a fixed order (the tool's share first), so waiting calls never
    /// hold one kind of slot while another call holds what they need next
    /// in reverse.
    async fn acquire(&self, gate: &ToolGate) -> Option<Admitted> {
        let share = Arc::clone(&gate.share).acquire_owned().await.ok()?;
        let calls = Arc::clone(&self.calls).acquire_owned().await.ok()?;
        let memories = Arc::clone(&self.memories)
            .acquire_many_owned(gate.footprint.memories)
            .await
            .ok()?;
        let tables = Arc::clone(&self.tables)
            .acquire_many_owned(gate.footprint.tables)
            .await
            .ok()?;
        Some(Admitted {
            _permits: [share, calls, memories, tables],
        })
    }

    /// What is in use and waiting now.
    pub(crate) fn usage(&self) -> PoolUsage {
        let (calls, memories, tables) = self.total;
        let used = |total: u32, semaphore: &Semaphore| {
            total.saturating_sub(u32::try_from(semaphore.available_permits()).unwrap_or(u32::MAX))
        };
        PoolUsage {
            calls: used(calls, &self.calls),
            memories: used(memories, &self.memories),
            tables: used(tables, &self.tables),
            waiting: u32::try_from(self.waiting.load(Ordering::SeqCst)).unwrap_or(u32::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_gets_at_most_half_of_each_pool() {
        let pool = Admission::new(10, 20, 40);
        let share = |memories, tables| {
            pool.gate(Footprint { memories, tables })
                .map(|g| g.share.available_permits())
        };
        assert_eq!(share(1, 1), Ok(5));
        assert_eq!(share(4, 1), Ok(2));
        assert_eq!(share(1, 10), Ok(2));
        assert!(share(11, 1).unwrap_err().contains("at most half"));
    }
}
