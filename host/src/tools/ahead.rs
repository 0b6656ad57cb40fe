//! Fresh instances prepared ahead of demand
//! ([`Limits::prepared_instances`]): a tool's next call finds its instance
//! made, and its instantiation is done off the call's path.
//!
//! Invariants:
//!
//! - An instance here has run its component's instantiation and nothing
//!   else. It is handed to exactly one call, which drops it after, as it
//!   drops an instance it made itself. Nothing is ever put back.
//! - At most `target` instances of a component are ready or being prepared
//!   at once. Preparing starts, on another task, once a call holds its
//!   instance (one taken from here, or its own room in the pool to make
//!   one), so that it overlaps the call, and again once the call's store
//!   is dropped.
//! - Room in the instance pool is taken without waiting, and no instance
//!   is kept while any call waits for room: [`Admission::admit`] reclaims
//!   ready instances before each wait, and an instance that finishes
//!   preparing while a call waits is dropped at once.
//! - Only components with nothing granted are prepared ahead: what a call
//!   can reach (files, variables, hosts, secrets) is read when it starts,
//!   never earlier.
//! - A component whose instantiation fails ahead of demand is not
//!   prepared again; its calls instantiate, and report the failure, as if
//!   nothing were prepared.
//! - A component that has once instantiated in less than
//!   [`WORTH_PREPARING`] is not prepared again: handing an instance to
//!   another thread costs more than making it (a Rust tool instantiates in
//!   about 3 µs; preparing it ahead made its calls 20% slower back to
//!   back). Its calls instantiate as if nothing were prepared.
//! - Instances are prepared only while fewer calls run than the host has
//!   cores: the work then runs on a core that would idle. On a busy host
//!   it would only add the handing over.
//! - A call's store is dropped in the call, unless dropping it has never
//!   taken less than [`WORTH_DROPPING_ASIDE`] (the memory reset: about
//!   40 µs for JavaScript, 100 µs for Python, 3 µs for Rust) and fewer
//!   calls run than the host has cores. It is then dropped on the
//!   sandbox's own thread for that once the call has its result (after
//!   the call, in the order calls ended), and counted as a running call
//!   until it is gone, so at most as many stores wait to be dropped as
//!   the host has cores. (Dropped aside on every call, on a busy host the
//!   stores waiting piled up: 16 Python sessions at once peaked 170 MiB
//!   higher.) Its host resources, the call's view of the context among
//!   them, are dropped in the call either way.
//!
//! [`Admission::admit`]: crate::sandbox::Admission

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime::component::{Instance, InstancePre};

use super::bindings::{Exports, tool};
use crate::sandbox::{CallState, CancelToken, Grants, Limits, Sandbox, Sources, ToolGate};

/// The shortest instantiation worth doing ahead of demand: a Python
/// tool's takes about 90 µs, a JavaScript tool's 7 µs, a Rust or C
/// tool's 3-4 µs. Handing an instance over costs a few microseconds (a
/// Rust tool prepared ahead was 20% slower back to back), so what
/// instantiates in less is made in its call.
pub(crate) const WORTH_PREPARING: Duration = Duration::from_micros(30);

/// The shortest drop of a call's store worth doing on another thread:
/// handing it over costs a few microseconds; a JavaScript tool's store
/// takes about 40 µs to drop, a Python tool's 100 µs, a Rust tool's 3 µs.
pub(crate) const WORTH_DROPPING_ASIDE: Duration = Duration::from_micros(20);

/// The shortest of the durations seen so far; none until one is. One
/// atomic, so noting and reading cost no lock.
struct Fastest(AtomicU64);

impl Default for Fastest {
    fn default() -> Self {
        Self(AtomicU64::new(u64::MAX))
    }
}

impl Fastest {
    fn note(&self, took: Duration) {
        // Kept below `u64::MAX`, which stands for none, however long.
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_min(nanos.min(u64::MAX - 1), Ordering::Relaxed);
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            u64::MAX => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }
}

/// An instance made ahead of its call, in the store it was made in.
pub(crate) struct Fresh {
    pub(crate) store: Store<CallState>,
    pub(crate) instance: Instance,
}

/// One component's prepared instances, what it takes to make more, and
/// what its instantiations have been seen to cost.
pub(crate) struct Ahead {
    /// Instances to keep ready: 0 for a component granted anything.
    target: usize,
    sandbox: Sandbox,
    pre: InstancePre<CallState>,
    /// Where an Airlock tool's exports are (`None` for a plain component).
    indices: Option<Exports>,
    limits: Limits,
    grants: Arc<Grants>,
    sources: Sources,
    gate: Arc<ToolGate>,
    state: Mutex<State>,
    /// Set when instantiating ahead failed: the component is not prepared
    /// again.
    failed: AtomicBool,
    /// Calls that found their instance ready, so far.
    taken: AtomicU64,
    /// The fastest instantiation seen.
    fastest: Fastest,
    /// The fastest drop of a call's store seen.
    fastest_drop: Fastest,
    /// Calls whose store was dropped aside, so far.
    dropped_aside: AtomicU64,
}

#[derive(Default)]
struct State {
    ready: Vec<Fresh>,
    /// Instances being made now (counted toward the target).
    preparing: usize,
}

/// One instance being made, counted in [`State::preparing`] until the
/// guard is dropped (also when its task is dropped unfinished).
struct Preparing(Arc<Ahead>);

impl Drop for Preparing {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.preparing = state.preparing.saturating_sub(1);
    }
}

/// Why no instance was made.
enum Skip {
    /// The pool had no room without waiting: try again on the next call.
    NoRoom,
    /// Instantiation failed: do not try again.
    Failed(String),
}

impl Ahead {
    /// For a component loaded with `limits` and `grants`: it prepares
    /// `limits.prepared_instances`, or none if it is granted anything.
    pub(crate) fn new(
        sandbox: &Sandbox,
        pre: &InstancePre<CallState>,
        indices: Option<Exports>,
        limits: &Limits,
        grants: &Arc<Grants>,
        sources: Sources,
        gate: &Arc<ToolGate>,
    ) -> Arc<Self> {
        let target = if grants.is_none() {
            limits.prepared_instances
        } else {
            0
        };
        Arc::new(Self {
            target,
            sandbox: sandbox.clone(),
            pre: pre.clone(),
            indices,
            limits: limits.clone(),
            grants: Arc::clone(grants),
            sources,
            gate: Arc::clone(gate),
            state: Mutex::default(),
            failed: AtomicBool::new(false),
            taken: AtomicU64::new(0),
            fastest: Fastest::default(),
            fastest_drop: Fastest::default(),
            dropped_aside: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ready instance, if there is one. The caller then fills
    /// ([`Ahead::fill`]) once it holds its own room in the pool, so that
    /// the next instances are made while the call runs without taking the
    /// room the call was about to take.
    pub(crate) fn take(&self) -> Option<Fresh> {
        let fresh = self.lock().ready.pop();
        if fresh.is_some() {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        fresh
    }

    /// Starts preparing instances up to the target on the current Tokio
    /// runtime (none without one; on a current-thread runtime, on its
    /// blocking threads). A call fills again when it ends: an instance
    /// that found no room while the call held it (a tool whose share of
    /// the pool is one call) is made then. Costs a lock and, per instance
    /// started, a task spawn.
    pub(crate) fn fill(self: &Arc<Self>) {
        if !self.preparing_now() {
            return;
        }
        let start = {
            let mut state = self.lock();
            let start = self
                .target
                .saturating_sub(state.ready.len() + state.preparing);
            state.preparing += start;
            start
        };
        if start == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.lock().preparing -= start;
            return;
        };
        // On a runtime of one thread, that thread runs the calls: an
        // instance is made beside them on a blocking thread (making one
        // needs no I/O or timer).
        let one_thread = runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread;
        for _ in 0..start {
            // Counted from here: a task dropped before it first runs (its
            // runtime shut down) still gives its count back.
            let prepare = Arc::clone(self).prepare(Preparing(Arc::clone(self)));
            if one_thread {
                let on = runtime.clone();
                runtime.spawn_blocking(move || on.block_on(prepare));
            } else {
                runtime.spawn(prepare);
            }
        }
    }

    /// The call's instance: `prepared` if it took one, else one made now
    /// in `store` (timed while that decides whether preparing is worth
    /// it; a component known to be fast pays no clock reads).
    pub(crate) async fn instance(
        &self,
        store: &mut Store<CallState>,
        prepared: Option<Instance>,
    ) -> wasmtime::Result<Instance> {
        if let Some(instance) = prepared {
            return Ok(instance);
        }
        if !self.worth_preparing() {
            return self.pre.instantiate_async(store).await;
        }
        let started = Instant::now();
        let instance = self.pre.instantiate_async(store).await?;
        self.instantiated(started.elapsed());
        Ok(instance)
    }

    /// Notes how long instantiating the component took (ahead of demand,
    /// at load, or in a call that found nothing ready).
    pub(crate) fn instantiated(&self, took: Duration) {
        self.fastest.note(took);
    }

    /// Whether instances are prepared now: they are worth preparing
    /// ([`Ahead::worth_preparing`]) and fewer calls run than the host has
    /// cores.
    fn preparing_now(&self) -> bool {
        self.worth_preparing() && self.sandbox.admission().cores_to_spare()
    }

    /// Whether instances are prepared when the host has a core to spare:
    /// the component may have some, no instantiation failed ahead of
    /// demand, and none was faster than [`WORTH_PREPARING`].
    fn worth_preparing(&self) -> bool {
        self.target > 0
            && !self.failed.load(Ordering::Relaxed)
            && self
                .fastest
                .get()
                .is_none_or(|fastest| fastest >= WORTH_PREPARING)
    }

    /// How many instances are kept ready when the host has a core to
    /// spare: the target while preparing is worth it, else 0.
    pub(crate) fn prepared(&self) -> usize {
        if self.worth_preparing() {
            self.target
        } else {
            0
        }
    }

    /// An Airlock tool's typed exports in `instance`, one this pool made
    /// in `store`.
    pub(crate) fn tool(
        &self,
        store: &mut Store<CallState>,
        instance: &Instance,
    ) -> wasmtime::Result<tool::Guest> {
        self.exports()?.tool(store, instance)
    }

    /// Where an Airlock tool's exports are.
    pub(crate) fn exports(&self) -> wasmtime::Result<&Exports> {
        self.indices
            .as_ref()
            .ok_or_else(|| wasmtime::Error::msg("not an Airlock tool"))
    }

    /// Drops a call's store, then prepares the next instances if they are
    /// short: a tool whose share of the pool is one call finds room only
    /// once the store is gone. The drop is done on the sandbox's own
    /// thread when it is worth it and a core is spare (see the module's
    /// invariants); the store's room in the pool is given back when it is
    /// done.
    pub(crate) fn retire(self: &Arc<Self>, store: Store<CallState>) {
        match self.fastest_drop.get() {
            // Known to be fast: dropped here, untimed.
            Some(fastest) if fastest < WORTH_DROPPING_ASIDE => drop(store),
            // Known to be slow, with a core to spare: aside (filling after).
            Some(_) if self.sandbox.admission().cores_to_spare() => {
                return self.drop_aside(store);
            }
            // Not known yet, or no core to spare: here, timed, so that a
            // faster drop seen later stops the handing over.
            _ => self.drop_timed(store),
        }
        self.fill();
    }

    /// Hands `store` to the sandbox's own thread, which drops it (timed),
    /// then fills; counted as a running call until it is gone. Its host
    /// resources are dropped here first. Done here if there is no thread.
    fn drop_aside(self: &Arc<Self>, mut store: Store<CallState>) {
        store.data_mut().release_resources();
        let running = self.sandbox.admission().running_owned();
        let ahead = Arc::clone(self);
        // Filling starts tasks on the call's runtime.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let job = self.sandbox.run_aside(Box::new(move || {
            ahead.drop_timed(store);
            drop(running);
            let _entered = runtime.as_ref().map(tokio::runtime::Handle::enter);
            ahead.fill();
        }));
        match job {
            Ok(()) => {
                self.dropped_aside.fetch_add(1, Ordering::Relaxed);
            }
            Err(job) => job(),
        }
    }

    /// Drops `store`, noting how long that took.
    fn drop_timed(&self, store: Store<CallState>) {
        let started = Instant::now();
        drop(store);
        self.fastest_drop.note(started.elapsed());
    }

    /// Drops every ready instance, giving back its memory and its room in
    /// the pool. The number dropped.
    pub(crate) fn release(&self) -> usize {
        // Taken out first, dropped outside the lock: each drop resets a
        // memory slot.
        let ready = std::mem::take(&mut self.lock().ready);
        let dropped = ready.len();
        drop(ready);
        dropped
    }

    /// Instances ready now.
    pub(crate) fn ready(&self) -> usize {
        self.lock().ready.len()
    }

    /// Calls that found their instance ready, so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// Calls whose store was dropped aside, so far.
    pub(crate) fn dropped_aside(&self) -> u64 {
        self.dropped_aside.load(Ordering::Relaxed)
    }

    /// Makes one instance and keeps it, unless a call is waiting for room
    /// by then (it is then dropped at once, giving its room back).
    async fn prepare(self: Arc<Self>, _counted: Preparing) {
        match self.make().await {
            Ok(fresh) => {
                // Checked under the lock `release` takes (see
                // `Admission::admit`); a spare is dropped outside it, as a
                // drop resets a memory slot.
                let spare = {
                    let mut state = self.lock();
                    if self.sandbox.admission().has_waiting() {
                        Some(fresh)
                    } else {
                        state.ready.push(fresh);
                        None
                    }
                };
                drop(spare);
            }
            Err(Skip::NoRoom) => {}
            Err(Skip::Failed(message)) => {
                self.failed.store(true, Ordering::Relaxed);
                tracing::debug!(%message, "instantiating ahead of demand failed; not trying again");
            }
        }
    }

    async fn make(&self) -> Result<Fresh, Skip> {
        let failed = |e: &dyn std::fmt::Display| Skip::Failed(e.to_string());
        let admitted = self
            .sandbox
            .admission()
            .try_admit(&self.gate)
            .ok_or(Skip::NoRoom)?;
        let state = CallState::new(
            &self.limits,
            &self.grants,
            self.sources,
            admitted,
            CancelToken::new(),
        )
        .map_err(|e| failed(&e))?;
        let mut store = self
            .sandbox
            .store(self.pre.engine(), state)
            .map_err(|e| failed(&e))?;
        // Bounded as a call's instantiation is: the store's deadline stops
        // running wasm at the tool's timeout. Nothing is granted, so there
        // is no host I/O to wait on.
        let instance = self
            .instance(&mut store, None)
            .await
            .map_err(|e| failed(&e))?;
        Ok(Fresh { store, instance })
    }
}
