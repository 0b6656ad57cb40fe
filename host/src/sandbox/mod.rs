//! The sandbox: one wasmtime [`Engine`] per host, the compile cache, and the
//! per-call [`Store`] with its limits and (empty unless granted) WASI
//! capabilities.
//!
//! Invariants:
//!
//! - Every call gets a fresh `Store` and instance; nothing survives a call.
//! - A store never outlives its call's deadline: epoch interruption stops
//!   running wasm, and the call's deadline bounds host-side awaits.
//! - Wasm that has run for two epoch ticks yields its executor thread at
//!   every tick after, so spinning guests share the runtime's workers with
//!   every other task.
//! - The guest's stdout and stderr never reach the host's streams.

mod admission;
mod aside;
pub(crate) mod cache;
mod compiler;
pub mod complexity;
mod files;
pub mod grants;
mod limits;
mod output;
pub(crate) mod shown;
mod tape;
mod until;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::{Duration, Instant};
use tokio::sync::Notify;

use wasmtime::component::ResourceTable;
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub use crate::policy::limits::{
    ENTRY_BYTES, Limits, MAX_INSTANCES_CEILING, MAX_PREPARED_INSTANCES, MAX_TIMEOUT,
    TABLE_ELEMENT_BYTES,
};
pub(crate) use admission::{Admission, Admitted, ToolGate};
pub use admission::{Footprint, PoolUsage, QUEUE_PER_SLOT};
use aside::Aside;
pub use cache::{CacheOutcome, CompileCache, FileStamp, UnsafeCache};
pub use compiler::{CHILD_ENV, CompileFailure, CompileLimits, Compiler, compile_child_main};
pub(crate) use files::FileWatch;
use grants::{CallSetup, HttpHooks};
pub use grants::{GrantError, Grants};
pub(crate) use limits::{CallLimiter, ResourceHit};
pub(crate) use output::Refusals;
pub(crate) use output::{CapturedOutput, OutputLimitExceeded};
pub use output::{GuestOutput, MAX_REFUSALS, Stream};
pub(crate) use tape::Reel;
pub(crate) use tape::Sources;
pub(crate) use until::{Stop, until};

/// How often the epoch advances. A call's deadline is checked on each tick,
/// so this is the precision of timeouts and cancellation.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Ticks a call runs through before it starts yielding its worker thread
/// at every tick (so at most 5-10 ms of wasm run without a yield).
const YIELD_AFTER_TICKS: u32 = 2;

/// Settings fixed for the life of a host.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Where compiled components are cached.
    pub cache: CompileCache,
    /// Instances that may exist at once (calls in flight). Memory for them is
    /// reserved up front by the pooling allocator: about 8.1 GiB of address
    /// space a call ([`reserved_per_call`]; virtual, none of it used until
    /// a call touches it), so when the process may map only so much
    /// (`RLIMIT_AS`, `ulimit -v`) the pool holds as many calls as fit in
    /// what is left beside 2 GiB for the rest of the process
    /// ([`Sandbox::new`]). Default 1,000.
    pub max_concurrent_instances: u32,
    /// The ceiling of any tool's linear memory limit. Default 4 GiB.
    pub max_memory_ceiling: usize,
    /// Count instructions so that [`Limits::fuel`] can be enforced. Costs
    /// some speed on every call, so it is off by default.
    pub fuel_metering: bool,
    /// Where components are compiled on a cache miss. Default: in this
    /// process, unbounded; the `airlock` binary uses a bounded child.
    pub compiler: Compiler,
    /// Components of at least this many bytes that the cache lacks are
    /// first compiled by the baseline compiler ([`Tier::Baseline`]: Winch,
    /// several times faster to compile, slower code) and served from that,
    /// while their optimised code is compiled in the background and filed
    /// in the cache for their next load ([`Sandbox::baseline_first`]).
    /// Default `None`: every miss waits for the optimised compile. The
    /// `airlock` binary sets [`BASELINE_FIRST_ABOVE`] for its one-shot
    /// commands, so that a first use of an interpreter's component does
    /// not wait for Cranelift. Costs, when set: a second engine (its own
    /// pool reservation and epoch thread) and linker.
    pub baseline_first: Option<usize>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            cache: CompileCache::from_env(),
            max_concurrent_instances: 1_000,
            max_memory_ceiling: 4 << 30,
            fuel_metering: false,
            compiler: Compiler::InProcess,
            baseline_first: None,
        }
    }
}

/// Which compiler made a component's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Cranelift, optimising: what the cache keeps and calls run on.
    Optimized,
    /// Winch, a single-pass baseline compiler: compiles an interpreter's
    /// component in a fraction of Cranelift's time into code that runs
    /// slower (one pass over each function, nothing optimised). Only for
    /// a first use that would otherwise wait
    /// ([`SandboxConfig::baseline_first`]); never cached.
    Baseline,
}

impl Tier {
    /// The tier's name in the compile child's arguments.
    fn as_str(self) -> &'static str {
        match self {
            Self::Optimized => "optimized",
            Self::Baseline => "baseline",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Self::Optimized, Self::Baseline]
            .into_iter()
            .find(|tier| tier.as_str() == text)
    }
}

/// The size from which the `airlock` binary compiles a first use with the
/// baseline compiler ([`SandboxConfig::baseline_first`]): an interpreter's
/// (Python 18 MB, JavaScript 12 MB) takes Cranelift 4-15 s, a Rust or C
/// tool's (under 2 MB) well under a second, which a baseline compile
/// would not be worth.
pub const BASELINE_FIRST_ABOVE: usize = 4 << 20;

/// The wasmtime engine and what goes with it.
#[derive(Debug, Clone)]
pub struct Sandbox {
    engine: Engine,
    /// The engine of [`Tier::Baseline`] code, when
    /// [`SandboxConfig::baseline_first`] is on: the same settings, Winch
    /// instead of Cranelift. A store runs code of one engine only, so a
    /// call's store is made by its component's engine.
    baseline: Option<Engine>,
    admission: Arc<Admission>,
    /// The settings the engine was built with (a compile child builds the
    /// same engine from them).
    config: Arc<SandboxConfig>,
    /// The thread that drops stores after their calls (`None`: none could
    /// be started, so every store is dropped in its call).
    aside: Option<Arc<Aside>>,
}

/// Linear memories and tables one call may have in the pool.
const MEMORIES_PER_CALL: u32 = 2;
const TABLES_PER_CALL: u32 = 4;
/// The most elements a table may have.
const TABLE_ELEMENTS: usize = 1_000_000;

/// Address space the process keeps beside the instance pools when it may
/// map only so much (`RLIMIT_AS`): its threads' stacks, its heap, the code
/// it maps.
pub const ADDRESS_SPACE_HEADROOM: u64 = 2 << 30;

/// The address space the instance pool reserves for each call it can hold
/// at once, by the settings [`Sandbox::new`] gives it and wasmtime 48's
/// defaults for the rest: two linear memories of 4 GiB (or the ceiling,
/// if larger) with a 32 MiB guard each, so that the code of a memory
/// access needs no bounds check; four tables of 1,000,000 elements; an
/// async stack of 2 MiB and its guard page. Reserved, not used: none of
/// it takes memory until a call touches it. About 8.1 GiB with the
/// default ceiling.
pub fn reserved_per_call(config: &SandboxConfig) -> u64 {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    let memory = (config.max_memory_ceiling as u64).max(4 * GIB) + 32 * MIB;
    let table = (TABLE_ELEMENTS * TABLE_ELEMENT_BYTES) as u64;
    let stack = 2 * MIB + 4096;
    u64::from(MEMORIES_PER_CALL) * memory + u64::from(TABLES_PER_CALL) * table + stack
}

/// The address space this process may map ([`ADDRESS_SPACE_HEADROOM`]
/// and the instance pools within it) was too small for a pool of even one
/// call.
#[derive(Debug, thiserror::Error)]
#[error(
    "this process may map {may_map} (RLIMIT_AS, `ulimit -v`), and an instance pool of one call \
     with the rest of the process needs {needs} (address space reserved, not memory used): raise \
     the limit to at least {needs} or remove it",
    needs = gib(*needs),
    may_map = gib(*may_map)
)]
pub struct AddressSpaceTooSmall {
    /// What the process may map, in bytes.
    pub may_map: u64,
    /// What a pool of one call (for each engine) and the headroom need.
    pub needs: u64,
}

/// `bytes` in GiB, to a tenth.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// How many calls at once the pools of `engines` engines may hold, at
/// most `wanted`, when the process may map `limit` bytes (none: no
/// limit), each call reserving `per_call` in each pool.
fn fitted_calls(
    wanted: u32,
    per_call: u64,
    engines: u64,
    limit: Option<u64>,
) -> Result<u32, AddressSpaceTooSmall> {
    let Some(may_map) = limit else {
        return Ok(wanted);
    };
    let per_call = per_call.saturating_mul(engines).max(1);
    let fit = may_map.saturating_sub(ADDRESS_SPACE_HEADROOM) / per_call;
    match u32::try_from(fit).unwrap_or(u32::MAX) {
        0 => Err(AddressSpaceTooSmall {
            may_map,
            needs: per_call.saturating_add(ADDRESS_SPACE_HEADROOM),
        }),
        fit => Ok(fit.min(wanted)),
    }
}

impl Sandbox {
    /// Creates the engine. Costs: reserves the pooling allocator's address
    /// space for `max_concurrent_instances` ([`reserved_per_call`] each;
    /// virtual, not committed), or for as many as fit when the process may
    /// map only so much (`RLIMIT_AS`; fewer is logged as a warning, none
    /// is [`AddressSpaceTooSmall`]), starts the epoch thread, which lives
    /// as long as the engine, and the thread that drops stores after their
    /// calls return, which lives as long as the sandbox.
    pub fn new(config: SandboxConfig) -> wasmtime::Result<Self> {
        let wanted = config.max_concurrent_instances;
        let engines = if config.baseline_first.is_some() {
            2
        } else {
            1
        };
        let limit = rustix::process::getrlimit(rustix::process::Resource::As).current;
        let calls = fitted_calls(wanted, reserved_per_call(&config), engines, limit)
            .map_err(wasmtime::Error::new)?;
        if let Some(may_map) = limit.filter(|_| calls < wanted) {
            tracing::warn!(
                calls,
                wanted,
                may_map = %gib(may_map),
                "the instance pool holds fewer calls at once: this process may map only so much \
                 (RLIMIT_AS, `ulimit -v`); more wait for room"
            );
        }
        let (memories, tables) = (
            calls.saturating_mul(MEMORIES_PER_CALL),
            calls.saturating_mul(TABLES_PER_CALL),
        );
        let mut pool = PoolingAllocationConfig::new();
        // Memories and tables reserve address space, so their totals are
        // fixed and calls are admitted against them (`admission`). Core
        // instances are only counted by the pool: their total is set so
        // that it never binds before the other two.
        let ceiling = u32::try_from(MAX_INSTANCES_CEILING).unwrap_or(u32::MAX);
        pool.total_component_instances(calls)
            .total_core_instances(calls.saturating_mul(ceiling))
            .max_core_instances_per_component(ceiling)
            .total_memories(memories)
            .total_tables(tables)
            .total_stacks(calls)
            .max_memory_size(config.max_memory_ceiling)
            .table_elements(TABLE_ELEMENTS)
            .max_tables_per_module(4)
            .max_memories_per_module(2)
            // A fresh instance per call means a slot is released per call.
            // Up to 4 MiB of the pages a call dirtied (found with
            // PAGEMAP_SCAN on Linux 6.7+) are reset in place with memcpy or
            // memset instead of madvise, so the slot's next instance takes
            // no page faults on them and concurrent calls do not serialize
            // on the kernel's memory-map lock; the madvise calls that remain
            // are batched. A Python call dirties about 1 MiB, a JS call
            // 0.6 MiB, a Rust call 16 KiB. (This needs the reset patched in
            // vendor/wasmtime: wasmtime 48 decommitted everything past the
            // first 32 dirty runs, so the interpreters re-faulted most of
            // their heap in every instance.) Cost: each warm slot may keep
            // up to 4 MiB resident.
            .linear_memory_keep_resident(4 << 20)
            .table_keep_resident(1 << 16)
            .decommit_batch_size(16)
            .pagemap_scan(wasmtime::Enabled::Auto);

        let engine_for = |tier: Tier| -> wasmtime::Result<Engine> {
            let mut wasm = Config::new();
            wasm.wasm_component_model(true)
                .epoch_interruption(true)
                .consume_fuel(config.fuel_metering)
                // Component-model async is unused; leaving it on slows
                // every `call_async`.
                .concurrency_support(false)
                .allocation_strategy(InstanceAllocationStrategy::Pooling(pool.clone()))
                .strategy(match tier {
                    Tier::Optimized => wasmtime::Strategy::Cranelift,
                    Tier::Baseline => wasmtime::Strategy::Winch,
                });
            let engine = Engine::new(&wasm)?;
            start_epoch_ticker(&engine);
            Ok(engine)
        };
        let engine = engine_for(Tier::Optimized)?;
        let baseline = match config.baseline_first {
            Some(_) => Some(engine_for(Tier::Baseline)?),
            None => None,
        };
        Ok(Self {
            engine,
            baseline,
            admission: Arc::new(Admission::new(calls, memories, tables)),
            config: Arc::new(config),
            aside: Aside::start().map(Arc::new),
        })
    }

    /// Runs `job` on the sandbox's own thread for work done after a call
    /// (see [`aside`]); gives it back if there is no such thread.
    pub(crate) fn run_aside(&self, job: aside::Job) -> Result<(), aside::Job> {
        match &self.aside {
            Some(aside) => aside.run(job),
            None => Err(job),
        }
    }

    /// Compiles `bytes` for this engine with the configured [`Compiler`]:
    /// the bytes of a precompiled component. Blocks.
    pub fn precompile(&self, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        self.precompile_as(Tier::Optimized, bytes)
    }

    /// Compiles `bytes` for this sandbox's engine of `tier` with the
    /// configured [`Compiler`]. Blocks ([`Tier::Baseline`]: a fraction of
    /// the optimised compile's time).
    pub fn precompile_as(&self, tier: Tier, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
        let engine = self.engine_for(tier).ok_or_else(|| {
            wasmtime::Error::msg("this sandbox has no baseline compiler (baseline_first is off)")
        })?;
        compiler::precompile(&self.config.compiler, &self.config, engine, bytes, tier)
    }

    /// The baseline engine, when a component of `size` bytes missing from
    /// the cache is to be compiled by it first
    /// ([`SandboxConfig::baseline_first`]).
    pub fn baseline_first(&self, size: usize) -> Option<&Engine> {
        let above = self.config.baseline_first?;
        self.baseline.as_ref().filter(|_| size >= above)
    }

    /// Starts compiling the component file at `path` (whose content is
    /// `bytes`) with the optimising compiler into the cache, without
    /// waiting: a compile child that outlives this process if need be
    /// ([`Compiler::Child`], at the lowest CPU priority), or a thread of
    /// this one. Nothing happens without a cache, or when the code is
    /// being compiled already (by any process). Its failure is logged,
    /// never returned: the component was loaded already.
    pub fn fill_cache_later(&self, path: &std::path::Path, bytes: &[u8]) {
        compiler::fill_later(&self.config, &self.engine, path, bytes);
    }

    /// Admission to the instance pool ([`PoolUsage`] for what is in use).
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// What one call of `component` takes from the pool: the memories and
    /// tables it declares, or `max_instances` of each when they cannot be
    /// known before instantiating it.
    pub(crate) fn footprint(
        component: &wasmtime::component::Component,
        limits: &Limits,
    ) -> Footprint {
        let fallback = u32::try_from(limits.max_instances).unwrap_or(u32::MAX);
        match component.resources_required() {
            Some(needs) => Footprint {
                memories: needs.num_memories,
                tables: needs.num_tables,
            },
            None => Footprint {
                memories: fallback,
                tables: fallback,
            },
        }
    }

    /// The largest memory limit a tool may have on this engine (the pool's
    /// per-memory reservation).
    pub fn max_memory_ceiling(&self) -> usize {
        self.config.max_memory_ceiling
    }

    /// The engine every component is compiled for.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine of `tier`'s code, if the sandbox has one (it always
    /// has the optimising one).
    pub fn engine_for(&self, tier: Tier) -> Option<&Engine> {
        match tier {
            Tier::Optimized => Some(&self.engine),
            Tier::Baseline => self.baseline.as_ref(),
        }
    }

    /// The compile cache.
    pub fn cache(&self) -> &CompileCache {
        &self.config.cache
    }

    /// Whether fuel limits can be enforced.
    pub fn fuel_metering(&self) -> bool {
        self.config.fuel_metering
    }

    /// A store for one call on `engine` (its component's: the sandbox's
    /// own, or its baseline one), with `state`'s limits armed: the memory
    /// and table limiter, the wall-clock deadline, and fuel if metered.
    pub(crate) fn store(
        &self,
        engine: &Engine,
        state: CallState,
    ) -> wasmtime::Result<Store<CallState>> {
        let mut store = Store::new(engine, state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if state.cancel.is_cancelled() {
                return Err(wasmtime::Error::new(Stop::Cancelled));
            }
            if Instant::now() >= state.deadline {
                return Err(wasmtime::Error::new(Stop::Deadline));
            }
            // A guest that computes without pause must not hold a worker
            // thread (and with it other calls' I/O and timers) for its
            // whole timeout: once it has run through YIELD_AFTER_TICKS
            // ticks, it yields to the executor on every tick. Short calls
            // (nearly all) never yield, which keeps many concurrent calls
            // cheap; a yield costs one boxed future.
            state.ticks = state.ticks.saturating_add(1);
            if state.ticks < YIELD_AFTER_TICKS {
                return Ok(UpdateDeadline::Continue(1));
            }
            Ok(UpdateDeadline::YieldCustom(
                1,
                Box::pin(tokio::task::yield_now()),
            ))
        });
        self.arm(&mut store)?;
        Ok(store)
    }

    /// The epoch check from the next tick, and the call's fuel in full if
    /// metered.
    fn arm(&self, store: &mut Store<CallState>) -> wasmtime::Result<()> {
        store.set_epoch_deadline(1);
        if self.config.fuel_metering {
            let fuel = store.data().fuel;
            store.set_fuel(fuel.unwrap_or(u64::MAX))?;
        }
        Ok(())
    }

    /// Arms a store made ahead of demand for the call that takes it, as
    /// [`Sandbox::store`] armed it for its instantiation: the deadline and
    /// the epoch check from now, the call's cancel token, and fuel in full
    /// if metered (what instantiation burned is not the call's).
    pub(crate) fn rearm(
        &self,
        store: &mut Store<CallState>,
        limits: &Limits,
        cancel: CancelToken,
    ) -> wasmtime::Result<()> {
        store.data_mut().rearm(limits, cancel);
        self.arm(store)
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] for as long as the
/// engine lives. The thread holds only a weak reference, so it ends once
/// the last clone of the engine (and of its components) is dropped.
fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    let spawned = std::thread::Builder::new()
        .name("airlock-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        });
    if let Err(e) = spawned {
        // Without the ticker no deadline fires; refuse to run silently
        // unbounded by logging loudly. Calls still end at the host-side timer.
        tracing::error!(error = %e, "cannot start the epoch ticker; wasm timeouts will not fire");
    }
}

/// Cancels runs and the tool calls in them. Clones share one state:
/// cancelling any clone cancels them all, for good.
///
/// A cancelled call stops within one epoch tick if it is running wasm
/// (the epoch callback checks the token), and at once if it is waiting on
/// the host (the call races the token).
///
/// The token is also how the caller hears from the call while it runs: a
/// token made with [`CancelToken::observed`] hands each [`CallEvent`] to
/// its observer as it happens.
#[derive(Debug, Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelState>,
}

/// Who hears a call's events ([`CancelToken::watched`]).
pub type Observer = Box<dyn Fn(CallEvent<'_>) + Send + Sync>;

#[derive(Default)]
struct CancelState {
    /// Whether it is cancelled: its own, or shared with the token it was
    /// made from ([`CancelToken::watched_with`]).
    signal: Arc<Signal>,
    observer: Option<Observer>,
    asker: Option<Asker>,
    sampler: Option<Sampler>,
    /// The clock readings and random bytes the call is given, played
    /// back from its journal (a replay); `None`: real ones, recorded.
    played: Option<Arc<crate::spec::Tape>>,
}

/// A token's cancellation, shared by the tokens made with it.
#[derive(Debug, Default)]
struct Signal {
    cancelled: AtomicBool,
    notify: Notify,
}

/// Who answers a call's requests for a completion (the `ask` import's
/// `ask-model`): given the request, the reply, once the model gave it.
pub type Sampler = Arc<
    dyn Fn(
            crate::spec::SampleRequest,
        ) -> futures::future::BoxFuture<'static, crate::spec::SampleReply>
        + Send
        + Sync,
>;

/// The most bytes of messages one request for a completion may carry; a
/// larger one fails the call.
pub const MAX_SAMPLE_BYTES: usize = 64 << 10;

/// The longest reply text a request for at most `max_tokens` tokens is
/// given, in bytes: 16 bytes a token (four times what English text
/// averages), and never less than [`MAX_SAMPLE_BYTES`]. A longer reply reaches the
/// tool as refused.
pub fn max_reply_bytes(max_tokens: u32) -> usize {
    (max_tokens as usize)
        .saturating_mul(16)
        .max(MAX_SAMPLE_BYTES)
}

/// Who answers a call's questions (the `ask` import): given the question,
/// the answer, once the person gave it.
pub type Asker = Arc<
    dyn Fn(crate::spec::Asked) -> futures::future::BoxFuture<'static, crate::spec::Answer>
        + Send
        + Sync,
>;

/// The most questions one call may ask; the next fails it.
pub const MAX_QUESTIONS: usize = 8;

/// The longest question or schema, in bytes; a longer one fails the call.
pub const MAX_QUESTION_BYTES: usize = 16 << 10;

/// The largest answer to a question, in bytes of JSON; a larger one
/// reaches the tool as unavailable.
pub const MAX_ANSWER_BYTES: usize = 64 << 10;

impl std::fmt::Debug for CancelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelState")
            .field("cancelled", &self.signal.cancelled)
            .field("observed", &self.observer.is_some())
            .field("asks", &self.asker.is_some())
            .field("samples", &self.sampler.is_some())
            .field("replays", &self.played.is_some())
            .finish_non_exhaustive()
    }
}

/// What a running call tells its caller as it happens (besides what it
/// returns): nothing of it is journaled or changes the call's outcome.
///
/// An observer is handed the call's own record, borrowed (the call keeps
/// it with its output): hearing a record costs no copy, and an observer
/// that keeps one takes it with [`CallEvent::into_owned`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CallEvent<'a> {
    /// A record of the `log` interface (also kept in the call's output).
    Log(Cow<'a, LogRecord>),
    /// A `progress.report` (also kept in the call's output): `done` of
    /// `total`, and a message of at most [`MAX_PROGRESS_MESSAGE`] bytes.
    Progress(Cow<'a, Progress>),
}

impl CallEvent<'_> {
    /// The event with its record copied if it was borrowed, to keep.
    pub fn into_owned(self) -> CallEvent<'static> {
        match self {
            CallEvent::Log(record) => CallEvent::Log(Cow::Owned(record.into_owned())),
            CallEvent::Progress(report) => CallEvent::Progress(Cow::Owned(report.into_owned())),
        }
    }
}

/// A guest broke a rule of an import it called (a progress report past its
/// bounds): the call fails with this message as its trap's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ImportMisused(pub(crate) String);

/// One `progress.report` of a call.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Progress {
    /// How far: finite, not negative.
    pub done: f64,
    /// Out of how much, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What is happening now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

// Its numbers are finite (the host refuses any other), so equality is
// an equivalence.
impl Eq for Progress {}

/// In words: `2 of 3: stroke 2 of 3` (the message as it is: a terminal
/// escapes it first).
impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.done)?;
        if let Some(total) = self.total {
            write!(f, " of {total}")?;
        }
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

/// The most `progress.report`s one call may make; the next fails it.
pub const MAX_PROGRESS_REPORTS: u32 = 1000;

/// The longest message of a progress report, in bytes; a longer one fails
/// the call.
pub const MAX_PROGRESS_MESSAGE: usize = 1024;

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that is not cancelled, whose call hands each event to
    /// `observer` as it happens. The observer runs on the thread running
    /// the call, inside it: it must not block (hand the event on, through
    /// a channel, to whoever waits for it).
    pub fn observed(observer: impl Fn(CallEvent<'_>) + Send + Sync + 'static) -> Self {
        Self::watched(Some(Box::new(observer)), None, None)
    }

    /// A token that is not cancelled, whose call's events go to
    /// `observer` (see [`CancelToken::observed`]), whose questions `asker`
    /// answers (without one, a question is answered
    /// [`Answer::Unavailable`](crate::spec::Answer::Unavailable)), and
    /// whose requests for a completion `sampler` answers (without one,
    /// they are refused).
    pub fn watched(
        observer: Option<Observer>,
        asker: Option<Asker>,
        sampler: Option<Sampler>,
    ) -> Self {
        Self::new().watched_with(observer, asker, sampler)
    }

    /// A token cancelled with this one (and cancelling it, and every
    /// clone of either), whose call is watched as [`CancelToken::watched`]
    /// says: one call's own observer and answers in a run that one token
    /// cancels. Costs one allocation, and nothing to keep them in step.
    pub fn watched_with(
        &self,
        observer: Option<Observer>,
        asker: Option<Asker>,
        sampler: Option<Sampler>,
    ) -> Self {
        Self {
            inner: Arc::new(CancelState {
                signal: Arc::clone(&self.inner.signal),
                observer,
                asker,
                sampler,
                played: None,
            }),
        }
    }

    /// A token that is not cancelled, for a call played back from its
    /// journal: its clocks and random numbers read from `tape`, its
    /// questions answered by `asker` and its requests for a completion by
    /// `sampler` (as they were answered). Such a call is given an instance
    /// prepared ahead only when its component reads neither clocks nor
    /// random numbers (one that does would have recorded its own).
    pub fn replaying(tape: crate::spec::Tape, asker: Asker, sampler: Sampler) -> Self {
        Self {
            inner: Arc::new(CancelState {
                asker: Some(asker),
                sampler: Some(sampler),
                played: Some(Arc::new(tape)),
                ..CancelState::default()
            }),
        }
    }

    /// What the call's clocks and random numbers play back, for a replay.
    pub(crate) fn played(&self) -> Option<&Arc<crate::spec::Tape>> {
        self.inner.played.as_ref()
    }

    /// Who answers the call's requests for a completion, if anyone.
    pub(crate) fn sampler(&self) -> Option<&Sampler> {
        self.inner.sampler.as_ref()
    }

    /// Who answers the call's questions, if anyone.
    pub(crate) fn asker(&self) -> Option<&Asker> {
        self.inner.asker.as_ref()
    }

    /// Hands `event` to the observer, if there is one.
    pub(crate) fn report(&self, event: CallEvent<'_>) {
        if let Some(observer) = &self.inner.observer {
            observer(event);
        }
    }

    /// Cancels every clone, for good.
    pub fn cancel(&self) {
        self.inner.signal.cancelled.store(true, Ordering::SeqCst);
        self.inner.signal.notify.notify_waiters();
    }

    /// Whether any clone was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.signal.cancelled.load(Ordering::SeqCst)
    }

    /// Completes once the token is cancelled.
    pub async fn cancelled(&self) {
        let notified = self.inner.signal.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.is_cancelled() {
            return;
        }
        notified.await;
    }
}

/// Everything a store holds for one call: the WASI context its grants
/// prepared, the resource table, the limiter, the captured output, the
/// deadline. Opaque outside the crate; it appears in public signatures only
/// as the store data type of the host's linker ([`grants::Capability::link`]).
pub struct CallState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    http: WasiHttpCtx,
    http_hooks: HttpHooks,
    pub(crate) limiter: CallLimiter,
    pub(crate) stdout: CapturedOutput,
    pub(crate) stderr: CapturedOutput,
    /// Records from the `log` interface, bounded like stdout.
    pub(crate) log: CapturedLog,
    /// What the host refused the guest, and why.
    refusals: Refusals,
    pub(crate) deadline: Instant,
    pub(crate) cancel: CancelToken,
    /// The call's room in the instance pool, given back when the store
    /// (and this state with it) is dropped.
    _admitted: Admitted,
    fuel: Option<u64>,
    /// Epoch ticks this call has run through.
    ticks: u32,
    /// Progress reports this call has made.
    pub(crate) progress: Vec<Progress>,
    /// What it has shown beside its result.
    pub(crate) shown: shown::ShownSoFar,
    /// The questions it asked, and their answers.
    pub(crate) asked: Vec<crate::spec::Asked>,
    /// The completions it asked the model for, and the replies.
    pub(crate) sampled: Vec<crate::spec::Sampled>,
    /// What it is granted: what it may show, ask and sample too.
    pub(crate) grants: Arc<Grants>,
    /// What it reads of clocks, random generators and (with `record =
    /// true`) HTTP and files, recorded or played back (`None`: nothing to
    /// record or play back).
    reel: Option<Reel>,
    /// What it finds in its granted directories, recorded or played back
    /// (`None`: neither, or no directory granted).
    pub(crate) files: Option<FileWatch>,
    /// What it may still write into its granted directories (`None`: it
    /// is granted none it may write to, and so made no budget).
    pub(crate) writes: Option<grants::WriteBudget>,
}

impl std::fmt::Debug for CallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallState")
            .field("deadline", &self.deadline)
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl CallState {
    /// State for a call under `limits`, starting now, with exactly `grants`:
    /// with none, no preopened directories, no environment, no network (no
    /// HTTP, no sockets), and an empty stdin. The clocks and random
    /// numbers of `sources` (what the component imports) are recorded, or
    /// played back when `cancel` replays a call.
    pub(crate) fn new(
        limits: &Limits,
        grants: &Arc<Grants>,
        sources: Sources,
        admitted: Admitted,
        cancel: CancelToken,
    ) -> Result<Self, GrantError> {
        let stdout = CapturedOutput::new(Stream::Stdout, limits.max_output_bytes);
        let stderr = CapturedOutput::new(Stream::Stderr, limits.max_output_bytes);
        let deadline = Instant::now() + limits.timeout;
        let mut wasi = WasiCtx::builder();
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        let played = cancel.played().cloned();
        let replaying = played.is_some();
        let mut setup = CallSetup {
            wasi: &mut wasi,
            secrets: Vec::new(),
            recorded_env: played.as_deref().map(|tape| &tape.env),
            // Only a call that records keeps what it was given.
            env: (grants.record && !replaying).then(std::collections::BTreeMap::new),
        };
        grants.prepare(&mut setup, replaying)?;
        let (secrets, env) = (setup.secrets, setup.env);
        let reel = Reel::arm(&mut wasi, sources, grants.record, played.clone());
        // A replay always has a reel: where what it cannot reproduce is
        // noted.
        let replayed = reel.clone().filter(|_| replaying);
        let recording = reel.clone().filter(|_| !replaying && grants.record);
        if let (Some(reel), Some(env)) = (&recording, env) {
            reel.keep_env(env);
        }
        let files = FileWatch::arm(
            &mut wasi,
            &grants.dirs,
            grants.record,
            reel.as_ref(),
            played.as_ref(),
        )
        .map_err(|source| GrantError::DirUnavailable {
            path: "a replay's scratch directory".to_owned(),
            source: Arc::new(source),
        })?;
        let refusals = Refusals::default();
        let writes = grants
            .dirs
            .iter()
            .any(|d| d.mode() == crate::policy::grants::DirMode::Rw)
            .then(|| grants::WriteBudget::new(limits.max_write_bytes, refusals.clone()));
        // What the host holds for the guest is bounded like its memory:
        // this many resources at once, each buffer capped so that together
        // they fit the memory limit.
        let mut table = ResourceTable::new();
        table.set_max_capacity(limits.max_host_resources);
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(limits.host_resource_bytes());
        Ok(Self {
            wasi: wasi.build(),
            table,
            http,
            http_hooks: HttpHooks::new(
                Arc::clone(grants),
                secrets,
                deadline,
                refusals.clone(),
                replayed,
                recording,
            ),
            refusals,
            limiter: CallLimiter::new(limits),
            stdout,
            stderr,
            log: CapturedLog::new(limits.max_output_bytes),
            deadline,
            cancel,
            _admitted: admitted,
            fuel: limits.fuel,
            ticks: 0,
            progress: Vec::new(),
            shown: shown::ShownSoFar::new(limits.max_result_bytes),
            asked: Vec::new(),
            sampled: Vec::new(),
            grants: Arc::clone(grants),
            reel,
            files,
            writes,
        })
    }

    /// Arms this state, made ahead of demand, for the call that takes it:
    /// the call's deadline (from now), its cancel token, and no epoch ticks
    /// run yet. Its limiter keeps counting what instantiation took.
    pub(crate) fn rearm(&mut self, limits: &Limits, cancel: CancelToken) {
        self.deadline = Instant::now() + limits.timeout;
        self.http_hooks.set_deadline(self.deadline);
        self.cancel = cancel;
        self.ticks = 0;
    }

    /// Drops every host resource the guest held (its context view, which
    /// shares the run's deps, and any streams or requests), for a store
    /// that is dropped later, elsewhere: nothing of the call's context
    /// outlives the call.
    pub(crate) fn release_resources(&mut self) {
        self.table = ResourceTable::new();
    }

    /// A grant one of the call's requests needed and could not have (an
    /// unset secret): the call fails with it.
    /// Costs nothing (no lock) for a tool granted no secret.
    pub(crate) fn missing_grant(&self) -> Option<GrantError> {
        if self.grants.secrets.is_empty() {
            return None;
        }
        self.refusals.missing_grant()
    }

    /// Takes what the guest has written so far (logs, stdout, stderr),
    /// leaving the log empty.
    pub(crate) fn take_output(&mut self) -> GuestOutput {
        GuestOutput {
            logs: self.log.take(),
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            refusals: self.refusals.take(),
            shown: self.shown.take(),
            asked: std::mem::take(&mut self.asked),
            sampled: std::mem::take(&mut self.sampled),
            progress: std::mem::take(&mut self.progress),
            tape: self.take_tape(),
        }
    }

    /// The tape so far (see [`Reel::take`]), with what it recorded of files.
    fn take_tape(&mut self) -> crate::spec::Tape {
        let mut tape = self.reel.as_ref().map(Reel::take).unwrap_or_default();
        if let Some(files) = &mut self.files {
            files.record_on(&mut tape);
        }
        tape
    }
}

impl WasiHttpView for CallState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Log level of a record a tool wrote through the `log` interface.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Finest detail.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something odd.
    Warn,
    /// Something failed.
    Error,
}

impl LogLevel {
    /// Its name, as the `log` interface and the journal write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }

    /// The level [`LogLevel::as_str`] names `name`.
    pub fn named(name: &str) -> Option<Self> {
        [
            Self::Trace,
            Self::Debug,
            Self::Info,
            Self::Warn,
            Self::Error,
        ]
        .into_iter()
        .find(|level| level.as_str() == name)
    }
}

/// One record a tool logged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogRecord {
    /// Its level.
    pub level: LogLevel,
    /// Its text, as the tool wrote it.
    pub message: String,
}

/// What one log record costs against [`Limits::max_output_bytes`] beyond
/// its text: the host keeps a level and a string for each (and frees
/// them after the call), so a flood of empty records is bounded like a
/// flood of text.
pub const LOG_RECORD_COST: usize = 64;

/// The log records of one call, bounded by their text and
/// [`LOG_RECORD_COST`] each.
#[derive(Debug)]
pub(crate) struct CapturedLog {
    records: Vec<LogRecord>,
    bytes: usize,
    limit: usize,
}

impl CapturedLog {
    fn new(limit: usize) -> Self {
        Self {
            records: Vec::new(),
            bytes: 0,
            limit,
        }
    }

    /// Keeps `record`, within the bound; the record as kept.
    pub(crate) fn push(&mut self, record: LogRecord) -> Result<&LogRecord, OutputLimitExceeded> {
        let bytes = self
            .bytes
            .saturating_add(record.message.len())
            .saturating_add(LOG_RECORD_COST);
        if bytes > self.limit {
            return Err(OutputLimitExceeded {
                stream: Stream::Log,
                limit: self.limit,
            });
        }
        self.bytes = bytes;
        self.records.push(record);
        Ok(&self.records[self.records.len() - 1])
    }

    pub(crate) fn take(&mut self) -> Vec<LogRecord> {
        std::mem::take(&mut self.records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_pool_holds_what_fits_beside_the_headroom_and_never_more_than_wanted() {
        let per_call = reserved_per_call(&SandboxConfig::default());
        // Two 4 GiB memories and their guards, four tables, a stack.
        assert_eq!(
            per_call,
            2 * (4 * GIB + (32 << 20)) + 4 * 8_000_000 + (2 << 20) + 4096
        );
        assert_eq!(fitted_calls(1_000, per_call, 2, None).unwrap(), 1_000);
        assert_eq!(fitted_calls(1_000, per_call, 1, Some(40 * GIB)).unwrap(), 4);
        assert_eq!(fitted_calls(1_000, per_call, 2, Some(40 * GIB)).unwrap(), 2);
        assert_eq!(fitted_calls(3, per_call, 1, Some(u64::MAX)).unwrap(), 3);
        // A pool of none asked for is not the address space's doing.
        assert_eq!(fitted_calls(0, per_call, 1, Some(40 * GIB)).unwrap(), 0);
        assert_eq!(
            fitted_calls(1_000, per_call, 1, Some(u64::MAX)).unwrap(),
            1_000
        );
        let refused = fitted_calls(1_000, per_call, 2, Some(8 * GIB)).unwrap_err();
        assert_eq!(refused.may_map, 8 * GIB);
        assert_eq!(refused.needs, 2 * per_call + ADDRESS_SPACE_HEADROOM);
        assert_eq!(
            refused.to_string(),
            "this process may map 8.0 GiB (RLIMIT_AS, `ulimit -v`), and an instance pool of one \
             call with the rest of the process needs 18.2 GiB (address space reserved, not \
             memory used): raise the limit to at least 18.2 GiB or remove it"
        );
        // Less than the headroom itself.
        assert!(fitted_calls(1, per_call, 1, Some(GIB)).is_err());
        // A larger memory ceiling reserves more a call.
        let larger = SandboxConfig {
            max_memory_ceiling: 8 << 30,
            ..SandboxConfig::default()
        };
        assert_eq!(reserved_per_call(&larger) - per_call, 2 * 4 * GIB);
    }
}
