//! Loading tool components, resolving tool names, and calling tools.
//!
//! [`Host`] is the entry point for embedders: build one, load components,
//! then call tools against a [`RunContext`](crate::RunContext).

mod ahead;
#[cfg(feature = "bench")]
mod bench;
mod bindings;
mod call;
mod error;
mod load;
pub mod plain;
mod serve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use wasmtime::component::{Component, Linker};

pub use bindings::{ContextView, Reads, WIT_VERSION, misfit};
pub use call::MAX_ERROR_MESSAGE_BYTES;
pub(crate) use call::Ran;
pub use error::{CallError, CallFailure, LoadError, failure_text, with_refusals};
use load::CompileHook;
pub use load::CompileProgress;
pub use serve::{
    Completing, MAX_COMPLETION_BYTES, MAX_COMPLETIONS, ResourceRead, ServeError, Withheld,
};

use crate::context::{ContextOp, ContextRules, KeyAccess, KeyRules};
use crate::journal::{CallEnd, Captured, CapturedLog};
use crate::policy::{Approval, Policy};
use crate::sandbox::{
    CacheOutcome, CallState, CompileCache, Grants, GuestOutput, Limits, LogLevel, LogRecord,
    Sandbox, SandboxConfig, Sources, ToolGate,
};
pub use crate::spec::ToolCall;
use crate::spec::ToolSpec;
use bindings::AirlockPre;
use bindings::airlock::tool::types::ContextOp as GuestOp;
use bindings::tool as guest;

/// What a successful call produced. Its `updates` have already been applied
/// to the context when the caller sees this.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutcome {
    /// The result the model sees (legacy `__update_context__` removed).
    pub result: Value,
    /// The ops applied, in order.
    pub updates: Vec<ContextOp>,
    /// What the guest logged and printed.
    pub output: GuestOutput,
    /// Wall-clock time of the whole call, checks included.
    pub duration: Duration,
}

/// How `result` ended, as the journal records it.
pub(crate) fn call_end(result: &Result<CallOutcome, CallFailure>) -> CallEnd<'_> {
    match result {
        Ok(outcome) => CallEnd::Completed {
            result: &outcome.result,
            ops: &outcome.updates,
            output: captured(&outcome.output),
        },
        Err(failure) => CallEnd::Failed {
            text: failure_text(failure),
            kind: failure.kind(),
            cancelled: matches!(failure.error, CallError::Cancelled),
            output: Captured {
                // A failed call shows nothing.
                shown: Vec::new(),
                ..captured(&failure.output)
            },
        },
    }
}

/// What a guest wrote, as the journal keeps it.
fn captured(output: &GuestOutput) -> Captured {
    Captured {
        logs: output
            .logs
            .iter()
            .map(|log| CapturedLog {
                level: log.level.as_str().to_owned(),
                message: log.message.clone(),
            })
            .collect(),
        stdout: output.stdout.clone(),
        stderr: output.stderr.clone(),
        refusals: output.refusals.clone(),
        shown: output.shown.clone(),
        asked: output.asked.clone(),
        sampled: output.sampled.clone(),
        tape: (!output.tape.is_empty()).then(|| Box::new(output.tape.clone())),
    }
}

/// What a guest wrote, back from the journal's form (a level the journal
/// does not name reads as `info`).
pub(crate) fn guest_output(captured: &Captured) -> GuestOutput {
    GuestOutput {
        logs: captured
            .logs
            .iter()
            .map(|log| LogRecord {
                level: LogLevel::named(&log.level).unwrap_or(LogLevel::Info),
                message: log.message.clone(),
            })
            .collect(),
        stdout: captured.stdout.clone(),
        stderr: captured.stderr.clone(),
        refusals: captured.refusals.clone(),
        shown: captured.shown.clone(),
        asked: captured.asked.clone(),
        sampled: captured.sampled.clone(),
        // Progress is not journaled.
        progress: Vec::new(),
        tape: captured.tape.as_deref().cloned().unwrap_or_default(),
    }
}

/// How a component's tools are called.
pub(crate) enum Kind {
    /// It exports Airlock's `tool` interface: `call(ctx, name, args)`.
    Airlock(AirlockPre),
    /// A plain component: each tool is one of its exported functions.
    Plain(wasmtime::component::InstancePre<CallState>),
}

/// What calling one tool runs.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// An Airlock tool, by the name its `describe` gave (the tool's own
    /// name may differ: the policy may rename it).
    Described(String),
    /// A plain component's function.
    Function(Arc<plain::Function>),
}

/// A loaded component: its compiled code, ready to instantiate, and the
/// tools it offers.
pub struct LoadedComponent {
    path: PathBuf,
    component: Component,
    kind: Kind,
    limits: Limits,
    grants: Arc<Grants>,
    rules: KeyRules,
    approval: Approval,
    scopes: Vec<String>,
    idempotent: bool,
    specs: Vec<ToolSpec>,
    /// One compiled argument schema per Airlock tool, by name (a plain
    /// function's arguments are checked as they are converted).
    validators: BTreeMap<String, Arc<jsonschema::Validator>>,
    /// What each tool runs, by name.
    targets: BTreeMap<String, Target>,
    /// A plain component's functions that are not offered, and why.
    skipped: Vec<plain::Skipped>,
    cache: CacheOutcome,
    /// Its share of the instance pool.
    gate: Arc<ToolGate>,
    /// Its instances prepared ahead of demand.
    ahead: Arc<ahead::Ahead>,
    /// Its resources and prompts (none for a plain component).
    offers: serve::Offers,
    /// The clocks and random generators it imports (what its calls'
    /// tapes record).
    sources: Sources,
}

impl std::fmt::Debug for LoadedComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedComponent")
            .field("path", &self.path)
            .field("tools", &self.specs)
            .field("limits", &self.limits)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl LoadedComponent {
    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The resources it offers (fixed URIs, then templates) and the
    /// prompts (each as its `describe` gave them).
    pub fn offers(&self) -> (Vec<&crate::spec::ResourceSpec>, &[crate::spec::PromptSpec]) {
        let resources = self
            .offers
            .resources
            .iter()
            .chain(self.offers.templates.iter().map(|(spec, _)| spec))
            .collect();
        (resources, &self.offers.prompts)
    }

    /// The resources it describes that are not offered, and why.
    pub fn withheld(&self) -> &[serve::Withheld] {
        &self.offers.withheld
    }

    /// Whether it exports the `resources` interface (WIT 0.1.2).
    pub fn exports_resources(&self) -> bool {
        matches!(&self.kind, Kind::Airlock(pre) if pre.exports().has_resources())
    }

    /// Whether it exports the `prompts` interface (WIT 0.1.2).
    pub fn exports_prompts(&self) -> bool {
        matches!(&self.kind, Kind::Airlock(pre) if pre.exports().has_prompts())
    }

    /// The tools it offers: as `describe` reported them, or a plain
    /// component's functions with their derived schemas (named and
    /// selected as the policy says).
    pub fn tools(&self) -> &[ToolSpec] {
        &self.specs
    }

    /// How many fresh instances are made ahead of its calls now: its
    /// [`Limits::prepared_instances`], or 0 when it is granted anything
    /// (see [`crate::sandbox::Grants::is_none`]) or has once instantiated
    /// too fast for preparing to be worth it (under 30 µs; Rust, C and
    /// JavaScript tools do).
    pub fn prepared_ahead(&self) -> usize {
        self.ahead.prepared()
    }

    /// Whether it is a plain component (its tools are its exported
    /// functions: no context view, no ops) rather than an Airlock tool.
    pub fn is_plain(&self) -> bool {
        matches!(self.kind, Kind::Plain(_))
    }

    /// A plain component's functions that are not offered, and why (for
    /// `airlock inspect`).
    pub fn skipped(&self) -> &[plain::Skipped] {
        &self.skipped
    }

    /// Where the tool `name` is in the component: the name its `describe`
    /// gave, or a plain function's `INTERFACE#name`.
    pub fn source_of(&self, name: &str) -> Option<String> {
        self.targets.get(name).map(|target| match target {
            Target::Described(described) => described.clone(),
            Target::Function(function) => function.qualified(),
        })
    }

    /// Its per-call limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What it is granted.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// The deps keys it may read and write.
    pub fn access(&self) -> &KeyAccess {
        &self.rules.access
    }

    /// Whether its calls need approval (the policy's setting).
    pub fn approval(&self) -> Approval {
        self.approval
    }

    /// The OAuth scopes a caller over authenticated HTTP MCP needs for
    /// its tools (the policy's `scopes`).
    pub fn scopes(&self) -> &[String] {
        &self.scopes
    }

    /// Whether its calls may run speculatively, alongside earlier calls of
    /// a turn and again if what they read changed: it may not ask its
    /// person or the model anything, and has no effectful grant
    /// ([`Grants::effectful`]) or the operator marked it `idempotent`.
    pub fn may_rerun(&self) -> bool {
        // A question to a person or the model is never asked twice.
        !self.asks() && (self.idempotent || !self.grants.effectful())
    }

    /// Whether it may ask its person or the model something mid-call.
    fn asks(&self) -> bool {
        self.grants.ask_user || self.grants.sampling.is_some()
    }

    /// Whether a call of it can neither change anything outside Airlock
    /// (no effectful grant, whatever `idempotent` says) nor hold what a
    /// person or the model said (no questions): such a call that applied
    /// no op may be committed without waiting for the disk
    /// ([`crate::journal::Flush::Deferred`]).
    pub fn reaches_nothing(&self) -> bool {
        !self.asks() && !self.grants.effectful()
    }

    /// Whether loading compiled the component or took it from the cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }

    /// The names of everything the component imports (WASI interfaces, the
    /// Airlock context and log), as the component declares them.
    pub fn imports(&self) -> Vec<String> {
        let engine = self.component.engine();
        self.component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_owned())
            .collect()
    }
}

/// Configures and builds a [`Host`].
#[derive(Default)]
pub struct HostBuilder {
    config: SandboxConfig,
    limits: Limits,
    context_rules: ContextRules,
    on_compile: Option<CompileHook>,
}

impl std::fmt::Debug for HostBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuilder")
            .field("config", &self.config)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl HostBuilder {
    /// Where compiled components are cached (default:
    /// [`CompileCache::from_env`]).
    pub fn cache(mut self, cache: CompileCache) -> Self {
        self.config.cache = cache;
        self
    }

    /// Where components are compiled on a cache miss (default: in this
    /// process, unbounded). [`Compiler::Child`](crate::sandbox::Compiler)
    /// bounds compiling in time and memory, in a child process.
    pub fn compiler(mut self, compiler: crate::sandbox::Compiler) -> Self {
        self.config.compiler = compiler;
        self
    }

    /// Limits for every component loaded afterwards.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Calls that may be in flight at once (default 1,000).
    pub fn max_concurrent_calls(mut self, n: u32) -> Self {
        self.config.max_concurrent_instances = n;
        self
    }

    /// Hidden keys and per-key schemas, for every tool.
    pub fn context_rules(mut self, rules: ContextRules) -> Self {
        self.context_rules = rules;
        self
    }

    /// Called when loading a component misses the compile cache: before
    /// and after compiling, which can take seconds for interpreter-based
    /// components (Python, JavaScript). Not called on a cache hit.
    pub fn on_compile(
        mut self,
        hook: impl Fn(CompileProgress<'_>) + Send + Sync + 'static,
    ) -> Self {
        self.on_compile = Some(Arc::new(hook));
        self
    }

    /// Compile a component of at least `above` bytes missing from the
    /// cache with the baseline compiler first, and its optimised code in
    /// the background for its next load
    /// ([`SandboxConfig::baseline_first`]; default `None`: never).
    pub fn baseline_first(mut self, above: Option<usize>) -> Self {
        self.config.baseline_first = above;
        self
    }

    /// Meter instructions so that [`Limits::fuel`] is enforced.
    pub fn fuel_metering(mut self, on: bool) -> Self {
        self.config.fuel_metering = on;
        self
    }

    /// Creates the engine and links every grant's interfaces (nothing
    /// granted until a tool's config says so) and the Airlock imports once,
    /// for every component the host will load.
    ///
    /// Costs: reserves the instance pool's address space (no memory is
    /// committed until calls run) and starts the epoch thread that enforces
    /// timeouts; both live as long as the host.
    pub fn build(self) -> Result<Host, LoadError> {
        let sandbox = Sandbox::new(self.config).map_err(LoadError::sandbox)?;
        let linker = |engine: &wasmtime::Engine| {
            let mut linker = Linker::new(engine);
            Grants::link(&mut linker)
                .and_then(|()| bindings::add_to_linker(&mut linker))
                .map_err(LoadError::sandbox)?;
            Ok::<_, LoadError>(linker)
        };
        let baseline_linker = sandbox
            .engine_for(crate::sandbox::Tier::Baseline)
            .map(linker)
            .transpose()?;
        Ok(Host {
            linker: linker(sandbox.engine())?,
            baseline_linker,
            sandbox,
            limits: self.limits,
            context_rules: Arc::new(self.context_rules),
            on_compile: self.on_compile,
            components: Vec::new(),
            tools: BTreeMap::new(),
        })
    }

    /// Builds a host for `policy` and loads every tool it lists, each with
    /// its own config: the one way to get a host that honours a policy
    /// whole (its context rules, its `[limits]` and fuel metering are
    /// taken from it, so they cannot be forgotten: a component loaded
    /// later with [`Host::load`] gets the policy's `[limits]`, not the
    /// builder's). Settings made on the builder before (cache, pool size)
    /// are kept.
    ///
    /// A tool the policy names by reference must have been resolved first
    /// ([`crate::oci::Resolver::resolve_policy`]); one that was not is
    /// refused ([`LoadError::NotPulled`]).
    ///
    /// Costs what [`HostBuilder::build`] and each [`Host::load_with`] cost.
    pub async fn build_with_policy(mut self, policy: &Policy) -> Result<Host, LoadError> {
        if let Some(tool) = policy
            .tools
            .iter()
            .find(|t| t.oci.is_some() && t.pulled.is_none())
        {
            return Err(LoadError::NotPulled {
                tool: tool.name.clone(),
            });
        }
        self.context_rules = policy.context.clone();
        self.limits = policy.limits.clone();
        self.config.fuel_metering = self.config.fuel_metering || policy.needs_fuel();
        let mut host = self.build()?;
        host.load_all(&policy.tools).await?;
        Ok(host)
    }
}

/// Runs tool components: loads them once, then calls their tools, each call
/// in a fresh sandboxed instance.
///
/// `Host` is `Send + Sync`; share it (e.g. in an `Arc`) to serve concurrent
/// runs. Calls take `&self`.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use airlock::{Host, RunContext, ToolCall};
///
/// let mut host = Host::builder().build()?;
/// host.load("stateful.wasm").await?;
///
/// let mut ctx = RunContext::default();
/// for _ in 0..3 {
///     host.call(&mut ctx, &ToolCall::new("increment", r#"{"name":"vowels"}"#)).await?;
/// }
/// assert_eq!(ctx.deps()["counters"]["vowels"], 3);
/// # Ok(()) }
/// ```
pub struct Host {
    sandbox: Sandbox,
    linker: Linker<CallState>,
    /// The same imports for the baseline engine's components, when the
    /// sandbox has one ([`crate::sandbox::SandboxConfig::baseline_first`]).
    baseline_linker: Option<Linker<CallState>>,
    limits: Limits,
    context_rules: Arc<ContextRules>,
    on_compile: Option<CompileHook>,
    components: Vec<Arc<LoadedComponent>>,
    /// Tool name → index into `components`.
    tools: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("sandbox", &self.sandbox)
            .field("limits", &self.limits)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

impl Host {
    /// A builder with the defaults: the cache from [`CompileCache::from_env`],
    /// default limits, no context rules, no fuel metering.
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// The engine and compile cache.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The linker for `component`'s engine: the baseline one's for code
    /// of the baseline compiler, the sandbox's own otherwise.
    pub(crate) fn linker_for(
        &self,
        component: &wasmtime::component::Component,
    ) -> &Linker<CallState> {
        match &self.baseline_linker {
            Some(baseline)
                if !wasmtime::Engine::same(component.engine(), self.sandbox.engine()) =>
            {
                baseline
            }
            _ => &self.linker,
        }
    }

    /// The host-wide context rules: hidden keys and per-key schemas.
    pub fn context_rules(&self) -> &ContextRules {
        &self.context_rules
    }

    /// The instance pool's slots in use and calls waiting for room, across
    /// all tools. A tool's calls hold at most half of each kind of slot.
    /// Instances prepared ahead of demand hold slots too: `prepared` says
    /// how many are ready (and counted in `calls`, `memories`, `tables`);
    /// `prepared_taken`, how many calls so far found theirs ready. A call
    /// whose store is dropped after it returned (`dropped_aside`) holds
    /// its slots until the store is gone.
    pub fn pool_usage(&self) -> crate::sandbox::PoolUsage {
        let ahead = || self.components.iter().map(|c| &c.ahead);
        let prepared = ahead().map(|ahead| ahead.ready()).sum::<usize>();
        crate::sandbox::PoolUsage {
            prepared: u32::try_from(prepared).unwrap_or(u32::MAX),
            prepared_taken: ahead().map(|ahead| ahead.taken()).sum(),
            dropped_aside: ahead().map(|ahead| ahead.dropped_aside()).sum(),
            ..self.sandbox.admission().usage()
        }
    }

    /// Drops every instance prepared ahead of demand
    /// ([`Limits::prepared_instances`]), giving back its memory and its room
    /// in the pool (for an embedder that wants an idle host small). The
    /// next call of each tool prepares them again. Calls that wait for room
    /// in the pool do this themselves. Returns how many were dropped; those
    /// being prepared right now are kept when they finish, unless a call is
    /// waiting for room then.
    pub fn release_prepared(&self) -> usize {
        self.components.iter().map(|c| c.ahead.release()).sum()
    }

    /// Every loaded tool, sorted by name.
    pub fn tools(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.iter().filter_map(|(name, &index)| {
            self.components[index]
                .specs
                .iter()
                .find(|spec| &spec.name == name)
        })
    }

    /// The names of every loaded tool, sorted.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The loaded components, in load order.
    pub fn components(&self) -> &[Arc<LoadedComponent>] {
        &self.components
    }

    /// The component that offers tool `name`, if one is loaded.
    pub fn component_for(&self, name: &str) -> Option<&LoadedComponent> {
        self.tools.get(name).map(|&index| &*self.components[index])
    }
}
