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
//! - a call that finds no room waits, woken whenever room is given back,
//!   for at most its timeout; at most [`QUEUE_PER_SLOT`] calls per admitted
//!   call of a tool wait, and past that (or past the wait) the call fails
//!   with `busy`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

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
    /// Calls admitted and not yet finished: a call whose store is dropped
    /// after it returned ([`PoolUsage::dropped_aside`]) until it is gone.
    pub calls: u32,
    /// Memories those calls hold.
    pub memories: u32,
    /// Tables those calls hold.
    pub tables: u32,
    /// Calls waiting for room.
    pub waiting: u32,
    /// Instances prepared ahead of demand and ready for a call (each also
    /// counted in `calls`, `memories` and `tables`).
    pub prepared: u32,
    /// Calls so far that found an instance prepared for them (against all
    /// calls, the share of calls that did not wait for instantiation).
    pub prepared_taken: u64,
    /// Calls so far whose store (with its memory reset, the costly part of
    /// ending a call) was dropped on the sandbox's own thread after the
    /// call returned, instead of before.
    pub dropped_aside: u64,
}

/// Slots of one kind: how many there are and how many are taken. Taking
/// and giving back are single atomic operations, so admitting a call costs
/// a few of them and no lock.
#[derive(Debug)]
struct Slots {
    total: u32,
    used: AtomicU32,
}

impl Slots {
    fn new(total: u32) -> Self {
        Self {
            total,
            used: AtomicU32::new(0),
        }
    }

    fn try_take(&self, n: u32) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= self.total)
            })
            .is_ok()
    }

    fn give_back(&self, n: u32) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    fn used(&self) -> u32 {
        self.used.load(Ordering::Acquire)
    }
}

/// The host's pool, as admission sees it.
#[derive(Debug)]
pub(crate) struct Admission {
    calls: Slots,
    memories: Slots,
    tables: Slots,
    /// Calls waiting for room, host-wide.
    waiting: AtomicUsize,
    /// Wakes waiting calls when room is given back.
    freed: Notify,
    /// Calls running now, from their start to their end (whatever room
    /// they hold); see [`Admission::cores_to_spare`].
    running: AtomicUsize,
    /// The cores this process may use, counted as at least 2: with one
    /// call at a time, work ahead of the next call also fits in the gap
    /// before it (an agent's model turn) on one core.
    cores: usize,
}

/// One running call, counted until dropped: borrowed from the admission
/// by a call ([`Admission::running`]), owned by work that outlives it
/// ([`Admission::running_owned`]).
pub(crate) struct Running<A: std::ops::Deref<Target = Admission>>(A);

impl<A: std::ops::Deref<Target = Admission>> Drop for Running<A> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One tool's share of the pool.
#[derive(Debug)]
pub(crate) struct ToolGate {
    footprint: Footprint,
    share: Arc<Slots>,
    max_waiting: usize,
    waiting: AtomicUsize,
}

/// Room in the pool, held for one call; given back when dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    pool: Arc<Admission>,
    share: Arc<Slots>,
    footprint: Footprint,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.pool.give_back(&self.share, self.footprint);
    }
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
        Self {
            calls: Slots::new(calls),
            memories: Slots::new(memories),
            tables: Slots::new(tables),
            waiting: AtomicUsize::new(0),
            freed: Notify::new(),
            running: AtomicUsize::new(0),
            cores: std::thread::available_parallelism().map_or(2, |n| n.get().max(2)),
        }
    }

    /// Counts a call as running until the guard is dropped.
    pub(crate) fn running(&self) -> Running<&Self> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(self)
    }

    /// [`Admission::running`], for work that outlives the borrow (a store
    /// dropped on another thread after its call).
    pub(crate) fn running_owned(self: &Arc<Self>) -> Running<Arc<Self>> {
        self.running.fetch_add(1, Ordering::Relaxed);
        Running(Arc::clone(self))
    }

    /// Whether fewer calls run than the process has cores: work done
    /// ahead of demand then runs on a core that would idle. On a host as
    /// busy as its cores it would only add the cost of handing instances
    /// over.
    pub(crate) fn cores_to_spare(&self) -> bool {
        self.running.load(Ordering::Relaxed) < self.cores
    }

    /// The gate of a tool whose calls take `footprint`: its share is as
    /// many concurrent calls as fit in half of each kind of slot. The error
    /// says which kind a single call needs too much of.
    pub(crate) fn gate(&self, footprint: Footprint) -> Result<ToolGate, String> {
        let (calls, memories, tables) = (self.calls.total, self.memories.total, self.tables.total);
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
        Ok(ToolGate {
            footprint,
            share: Arc::new(Slots::new(share)),
            max_waiting: (share as usize).saturating_mul(QUEUE_PER_SLOT),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Room for one call through `gate`, waiting at most `wait`. The error
    /// is why there is none (for [`crate::tools::CallError::Busy`]).
    ///
    /// Before each try after the first, the call is counted as waiting
    /// ([`Admission::has_waiting`]) and `reclaim` runs: it gives back room
    /// held ahead of demand (prepared instances), so that room never keeps
    /// a call waiting. Counting first closes the race with an instance
    /// that finishes preparing meanwhile: it either sees the waiting call
    /// and gives its room back at once, or is there for `reclaim` to find.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        gate: &ToolGate,
        wait: Duration,
        reclaim: &(dyn Fn() + Sync),
    ) -> Result<Admitted, String> {
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
        let retry = async {
            loop {
                let freed = self.freed.notified();
                tokio::pin!(freed);
                // Registered before trying, so room given back between the
                // try and the wait still wakes this call.
                freed.as_mut().enable();
                reclaim();
                if let Some(admitted) = self.try_admit(gate) {
                    return admitted;
                }
                freed.await;
            }
        };
        tokio::time::timeout(wait, retry).await.map_err(|_| {
            format!(
                "no room in the instance pool within {} ms",
                wait.as_millis()
            )
        })
    }

    /// Whether any call is waiting for room: room held ahead of demand is
    /// then given back rather than kept.
    pub(crate) fn has_waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    /// Room for one call through `gate` if there is some now, without
    /// waiting. Takes the tool's share first, then the host's slots; gives
    /// back what it took if any kind is short.
    pub(crate) fn try_admit(self: &Arc<Self>, gate: &ToolGate) -> Option<Admitted> {
        let Footprint { memories, tables } = gate.footprint;
        let taken = [
            (&*gate.share, 1),
            (&self.calls, 1),
            (&self.memories, memories),
            (&self.tables, tables),
        ];
        for (i, (slots, n)) in taken.iter().enumerate() {
            if !slots.try_take(*n) {
                for (slots, n) in &taken[..i] {
                    slots.give_back(*n);
                }
                return None;
            }
        }
        Some(Admitted {
            pool: Arc::clone(self),
            share: Arc::clone(&gate.share),
            footprint: gate.footprint,
        })
    }

    fn give_back(&self, share: &Slots, footprint: Footprint) {
        self.tables.give_back(footprint.tables);
        self.memories.give_back(footprint.memories);
        self.calls.give_back(1);
        share.give_back(1);
        // Only waiting calls need waking; each then tries again.
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }

    /// What is in use and waiting now.
    pub(crate) fn usage(&self) -> PoolUsage {
        PoolUsage {
            calls: self.calls.used(),
            memories: self.memories.used(),
            tables: self.tables.used(),
            waiting: u32::try_from(self.waiting.load(Ordering::SeqCst)).unwrap_or(u32::MAX),
            prepared: 0,
            prepared_taken: 0,
            dropped_aside: 0,
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
                .map(|g| g.share.total)
        };
        assert_eq!(share(1, 1), Ok(5));
        assert_eq!(share(4, 1), Ok(2));
        assert_eq!(share(1, 10), Ok(2));
        assert!(share(11, 1).unwrap_err().contains("at most half"));
    }
}
