//! Calling a tool: a fresh instance, the guest's `call`, its output parsed
//! and its ops applied, and failures mapped to typed errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use wasmtime::{Store, Trap};

use wasmtime::component::{Instance, Val};

use super::ahead::Fresh;
use super::bindings::Reads;
use super::plain::{self, Function};
use super::{
    CallError, CallFailure, CallOutcome, ContextView, GuestOp, Host, Kind, LoadedComponent, Target,
    ToolCall, guest,
};
use crate::context::{
    JsonType, OpKind, ParsedOutput, RunContext, SchemaViolation, WireOp, parse_output,
};
use crate::sandbox::{
    CallState, CancelToken, Grants, GuestOutput, ImportMisused, Limits, OutputLimitExceeded,
    ResourceHit, Sources, Stop, ToolGate, until,
};

/// A call that ran without changing the context ([`Host::run_only`]).
#[derive(Debug)]
pub(crate) struct Ran {
    /// The checked output and what the guest wrote, or how it failed.
    pub(crate) outcome: Result<(ParsedOutput, GuestOutput), CallFailure>,
    /// What it read through its view (empty unless asked to record it).
    pub(crate) reads: Reads,
    /// How long it took.
    pub(crate) duration: Duration,
}

impl Host {
    pub(super) fn component_of(&self, name: &str) -> Result<&LoadedComponent, CallError> {
        self.component_for(name)
            .ok_or_else(|| CallError::UnknownTool {
                name: name.to_owned(),
                available: self.tool_names(),
            })
    }

    /// Runs one tool call and applies its ops to `ctx`, all or none.
    ///
    /// On `Ok`, `ctx.deps()` holds the result of applying every op in
    /// `updates`. On `Err`, `ctx` is unchanged, whatever the guest did, and
    /// the failure carries what the guest logged and printed before it.
    pub fn call<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        call: &'a ToolCall,
    ) -> impl Future<Output = Result<CallOutcome, CallFailure>> + Send + 'a {
        self.run_and_apply(ctx, call, None, true)
    }

    /// [`Host::call`], stopped with [`CallError::Cancelled`] (and `ctx`
    /// unchanged but for the count) as soon as `cancel` fires.
    ///
    /// Counts the call in `ctx.usage.tool_calls` before it runs, so the
    /// tool sees itself counted (as it does in the agent loop), whether it
    /// then succeeds or not.
    pub fn call_cancellable<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        call: &'a ToolCall,
        cancel: &'a CancelToken,
    ) -> impl Future<Output = Result<CallOutcome, CallFailure>> + Send + 'a {
        self.run_and_apply(ctx, call, Some(cancel), true)
    }

    /// The one async body behind [`Host::call`] and
    /// [`Host::call_cancellable`] (plain functions returning it), and what
    /// the agent loop and a session's direct calls run: a call's future is
    /// kilobytes, and each async layer over it would copy it once more on
    /// every call. Counts the call first if `count` (a caller that counted
    /// it already, when the model asked, passes false); with no `cancel`,
    /// the call has a token of its own that nothing fires.
    pub(crate) async fn run_and_apply(
        &self,
        ctx: &mut RunContext,
        call: &ToolCall,
        cancel: Option<&CancelToken>,
        count: bool,
    ) -> Result<CallOutcome, CallFailure> {
        if count {
            ctx.usage.tool_calls = ctx.usage.tool_calls.saturating_add(1);
        }
        let own;
        let cancel = match cancel {
            Some(cancel) => cancel,
            None => {
                own = CancelToken::new();
                &own
            }
        };
        let ran = self.run_only(ctx, call, cancel, false).await;
        self.apply_ran(ctx, call, ran)
    }

    /// Runs a call against `ctx` without changing it: what the tool
    /// returned (checked, not applied) or how it failed, and, with
    /// `record_reads`, what it read through its view.
    /// [`Host::apply_ran`] applies it; run and applied at once, it is
    /// [`Host::run_and_apply`].
    pub(crate) async fn run_only(
        &self,
        ctx: &RunContext,
        call: &ToolCall,
        cancel: &CancelToken,
        record_reads: bool,
    ) -> Ran {
        let started = Instant::now();
        let span = tracing::debug_span!("tool_call", tool = %call.name, id = %call.id);
        // Checked first, and the call's future awaited straight from
        // `invoke`: no binding or match temporary holds a second copy of it.
        let (outcome, reads) = match self.check(call) {
            Err(error) => (Err(error.into()), Reads::default()),
            Ok(checked) => {
                let run = Run {
                    host: self,
                    component: checked.component,
                    ctx,
                    call,
                    cancel,
                    span: &span,
                };
                match run
                    .invoke(checked.target, checked.arguments, record_reads)
                    .await
                {
                    Err(failure) => (Err(failure), Reads::default()),
                    Ok((Ok(parsed), output, reads)) => (Ok((parsed, output)), reads),
                    Ok((Err(error), output, reads)) => (Err(CallFailure { error, output }), reads),
                }
            }
        };
        Ran {
            outcome,
            reads,
            duration: started.elapsed(),
        }
    }

    /// Checks the call's tool and arguments: a call with bad arguments
    /// never starts.
    fn check<'a>(&'a self, call: &ToolCall) -> Result<Checked<'a>, CallError> {
        let component = self.component_of(&call.name)?;
        let arguments = check_arguments(
            &call.arguments,
            component.validators.get(&call.name).map(Arc::as_ref),
        )?;
        let target = component
            .targets
            .get(&call.name)
            .ok_or_else(|| CallError::UnknownTool {
                name: call.name.clone(),
                available: self.tool_names(),
            })?;
        Ok(Checked {
            component,
            target,
            arguments,
        })
    }

    /// Applies a call [`Host::run_only`] ran to `ctx`: its ops checked
    /// against `ctx` as it is now and applied all or none. `ctx` is
    /// unchanged on `Err`.
    #[expect(
        clippy::result_large_err,
        reason = "the result every call path returns (Host::call's)"
    )]
    pub(crate) fn apply_ran(
        &self,
        ctx: &mut RunContext,
        call: &ToolCall,
        ran: Ran,
    ) -> Result<CallOutcome, CallFailure> {
        let applying = Instant::now();
        let (parsed, output) = ran.outcome?;
        let component = self.component_of(&call.name)?;
        ctx.apply_with_rules(&parsed.ops, &component.limits.ops, &component.rules)
            .map_err(|e| CallFailure {
                error: e.into(),
                output: output.clone(),
            })?;
        let duration = ran.duration + applying.elapsed();
        tracing::debug!(tool = %call.name, ops = parsed.ops.len(), ?duration, "tool call applied");
        Ok(CallOutcome {
            result: parsed.result,
            updates: parsed.ops,
            output,
            duration,
        })
    }

    /// A store for one call of a tool whose share of the instance pool is
    /// `gate`, on `engine` (its component's): admitted to the pool first
    /// (waiting at most the call's timeout), holding that room until the
    /// store is dropped.
    pub(super) async fn new_store(
        &self,
        engine: &wasmtime::Engine,
        limits: &Limits,
        grants: &Arc<Grants>,
        sources: Sources,
        gate: &ToolGate,
        cancel: CancelToken,
    ) -> Result<Store<CallState>, CallError> {
        let admitted = self
            .sandbox
            .admission()
            .admit(gate, limits.timeout, &|| {
                self.release_prepared();
            })
            .await
            .map_err(CallError::Busy)?;
        let state = CallState::new(limits, grants, sources, admitted, cancel)?;
        self.sandbox
            .store(engine, state)
            .map_err(|e| CallError::Busy(format!("{e:#}")))
    }
}

/// What running a call gives: the outer error is a call that never ran;
/// the inner one, a guest that ran and failed (or returned what the host
/// refuses), with what it wrote until then and what it read.
type Invoked = Result<(Result<ParsedOutput, CallError>, GuestOutput, Reads), CallFailure>;

/// A call whose tool and arguments passed [`Host::check`].
struct Checked<'a> {
    component: &'a LoadedComponent,
    target: &'a Target,
    /// The parsed arguments (a plain function's are converted from them).
    arguments: Value,
}

/// A call's store, ready for the guest: its prepared instance (if one
/// was), the view the guest gets a borrow of and its handle's number, and
/// when the host-side timer fires.
pub(super) struct Armed {
    pub(super) store: Store<CallState>,
    pub(super) prepared: Option<Instance>,
    pub(super) view: wasmtime::component::Resource<ContextView>,
    pub(super) view_rep: u32,
    pub(super) deadline: tokio::time::Instant,
}

/// One call about to run in a fresh instance of its component.
pub(super) struct Run<'a> {
    pub(super) host: &'a Host,
    pub(super) component: &'a LoadedComponent,
    pub(super) ctx: &'a RunContext,
    pub(super) call: &'a ToolCall,
    pub(super) cancel: &'a CancelToken,
    pub(super) span: &'a tracing::Span,
}

impl Run<'_> {
    /// Runs the checked call, counted as running until its store is
    /// retired.
    async fn invoke(self, target: &Target, arguments: Value, record_reads: bool) -> Invoked {
        let _running = self.host.sandbox.admission().running();
        match (&self.component.kind, target) {
            (Kind::Airlock(_), Target::Described(name)) => self.airlock(name, record_reads).await,
            (Kind::Plain(_), Target::Function(function)) => self.plain(function, arguments).await,
            _ => Err(CallError::Busy(format!(
                "tool {:?} does not match its component's kind",
                self.call.name
            ))
            .into()),
        }
    }

    /// The call's store and, if one was prepared ahead of demand, its
    /// fresh instance, the store armed for this call. Otherwise a new store
    /// admitted to the instance pool (waiting at most the call's timeout,
    /// or until cancelled) to instantiate in.
    pub(super) async fn store(&self) -> Result<(Store<CallState>, Option<Instance>), CallFailure> {
        let component = self.component;
        let ahead = &component.ahead;
        // A replayed call's reads are played back from its start: never
        // an instance that recorded its own. A component that reads
        // neither clocks nor random numbers records nothing, and one
        // prepared ahead has no grant to withhold: its instances serve a
        // replay as they are.
        let fresh = match self.cancel.played() {
            Some(_) if component.sources.any() => None,
            _ => ahead.take(),
        };
        if let Some(fresh) = fresh {
            let Fresh {
                mut store,
                instance,
            } = fresh;
            ahead.fill();
            self.host
                .sandbox
                .rearm(&mut store, &component.limits, self.cancel.clone())
                .map_err(|e| CallError::Busy(format!("{e:#}")))?;
            return Ok((store, Some(instance)));
        }
        let admitted = self.host.new_store(
            component.component.engine(),
            &component.limits,
            &component.grants,
            component.sources,
            &component.gate,
            self.cancel.clone(),
        );
        let store = until(admitted, None, Some(self.cancel), self.span)
            .await
            .map_err(|_| CallError::Cancelled)??;
        ahead.fill();
        Ok((store, None))
    }

    /// The call's store ([`Run::store`]) with its view pushed (recording
    /// what it reads when `record_reads`), and the timer's deadline.
    pub(super) async fn armed(&self, record_reads: bool) -> Result<Armed, CallFailure> {
        let (mut store, prepared) = self.store().await?;
        let view = push_view(
            &mut store,
            self.component,
            self.ctx,
            self.call,
            record_reads,
        )?;
        let view_rep = view.rep();
        let deadline = timer_deadline(&store);
        Ok(Armed {
            store,
            prepared,
            view,
            view_rep,
            deadline,
        })
    }

    /// Drops the call's store, then prepares the component's next
    /// instances if they are short.
    pub(super) fn retire(&self, store: Store<CallState>) {
        self.component.ahead.retire(store);
    }

    /// `work` bounded by the call's deadline and its cancellation
    /// ([`until`]: no timer for a call that never waits).
    /// Not an async fn: `work` is held once, in [`until`]'s future.
    pub(super) fn bounded<'s, T>(
        &'s self,
        deadline: tokio::time::Instant,
        work: impl Future<Output = wasmtime::Result<T>> + 's,
    ) -> impl Future<Output = Result<wasmtime::Result<T>, Stop>> + 's {
        until(work, Some(deadline), Some(self.cancel), self.span)
    }

    /// How a bounded run ended, as the call's error.
    pub(super) fn ended<T>(
        &self,
        ran: Result<wasmtime::Result<T>, Stop>,
        store: &Store<CallState>,
    ) -> Result<T, CallError> {
        let limits = &self.component.limits;
        match ran {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(classify(e, store, limits)),
            Err(Stop::Deadline) => Err(CallError::Timeout {
                limit: limits.timeout,
            }),
            Err(Stop::Cancelled) => Err(CallError::Cancelled),
        }
    }

    /// An Airlock tool's call: a fresh instance (prepared ahead, or made
    /// now from the component's `InstancePre`), the guest's
    /// `call(ctx, name, args)` with the call's read-only view, its output
    /// checked. The store is dropped before this returns, so the context's
    /// deps are no longer shared with the view when ops are applied.
    async fn airlock(self, name: &str, record_reads: bool) -> Invoked {
        let Armed {
            mut store,
            prepared,
            view,
            view_rep,
            deadline,
        } = self.armed(record_reads).await?;
        let ahead = &self.component.ahead;
        let run = async {
            let instance = ahead.instance(&mut store, prepared).await?;
            ahead
                .tool(&mut store, &instance)?
                .call_call(&mut store, view, name, &self.call.arguments)
                .await
        };
        let ran = self.bounded(deadline, run).await;
        let returned = match self.ended(ran, &store) {
            Ok(Ok(output)) => check_output(output, &self.component.limits),
            Ok(Err(guest::ToolError::InvalidArgs(msg))) => {
                Err(CallError::InvalidArgs(bounded_message(msg)))
            }
            Ok(Err(guest::ToolError::Failed(msg))) => Err(CallError::Failed(bounded_message(msg))),
            Ok(Err(guest::ToolError::Retry(msg))) => Err(CallError::Retry(bounded_message(msg))),
            Err(e) => Err(e),
        };
        let returned = grant_first(returned, &store);
        let output = store.data_mut().take_output();
        let reads = take_reads(&mut store, view_rep, record_reads);
        self.retire(store);
        Ok((returned, output, reads))
    }

    /// A plain component's function: its arguments converted by their WIT
    /// types (a mismatch is `bad_arguments`, naming where, and nothing
    /// runs), a fresh instance, the call, its result as JSON (a `result`'s
    /// `err` a failure carrying the error as JSON). No view, no ops.
    ///
    /// What the host allocates to read the result is bounded before it is
    /// read (wasmtime's hostcall fuel, sized so that any result within
    /// `max_result_bytes` as JSON fits): a guest cannot make the host
    /// build a huge value out of its memory.
    async fn plain(self, function: &Function, arguments: Value) -> Invoked {
        let params = plain::value::arguments(&function.params, arguments).map_err(|mismatch| {
            CallError::BadArguments(format!(
                "the arguments do not fit the function's types {mismatch}"
            ))
        })?;
        let limits = &self.component.limits;
        let (mut store, prepared) = self.store().await?;
        store.set_hostcall_fuel(
            limits
                .max_result_bytes
                .saturating_mul(std::mem::size_of::<Val>()),
        );
        let index = function.index;
        let deadline = timer_deadline(&store);
        let results_len = usize::from(function.result.is_some());
        let run = async {
            let instance = self.component.ahead.instance(&mut store, prepared).await?;
            let func = instance
                .get_func(&mut store, index)
                .ok_or_else(|| wasmtime::Error::msg("the function is no longer exported"))?;
            let mut results = vec![Val::Bool(false); results_len];
            func.call_async(&mut store, &params, &mut results).await?;
            Ok(results.pop())
        };
        let ran = self.bounded(deadline, run).await;
        let returned = self
            .ended(ran, &store)
            .map_err(|error| match error {
                CallError::Trap { message, .. } if message.contains(HOSTCALL_FUEL) => {
                    CallError::ResultOverLimit {
                        limit: limits.max_result_bytes,
                    }
                }
                other => other,
            })
            .and_then(|result| outcome(result, limits));
        let returned = grant_first(returned, &store);
        let output = store.data_mut().take_output();
        self.retire(store);
        Ok((returned, output, Reads::default()))
    }
}

/// A call one of whose requests needed a grant that could not be
/// honoured (an unset secret) fails with it, whatever the guest made of
/// the refused request.
fn grant_first<T>(
    returned: Result<T, CallError>,
    store: &Store<CallState>,
) -> Result<T, CallError> {
    match store.data().missing_grant() {
        Some(missing) => Err(CallError::Grant(missing)),
        None => returned,
    }
}

/// What the call's view recorded of its reads, when it was asked to
/// (`view_rep` is the view's handle); only a recording view has reads to
/// give, so the plain call path skips the lookup.
pub(super) fn take_reads(store: &mut Store<CallState>, view_rep: u32, record_reads: bool) -> Reads {
    if !record_reads {
        return Reads::default();
    }
    store
        .data_mut()
        .table
        .get_mut(&wasmtime::component::Resource::<ContextView>::new_borrow(
            view_rep,
        ))
        .ok()
        .and_then(ContextView::take_reads)
        .unwrap_or_default()
}

/// What wasmtime says when reading a value from a guest would allocate
/// more than the store's hostcall fuel allows (its error type is private).
const HOSTCALL_FUEL: &str = "fuel allocated for hostcalls has been exhausted";

/// A plain function's result as a tool's: its JSON (`null` for none), or,
/// for a `result`, `ok`'s value or a failure carrying `err`'s as JSON;
/// refused past `max_result_bytes` of JSON.
fn outcome(result: Option<Val>, limits: &Limits) -> Result<ParsedOutput, CallError> {
    let json = match result {
        None => Value::Null,
        Some(Val::Result(Ok(payload))) => payload
            .as_deref()
            .map_or(Value::Null, plain::value::to_json),
        Some(Val::Result(Err(payload))) => {
            let error = payload
                .as_deref()
                .map_or(Value::Null, plain::value::to_json)
                .to_string();
            return Err(CallError::Failed(bounded_message(error)));
        }
        Some(val) => plain::value::to_json(&val),
    };
    let bytes = crate::json::len(&json);
    if bytes > limits.max_result_bytes {
        return Err(CallError::ResultTooLarge {
            bytes,
            limit: limits.max_result_bytes,
        });
    }
    Ok(ParsedOutput {
        result: json,
        ops: Vec::new(),
    })
}

/// Host-side timer slack beyond [`Limits::timeout`]. Epoch interruption
/// normally stops the guest first; the timer catches a guest that is
/// blocked in a host call rather than running wasm.
const TIMER_GRACE: Duration = Duration::from_millis(250);

/// When the host-side timer of `store`'s call fires: [`TIMER_GRACE`]
/// after the deadline the store was armed with (no clock read of its own).
pub(super) fn timer_deadline(store: &Store<CallState>) -> tokio::time::Instant {
    tokio::time::Instant::from_std(store.data().deadline) + TIMER_GRACE
}

/// The longest error message a tool may give; longer ones are cut here
/// (they go to the model, the terminal and the event log).
pub const MAX_ERROR_MESSAGE_BYTES: usize = 16 << 10;

/// `message` cut to [`MAX_ERROR_MESSAGE_BYTES`], saying so and how long it
/// was.
pub(super) fn bounded_message(message: String) -> String {
    if message.len() <= MAX_ERROR_MESSAGE_BYTES {
        return message;
    }
    format!(
        "{} (message cut: {} bytes; the limit is {MAX_ERROR_MESSAGE_BYTES})",
        crate::text::truncate(&message, MAX_ERROR_MESSAGE_BYTES),
        message.len()
    )
}

/// How much of a crashed guest's stderr an error carries.
const STDERR_TAIL_BYTES: usize = 2048;

/// Puts the call's read-only context view into the store's table (recording
/// what the tool reads when `record_reads`); the guest gets a borrow of it.
pub(super) fn push_view(
    store: &mut Store<CallState>,
    component: &LoadedComponent,
    ctx: &RunContext,
    call: &ToolCall,
    record_reads: bool,
) -> Result<wasmtime::component::Resource<ContextView>, CallError> {
    let view = ContextView::new(
        ctx,
        &call.id,
        call.retry,
        component.rules.clone(),
        record_reads,
    );
    store
        .data_mut()
        .table
        .push(view)
        .map_err(|e| CallError::Busy(e.to_string()))
}

/// The longest schema message an argument error quotes (jsonschema's
/// quotes the value, which may be as long as the arguments).
const MAX_SCHEMA_MESSAGE: usize = 1024;

/// What a refusal of arguments that break the tool's schema at `e` says:
/// where, and jsonschema's message when it is at most
/// [`MAX_SCHEMA_MESSAGE`] bytes; else where and which rule alone.
fn schema_refusal(e: &jsonschema::ValidationError<'_>) -> String {
    let said = e.to_string();
    if said.len() > MAX_SCHEMA_MESSAGE {
        let broken = SchemaViolation::of(e);
        return format!("the arguments do not match the tool's schema: {broken}");
    }
    match e.instance_path().to_string() {
        at if at.is_empty() => format!("the arguments do not match the tool's schema: {said}"),
        at => format!("the arguments do not match the tool's schema at {at}: {said}"),
    }
}

/// Checks that `arguments` is a JSON object that satisfies the tool's
/// parameter schema; the parsed arguments.
fn check_arguments(
    arguments: &str,
    validator: Option<&jsonschema::Validator>,
) -> Result<Value, CallError> {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => {
            // `is_valid` first: it stops at the first failure and builds
            // no error, which is all a valid call (nearly every one) needs.
            let invalid = validator.filter(|v| !v.is_valid(&value));
            match invalid.and_then(|v| v.iter_errors(&value).next()) {
                None => Ok(value),
                Some(e) => Err(CallError::BadArguments(schema_refusal(&e))),
            }
        }
        Ok(other) => Err(CallError::BadArguments(format!(
            "arguments must be a JSON object, not {}",
            JsonType::of(&other)
        ))),
        Err(e) => Err(CallError::BadArguments(format!(
            "arguments are not valid JSON: {e}"
        ))),
    }
}

/// Turns a guest's output into a result value and checked ops: the
/// result's size here, everything else in [`parse_output`]. Applies
/// nothing.
fn check_output(output: guest::ToolOutput, limits: &Limits) -> Result<ParsedOutput, CallError> {
    if output.result.len() > limits.max_result_bytes {
        return Err(CallError::ResultTooLarge {
            bytes: output.result.len(),
            limit: limits.max_result_bytes,
        });
    }
    Ok(parse_output(&output.result, output.updates, &limits.ops)?)
}

/// The guest interface's op is what [`parse_output`] parses: each op is
/// parsed once, from what the guest returned.
impl WireOp for GuestOp {
    fn kind(&self) -> OpKind {
        match self {
            GuestOp::Set(_) => OpKind::Set,
            GuestOp::Merge(_) => OpKind::Merge,
            GuestOp::Append(_) => OpKind::Append,
            GuestOp::Delete(_) => OpKind::Delete,
        }
    }

    fn key(&self) -> &str {
        match self {
            GuestOp::Set(e) | GuestOp::Merge(e) | GuestOp::Append(e) => &e.key,
            GuestOp::Delete(key) => key,
        }
    }

    fn value_len(&self) -> usize {
        match self {
            GuestOp::Set(e) | GuestOp::Merge(e) | GuestOp::Append(e) => e.value.len(),
            GuestOp::Delete(_) => 0,
        }
    }

    fn into_parts(self) -> (String, Option<String>) {
        match self {
            GuestOp::Set(e) | GuestOp::Merge(e) | GuestOp::Append(e) => (e.key, Some(e.value)),
            GuestOp::Delete(key) => (key, None),
        }
    }
}

/// Maps a failure inside the guest (or at its boundary) to a typed error.
pub(super) fn classify(
    error: wasmtime::Error,
    store: &Store<CallState>,
    limits: &Limits,
) -> CallError {
    if let Some(stop) = find::<Stop>(&error) {
        return match stop {
            Stop::Deadline => CallError::Timeout {
                limit: limits.timeout,
            },
            Stop::Cancelled => CallError::Cancelled,
        };
    }
    if let Some(over) = find::<OutputLimitExceeded>(&error) {
        return CallError::OutputLimit {
            stream: over.stream,
            limit: over.limit,
        };
    }
    if find::<wasmtime::component::ResourceTableError>(&error)
        .is_some_and(|e| matches!(e, wasmtime::component::ResourceTableError::Full))
    {
        return CallError::ResourceLimit {
            limit: limits.max_host_resources,
        };
    }
    if let Some(misused) = find::<ImportMisused>(&error) {
        return CallError::Trap {
            message: misused.to_string(),
            stderr: crate::text::tail(&store.data().stderr.text(), STDERR_TAIL_BYTES),
        };
    }
    if find::<wasmtime::PoolConcurrencyLimitError>(&error).is_some() {
        return CallError::Busy(error.to_string());
    }
    match store.data().limiter.hit {
        Some(ResourceHit::Memory { .. }) => {
            return CallError::MemoryLimit {
                limit: limits.max_memory_bytes,
            };
        }
        Some(ResourceHit::Table { .. }) => {
            return CallError::TableLimit {
                limit: limits.max_table_elements,
            };
        }
        None => {}
    }
    let trap = find::<Trap>(&error).copied();
    if trap == Some(Trap::OutOfFuel) {
        return CallError::FuelExhausted {
            limit: limits.fuel.unwrap_or(0),
        };
    }
    tracing::debug!(error = ?error, "guest trapped");
    let message = match trap {
        Some(trap) => trap.to_string(),
        None => error.to_string(),
    };
    CallError::Trap {
        message,
        stderr: crate::text::tail(&store.data().stderr.text(), STDERR_TAIL_BYTES),
    }
}

/// Finds an error of type `T` in `error` or the errors it wraps.
fn find<T: std::error::Error + Send + Sync + 'static>(error: &wasmtime::Error) -> Option<&T> {
    error
        .downcast_ref::<T>()
        .or_else(|| error.chain().find_map(|cause| cause.downcast_ref::<T>()))
}
